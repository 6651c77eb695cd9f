//! What this replica remembers of its own recent writes, so that a reconcile seeing a cache the
//! watch has not yet updated does not act on an outdated object or repeat a write. Entries expire:
//! after that long the watch has long delivered the write.

use std::time::Duration;

use kube::ResourceExt;
use moka::sync::Cache;

use crate::crd::AgentRun;

/// The most entries each memory holds (the oldest are dropped first).
const CAPACITY: u64 = 100_000;

/// How long a worker Pod this replica created is taken to exist while the Pod watch has not shown
/// it. After that a Pod still unseen is created again.
pub const CREATED_POD_UNSEEN_FOR: Duration = Duration::from_secs(30);

/// The run versions this replica wrote over (by run uid), the ApprovalRequests whose resolution
/// it recorded, the worker Pods it created that the Pod watch has not shown yet and those it is
/// deleting (the last three by `namespace/name`).
pub struct Memory {
    written: Cache<String, String>,
    recorded: Cache<String, ()>,
    created: Cache<String, ()>,
    deleted: Cache<String, ()>,
}

impl Default for Memory {
    fn default() -> Self {
        Memory::new(
            Duration::from_secs(300),
            Duration::from_secs(600),
            CREATED_POD_UNSEEN_FOR,
        )
    }
}

impl Memory {
    /// A memory whose written versions expire after `written_for`, recorded requests after
    /// `recorded_for`, and created and deleted Pods after `pods_for`.
    pub fn new(written_for: Duration, recorded_for: Duration, pods_for: Duration) -> Memory {
        Memory {
            written: cache(written_for),
            recorded: cache(recorded_for),
            created: cache(pods_for),
            deleted: cache(pods_for),
        }
    }

    /// Remembers that this replica wrote over `run` (the version it read).
    pub fn wrote_over(&self, run: &AgentRun) {
        if let (Some(uid), Some(rv)) = (run.uid(), run.resource_version()) {
            self.written.insert(uid, rv);
        }
    }

    /// Whether `run` is a version this replica wrote over: the watch has not delivered the write
    /// yet. Versions are compared for equality only, as the API conventions require.
    pub fn is_stale(&self, run: &AgentRun) -> bool {
        let (Some(uid), Some(rv)) = (run.uid(), run.resource_version()) else {
            return false;
        };
        self.written.get(&uid).is_some_and(|written| written == rv)
    }

    /// Remembers that the resolution of request `name` in `ns` was recorded.
    pub fn recorded(&self, ns: &str, name: &str) {
        self.recorded.insert(key(ns, name), ());
    }

    /// Forgets a recorded resolution (its write failed: a later reconcile repeats it).
    pub fn forget_recorded(&self, ns: &str, name: &str) {
        self.recorded.invalidate(&key(ns, name));
    }

    /// Whether the resolution of request `name` in `ns` was recorded recently.
    pub fn was_recorded(&self, ns: &str, name: &str) -> bool {
        self.recorded.contains_key(&key(ns, name))
    }

    /// Remembers that worker Pod `name` in `ns` was created (or found existing on create).
    pub fn created_pod(&self, ns: &str, name: &str) {
        self.created.insert(key(ns, name), ());
    }

    /// Forgets a created Pod: the Pod watch has shown it, so from now on its absence means it is
    /// gone.
    pub fn saw_pod(&self, ns: &str, name: &str) {
        self.created.invalidate(&key(ns, name));
    }

    /// Whether worker Pod `name` in `ns` was created recently and the Pod watch has not shown it.
    pub fn created_unseen(&self, ns: &str, name: &str) -> bool {
        self.created.contains_key(&key(ns, name))
    }

    /// Remembers that worker Pod `name` in `ns` is being deleted; `false` if it was already,
    /// recently (a reconcile before the Pod watch showed it gone asked for it again).
    pub fn deleting_pod(&self, ns: &str, name: &str) -> bool {
        self.deleted.entry(key(ns, name)).or_insert(()).is_fresh()
    }

    /// Forgets a Pod's deletion (it failed: a later reconcile may ask for it again).
    pub fn forget_deleting(&self, ns: &str, name: &str) {
        self.deleted.invalidate(&key(ns, name));
    }
}

fn cache<V: Clone + Send + Sync + 'static>(ttl: Duration) -> Cache<String, V> {
    Cache::builder()
        .max_capacity(CAPACITY)
        .time_to_live(ttl)
        .build()
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_this_replica_wrote_over_is_stale_and_newer_ones_are_not() {
        let memory = Memory::default();
        let v10 = AgentRun::test().with_uid("u1").with_resource_version("10");
        assert!(!memory.is_stale(&v10));
        memory.wrote_over(&v10);
        assert!(memory.is_stale(&v10));
        assert!(
            !memory.is_stale(&v10.clone().with_resource_version("11")),
            "the watch delivered the write"
        );
        assert!(!memory.is_stale(&v10.with_uid("u2")), "another run");
    }

    #[test]
    fn recorded_decisions_are_remembered_until_forgotten_or_expired() {
        let memory = Memory::default();
        assert!(!memory.was_recorded("ns", "r1-call-1"));
        memory.recorded("ns", "r1-call-1");
        assert!(memory.was_recorded("ns", "r1-call-1"));
        assert!(!memory.was_recorded("other", "r1-call-1"));
        memory.forget_recorded("ns", "r1-call-1");
        assert!(!memory.was_recorded("ns", "r1-call-1"));

        let short = Memory::new(
            Duration::from_millis(20),
            Duration::from_millis(20),
            Duration::from_millis(20),
        );
        short.recorded("ns", "r1-call-1");
        short.wrote_over(&AgentRun::test().with_resource_version("1"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!short.was_recorded("ns", "r1-call-1"));
        assert!(!short.is_stale(&AgentRun::test().with_resource_version("1")));
    }

    #[test]
    fn created_pods_are_remembered_until_seen_or_expired() {
        let memory = Memory::default();
        assert!(!memory.created_unseen("ns", "r1-step-1"));
        memory.created_pod("ns", "r1-step-1");
        assert!(memory.created_unseen("ns", "r1-step-1"));
        assert!(!memory.created_unseen("other", "r1-step-1"));
        memory.saw_pod("ns", "r1-step-1");
        assert!(!memory.created_unseen("ns", "r1-step-1"));

        let short = Memory::new(
            Duration::from_secs(300),
            Duration::from_secs(300),
            Duration::from_millis(20),
        );
        short.created_pod("ns", "r1-step-1");
        std::thread::sleep(Duration::from_millis(60));
        assert!(!short.created_unseen("ns", "r1-step-1"));
    }

    #[test]
    fn a_pod_is_deleted_once_until_forgotten_or_expired() {
        let memory = Memory::default();
        assert!(memory.deleting_pod("ns", "r1-step-1"));
        assert!(!memory.deleting_pod("ns", "r1-step-1"), "asked again");
        assert!(memory.deleting_pod("other", "r1-step-1"));
        memory.forget_deleting("ns", "r1-step-1");
        assert!(
            memory.deleting_pod("ns", "r1-step-1"),
            "the deletion failed"
        );

        let short = Memory::new(
            Duration::from_secs(300),
            Duration::from_secs(300),
            Duration::from_millis(20),
        );
        assert!(short.deleting_pod("ns", "r1-step-1"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(short.deleting_pod("ns", "r1-step-1"));
    }
}
