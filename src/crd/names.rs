//! Deterministic names of the objects the controller creates for a run, so that a retried
//! reconcile or a second controller finds the object it would create instead of making another.
//!
//! Every name is `<base><suffix>` where the base comes from the run (and the tool call id) and the
//! suffix says what the object is:
//!
//! - worker Pods: `<run>-step-<n>`, `<run>-step-<n>-r<k>` for retries ([`worker_pod_name`]), at
//!   most 63 characters because the name is also a label value;
//! - the worker ServiceAccount, Role and RoleBinding: `<run>-worker` ([`worker_account_name`]);
//! - ApprovalRequests: `<run>-<tool call id>` ([`approval_request_name`]), a valid object name
//!   however the model spells its ids;
//! - offloaded state chunks: `<run>-state-<digest prefix>-<i>` ([`chunk_name`]);
//! - the `agentrun.dev/run` label value ([`run_label_value`]).
//!
//! One scheme shortens and repairs them all: when the base had to be changed to be valid (case,
//! characters) or the name would be too long, the base is cut to fit and a short hash of the exact
//! inputs is inserted before the suffix (`<base prefix>-<hash><suffix>`), so inputs that differ
//! only in what was changed or cut (`call_TX_9` and `call_tx_9`, two long run names sharing their
//! first 246 characters) still get different names.

use sha2::{Digest, Sha256};

/// The longest object name (DNS-1123 subdomain).
pub const MAX_NAME_LENGTH: usize = 253;
/// The longest label value, and so the longest worker Pod name.
pub const MAX_LABEL_VALUE_LENGTH: usize = 63;
/// Hex digits of the hash inserted into names that had to be changed or shortened.
const HASH_LENGTH: usize = 10;

/// The name of the worker Pod of `run` at `step`, attempt `attempt` (0 for the first try):
/// `<run>-step-<step>`, then `-r<attempt>` for retries. At most [`MAX_LABEL_VALUE_LENGTH`]
/// characters.
pub fn worker_pod_name(run: &str, step: u32, attempt: u32) -> String {
    let suffix = match attempt {
        0 => format!("-step-{step}"),
        _ => format!("-step-{step}-r{attempt}"),
    };
    run_scoped(run, &suffix, MAX_LABEL_VALUE_LENGTH)
}

/// The name of a run's worker ServiceAccount, Role and RoleBinding: `<run>-worker`.
pub fn worker_account_name(run: &str) -> String {
    run_scoped(run, "-worker", MAX_NAME_LENGTH)
}

/// The name of the RunStateChunk holding chunk `index` of an offloaded state with this digest:
/// `<run>-state-<first 12 digits of the digest>-<index>`.
pub fn chunk_name(run: &str, digest: &str, index: usize) -> String {
    run_scoped(
        run,
        &format!("{}{index}", chunk_infix(digest)),
        MAX_NAME_LENGTH,
    )
}

/// The part of [`chunk_name`] between the run and the index: `-state-<digest prefix>-`.
fn chunk_infix(digest: &str) -> String {
    format!("-state-{}-", &digest[..digest.len().min(12)])
}

/// Whether `name` is a chunk of the state with this digest (any index).
pub fn is_chunk_of(name: &str, digest: &str) -> bool {
    name.contains(&chunk_infix(digest))
}

/// The value of the [`labels::RUN`](super::keys::labels::RUN) label for a run: the run's name
/// when it fits a label value.
pub fn run_label_value(run: &str) -> String {
    run_scoped(run, "", MAX_LABEL_VALUE_LENGTH)
}

/// `<run><suffix>` at most `max` characters, by the module's scheme.
fn run_scoped(run: &str, suffix: &str, max: usize) -> String {
    let valid = is_dns1123_subdomain(run);
    let base = if valid { run.to_owned() } else { sanitize(run) };
    fitted(&base, suffix, max, !valid, &[run])
}

/// `<base><suffix>` when the base was not `changed` and it fits in `max`; otherwise the base cut
/// to fit with a hash of `inputs` inserted: `<base prefix>-<hash><suffix>`.
fn fitted(base: &str, suffix: &str, max: usize, changed: bool, inputs: &[&str]) -> String {
    if !changed && !base.is_empty() && base.len() + suffix.len() <= max {
        return format!("{base}{suffix}");
    }
    with_hash(base, &short_hash(inputs), suffix, max)
}

/// The name of the ApprovalRecord of request `request` in namespace `namespace`:
/// `<namespace>.<request>` (both are DNS labels or subdomains, so the result is a valid name unless
/// it is too long, then shortened with a hash).
pub fn approval_record_name(namespace: &str, request: &str) -> String {
    let base = format!("{namespace}.{request}");
    let valid = is_dns1123_subdomain(&base);
    let base_fixed = if valid { base.clone() } else { sanitize(&base) };
    fitted(
        &base_fixed,
        "",
        MAX_NAME_LENGTH,
        !valid,
        &[namespace, request],
    )
}

/// The name of the ApprovalRequest for the tool call `tool_call_id` of `run`: `<run>-<id>`.
///
/// The id is lowercased, every character other than `a-z` and `0-9` becomes `-`, runs of `-` are
/// collapsed and `-` is trimmed from both ends. When that changed the id (or the run name was not
/// a valid object name), or the result is longer than [`MAX_NAME_LENGTH`], the name is shortened as
/// needed and a hash of the exact run name and id appended: `<run>-<id>-<hash>`. The exact id is
/// kept in the request's `spec.toolCallId`.
pub fn approval_request_name(run: &str, tool_call_id: &str) -> String {
    let run_valid = is_dns1123_subdomain(run);
    let run_part = if run_valid {
        run.to_owned()
    } else {
        sanitize(run)
    };
    let id_part = sanitize(tool_call_id);
    let base = match (run_part.is_empty(), id_part.is_empty()) {
        (false, false) => format!("{run_part}-{id_part}"),
        (false, true) => run_part,
        (true, _) => id_part.clone(),
    };
    let changed = !run_valid || id_part.is_empty() || id_part != tool_call_id;
    fitted(&base, "", MAX_NAME_LENGTH, changed, &[run, tool_call_id])
}

/// True when `name` is a valid DNS-1123 subdomain: at most 253 characters, dot-separated labels
/// of `a-z`, `0-9` and `-` that start and end with a letter or digit.
pub fn is_dns1123_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LENGTH
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                && bytes[0] != b'-'
                && bytes[bytes.len() - 1] != b'-'
        })
}

/// `text` lowercased, with every character other than `a-z`/`0-9` replaced by `-`, runs of `-`
/// collapsed and `-` trimmed from both ends. May be empty.
fn sanitize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// `<base cut to fit>-<hash><suffix>`, at most `max` characters. `base` is a valid DNS-1123
/// subdomain or empty; the cut drops trailing `-` and `.` so the result stays valid.
fn with_hash(base: &str, hash: &str, suffix: &str, max: usize) -> String {
    let tail = format!("{hash}{suffix}");
    // `base` is ASCII, so byte lengths are character counts.
    let room = max.saturating_sub(tail.len() + 1);
    let head = base[..base.len().min(room)].trim_end_matches(['-', '.']);
    if head.is_empty() {
        tail
    } else {
        format!("{head}-{tail}")
    }
}

/// The first [`HASH_LENGTH`] hex digits of the SHA-256 of the parts (each length-prefixed, so
/// different splits of the same text hash differently).
fn short_hash(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    let mut hex = hex::encode(hasher.finalize());
    hex.truncate(HASH_LENGTH);
    hex
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn is_label_value(v: &str) -> bool {
        v.len() <= MAX_LABEL_VALUE_LENGTH
            && (v.is_empty()
                || (v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                    && v.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
                    && v.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))))
    }

    #[test]
    fn pod_names_are_run_step_n() {
        assert_eq!(worker_pod_name("demo", 0, 0), "demo-step-0");
        assert_eq!(worker_pod_name("demo.v2", 12, 0), "demo.v2-step-12");
    }

    #[test]
    fn long_run_names_give_short_distinct_pod_names() {
        let a = format!("{}a", "x".repeat(80));
        let b = format!("{}b", "x".repeat(80));
        let (na, nb) = (worker_pod_name(&a, 3, 0), worker_pod_name(&b, 3, 0));
        assert_ne!(na, nb);
        assert!(na.len() <= MAX_LABEL_VALUE_LENGTH, "{na}");
        assert!(na.ends_with("-step-3"), "{na}");
        assert!(na.starts_with("xxxx"), "{na}");
        assert_eq!(na, worker_pod_name(&a, 3, 0), "deterministic");
        let exact = "r".repeat(MAX_LABEL_VALUE_LENGTH - "-step-7".len());
        assert_eq!(worker_pod_name(&exact, 7, 0), format!("{exact}-step-7"));
        let max_step = worker_pod_name(&"y".repeat(253), u32::MAX, 0);
        assert!(max_step.len() <= MAX_LABEL_VALUE_LENGTH, "{max_step}");
    }

    #[test]
    fn retries_stay_within_a_label_value() {
        assert_eq!(worker_pod_name("demo", 0, 2), "demo-step-0-r2");
        let long = "r".repeat(63);
        let retry = worker_pod_name(&long, 7, 12);
        assert!(retry.len() <= MAX_LABEL_VALUE_LENGTH, "{retry}");
        assert!(retry.ends_with("-step-7-r12"), "{retry}");
        assert_ne!(retry, worker_pod_name(&long, 7, 0));
    }

    #[test]
    fn long_run_names_sharing_a_prefix_get_distinct_worker_accounts() {
        assert_eq!(worker_account_name("demo"), "demo-worker");
        let a = format!("{}a", "x".repeat(252));
        let b = format!("{}b", "x".repeat(252));
        let (na, nb) = (worker_account_name(&a), worker_account_name(&b));
        assert_ne!(na, nb);
        for name in [&na, &nb] {
            assert!(
                name.len() <= MAX_NAME_LENGTH && name.ends_with("-worker"),
                "{name}"
            );
            assert!(is_dns1123_subdomain(name), "{name}");
        }
    }

    #[test]
    fn chunk_names_and_label_values() {
        let digest = "0123456789abcdef".repeat(4);
        assert_eq!(chunk_name("demo", &digest, 3), "demo-state-0123456789ab-3");
        assert!(is_chunk_of(&chunk_name("demo", &digest, 3), &digest));
        assert!(!is_chunk_of(
            &chunk_name("demo", &digest, 3),
            &"f".repeat(64)
        ));
        let long = "y".repeat(253);
        let chunk = chunk_name(&long, &digest, 11);
        assert!(
            chunk.len() <= MAX_NAME_LENGTH && is_chunk_of(&chunk, &digest),
            "{chunk}"
        );
        assert_eq!(run_label_value("demo"), "demo");
        let label = run_label_value(&long);
        assert!(is_label_value(&label), "{label}");
        assert_ne!(label, run_label_value(&format!("{}z", "y".repeat(252))));
    }

    #[test]
    fn record_names_are_namespace_dot_request_and_bounded() {
        assert_eq!(approval_record_name("team", "r1-call-1"), "team.r1-call-1");
        let long = approval_record_name(&"n".repeat(63), &"r".repeat(253));
        assert!(
            long.len() <= MAX_NAME_LENGTH && is_dns1123_subdomain(&long),
            "{long}"
        );
        assert_ne!(
            long,
            approval_record_name(&"n".repeat(63), &format!("{}s", "r".repeat(252)))
        );
    }

    #[test]
    fn approval_names_keep_clean_ids_verbatim() {
        assert_eq!(approval_request_name("demo", "call-1"), "demo-call-1");
        assert_eq!(approval_request_name("demo", "abc123"), "demo-abc123");
    }

    #[test]
    fn approval_names_differ_by_case_of_the_id() {
        let upper = approval_request_name("demo", "call_TX_9");
        let lower = approval_request_name("demo", "call_tx_9");
        assert_ne!(upper, lower);
        assert!(upper.starts_with("demo-call-tx-9-"), "{upper}");
        assert!(lower.starts_with("demo-call-tx-9-"), "{lower}");
        assert_eq!(upper.len(), "demo-call-tx-9-".len() + HASH_LENGTH);
        assert!(is_dns1123_subdomain(&upper));
        assert_eq!(
            upper,
            approval_request_name("demo", "call_TX_9"),
            "deterministic"
        );
    }

    #[test]
    fn approval_names_for_odd_ids() {
        for id in ["", "___", "ÄÖÜ", "call:1/2", "-a-", "a..b", "🙂call🙂"] {
            let name = approval_request_name("demo", id);
            assert!(is_dns1123_subdomain(&name), "{id:?} -> {name}");
            assert!(name.starts_with("demo-"), "{id:?} -> {name}");
        }
        assert_ne!(
            approval_request_name("demo", ""),
            approval_request_name("demo", "___")
        );
    }

    #[test]
    fn approval_names_are_bounded() {
        let run = "r".repeat(63);
        let id = "i".repeat(400);
        let name = approval_request_name(&run, &id);
        assert!(name.len() <= MAX_NAME_LENGTH);
        assert!(is_dns1123_subdomain(&name), "{name}");
        let other = approval_request_name(&run, &format!("{}j", "i".repeat(399)));
        assert_ne!(name, other);
    }

    #[test]
    fn subdomain_check() {
        assert!(is_dns1123_subdomain("a"));
        assert!(is_dns1123_subdomain("a-b.c1"));
        assert!(!is_dns1123_subdomain(""));
        assert!(!is_dns1123_subdomain("A"));
        assert!(!is_dns1123_subdomain("a_b"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(!is_dns1123_subdomain("a."));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
    }

    proptest! {
        #[test]
        fn approval_names_are_always_valid(run in "[a-z0-9]([a-z0-9.-]{0,80}[a-z0-9])?", id in "\\PC{0,300}") {
            let name = approval_request_name(&run, &id);
            prop_assert!(is_dns1123_subdomain(&name), "{:?} {:?} -> {}", run, id, name);
        }

        #[test]
        fn approval_names_are_injective_in_the_id(id_a in "[A-Za-z0-9_-]{1,40}", id_b in "[A-Za-z0-9_-]{1,40}") {
            prop_assume!(id_a != id_b);
            prop_assert_ne!(approval_request_name("run", &id_a), approval_request_name("run", &id_b));
        }

        #[test]
        fn pod_names_are_always_valid_label_values(run in "\\PC{0,300}", step in any::<u32>(), attempt in any::<u32>()) {
            let name = worker_pod_name(&run, step, attempt);
            prop_assert!(is_dns1123_subdomain(&name), "{:?} -> {}", run, name);
            prop_assert!(is_label_value(&name), "{:?} -> {}", run, name);
        }
    }
}
