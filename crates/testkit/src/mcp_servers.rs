//! MCP servers nobody here wrote, on 127.0.0.1, for tests:
//!
//! - [`PythonMcpServer`]: `tests/mcp/tools_server.py`, written with the official Python SDK (`mcp`
//!   on PyPI, [`PYTHON_MCP_VERSION`]; MCPServer, formerly FastMCP) and served over Streamable HTTP.
//!   The SDK is installed with pip into a virtual environment under the user cache dir
//!   ([`cache_dir`]), once per version. It logs every request (JSON-RPC method, headers) and every executed call.
//! - [`EverythingServer`]: the reference server `@modelcontextprotocol/server-everything`
//!   ([`EVERYTHING_VERSION`]) from npm, installed under the user cache dir, run with `node` in its
//!   `streamableHttp` mode.
//!
//! Both stop when dropped. Installing fails the test with what went wrong (no network access to
//! the package registry, no `python3 -m venv`, no `npm`).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::cluster::repo_root;

/// The version of the Python SDK the tests install.
pub const PYTHON_MCP_VERSION: &str = "2.3.0";

/// The version of `@modelcontextprotocol/server-everything` the tests install.
pub const EVERYTHING_VERSION: &str = "2026.8.31";

/// Where installs are kept by version: `$AGENTRUN_CACHE_DIR`, else `$XDG_CACHE_HOME/agentrun`,
/// else `~/.cache/agentrun` (as `scripts/build-control-plane` does), then `mcp/`.
pub fn cache_dir() -> PathBuf {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let base = non_empty("AGENTRUN_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| non_empty("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("agentrun")))
        .or_else(|| non_empty("HOME").map(|h| PathBuf::from(h).join(".cache/agentrun")))
        .unwrap_or_else(|| std::env::temp_dir().join("agentrun-cache"));
    let dir = base.join("mcp");
    std::fs::create_dir_all(&dir).expect("create the MCP install cache");
    dir
}

/// Runs `command`, panicking with its output when it fails.
fn run(command: &mut Command, what: &str) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Installs into `final_dir` once: `install` fills a fresh folder, which is then renamed (so a
/// concurrent test process never sees half an install).
fn install_once(final_dir: &Path, install: impl FnOnce(&Path)) -> PathBuf {
    let marker = final_dir.join(".installed");
    if marker.is_file() {
        return final_dir.to_path_buf();
    }
    let staging = final_dir.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).expect("create the install folder");
    install(&staging);
    std::fs::write(staging.join(".installed"), "").expect("mark the install");
    if std::fs::rename(&staging, final_dir).is_err() {
        // Another process finished first: use its install.
        let _ = std::fs::remove_dir_all(&staging);
        assert!(
            marker.is_file(),
            "{} is not a finished install",
            final_dir.display()
        );
    }
    final_dir.to_path_buf()
}

/// The Python of a virtual environment holding `mcp` [`PYTHON_MCP_VERSION`].
pub fn python_with_mcp() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let dir = cache_dir().join(format!("python-mcp-{PYTHON_MCP_VERSION}"));
        let dir = install_once(&dir, |staging| {
            let started = Instant::now();
            run(
                Command::new("python3").args(["-m", "venv"]).arg(staging),
                "creating a Python virtual environment for the MCP SDK (python3 -m venv)",
            );
            run(
                Command::new(staging.join("bin/python")).args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    &format!("mcp=={PYTHON_MCP_VERSION}"),
                ]),
                &format!("installing the MCP Python SDK (pip install mcp=={PYTHON_MCP_VERSION})"),
            );
            eprintln!(
                "installed mcp=={PYTHON_MCP_VERSION} in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        });
        // A venv's scripts name its own path: the renamed folder's python still runs (it is a
        // symlink to the system python), and `python -m` needs nothing else.
        dir.join("bin/python")
    })
}

/// The `dist/index.js` of `@modelcontextprotocol/server-everything` [`EVERYTHING_VERSION`].
pub fn everything_script() -> &'static Path {
    static SCRIPT: OnceLock<PathBuf> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let dir = cache_dir().join(format!("server-everything-{EVERYTHING_VERSION}"));
        let dir = install_once(&dir, |staging| {
            run(
                Command::new("npm")
                    .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
                    .arg(staging)
                    .arg(format!(
                        "@modelcontextprotocol/server-everything@{EVERYTHING_VERSION}"
                    )),
                "installing @modelcontextprotocol/server-everything with npm",
            );
        });
        dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
    })
}

/// A free port on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Waits until something accepts connections on `port`, or panics with the log.
fn wait_for_port(port: u16, child: &mut Child, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the MCP server exited ({status}) before listening:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "the MCP server did not listen on 127.0.0.1:{port} within 60 s:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Options of a [`PythonMcpServer`].
#[derive(Clone, Debug, Default)]
pub struct PythonMcpOptions {
    /// Give `delete_file` another description (another definition digest).
    pub changed: bool,
    /// Answer 401 unless this header (name, value) is sent.
    pub require_header: Option<(String, String)>,
    /// Seconds `read_file` takes to answer (0: at once).
    pub slow_read_seconds: u32,
}

/// `tests/mcp/tools_server.py` on 127.0.0.1 (tools `delete_file`, destructive; `read_file`,
/// read-only; `fail`, read-only, always an error).
pub struct PythonMcpServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PythonMcpServer {
    /// Starts it on a free port (the SDK installed first if needed).
    pub fn start(options: &PythonMcpOptions) -> PythonMcpServer {
        let dir = std::env::temp_dir().join(format!(
            "agentrun-mcp-server-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("create the MCP server's folder");
        let mut server = PythonMcpServer {
            port: free_port(),
            dir,
            child: None,
        };
        server.spawn(options);
        server
    }

    fn spawn(&mut self, options: &PythonMcpOptions) {
        let python = python_with_mcp();
        let log = self.dir.join("server.log");
        let mut command = Command::new(python);
        command
            .arg(repo_root().join("tests/mcp/tools_server.py"))
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--log")
            .arg(self.log_path())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("server log"))
            .stderr(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&log)
                    .expect("server log"),
            );
        if options.changed {
            command.arg("--changed");
        }
        if let Some((name, value)) = &options.require_header {
            command
                .arg("--require-header")
                .arg(format!("{name}={value}"));
        }
        if options.slow_read_seconds > 0 {
            command
                .arg("--slow-read")
                .arg(options.slow_read_seconds.to_string());
        }
        let mut child = command.spawn().expect("start the Python MCP server");
        wait_for_port(self.port, &mut child, &log);
        self.child = Some(child);
    }

    /// Its Streamable HTTP URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("requests.jsonl")
    }

    /// Stops it (the port stays its own: [`Self::restart`] starts it there again).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child);
        }
    }

    /// Starts it again on the same port with `options` (e.g. a changed definition).
    pub fn restart(&mut self, options: &PythonMcpOptions) {
        self.stop();
        self.spawn(options);
    }

    /// Every logged entry: requests (`http`, `method`, `tool`, `headers`) and executed calls
    /// (`executed`, `arguments`).
    pub fn log(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// How many times `tool` was executed.
    pub fn executed(&self, tool: &str) -> usize {
        self.log()
            .iter()
            .filter(|e| e["executed"].as_str() == Some(tool))
            .count()
    }

    /// The headers of each `tools/call` request of `tool`.
    pub fn call_headers(&self, tool: &str) -> Vec<serde_json::Value> {
        self.log()
            .into_iter()
            .filter(|e| e["method"] == "tools/call" && e["tool"].as_str() == Some(tool))
            .map(|e| e["headers"].clone())
            .collect()
    }
}

impl Drop for PythonMcpServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `@modelcontextprotocol/server-everything` on 127.0.0.1, Streamable HTTP at `/mcp`.
pub struct EverythingServer {
    port: u16,
    child: Child,
    log: PathBuf,
}

impl EverythingServer {
    /// Starts it on a free port (installed with npm first if needed).
    pub fn start() -> EverythingServer {
        let script = everything_script();
        let port = free_port();
        let log = std::env::temp_dir().join(format!("agentrun-mcp-everything-{port}.log"));
        let mut child = Command::new("node")
            .arg(script)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("server log"))
            .spawn()
            .expect("start server-everything with node");
        wait_for_port(port, &mut child, &log);
        EverythingServer { port, child, log }
    }

    /// Its Streamable HTTP URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for EverythingServer {
    fn drop(&mut self) {
        stop(&mut self.child);
        let _ = std::fs::remove_file(&self.log);
    }
}
