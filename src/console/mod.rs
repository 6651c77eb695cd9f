//! `agentrun console`: a web console for the people who decide on gated tool calls, without
//! weakening anything the API server enforces.
//!
//! - **Every request runs as the person.** The console has no rights of its own on agentrun
//!   objects: it forwards the person's credential (a bearer token pasted at login, or the
//!   `Authorization` header an authenticating proxy sets) with each API request, so RBAC, the
//!   admission policies, the decision stamp and the API server's audit log see the person, exactly
//!   as with kubectl ([`access`]).
//! - **Inbox**: the pending ApprovalRequests of the namespaces the person may list, oldest first,
//!   live (server-sent events from a watch, as the person); **a request**: the conversation that led
//!   to the call, the exact arguments and their digest, the tool endpoint and definition digest, the
//!   rule that asked for approval, approve and reject forms; **a run's audit** ([`data`], reusing
//!   the kubectl plugin's readers).
//! - **Security**: sessions in a server-side store behind an HttpOnly, SameSite=Strict cookie
//!   (Secure under TLS) that expire ([`session`]); a CSRF token on every state change ([`csrf`]); a
//!   strict Content-Security-Policy and no inline script ([`server`], [`assets`]); every text
//!   escaped by the templates ([`views`]).
//!
//! Pages are rendered on the server from askama templates compiled into the binary, with one small
//! script for the live updates: no front-end build, no JavaScript dependency, and escaping in one
//! place (see `docs/console.md`).

pub mod access;
pub mod assets;
pub mod csrf;
pub mod data;
pub mod routes;
pub mod server;
pub mod session;
pub mod views;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use server::{Console, ConsoleConfig, TlsFiles};

/// Errors that stop the console.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// The API server's address or CA cannot be used.
    #[error("{message}")]
    Api {
        /// Why.
        message: String,
    },
    /// The TLS certificate or key cannot be used.
    #[error("cannot use {}: {message}", path.display())]
    Tls {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The listen address cannot be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("the console's server failed: {0}")]
    Serve(#[source] std::io::Error),
}
