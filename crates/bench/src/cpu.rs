//! [`CpuClock`]: the CPU time each process on the approval path spends during a burst, from
//! `/proc` (Linux), to show where the machine's cores go.

use std::path::Path;
use std::time::Instant;

/// Clock ticks per second of `/proc/<pid>/stat` and `/proc/stat` (Linux's `USER_HZ`, 100 on
/// every architecture it exports to user space).
const TICKS_PER_SECOND: f64 = 100.0;

/// What the processes on the path spent over a window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuUse {
    /// Each process (by role) and its CPU seconds (user + system) in the window.
    pub processes: Vec<(String, f64)>,
    /// The window's wall-clock seconds.
    pub seconds: f64,
    /// The share of all the machine's cores that was busy in the window (0 to 1).
    pub machine_busy: f64,
}

impl CpuUse {
    /// `kube-apiserver 31.3, etcd 1.9, …; 21.1 s, machine 99% busy`.
    pub fn summary(&self) -> String {
        let processes: Vec<String> = self
            .processes
            .iter()
            .map(|(name, seconds)| format!("{name} {seconds:.1}"))
            .collect();
        format!(
            "{}; {:.1} s, machine {:.0}% busy",
            processes.join(", "),
            self.seconds,
            self.machine_busy * 100.0
        )
    }
}

/// A process to clock: its role, its pid, and whether the CPU of the children it reaped
/// counts (the dev kubelet's worker processes).
#[derive(Clone, Debug)]
pub(crate) struct Probe {
    pub(crate) role: String,
    pub(crate) pid: u32,
    pub(crate) with_children: bool,
}

/// CPU ticks of each probe and of the machine at the start of a window.
pub(crate) struct CpuClock {
    probes: Vec<Probe>,
    ticks: Vec<Option<u64>>,
    machine: Option<(u64, u64)>,
    started: Instant,
}

impl CpuClock {
    /// Starts a window now.
    pub(crate) fn start(probes: Vec<Probe>) -> CpuClock {
        CpuClock {
            ticks: probes.iter().map(process_ticks).collect(),
            machine: machine_ticks(),
            probes,
            started: Instant::now(),
        }
    }

    /// What each probe spent since the start; a process that exited in between is left out.
    pub(crate) fn finish(&self) -> CpuUse {
        let processes = self
            .probes
            .iter()
            .zip(&self.ticks)
            .filter_map(|(probe, before)| {
                let spent = process_ticks(probe)?.checked_sub((*before)?)?;
                Some((probe.role.clone(), spent as f64 / TICKS_PER_SECOND))
            })
            .collect();
        let machine_busy = match (self.machine, machine_ticks()) {
            (Some((busy0, all0)), Some((busy1, all1))) if all1 > all0 => {
                busy1.saturating_sub(busy0) as f64 / (all1 - all0) as f64
            }
            _ => 0.0,
        };
        CpuUse {
            processes,
            seconds: self.started.elapsed().as_secs_f64(),
            machine_busy,
        }
    }
}

/// The control plane's processes of `scripts/local-cluster`'s folder (its `pids` file: one
/// `name pid binary` per line), those running.
pub(crate) fn control_plane_probes(cluster_dir: &Path) -> Vec<Probe> {
    let text = std::fs::read_to_string(cluster_dir.join("pids")).unwrap_or_default();
    parse_pids(&text)
        .into_iter()
        .filter(|p| Path::new(&format!("/proc/{}", p.pid)).exists())
        .collect()
}

fn parse_pids(text: &str) -> Vec<Probe> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let role = words.next()?.to_owned();
            let pid = words.next()?.parse().ok()?;
            Some(Probe {
                role,
                pid,
                with_children: false,
            })
        })
        .collect()
}

fn process_ticks(probe: &Probe) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", probe.pid)).ok()?;
    parse_process_ticks(&stat, probe.with_children)
}

/// utime + stime (and cutime + cstime with `children`) of a `/proc/<pid>/stat` line.
fn parse_process_ticks(stat: &str, children: bool) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces; fields 14-17 follow.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let [utime, stime, cutime, cstime] = fields[..] else {
        return None;
    };
    Some(utime + stime + if children { cutime + cstime } else { 0 })
}

fn machine_ticks() -> Option<(u64, u64)> {
    parse_machine_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// (busy, all) ticks of all cores from `/proc/stat`'s first line; idle and iowait are not busy.
fn parse_machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let all: u64 = ticks.iter().sum();
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    Some((all - idle, all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_process_stat_line_with_spaces_in_the_name() {
        let line = "4058 (kube api) S 1 4058 4058 0 -1 4194560 1 0 0 0 1500 250 30 20 20 0 12";
        assert_eq!(parse_process_ticks(line, false), Some(1750));
        assert_eq!(parse_process_ticks(line, true), Some(1800));
        assert_eq!(parse_process_ticks("garbage", false), None);
    }

    #[test]
    fn reads_the_machine_line() {
        let stat = "cpu  100 5 50 800 20 0 25 0 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_machine_ticks(stat), Some((180, 1000)));
        assert_eq!(parse_machine_ticks("intr 1 2"), None);
    }

    #[test]
    fn reads_the_pids_file() {
        let probes =
            parse_pids("etcd 4057 /bin/etcd\nkube-apiserver 4058 /bin/kube-apiserver\nbad\n");
        let roles: Vec<(&str, u32)> = probes.iter().map(|p| (p.role.as_str(), p.pid)).collect();
        assert_eq!(roles, [("etcd", 4057), ("kube-apiserver", 4058)]);
    }

    #[test]
    fn clocks_this_process() {
        let clock = CpuClock::start(vec![Probe {
            role: "bench".into(),
            pid: std::process::id(),
            with_children: false,
        }]);
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed().as_millis() < 100 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let used = clock.finish();
        assert_eq!(used.processes.len(), 1);
        assert!(used.processes[0].1 > 0.0, "{used:?}");
        assert!(used.seconds >= 0.1);
        assert!(used.machine_busy > 0.0 && used.machine_busy <= 1.0);
        assert!(used.summary().starts_with("bench "));
    }
}
