//! A bounded cache of small RunStates, so that applying a decision or reading a finished step does
//! not fetch the run again.
//!
//! The runs' cache holds runs without their `status.runState` (its memory must not grow with the
//! conversations). The watch delivers each state anyway; this cache keeps the stored text of the
//! small ones, keyed by the run's uid and tagged with the `resourceVersion` it came with. A reader
//! uses an entry only when it matches the resourceVersion of the run it reconciles, and the
//! controller's writes that depend on the state are guarded by that same resourceVersion, so a
//! cached state is exactly the state the API server holds. Large states, chunked states, states
//! beyond the byte budget and finished runs are not kept: their reads go to the API server.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::ResourceExt;
use kube::runtime::watcher;

use crate::crd::{AgentRun, AgentRunPhase};

/// The default byte budget of the cache.
pub const DEFAULT_BUDGET_BYTES: usize = 32 << 20;
/// States above this size are never cached.
pub const MAX_ENTRY_BYTES: usize = 16 << 10;

/// Small RunStates by run uid, within a byte budget.
#[derive(Debug)]
pub struct StateCache {
    budget: usize,
    max_entry: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    bytes: usize,
}

#[derive(Debug)]
struct Entry {
    resource_version: String,
    run_state: String,
}

impl Default for StateCache {
    fn default() -> Self {
        StateCache::new(DEFAULT_BUDGET_BYTES, MAX_ENTRY_BYTES)
    }
}

impl StateCache {
    /// A cache of at most `budget` bytes of states, each at most `max_entry` bytes; a budget of 0
    /// disables it.
    pub fn new(budget: usize, max_entry: usize) -> StateCache {
        StateCache {
            budget,
            max_entry,
            inner: Mutex::default(),
        }
    }

    /// Follows the runs' watch: keeps, replaces or drops each run's entry.
    pub fn observe_event(&self, event: &watcher::Event<AgentRun>) {
        match event {
            watcher::Event::Apply(run) | watcher::Event::InitApply(run) => self.observe(run),
            watcher::Event::Delete(run) => self.forget(run),
            // A relist starts: runs deleted meanwhile are never seen again.
            watcher::Event::Init => *self.lock() = Inner::default(),
            watcher::Event::InitDone => {}
        }
    }

    /// Keeps the run's state if it is small, the run still needs it and the budget allows.
    pub fn observe(&self, run: &AgentRun) {
        let Some(uid) = run.uid() else {
            return;
        };
        let status = run.status.as_ref();
        let keep = status
            .filter(|s| !s.phase.is_some_and(AgentRunPhase::is_terminal))
            .filter(|s| s.run_state_chunks.unwrap_or(0) == 0)
            .and_then(|s| s.run_state.as_ref())
            .filter(|text| text.len() <= self.max_entry);
        let mut inner = self.lock();
        if let Some(old) = inner.entries.remove(&uid) {
            inner.bytes -= old.run_state.len();
        }
        if let (Some(text), Some(rv)) = (keep, run.resource_version())
            && inner.bytes + text.len() <= self.budget
        {
            inner.bytes += text.len();
            inner.entries.insert(
                uid,
                Entry {
                    resource_version: rv,
                    run_state: text.clone(),
                },
            );
        }
    }

    /// Drops the run's entry.
    pub fn forget(&self, run: &AgentRun) {
        let Some(uid) = run.uid() else {
            return;
        };
        let mut inner = self.lock();
        if let Some(old) = inner.entries.remove(&uid) {
            inner.bytes -= old.run_state.len();
        }
    }

    /// The run with its state put back, when the cache holds the state of exactly this version.
    pub fn restore(&self, run: &AgentRun) -> Option<AgentRun> {
        let uid = run.uid()?;
        let rv = run.resource_version()?;
        let inner = self.lock();
        let entry = inner.entries.get(&uid)?;
        if entry.resource_version != rv {
            return None;
        }
        let mut full = run.clone();
        full.status.as_mut()?.run_state = Some(entry.run_state.clone());
        Some(full)
    }

    /// Bytes of states held.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(uid: &str, rv: &str, phase: AgentRunPhase, state: &str) -> AgentRun {
        let mut run = AgentRun::test()
            .with_uid(uid)
            .with_resource_version(rv)
            .in_phase(Some(phase));
        run.status.as_mut().unwrap().run_state = Some(state.into());
        run
    }

    fn stripped(run: &AgentRun) -> AgentRun {
        let mut r = run.clone();
        r.status.as_mut().unwrap().run_state = None;
        r
    }

    #[test]
    fn a_state_is_restored_only_for_its_own_version() {
        let cache = StateCache::new(1 << 20, 1 << 10);
        let v1 = run("u1", "10", AgentRunPhase::AwaitingApproval, "{\"a\": 1}");
        cache.observe(&v1);
        let restored = cache.restore(&stripped(&v1)).unwrap();
        assert_eq!(restored, v1);
        let v2 = run("u1", "11", AgentRunPhase::AwaitingApproval, "{\"a\": 2}");
        assert_eq!(
            cache.restore(&stripped(&v2)),
            None,
            "the cache has not seen v2"
        );
        cache.observe(&v2);
        assert_eq!(cache.restore(&stripped(&v1)), None, "v1 is gone");
        assert_eq!(cache.restore(&stripped(&v2)).unwrap(), v2);
        assert_eq!(cache.bytes(), 8);
    }

    #[test]
    fn large_finished_and_deleted_states_are_not_kept_and_the_budget_holds() {
        let cache = StateCache::new(20, 10);
        cache.observe(&run(
            "u1",
            "1",
            AgentRunPhase::AwaitingApproval,
            &"x".repeat(11),
        ));
        assert_eq!(cache.bytes(), 0, "above the entry limit");
        let small = run("u1", "2", AgentRunPhase::Running, &"x".repeat(10));
        cache.observe(&small);
        assert_eq!(cache.bytes(), 10);
        cache.observe(&run("u2", "3", AgentRunPhase::Running, &"y".repeat(10)));
        assert_eq!(cache.bytes(), 20);
        cache.observe(&run("u3", "4", AgentRunPhase::Running, &"z".repeat(10)));
        assert_eq!(cache.bytes(), 20, "over budget: not kept");
        cache.observe(&run("u2", "5", AgentRunPhase::Succeeded, &"y".repeat(10)));
        assert_eq!(cache.bytes(), 10, "finished runs are dropped");
        cache.observe_event(&watcher::Event::Delete(small.clone()));
        assert_eq!(cache.bytes(), 0);
        assert_eq!(cache.restore(&stripped(&small)), None);
        let disabled = StateCache::new(0, 10);
        disabled.observe(&small);
        assert_eq!(disabled.restore(&stripped(&small)), None);
    }
}
