//! `agentrun console` in-process for a test: served on a free loopback port, reaching the test's
//! control plane with the URL and CA of the admin kubeconfig (whose credentials the console drops:
//! every request runs with the credential of the person using it).

use std::time::Duration;

use agentrun::console::access::ApiServer;
use agentrun::console::{Console, ConsoleConfig};
use tokio_util::sync::CancellationToken;

use crate::cluster::{ControlPlane, Identity};

/// A console serving one test.
pub struct ConsoleServer {
    /// Its base URL, e.g. `http://127.0.0.1:40123`.
    pub url: String,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ConsoleServer {
    /// Starts a console whose inbox looks in `namespaces` (for people who may not list all), with
    /// the default session timeouts (30 minutes idle, 8 hours in all).
    pub async fn start(cp: &ControlPlane, namespaces: &[&str]) -> ConsoleServer {
        Self::start_with(
            cp,
            namespaces,
            Duration::from_secs(30 * 60),
            Duration::from_secs(8 * 3600),
        )
        .await
    }

    /// Starts a console whose sessions end after `idle_timeout` without a page view, or
    /// `lifetime` after login.
    pub async fn start_with(
        cp: &ControlPlane,
        namespaces: &[&str],
        idle_timeout: Duration,
        lifetime: Duration,
    ) -> ConsoleServer {
        let api = ApiServer::Kubeconfig {
            path: Some(cp.kubeconfig(Identity::Admin)),
            context: None,
        }
        .config()
        .await
        .expect("the API server's configuration");
        let config = ConsoleConfig {
            listen: "127.0.0.1:0".parse().expect("an address"),
            api,
            namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
            tls: None,
            secure_cookies: false,
            idle_timeout,
            lifetime,
        };
        let console = Console::bind(config).await.expect("bind the console");
        let url = format!("http://{}", console.local_addr().expect("its address"));
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = console.serve(token).await {
                panic!("the console failed: {error}");
            }
        });
        ConsoleServer {
            url,
            shutdown,
            task: Some(task),
        }
    }

    /// The URL of `path` (starting with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// Stops the console and waits for it.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ConsoleServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
