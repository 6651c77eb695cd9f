//! A real OpenTelemetry Collector on 127.0.0.1 for trace tests: the binary
//! `scripts/build-otel-collector` builds from the Go module proxy (run here when needed), with an
//! OTLP/HTTP receiver and the file exporter writing what it receives as OTLP JSON lines, which
//! [`Collector::spans`] reads back. It stops when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::repo_root;

/// One exported span, flattened from the OTLP JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportedSpan {
    /// `service.name` of the resource that sent it.
    pub service: String,
    /// The trace id (hex).
    pub trace_id: String,
    /// The span id (hex).
    pub span_id: String,
    /// The parent span id (hex; empty for a root).
    pub parent_span_id: String,
    /// The span's name.
    pub name: String,
    /// Its attributes, values as JSON (strings, numbers, booleans).
    pub attributes: serde_json::Map<String, serde_json::Value>,
    /// Start and end, nanoseconds since the epoch.
    pub start_end: (u64, u64),
}

impl ExportedSpan {
    /// The attribute `key` as a string (numbers and booleans as written).
    pub fn attr(&self, key: &str) -> Option<String> {
        self.attributes.get(key).map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

/// A running collector.
pub struct Collector {
    child: Child,
    port: u16,
    dir: PathBuf,
}

/// The collector binary (built by `scripts/build-otel-collector` when missing).
pub fn collector_binary() -> PathBuf {
    let output = Command::new(repo_root().join("scripts/build-otel-collector"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/build-otel-collector");
    assert!(
        output.status.success(),
        "scripts/build-otel-collector failed ({})",
        output.status
    );
    let path = String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_owned();
    PathBuf::from(path)
}

impl Collector {
    /// Starts a collector on a free port of 127.0.0.1.
    pub fn start() -> Collector {
        let binary = collector_binary();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!(
            "agentrun-otelcol-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("the collector's folder");
        let config = format!(
            r#"receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{port}
exporters:
  file:
    path: {traces}
    flush_interval: 200ms
service:
  telemetry:
    logs:
      level: warn
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
"#,
            traces = dir.join("traces.jsonl").display()
        );
        let config_path = dir.join("config.yaml");
        std::fs::write(&config_path, config).expect("write the collector config");
        let log = dir.join("collector.log");
        let mut child = Command::new(binary)
            .arg("--config")
            .arg(format!("file:{}", config_path.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("collector log"))
            .spawn()
            .expect("start the collector");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "the collector exited ({status}):\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the collector did not listen within 30 s:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Collector { child, port, dir }
    }

    /// The OTLP/HTTP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span the collector has written so far.
    pub fn spans(&self) -> Vec<ExportedSpan> {
        let text = std::fs::read_to_string(self.dir.join("traces.jsonl")).unwrap_or_default();
        let mut spans = vec![];
        for line in text.lines() {
            let Ok(export) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            for resource in export["resourceSpans"].as_array().into_iter().flatten() {
                let service = attributes(&resource["resource"]["attributes"])
                    .get("service.name")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_owned();
                for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                    for span in scope["spans"].as_array().into_iter().flatten() {
                        let nanos = |key: &str| {
                            span[key]
                                .as_str()
                                .and_then(|t| t.parse().ok())
                                .unwrap_or_default()
                        };
                        spans.push(ExportedSpan {
                            service: service.clone(),
                            trace_id: span["traceId"].as_str().unwrap_or_default().into(),
                            span_id: span["spanId"].as_str().unwrap_or_default().into(),
                            parent_span_id: span["parentSpanId"]
                                .as_str()
                                .unwrap_or_default()
                                .into(),
                            name: span["name"].as_str().unwrap_or_default().into(),
                            attributes: attributes(&span["attributes"]),
                            start_end: (nanos("startTimeUnixNano"), nanos("endTimeUnixNano")),
                        });
                    }
                }
            }
        }
        spans
    }
}

/// OTLP JSON attributes (`[{key, value: {stringValue|intValue|doubleValue|boolValue}}]`) as a map.
fn attributes(list: &serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    let mut map = serde_json::Map::new();
    for attribute in list.as_array().into_iter().flatten() {
        let key = attribute["key"].as_str().unwrap_or_default().to_owned();
        let value = &attribute["value"];
        let value = if let Some(s) = value.get("stringValue") {
            s.clone()
        } else if let Some(i) = value.get("intValue") {
            // OTLP JSON writes 64-bit integers as strings.
            i.as_str()
                .and_then(|t| t.parse::<i64>().ok())
                .map_or(i.clone(), serde_json::Value::from)
        } else if let Some(d) = value.get("doubleValue") {
            d.clone()
        } else if let Some(b) = value.get("boolValue") {
            b.clone()
        } else {
            value.clone()
        };
        map.insert(key, value);
    }
    map
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
