//! Wire compatibility with CPython's `json` module, checked against vectors generated at test time
//! by running `python3`.
//!
//! * `dumps(loads(x))` must be byte-identical to Python's `json.dumps(json.loads(x))` for inputs
//!   covering non-ASCII, astral characters, control characters, DEL, many floats (fixed and random),
//!   big integers, nested dicts (insertion order) and duplicate keys.
//! * Every prefix of a set of documents must be accepted by both or rejected by both.
//! * Python's `json.loads` of our output must equal (strictly: types, float bits, key order) the
//!   value it loads from the input.
//! * Full RunState payloads written by Python (`json.dumps(to_dict())`, including older payloads with
//!   missing fields, unknown keys, other UTC offsets and naive timestamps) must come back
//!   byte-identical from `RunState::from_json(..).to_json()`, compared with a Python reference of
//!   `from_dict`/`to_dict`.

use std::io::Write;
use std::process::{Command, Stdio};

use agentrun::state::pyjson::{self, Value};
use agentrun::state::{Approval, Rejection, RunState};

/// Runs `python3 -c script` with `stdin` and returns its stdout; panics with stderr on failure.
fn python(script: &str, stdin: &str) -> String {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed to run the wire-compatibility vectors");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(stdin.as_bytes())
        .expect("write python stdin");
    let output = child.wait_with_output().expect("wait for python3");
    assert!(
        output.status.success(),
        "python3 failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("python3 output is UTF-8")
}

/// Stands for Python's `None` in [`hex_records`].
const NONE: &str = "\u{0}<none>";

/// Decodes `hex` lines of tab-separated fields (the framing between Python and these tests, so that
/// the exchange does not itself depend on the JSON code under test).
fn hex_records(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            line.split('\t')
                .map(|field| {
                    if field == "-" {
                        NONE.to_owned()
                    } else {
                        String::from_utf8(hex::decode(field).expect("hex")).expect("utf-8 field")
                    }
                })
                .collect()
        })
        .collect()
}

fn hex_line(fields: &[&str]) -> String {
    let mut line = fields
        .iter()
        .map(|f| hex::encode(f.as_bytes()))
        .collect::<Vec<_>>()
        .join("\t");
    line.push('\n');
    line
}

/// The seeds for Python's random vectors: a fixed one (reproducible) and one from the clock (more
/// coverage over time; printed on failure).
fn seeds() -> [u64; 2] {
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs());
    [20_261_202, clock]
}

const PY_PRELUDE: &str = r#"
import json, math, random, struct, sys
def h(s):
    return s.encode('utf-8').hex()
def emit(*fields):
    sys.stdout.write('\t'.join('-' if f is None else h(f) for f in fields) + '\n')
"#;

/// Python script printing `input \t json.dumps(json.loads(input))` for many inputs.
const PY_VECTORS: &str = r#"
seed = int(sys.argv[1]) if len(sys.argv) > 1 else int(sys.stdin.read())
rng = random.Random(seed)
cases = []
# Strings: every control character, DEL, quotes, backslash, non-ASCII, astral, random code points.
cases.append(json.dumps(''.join(chr(c) for c in range(0, 0x20)) + '\x7f"\\/'))
cases.append(json.dumps('caf\u00e9 \u20ac \u4e2d\u6587 \U0001F600 \U0001F9D1\u200d\U0001F4BB \U0010FFFF \u0080\u00ff\u0100\uffff'))
cases.append('"\\u00e9\\/\\ud83d\\ude00\\n\\t\\"\\\\ raw \u00e9\U0001F600"')
cases.append('{"\u00e9\U0001F600": "\\u0000", "k\\u0001": ["\\u001f", "\\u007f"]}')
def rand_char():
    while True:
        c = rng.choice([rng.randrange(0, 0x80), rng.randrange(0x80, 0x800), rng.randrange(0x800, 0x10000), rng.randrange(0x10000, 0x110000)])
        if not (0xD800 <= c <= 0xDFFF):
            return chr(c)
for _ in range(200):
    s = ''.join(rand_char() for _ in range(rng.randrange(0, 30)))
    cases.append(json.dumps(s, ensure_ascii=rng.random() < 0.5))
# Floats: fixed edge cases and random ones (bit patterns, uniform, decimal literals).
fixed = [0.1, 0.2, 0.3, 1e16, 1e15, 1e-5, 1e-4, 0.0001, 0.00001, 123456789.123, -0.0, 0.0, 5e-324,
         1.7976931348623157e308, 2.2250738585072014e-308, 1.5e16, 9007199254740993.0, 1e22, 1e23,
         100.0, 1.0, -1.5, 3.141592653589793, 2.718281828459045, 1e-7, 1.5e-7, 123e45, 0.5, 4.35,
         9999999999999998.0, 1e+300, 1.2345678901234567e-300, 33.3333, 1/3, 2/3]
cases.append(json.dumps(fixed))
for _ in range(2000):
    bits = rng.getrandbits(64)
    f = struct.unpack('<d', struct.pack('<Q', bits))[0]
    if math.isfinite(f):
        cases.append(json.dumps(f))
for _ in range(300):
    cases.append(json.dumps(rng.uniform(-1e6, 1e6)))
    cases.append(json.dumps(rng.random() * 10 ** rng.randrange(-30, 30)))
for _ in range(300):
    digits = ''.join(rng.choice('0123456789') for _ in range(rng.randrange(1, 40)))
    lit = str(rng.randrange(0, 10)) + '.' + digits + rng.choice(['', 'e%d' % rng.randrange(-320, 300), 'E+%d' % rng.randrange(0, 300)])
    if rng.random() < 0.3:
        lit = '-' + lit
    if math.isfinite(json.loads(lit)):
        cases.append(lit)
for lit in ['-0', '-0.0', '0e0', '1E+2', '1e-400', '2.5e-324', '2.4703282292062328e-324', '1e308', '0.000001', '0.0000001', '10E-1', '1.0000000000000000000000000001']:
    cases.append(lit)
# Integers, including big ones.
for v in [0, -1, 2**63 - 1, -2**63, 2**63, 2**64, 2**70, -2**100, 10**4299, -(10**4299)]:
    cases.append(json.dumps(v))
for _ in range(200):
    cases.append(json.dumps(rng.randrange(-2**200, 2**200) >> rng.randrange(0, 200)))
# Nested values in insertion order, duplicate keys, odd whitespace.
cases.append('{"z": 1, "a": {"y": [1, {"b": null, "a": true}], "x": false}, "m": []}')
cases.append('{"a": 1, "b": 2, "a": 3}')
cases.append('{"a": {"x": 1}, "b": 2, "a": {"y": 2}, "c": [], "b": [3]}')
cases.append(' \t\n\r{ "a" :1 ,"b":[ 1 , 2.50 ,{ } , [ ] ] } \n')
cases.append('[[[[[[[[[[[[[[[[[[[[{"deep": [1, 2, {"deeper": "\u00e9"}]}]]]]]]]]]]]]]]]]]]]]')
cases.append('[' * 900 + ']' * 900)
def rand_value(depth):
    kind = rng.randrange(0, 8 if depth < 4 else 5)
    if kind == 0: return None
    if kind == 1: return rng.random() < 0.5
    if kind == 2: return rng.randrange(-10**30, 10**30) if rng.random() < 0.2 else rng.randrange(-1000, 1000)
    if kind == 3:
        f = struct.unpack('<d', struct.pack('<Q', rng.getrandbits(64)))[0]
        return f if math.isfinite(f) else 0.5
    if kind == 4: return ''.join(rand_char() for _ in range(rng.randrange(0, 8)))
    if kind in (5, 6):
        return {''.join(rand_char() for _ in range(rng.randrange(0, 6))): rand_value(depth + 1) for _ in range(rng.randrange(0, 6))}
    return [rand_value(depth + 1) for _ in range(rng.randrange(0, 6))]
for _ in range(200):
    cases.append(json.dumps(rand_value(0), ensure_ascii=rng.random() < 0.5))
for c in cases:
    emit(c, json.dumps(json.loads(c)))
"#;

#[test]
fn dumps_of_loads_is_byte_identical_to_python() {
    for seed in seeds() {
        let script = format!("{PY_PRELUDE}{PY_VECTORS}");
        let out = python(&script, &seed.to_string());
        let records = hex_records(&out);
        assert!(records.len() > 3000, "only {} vectors", records.len());
        let mut ours_all = String::new();
        for record in &records {
            let (input, expected) = (&record[0], &record[1]);
            let value = pyjson::loads(input)
                .unwrap_or_else(|e| panic!("seed {seed}: loads({input:?}) failed: {e}"));
            let ours = pyjson::dumps(&value)
                .unwrap_or_else(|e| panic!("seed {seed}: dumps failed for {input:?}: {e}"));
            assert_eq!(&ours, expected, "seed {seed}: input {input:?}");
            ours_all.push_str(&hex_line(&[input, &ours]));
        }
        // Python reads our output back to exactly the value it reads from the input.
        let check = python(
            &format!(
                "{PY_PRELUDE}{}",
                r#"
sys.setrecursionlimit(100000)
def same(a, b):
    if type(a) is not type(b): return False
    if isinstance(a, float): return a.hex() == b.hex()
    if isinstance(a, list): return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict): return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b
bad = 0
for line in sys.stdin.read().splitlines():
    inp, ours = (bytes.fromhex(f).decode('utf-8') for f in line.split('\t'))
    if not same(json.loads(inp), json.loads(ours)):
        bad += 1
        print('MISMATCH', repr(inp)[:200], repr(ours)[:200])
print('bad', bad)
"#
            ),
            &ours_all,
        );
        assert!(check.trim_end().ends_with("bad 0"), "seed {seed}:\n{check}");
    }
}

#[test]
fn prefixes_are_accepted_or_rejected_like_python() {
    let docs = [
        r#"{"a": [1, -2.5e-3, true, false, null, "x\u00e9\ud83d\ude00\n"], "b": {"c": 12345678901234567890123}}"#,
        "[0, -0, 10, 1.5, 1e5, 2E-3, -1.0e+2, \"\\\"\\\\\\/\\b\\f\\n\\r\\t\"]",
        "  {\"k\" : \"caf\u{e9} \u{1F600}\" , \"n\":[ ] , \"o\":{ }}  ",
    ];
    let mut input = String::new();
    for doc in docs {
        for (i, _) in doc.char_indices().chain([(doc.len(), ' ')]) {
            input.push_str(&hex_line(&[&doc[..i]]));
        }
    }
    // Also some invalid documents that are not prefixes.
    for bad in [
        "  ",
        "\n\n  x",
        "[1,\n 2,\n ]",
        "{\"a\": 1,}",
        "{\"a\"}",
        "{\"a\": }",
        "{,}",
        "[,]",
        "\"abc",
        "\"a\\",
        "\"\\u00\"",
        "\"\\u00zz\"",
        "\"\\ud83d\\uzzzz\"",
        "\"\\q\"",
        "\"tab\there\"",
        "[\"\u{e9}\u{1F600}\", 1 2]",
        "{\"\u{e9}\": 1 \"b\": 2}",
        "-",
        "-a",
        "1.e5",
        "1e",
        "1E+",
        "01.5",
        "-01",
        "[1.5.2]",
        "truefalse",
        "nan",
        "{\"a\" \n : 1 ,}",
        // Refused constructs followed by a real error: CPython's error wins, as in CPython.
        "[NaN x]",
        "[-Infinity,]",
        "[\"\\ud800\" 1]",
        "[1e400 1]",
        "{\"\\udc00\": 1,}",
        "[1,]",
        "{\"a\":1,}",
        "[01]",
        "[1.]",
        "[.5]",
        "[+1]",
        "{'a': 1}",
        "[1 2]",
        "{\"a\" 1}",
        "{1: 2}",
        "\"\\x41\"",
        "\"\\u12\"",
        "[\"a\tb\"]",
        "nulll",
        "[true false]",
        "[1] [2]",
        "\u{feff}[]",
        "[-]",
        "[--1]",
        "[1e]",
        "[1e+]",
        "[0x10]",
        "[Inf]",
        "[nan]",
    ] {
        input.push_str(&hex_line(&[bad]));
    }
    let out = python(
        &format!(
            "{PY_PRELUDE}{}",
            r#"
for line in sys.stdin.read().splitlines():
    text = bytes.fromhex(line).decode('utf-8')
    try:
        emit(text, json.dumps(json.loads(text)), None)
    except json.JSONDecodeError as e:
        emit(text, None, '%d:%d:%s' % (e.lineno, e.colno, e.msg))
    except (ValueError, RecursionError) as e:
        emit(text, None, None)
"#
        ),
        &input,
    );
    let records = hex_records(&out);
    assert!(records.len() > 100);
    for record in &records {
        let (text, expected, python_error) = (&record[0], &record[1], &record[2]);
        let ours = pyjson::loads(text).map(|v| pyjson::dumps(&v).expect("dumps"));
        if expected == NONE {
            // Same message at the same line and column as CPython's JSONDecodeError.
            match ours {
                Err(pyjson::JsonError::Syntax {
                    line,
                    column,
                    message,
                }) => {
                    if python_error != NONE {
                        assert_eq!(
                            &format!("{line}:{column}:{message}"),
                            python_error,
                            "input {text:?}"
                        );
                    }
                }
                other => panic!("Python rejects {text:?}, we returned {other:?}"),
            }
        } else {
            match ours {
                Ok(ours) => assert_eq!(&ours, expected, "input {text:?}"),
                Err(e) => panic!("Python accepts {text:?}, we reject it: {e}"),
            }
        }
    }
}

#[test]
fn python_accepts_what_we_reject_only_where_documented() {
    // These are valid for CPython's json.loads but deliberately refused here.
    for text in [
        "NaN",
        "Infinity",
        "-Infinity",
        "[1e400]",
        "-1e999",
        "\"\\ud800\"",
        "\"\\udfff\"",
        "\"\\ud800x\"",
        "\"\\ud800\\u0041\"",
    ] {
        let python_ok = python(
            &format!("{PY_PRELUDE}\njson.loads(sys.stdin.read())\nprint('ok')"),
            text,
        );
        assert_eq!(python_ok.trim(), "ok");
        let err = pyjson::loads(text).expect_err(text).to_string();
        assert!(err.starts_with("invalid JSON at line 1 column "), "{err}");
    }
}

/// A Python reference of RunState `from_dict` / `to_dict` (the documented tolerance rules) plus
/// payload generators: prints `payload \t json.dumps(to_dict(from_dict(json.loads(payload))))`.
const PY_STATES: &str = r#"
from datetime import datetime, timezone, timedelta
seed = int(sys.stdin.read())
rng = random.Random(seed)

def ts_out(s):
    d = datetime.fromisoformat(s.replace('Z', '+00:00'))
    d = d.replace(tzinfo=timezone.utc) if d.tzinfo is None else d.astimezone(timezone.utc)
    return d.isoformat()

def canonical(d):
    g = lambda m, k, default: default if m.get(k) is None else m.get(k)
    dtr = g(d, 'deferred_tool_requests', {})
    usage = g(d, 'usage', {})
    return {
        'run_id': g(d, 'run_id', ''),
        'agent_name': g(d, 'agent_name', ''),
        'input': g(d, 'input', ''),
        'messages': g(d, 'messages', []),
        'deferred_tool_requests': {
            'calls': g(dtr, 'calls', []),
            'approvals': [{'tool_call_id': a['tool_call_id'], 'tool_name': a['tool_name'],
                           'args': a.get('args', {})} for a in g(dtr, 'approvals', [])],
        },
        'approved_tools': g(d, 'approved_tools', []),
        'rejected_tools': [{'tool_call_id': r['tool_call_id'], 'message': r.get('message')}
                           for r in g(d, 'rejected_tools', [])],
        'approval_metadata': {k: {'approver_id': m.get('approver_id'), 'reason': m.get('reason'),
                                  'timestamp': ts_out(m['timestamp'])}
                              for k, m in g(d, 'approval_metadata', {}).items()},
        'current_turn': g(d, 'current_turn', 0),
        'usage': {'requests': g(usage, 'requests', 0), 'input_tokens': g(usage, 'input_tokens', 0),
                  'output_tokens': g(usage, 'output_tokens', 0)},
        'final_output': d.get('final_output'),
    }

def rand_text(n):
    pool = 'abc xyz \u00e9\u00fc\u4e2d\U0001F600\n\t"\\\x00\x1f\x7f'
    return ''.join(rng.choice(pool) for _ in range(rng.randrange(0, n)))

def rand_ts():
    base = datetime(2026, 12, 2, 19, 30, 25, tzinfo=timezone.utc) + timedelta(seconds=rng.randrange(-10**8, 10**8))
    micro = rng.choice([0, 123456, rng.randrange(0, 10**6)])
    base = base.replace(microsecond=micro)
    form = rng.randrange(0, 5)
    if form == 0: return base.isoformat()
    if form == 1: return base.astimezone(timezone(timedelta(hours=rng.randrange(-12, 14), minutes=rng.choice([0, 30])))).isoformat()
    if form == 2: return base.replace(tzinfo=None).isoformat()          # naive, older payloads
    if form == 3: return base.isoformat().replace('+00:00', 'Z')
    return base.replace(tzinfo=None).isoformat(sep=' ')

def rand_args(depth=0):
    d = {}
    for _ in range(rng.randrange(0, 5)):
        k = rand_text(6)
        r = rng.randrange(0, 7 if depth < 3 else 5)
        d[k] = [lambda: None, lambda: True, lambda: rng.randrange(-2**70, 2**70),
                lambda: rng.random() * 1e20, lambda: rand_text(10), lambda: rand_args(depth + 1),
                lambda: [rand_args(depth + 1), 1.5]][r]()
    return d

def rand_state(full):
    ids = ['call_%d' % i for i in range(rng.randrange(0, 6))]
    approvals = [{'tool_call_id': i, 'tool_name': rng.choice(['delete_user', 'send_email', 'sql']),
                  'args': rand_args()} for i in ids]
    decided = rng.sample(ids, rng.randrange(0, len(ids) + 1))
    approved = decided[: len(decided) // 2]
    rejected = [{'tool_call_id': i, 'message': rng.choice([None, rand_text(20)])} for i in decided[len(decided) // 2:]]
    meta = {i: {'approver_id': rng.choice([None, 'alice@example.com', rand_text(8)]),
                'reason': rng.choice([None, 'CR-1234', rand_text(30)]), 'timestamp': rand_ts()}
            for i in decided if rng.random() < 0.7}
    messages = [{'role': 'user', 'content': rand_text(40)}]
    for i in ids:
        messages.append({'role': 'assistant', 'content': None, 'tool_calls': [
            {'id': i, 'type': 'function', 'function': {'name': 'x', 'arguments': json.dumps(rand_args())}}]})
        messages.append({'role': 'tool', 'tool_call_id': i, 'content': rand_text(30), 'extra_unmodelled': [1, 2.5, None]})
    d = {
        'run_id': 'run-' + rand_text(5), 'agent_name': rand_text(10), 'input': rand_text(50),
        'messages': messages,
        'deferred_tool_requests': {'calls': [{'tool_call_id': 'ext', 'tool_name': 'slow', 'args': rand_args()}], 'approvals': approvals},
        'approved_tools': approved, 'rejected_tools': rejected, 'approval_metadata': meta,
        'current_turn': rng.randrange(0, 50),
        'usage': {'requests': rng.randrange(0, 100), 'input_tokens': rng.randrange(0, 10**6), 'output_tokens': rng.randrange(0, 10**5)},
        'final_output': rng.choice([None, rand_text(40)]),
    }
    if not full:
        # An older or foreign payload: fields missing, nulls for non-nullable fields, unknown keys.
        for k in rng.sample(list(d), rng.randrange(1, 5)):
            del d[k]
        for k in rng.sample(list(d), min(len(d), rng.randrange(0, 2))):
            if k not in ('messages',):
                d[k] = None
        d['version'] = 3
        d['legacy_field'] = {'anything': [1, 2]}
        if 'usage' in d and d['usage'] is not None:
            d['usage']['total_tokens'] = 5
    return d

for n in range(150):
    d = rand_state(full=n % 3 != 0)
    payload = json.dumps(d)
    emit(payload, json.dumps(canonical(json.loads(payload))))
"#;

#[test]
fn runstate_payloads_round_trip_byte_identical_to_python() {
    for seed in seeds() {
        let out = python(&format!("{PY_PRELUDE}{PY_STATES}"), &seed.to_string());
        let records = hex_records(&out);
        assert_eq!(records.len(), 150);
        let mut ours_all = String::new();
        for record in &records {
            let (payload, expected) = (&record[0], &record[1]);
            let state = RunState::from_json(payload)
                .unwrap_or_else(|e| panic!("seed {seed}: from_json failed: {e}\n{payload}"));
            let ours = state.to_json();
            assert_eq!(&ours, expected, "seed {seed}: payload {payload}");
            assert_eq!(state.try_to_json().as_ref(), Ok(&ours));
            assert_eq!(
                pyjson::dumps(&Value::Dict(state.to_dict())).as_ref(),
                Ok(&ours),
                "to_json == dumps(to_dict())"
            );
            // Canonical payloads are fixed points.
            assert_eq!(
                RunState::from_json(&ours).map(|s| s.to_json()),
                Ok(ours.clone())
            );
            ours_all.push_str(&hex_line(&[expected, &ours]));
        }
        let check = python(
            &format!(
                "{PY_PRELUDE}{}",
                r#"
bad = 0
for line in sys.stdin.read().splitlines():
    exp, ours = (bytes.fromhex(f).decode('utf-8') for f in line.split('\t'))
    a, b = json.loads(exp), json.loads(ours)
    if a != b or json.dumps(a) != json.dumps(b) or 'version' in b:
        bad += 1
print('bad', bad)
"#
            ),
            &ours_all,
        );
        assert_eq!(check.trim(), "bad 0", "seed {seed}");
    }
}

#[test]
fn decisions_serialize_like_python() {
    // Python reference of approve()/reject() with audit metadata, at a fixed time.
    let out = python(
        &format!(
            "{PY_PRELUDE}{}",
            r#"
from datetime import datetime, timezone
ts = datetime(2026, 12, 2, 19, 30, 25, 123456, tzinfo=timezone.utc).isoformat()
ts0 = datetime(2026, 12, 2, 19, 30, 25, tzinfo=timezone.utc).isoformat()
base = {'run_id': 'r-1', 'agent_name': 'ops', 'input': 'Delete user u-1 \u00e9',
        'messages': [{'role': 'user', 'content': 'Delete user u-1 \u00e9'}],
        'deferred_tool_requests': {'calls': [], 'approvals': [
            {'tool_call_id': 'call_1', 'tool_name': 'delete_user', 'args': {'user_id': 'u-1', 'hard': True}},
            {'tool_call_id': 'call_2', 'tool_name': 'send_email', 'args': {'to': ['a@b.c'], 'n': 2**70}},
            {'tool_call_id': 'call_3', 'tool_name': 'sql', 'args': {'q': 'DROP TABLE x'}}]},
        'approved_tools': [], 'rejected_tools': [], 'approval_metadata': {}, 'current_turn': 1,
        'usage': {'requests': 1, 'input_tokens': 10, 'output_tokens': 5}, 'final_output': None}
emit(json.dumps(base))
after = json.loads(json.dumps(base))
after['approved_tools'].append('call_1')
after['approval_metadata']['call_1'] = {'approver_id': 'alice@example.com', 'reason': 'authorized per change CR-1234', 'timestamp': ts}
after['rejected_tools'].append({'tool_call_id': 'call_2', 'message': 'Not authorized for this resource'})
after['approval_metadata']['call_2'] = {'approver_id': 'bob@example.com', 'reason': 'policy violation: tier-0 write', 'timestamp': ts0}
after['rejected_tools'].append({'tool_call_id': 'call_3', 'message': None})
emit(json.dumps(after))
"#
        ),
        "",
    );
    let records = hex_records(&out);
    let mut state = RunState::from_json(&records[0][0]).expect("base payload");
    let ts = chrono::DateTime::parse_from_rfc3339("2026-12-02T19:30:25.123456789Z")
        .expect("ts")
        .to_utc();
    let ts0 = chrono::DateTime::parse_from_rfc3339("2026-12-02T21:30:25+02:00")
        .expect("ts0")
        .to_utc();
    state
        .approve(
            "call_1",
            Approval::new()
                .approver_id("alice@example.com")
                .reason("authorized per change CR-1234")
                .at(ts),
        )
        .expect("approve");
    state
        .reject(
            "call_2",
            Rejection::new()
                .message("Not authorized for this resource")
                .approver_id("bob@example.com")
                .reason("policy violation: tier-0 write")
                .at(ts0),
        )
        .expect("reject");
    // No approver_id and no reason: no metadata entry.
    state.reject("call_3", Rejection::new()).expect("reject");
    assert_eq!(state.to_json(), records[1][0]);
}

/// The reader's fast paths (short and `\uXXXX` escapes decoded inline, surrogate pairs, dict entries
/// completed in place, containers closing together) against CPython: every prefix of documents
/// that use them is accepted or rejected like `json.loads` does (same message, line and column),
/// and accepted ones are written back byte-identically.
#[test]
fn fast_paths_match_python_at_every_prefix() {
    let docs = [
        r#"{"k\u00e9y": {"a": {"b": [1, {"c": "\u65e5\u672c\ud83d\ude80\"q\" \\ \/ \u00C9\u00c9x"}]}, "a": 2}, "k\u00e9y": null, "z": [[], {}, [[{"d": {}}]]]}"#,
        r#"["\ud83d\ude00\ud83d\ude80", "\u0041\b\f\n\r\t\u001f\u007f", "\ud800\udc00\udbff\udfff", "x\\"]"#,
        r#"{"a": 1, "b": {"a": [2, 3], "a": {"x": "\u20ac"}}, "a": -0.0, "f": [1e-400, 5e-324, 1.5, 123456789012345678901234567890]}"#,
    ];
    let mut input = String::new();
    for doc in docs {
        for i in 0..=doc.len() {
            input.push_str(&hex_line(&[&doc[..i]]));
        }
    }
    let out = python(
        &format!(
            "{PY_PRELUDE}{}",
            r#"
for line in sys.stdin.read().splitlines():
    text = bytes.fromhex(line).decode('utf-8')
    try:
        emit(text, json.dumps(json.loads(text)), None)
    except json.JSONDecodeError as e:
        emit(text, None, '%d:%d:%s' % (e.lineno, e.colno, e.msg))
"#
        ),
        &input,
    );
    let records = hex_records(&out);
    assert!(records.len() > 300, "only {} records", records.len());
    for record in &records {
        let (text, expected, python_error) = (&record[0], &record[1], &record[2]);
        let ours = pyjson::loads(text).map(|v| pyjson::dumps(&v).expect("dumps"));
        match ours {
            Ok(ours) => assert_eq!(&ours, expected, "input {text:?}"),
            Err(pyjson::JsonError::Syntax {
                line,
                column,
                message,
            }) => assert_eq!(
                &format!("{line}:{column}:{message}"),
                python_error,
                "input {text:?}"
            ),
            Err(e) => panic!("{text:?}: {e}"),
        }
    }
}
