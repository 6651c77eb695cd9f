//! A real headless browser for tests: Debian's `chromium`, driven through `chromedriver` (W3C
//! WebDriver, with the `thirtyfour` crate).
//!
//! Each [`Browser`] starts its own chromedriver on a free loopback port and one Chromium with a
//! fresh profile in the temp dir (no first-run, sync, component updates or background networking:
//! it talks to nothing but the pages it is sent to). [`Browser::stop`] (or dropping it) quits
//! Chromium, stops chromedriver and removes the profile.
//!
//! Missing binaries fail the test with a message saying how to install them (`.ci/run` does):
//! a browser test never skips.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use thirtyfour::prelude::*;

use crate::wait::free_port;

/// The WebDriver client crate, for tests that drive the browser.
pub use thirtyfour;

/// The Chromium binary (`$AGENTRUN_CHROMIUM`, else Debian's `chromium`).
pub fn chromium_path() -> PathBuf {
    binary("AGENTRUN_CHROMIUM", &["chromium", "chromium-browser"])
}

/// The chromedriver binary (`$AGENTRUN_CHROMEDRIVER`, else Debian's `chromedriver`).
pub fn chromedriver_path() -> PathBuf {
    binary("AGENTRUN_CHROMEDRIVER", &["chromedriver"])
}

fn binary(variable: &str, names: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os(variable) {
        return PathBuf::from(path);
    }
    let dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for name in names {
        for dir in dirs
            .iter()
            .map(PathBuf::as_path)
            .chain([Path::new("/usr/bin")])
        {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "{} not found (set ${variable} or install it: `apt-get install chromium chromium-driver`, as .ci/run does); the console's tests need a real browser",
        names[0]
    );
}

/// Chromium's flags for tests.
pub const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
];

/// A headless Chromium under a chromedriver of its own.
pub struct Browser {
    /// The WebDriver session.
    pub driver: WebDriver,
    chromedriver: Child,
    profile: PathBuf,
}

impl Browser {
    /// Starts chromedriver and Chromium; panics (with the reason) when they cannot start.
    pub async fn start() -> Browser {
        let chromium = chromium_path();
        let chromedriver_binary = chromedriver_path();
        let port = free_port().expect("a free port").port();
        let profile = std::env::temp_dir().join(format!(
            "agentrun-chromium-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&profile).expect("create the browser profile folder");
        let log = std::fs::File::create(profile.with_extension("chromedriver.log"))
            .expect("create the chromedriver log");
        // A process group of its own: Chromium and its helpers are chromedriver's children, so
        // cleaning up (even after a panic) ends exactly them.
        let mut chromedriver = Command::new(&chromedriver_binary)
            .process_group(0)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", chromedriver_binary.display()));
        let mut caps = DesiredCapabilities::chrome();
        caps.set_binary(&chromium.to_string_lossy())
            .expect("the chromium binary capability");
        for flag in CHROMIUM_FLAGS {
            caps.add_arg(flag).expect("a chromium flag");
        }
        caps.add_arg(&format!("--user-data-dir={}", profile.display()))
            .expect("the profile flag");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let driver = loop {
            match WebDriver::new(&url, caps.clone()).await {
                Ok(driver) => break driver,
                Err(error) => {
                    if let Ok(Some(status)) = chromedriver.try_wait() {
                        let log =
                            std::fs::read_to_string(profile.with_extension("chromedriver.log"))
                                .unwrap_or_default();
                        panic!("chromedriver exited ({status}):\n{log}");
                    }
                    if tokio::time::Instant::now() > deadline {
                        let _ = chromedriver.kill();
                        let _ = chromedriver.wait();
                        panic!(
                            "cannot start Chromium ({}) under chromedriver ({}): {error}",
                            chromium.display(),
                            chromedriver_binary.display()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        Browser {
            driver,
            chromedriver,
            profile,
        }
    }

    /// Quits Chromium, stops chromedriver and removes the profile.
    pub async fn stop(self) {
        let driver = self.driver.clone();
        let _ = driver.quit().await;
        drop(self);
    }

    fn cleanup(&mut self) {
        // The whole process group: chromedriver, Chromium and Chromium's helper processes.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.chromedriver.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.chromedriver.kill();
        let _ = self.chromedriver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
        let _ = std::fs::remove_file(self.profile.with_extension("chromedriver.log"));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Where tests save screenshots: `target/test-artifacts/<test>/` in the repository.
pub fn artifacts_dir(test: &str) -> PathBuf {
    let dir = crate::cluster::repo_root()
        .join("target/test-artifacts")
        .join(test);
    std::fs::create_dir_all(&dir).expect("create the artifacts folder");
    dir
}
