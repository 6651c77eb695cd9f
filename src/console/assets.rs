//! The console's static assets, compiled into the binary (no files to ship or serve from disk).
//!
//! They are served at fixed paths (`/static/console.css`, `/static/console.js`), which the
//! Content-Security-Policy allows as `'self'`; no page has inline script or style.

/// The style sheet.
pub const CSS: &str = include_str!("static/console.css");
/// The script: live updates of the inbox (server-sent events, then a fetch of the table body).
pub const JS: &str = include_str!("static/console.js");
