//! RunState JSON speed, side by side with CPython's `json` module.
//!
//! `cargo bench --bench state_json` builds realistic RunStates of about 1 KiB, 100 KiB and 4 MiB
//! (conversations with text, some of it non-ASCII, assistant tool calls, tool results, deferred
//! calls with nested arguments), writes each payload to a temporary file, and times
//!
//! * ours: `RunState::to_json` (of the state `from_json` read from the payload) and
//!   `RunState::from_json`;
//! * CPython: `json.dumps(d)` and `json.loads(text)` of the same dict / text, in a `python3`
//!   process started for the payload, with `timeit`.
//!
//! Both sides use the same policy: one operation per sample, the same number of samples, and the
//! median is reported. The samples are taken in rounds that alternate between the two sides, so
//! that a change in the machine's load affects both alike. The ratio is CPython's time divided by
//! ours (higher is better for us).

/// The allocator of the `agentrun` binary (src/main.rs), so that the codec is timed as it runs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;
use std::io::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use agentrun::state::pyjson::{self, Value};
use agentrun::state::{Approval, DeferredToolCall, Rejection, RunState, Usage};

/// Deterministic pseudo-random numbers (so every run benchmarks the same payloads).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Everyday words: most of the text.
const WORDS: &[&str] = &[
    "the",
    "user",
    "account",
    "delete",
    "request",
    "policy",
    "approved",
    "cluster",
    "namespace",
    "deployment",
    "rollback",
    "incident",
    "ticket",
    "customer",
    "invoice",
    "refund",
    "please",
    "confirm",
    "and",
    "for",
    "with",
    "this",
    "that",
    "from",
    "status",
    "error",
    "service",
    "config",
    "version",
    "after",
];

/// Words that need escaping in `ensure_ascii` JSON: non-ASCII (2-, 3- and 4-byte UTF-8),
/// control characters, quotes and backslashes. About one word in eight.
const SPECIAL_WORDS: &[&str] = &[
    "résumé",
    "café",
    "naïve",
    "Zürich",
    "日本語",
    "中文",
    "données",
    "🙂",
    "🚀",
    "—",
    "“quoted”",
    "tab\there",
    "line\nbreak",
    "C:\\path",
    "\"json\"",
    "100%",
    "$42.50",
    "e-mail",
];

fn sentence(rng: &mut Lcg, words: usize) -> String {
    let mut s = String::new();
    for i in 0..words {
        if i > 0 {
            s.push(' ');
        }
        let pool = if rng.below(8) == 0 {
            SPECIAL_WORDS
        } else {
            WORDS
        };
        s.push_str(pool[rng.below(pool.len() as u64) as usize]);
    }
    s
}

fn args(rng: &mut Lcg, depth: u32) -> Value {
    let mut d = pyjson::Dict::default();
    d.insert("user_id", Value::from(format!("u-{}", rng.below(100_000))));
    d.insert("reason", Value::from(sentence(rng, 6)));
    d.insert("dry_run", Value::Bool(rng.below(2) == 0));
    d.insert("limit", Value::from(rng.below(1000) as i64));
    d.insert("threshold", Value::Float(rng.below(10_000) as f64 / 7.0));
    if depth < 2 {
        d.insert(
            "filters",
            Value::List(vec![args(rng, depth + 1), Value::Null]),
        );
    }
    Value::Dict(d)
}

/// A RunState whose JSON is at least `target` bytes.
fn build_state(target: usize) -> RunState {
    let mut rng = Lcg(target as u64);
    let mut state = RunState::new("run-bench-0001", "ops-agent", sentence(&mut rng, 12));
    state.messages.push(Value::from_iter([
        ("role", Value::from("system")),
        (
            "content",
            Value::from("You are a careful operations agent."),
        ),
    ]));
    let mut size = 0;
    let mut n = 0u64;
    while size < target {
        n += 1;
        let id = format!("call_{n:06}");
        // Keep single messages small when the whole state is small.
        let scale = (target / 1024).clamp(1, 8) as u64;
        let user_words = 3 + rng.below(8 * scale) as usize;
        state.messages.push(Value::from_iter([
            ("role", Value::from("user")),
            ("content", Value::from(sentence(&mut rng, user_words))),
        ]));
        let call_args = args(&mut rng, if target < 8 << 10 { 2 } else { 0 });
        let arguments = pyjson::dumps(&call_args).expect("finite args");
        state.messages.push(Value::from_iter([
            ("role", Value::from("assistant")),
            ("content", Value::Null),
            (
                "tool_calls",
                Value::List(vec![Value::from_iter([
                    ("id", Value::from(id.as_str())),
                    ("type", Value::from("function")),
                    (
                        "function",
                        Value::from_iter([
                            ("name", Value::from("delete_user")),
                            ("arguments", Value::from(arguments)),
                        ]),
                    ),
                ])]),
            ),
        ]));
        let tool_words = 5 + rng.below(20 * scale) as usize;
        state.messages.push(Value::from_iter([
            ("role", Value::from("tool")),
            ("tool_call_id", Value::from(id.as_str())),
            ("content", Value::from(sentence(&mut rng, tool_words))),
        ]));
        if n % 10 == 1 {
            state
                .deferred_tool_requests
                .approvals
                .push(DeferredToolCall {
                    tool_call_id: id.clone(),
                    tool_name: "delete_user".into(),
                    args: call_args,
                });
            let result = match n % 30 {
                1 => state.approve(&id, Approval::new().approver_id("alice@example.com")),
                11 => state.reject(&id, Rejection::new().message("no").reason("policy")),
                _ => Ok(()),
            };
            result.expect("fresh call is pending");
        }
        // Measuring the size is the expensive part; do it every few rounds once large.
        if n < 64 || n.is_multiple_of(64) {
            size = state.to_json().len();
        }
    }
    state.current_turn = n;
    state.usage = Usage {
        requests: n,
        input_tokens: n * 900,
        output_tokens: n * 120,
    };
    state
}

/// Samples per size: enough for about 1.5 s of our slower operation, between 5 and 2000.
fn samples_for(one: Duration) -> usize {
    let per = one.as_secs_f64().max(1e-7);
    ((1.5 / per) as usize).clamp(5, 2000)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// Times `samples` runs of `op`, one per sample.
fn time<T>(samples: usize, mut op: impl FnMut() -> T) -> Vec<Duration> {
    (0..samples)
        .map(|_| {
            let start = Instant::now();
            black_box(op());
            start.elapsed()
        })
        .collect()
}

/// The CPython side: one `python3` process per payload that, for each line `dumps N` or `loads N`
/// on its stdin, times N runs with `timeit` (one operation per sample, garbage collection off, as
/// `timeit` does) and prints the N times in nanoseconds on one line.
const PY_TIMER: &str = r#"
import json, sys, timeit
with open(sys.argv[1], encoding='utf-8') as f:
    text = f.read()
d = json.loads(text)
assert json.dumps(d) == text, 'payload is not canonical json.dumps output'
ops = {'dumps': lambda: json.dumps(d), 'loads': lambda: json.loads(text)}
for line in sys.stdin:
    op, n = line.split()
    times = timeit.repeat(ops[op], number=1, repeat=int(n))
    print(' '.join(str(int(t * 1e9)) for t in times), flush=True)
"#;

/// A running CPython timer (see [`PY_TIMER`]).
struct Python {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Python {
    fn start(path: &std::path::Path) -> Option<Python> {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(PY_TIMER)
            .arg(path)
            // CPython with its usual allocator, whatever this process was started with.
            .env_remove("LD_PRELOAD")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| eprintln!("python3 not started: {e}"))
            .ok()?;
        let stdin = child.stdin.take()?;
        let stdout = std::io::BufReader::new(child.stdout.take()?);
        Some(Python {
            child,
            stdin,
            stdout,
        })
    }

    /// `samples` times of `json.dumps` (`op` = "dumps") or `json.loads` ("loads").
    fn time(&mut self, op: &str, samples: usize) -> Option<Vec<Duration>> {
        use std::io::BufRead as _;
        writeln!(self.stdin, "{op} {samples}").ok()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line).ok()?;
        let times: Vec<Duration> = line
            .split_whitespace()
            .map(|t| t.parse().map(Duration::from_nanos))
            .collect::<Result<_, _>>()
            .ok()?;
        (times.len() == samples).then_some(times)
    }
}

impl Drop for Python {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Rounds per measurement: ours and CPython's samples alternate in this many rounds, so that a
/// change in the machine's load during the measurement affects both sides alike.
const ROUNDS: usize = 5;

fn human_size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.2} MiB", bytes as f64 / f64::from(1 << 20))
    } else if bytes >= 1 << 10 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

fn human_time(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is ignored. Payloads go to a temporary
    // directory, or to `$STATE_JSON_BENCH_DIR` (kept) when set.
    let temp = tempfile::tempdir().expect("temp dir");
    let dir = std::env::var_os("STATE_JSON_BENCH_DIR")
        .map_or_else(|| temp.path().to_path_buf(), std::path::PathBuf::from);
    println!(
        "{:<22} {:<22} {:>7} {:>12} {:>12} {:>8}",
        "size", "operation", "samples", "ours", "CPython", "ratio"
    );
    for (label, target) in [
        ("~1 KiB", 1 << 10),
        ("~100 KiB", 100 << 10),
        ("~4 MiB", 4 << 20),
    ] {
        let state = build_state(target);
        let text = state.to_json();
        assert_eq!(
            RunState::from_json(&text).as_ref(),
            Ok(&state),
            "benchmark payload must round-trip"
        );
        let path = dir.join(format!("state-{target}.json"));
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .expect("write payload");

        let warm = Instant::now();
        black_box(RunState::from_json(&text).expect("payload"));
        let samples = samples_for(warm.elapsed());

        // Like the CPython side, which dumps the dict `json.loads` just built, dump the state
        // `from_json` just built (the controller, too, only ever writes a state it loaded).
        let loaded = RunState::from_json(&text).expect("payload");
        drop(state);
        let mut python = Python::start(&path);
        let per_round = samples.div_ceil(ROUNDS);
        let (mut ours_dumps, mut ours_loads) = (Vec::new(), Vec::new());
        let (mut py_dumps, mut py_loads) = (Some(Vec::new()), Some(Vec::new()));
        for _ in 0..ROUNDS {
            ours_dumps.extend(time(per_round, || loaded.to_json()));
            ours_loads.extend(time(per_round, || {
                RunState::from_json(&text).expect("payload")
            }));
            for (op, times) in [("dumps", &mut py_dumps), ("loads", &mut py_loads)] {
                let more = python.as_mut().and_then(|p| p.time(op, per_round));
                match (times.as_mut(), more) {
                    (Some(times), Some(more)) => times.extend(more),
                    _ => *times = None,
                }
            }
        }
        drop(python);
        let samples = per_round * ROUNDS;
        let (ours_dumps, ours_loads) = (median(ours_dumps), median(ours_loads));
        let python = py_dumps.zip(py_loads).map(|(d, l)| (median(d), median(l)));
        let size = format!("{label} ({})", human_size(text.len()));
        for (op, ours, py) in [
            ("to_json / json.dumps", ours_dumps, python.map(|p| p.0)),
            ("from_json / json.loads", ours_loads, python.map(|p| p.1)),
        ] {
            let (py_text, ratio) = match py {
                Some(py) => (
                    human_time(py),
                    format!("{:.1}x", py.as_secs_f64() / ours.as_secs_f64().max(1e-12)),
                ),
                None => ("n/a".to_owned(), "n/a".to_owned()),
            };
            println!(
                "{:<22} {:<22} {:>7} {:>12} {:>12} {:>8}",
                size,
                op,
                samples,
                human_time(ours),
                py_text,
                ratio
            );
        }
    }
}
