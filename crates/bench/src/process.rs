//! The benchmark's child processes (the controller, the dev kubelet) and what it reads of them:
//! memory from `/proc`, the controller's `/metrics` and `/readyz`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use agentrun_testkit::wait::free_port;

use crate::cluster::BenchNamespace;
use crate::error::io_error;
use crate::{BenchConfig, BenchError};

/// A process's memory from `/proc/PID/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident set size now (`VmRSS`), KiB.
    pub rss_kib: u64,
    /// Peak resident set size (`VmHWM`), KiB.
    pub peak_kib: u64,
}

impl Memory {
    /// The current RSS in MiB.
    pub fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    /// The peak RSS in MiB.
    pub fn peak_mib(&self) -> f64 {
        self.peak_kib as f64 / 1024.0
    }
}

/// Reads `VmRSS` and `VmHWM` from the text of `/proc/PID/status`.
pub fn parse_proc_status(text: &str) -> Option<Memory> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let rest = line[name.len()..].trim_start_matches(':').trim();
        rest.strip_suffix("kB")?.trim().parse().ok()
    };
    Some(Memory {
        rss_kib: field("VmRSS")?,
        peak_kib: field("VmHWM")?,
    })
}

/// The memory of a running process.
pub fn process_memory(pid: u32) -> Result<Memory, BenchError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(io_error(format!("reading {path}")))?;
    parse_proc_status(&text).ok_or_else(|| BenchError::Io {
        what: format!("reading {path}"),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no VmRSS/VmHWM"),
    })
}

/// The value of an unlabelled sample in a Prometheus text exposition.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (metric, value) = l.split_once(' ')?;
        (metric == name).then(|| value.trim().parse().ok())?
    })
}

/// The CPU priority a child process starts with (its children inherit it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CpuPriority {
    /// The benchmark's own.
    Normal,
    /// The lowest (`nice -n 19`): it gets only the CPU that every other process leaves.
    Lowest,
}

/// A child process (controller or dev kubelet) with its output in a log file; killed on drop.
pub(crate) struct ChildProcess {
    what: String,
    log: PathBuf,
    child: tokio::process::Child,
}

impl ChildProcess {
    pub(crate) fn spawn(
        what: &str,
        binary: &Path,
        args: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
        log: PathBuf,
        priority: CpuPriority,
    ) -> Result<ChildProcess, BenchError> {
        let file =
            std::fs::File::create(&log).map_err(io_error(format!("creating {}", log.display())))?;
        let err = file
            .try_clone()
            .map_err(io_error(format!("opening {}", log.display())))?;
        // `nice` executes the binary in its own place, so the child's pid is the binary's.
        let mut command = match priority {
            CpuPriority::Normal => tokio::process::Command::new(binary),
            CpuPriority::Lowest => {
                let mut nice = tokio::process::Command::new("nice");
                nice.args(["-n", "19"]).arg(binary);
                nice
            }
        };
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().map_err(io_error(format!(
            "starting {} {}",
            binary.display(),
            args.join(" ")
        )))?;
        Ok(ChildProcess {
            what: what.to_owned(),
            log,
            child,
        })
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub(crate) fn check_alive(&mut self) -> Result<(), BenchError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.exited(status.to_string())),
            Err(e) => Err(self.exited(e.to_string())),
        }
    }

    fn exited(&self, status: String) -> BenchError {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        BenchError::ChildExited {
            what: self.what.clone(),
            status,
            log: self.log.display().to_string(),
            tail: lines[lines.len().saturating_sub(20)..].join("\n"),
        }
    }

    pub(crate) fn memory(&self) -> Result<Memory, BenchError> {
        let pid = self.pid().ok_or_else(|| BenchError::Io {
            what: format!("reading the memory of the {}", self.what),
            source: std::io::Error::other("the process has exited"),
        })?;
        process_memory(pid)
    }

    pub(crate) async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

/// The controller as a child process, authenticated as its ServiceAccount.
pub(crate) struct Controller {
    pub(crate) process: ChildProcess,
    metrics: SocketAddr,
    http: reqwest::Client,
}

impl Controller {
    pub(crate) async fn start(
        config: &BenchConfig,
        ns: &BenchNamespace,
        log_name: &str,
    ) -> Result<(Controller, Instant), BenchError> {
        let metrics = free_port().map_err(io_error("finding a free port on 127.0.0.1"))?;
        let mimalloc = |name: &str| std::env::var_os(name).unwrap_or_else(|| "0".into());
        let (allow_thp, purge_delay) = (
            mimalloc("MIMALLOC_ALLOW_THP"),
            mimalloc("MIMALLOC_PURGE_DELAY"),
        );
        let addr = metrics.to_string();
        let process = ChildProcess::spawn(
            "controller",
            &config.agentrun_binary,
            &[
                "controller",
                "--namespace",
                &ns.name,
                "--metrics-addr",
                &addr,
                // Its signing keys and published JWKS live in the bench namespace too.
                "--controller-namespace",
                &ns.name,
                // As the chart runs it on Kubernetes >= 1.34.
                "--streaming-lists",
            ],
            &[
                ("KUBECONFIG", ns.controller_kubeconfig.as_os_str()),
                // As the chart runs it (no transparent huge pages for its heap, freed memory
                // given back at once), unless the bench's own environment says otherwise.
                ("MIMALLOC_ALLOW_THP", allow_thp.as_os_str()),
                ("MIMALLOC_PURGE_DELAY", purge_delay.as_os_str()),
            ],
            ns.dir.join(log_name),
            CpuPriority::Normal,
        )?;
        let started = Instant::now();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .no_proxy()
            .build()
            .map_err(|e| BenchError::Config(format!("an HTTP client for /metrics: {e}")))?;
        Ok((
            Controller {
                process,
                metrics,
                http,
            },
            started,
        ))
    }

    /// When each of the controller's caches synced, from its log's `cache synced` lines
    /// (milliseconds since its watches started), in the order they synced.
    pub(crate) fn cache_sync_times(&self) -> Vec<(String, u64)> {
        let text = std::fs::read_to_string(&self.process.log).unwrap_or_default();
        parse_cache_sync_times(&text)
    }

    pub(crate) async fn get(&self, path: &str) -> Option<(u16, String)> {
        let response = self
            .http
            .get(format!("http://{}{path}", self.metrics))
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }

    /// Waits until `/readyz` answers 200 (every cache synced).
    pub(crate) async fn wait_ready(&mut self, timeout: Duration) -> Result<(), BenchError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.process.check_alive()?;
            if let Some((200, _)) = self.get("/readyz").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(BenchError::Timeout {
                    what: "the controller's caches to sync (/readyz)".into(),
                    seconds: timeout.as_secs(),
                    progress: format!("see {}", self.process.log.display()),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The `cache="NAME" elapsed_ms=MS` pairs of the `cache synced` lines of a controller log.
pub(crate) fn parse_cache_sync_times(log: &str) -> Vec<(String, u64)> {
    let field = |line: &str, name: &str| -> Option<String> {
        let start = line.find(&format!("{name}="))? + name.len() + 1;
        let rest = &line[start..];
        let value = match rest.strip_prefix('"') {
            Some(quoted) => &quoted[..quoted.find('"')?],
            None => rest.split_whitespace().next()?,
        };
        Some(value.to_owned())
    };
    log.lines()
        .filter(|line| line.contains("cache synced"))
        .filter_map(|line| {
            let cache = field(line, "cache")?;
            let ms = field(line, "elapsed_ms")?.parse().ok()?;
            Some((cache, ms))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nice value of process `pid` (field 19 of `/proc/<pid>/stat`, after the name).
    fn nice_of(pid: u32) -> i64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(16).unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn a_child_at_the_lowest_priority_runs_niced_under_its_own_pid() {
        let dir = std::env::temp_dir().join(format!("agentrun-bench-nice-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spawn = |priority, log: &str| {
            ChildProcess::spawn(
                "sleeper",
                Path::new("sleep"),
                &["30"],
                &[],
                dir.join(log),
                priority,
            )
            .unwrap()
        };
        let (mut normal, mut lowest) = (
            spawn(CpuPriority::Normal, "normal.log"),
            spawn(CpuPriority::Lowest, "lowest.log"),
        );
        let ours = nice_of(std::process::id());
        let pid = lowest.pid().unwrap();
        // Until `nice` has executed `sleep`, the pid still names `nice`.
        for _ in 0..200 {
            if std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap() == "sleep\n" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap(),
            "sleep\n"
        );
        assert_eq!(nice_of(pid), 19);
        assert_eq!(nice_of(normal.pid().unwrap()), ours);
        normal.check_alive().unwrap();
        lowest.check_alive().unwrap();
        drop((normal, lowest));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn proc_status_and_metrics() {
        let status =
            "Name:\tagentrun\nVmPeak:\t  900000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\n";
        let memory = parse_proc_status(status).unwrap();
        assert_eq!(
            memory,
            Memory {
                rss_kib: 40960,
                peak_kib: 51200
            }
        );
        assert_eq!(memory.rss_mib(), 40.0);
        assert_eq!(memory.peak_mib(), 50.0);
        assert_eq!(parse_proc_status("Name:\tx\nVmRSS:\t1 kB\n"), None);
        let metrics = "# HELP agentrun_pending_approvals x\nagentrun_pending_approvals 9999\nagentrun_runs{phase=\"Running\"} 3\n";
        assert_eq!(
            metric_value(metrics, "agentrun_pending_approvals"),
            Some(9999.0)
        );
        assert_eq!(metric_value(metrics, "agentrun_runs"), None);
        assert_eq!(metric_value(metrics, "missing"), None);
    }

    #[test]
    fn cache_sync_times_from_the_log() {
        let log = "2026-12-04T12:00:00.1Z  INFO agentrun::controller::runtime: cache synced cache=\"agentruns\" elapsed_ms=812\n\
                   2026-12-04T12:00:00.2Z  INFO agentrun::controller::runtime: cache synced cache=\"admission policies\" elapsed_ms=40\n\
                   2026-12-04T12:00:00.3Z  INFO agentrun::controller::runtime: caches synced elapsed_ms=900\n\
                   {\"message\":\"unrelated\"}\n";
        assert_eq!(
            parse_cache_sync_times(log),
            [
                ("agentruns".to_owned(), 812),
                ("admission policies".to_owned(), 40)
            ]
        );
    }
}
