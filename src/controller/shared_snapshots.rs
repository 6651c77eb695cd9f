//! [`SharedSnapshots`]: one copy of each Agent snapshot in the runs' cache.
//!
//! Every run records the Agent it is bound to (`status.agent`: the Agent's spec with its tools'
//! definitions and the model's instructions), and the runs of one Agent record the same snapshot.
//! Decoded, a snapshot costs kilobytes; the cache would hold one per run. The runs' watch hands
//! each run's snapshot to [`SharedSnapshots::share`], which replaces it by an equal one a cached
//! run already holds, so the runs of an Agent share one copy. The table holds weak references:
//! a snapshot no cached run holds any more is freed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::crd::AgentSnapshot;

/// Agent snapshots held by cached runs, by spec digest.
#[derive(Debug, Default)]
pub struct SharedSnapshots {
    inner: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    by_digest: HashMap<String, Vec<Weak<AgentSnapshot>>>,
    /// The number of digests after the last sweep of those no run holds any more.
    swept_at: usize,
}

/// The table is swept of snapshots nobody holds once it has this many digests, then each time
/// it doubles.
const FIRST_SWEEP: usize = 64;

impl SharedSnapshots {
    /// Replaces `snapshot` by an equal snapshot another run holds, or remembers it for the next
    /// run with the same snapshot.
    pub fn share(&self, snapshot: &mut Arc<AgentSnapshot>) {
        let mut table = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let copies = table
            .by_digest
            .entry(snapshot.spec_digest.clone())
            .or_default();
        copies.retain(|copy| copy.strong_count() > 0);
        if let Some(same) = copies
            .iter()
            .filter_map(Weak::upgrade)
            .find(|copy| **copy == **snapshot)
        {
            *snapshot = same;
            return;
        }
        copies.push(Arc::downgrade(snapshot));
        if table.by_digest.len() >= FIRST_SWEEP.max(2 * table.swept_at) {
            table.by_digest.retain(|_, copies| {
                copies.retain(|copy| copy.strong_count() > 0);
                !copies.is_empty()
            });
            table.swept_at = table.by_digest.len();
        }
    }

    /// How many distinct snapshots the table knows (some may no longer be held).
    pub fn len(&self) -> usize {
        let table = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        table.by_digest.values().map(Vec::len).sum()
    }

    /// Whether the table knows no snapshot.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(digest: &str, generation: i64) -> Arc<AgentSnapshot> {
        Arc::new(AgentSnapshot {
            name: "a".into(),
            generation: Some(generation),
            spec_digest: digest.into(),
            ..Default::default()
        })
    }

    #[test]
    fn runs_with_equal_snapshots_share_one_copy() {
        let shared = SharedSnapshots::default();
        let mut first = snapshot("d1", 1);
        let mut second = snapshot("d1", 1);
        shared.share(&mut first);
        shared.share(&mut second);
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(shared.len(), 1);
    }

    #[test]
    fn snapshots_that_differ_are_kept_apart_even_with_one_digest() {
        let shared = SharedSnapshots::default();
        let mut first = snapshot("d1", 1);
        let mut other_generation = snapshot("d1", 2);
        let mut other_digest = snapshot("d2", 1);
        shared.share(&mut first);
        shared.share(&mut other_generation);
        shared.share(&mut other_digest);
        assert!(!Arc::ptr_eq(&first, &other_generation));
        assert_eq!(other_generation.generation, Some(2));
        assert_eq!(other_digest.spec_digest, "d2");
        assert_eq!(shared.len(), 3);
    }

    #[test]
    fn a_snapshot_no_run_holds_is_freed_and_forgotten() {
        let shared = SharedSnapshots::default();
        let mut first = snapshot("d0", 1);
        shared.share(&mut first);
        let weak = Arc::downgrade(&first);
        drop(first);
        assert!(weak.upgrade().is_none(), "the table must not keep it alive");
        let mut held = vec![];
        for i in 1..=FIRST_SWEEP {
            let mut s = snapshot(&format!("d{i}"), 1);
            shared.share(&mut s);
            held.push(s);
        }
        // The sweep at FIRST_SWEEP digests dropped d0, which no run held.
        assert_eq!(shared.len(), FIRST_SWEEP);
        let mut again = snapshot("d0", 1);
        shared.share(&mut again);
        assert_eq!(again.spec_digest, "d0");
    }
}
