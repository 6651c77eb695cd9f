//! [`Owned`]: the cache of the objects runs own (worker Pods, ApprovalRequests), kept by the uid
//! of their owners, so that a reconcile finds its run's objects without scanning every cached
//! object (at 10,000 runs, tens of thousands of them).
//!
//! It is its own store rather than a reflector's `Store` plus an index: a reflector keys each
//! object by a full `ObjectRef` (kind, namespace, name, resourceVersion and uid, four strings),
//! and an index beside it would key each object twice more. Here an object costs one map slot
//! keyed by its namespace (shared) and name, a place in its owner's list, and what [`Keep`]
//! keeps of it: the whole object, or (worker Pods, one per step and attempt of every run) only
//! what a reconcile reads. And only while its owner is in progress: a finished run's objects stay
//! on the API server until the run is deleted, but no reconcile reads them
//! ([`Owned::observe_owner_event`]), so the cache grows with the runs in progress, not with those
//! kept for their history.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::crd::ApprovalRequest;

/// How [`Owned`] keeps the objects of a watch.
pub trait Keep: Resource<DynamicType = ()> + Sized + 'static {
    /// What is kept of an object.
    type Kept: Send + Sync + 'static;
    /// What is kept of `object`.
    fn keep(&self) -> Self::Kept;
    /// The uids of the owners of a kept object.
    fn owner_uids(kept: &Self::Kept) -> impl Iterator<Item = &str>;
    /// The object as a reconcile reads it, from what was kept of the object `name` in
    /// `namespace`.
    fn restore(kept: &Self::Kept, namespace: Option<&str>, name: &str) -> Self;
}

/// The objects a watch reports, kept by namespace and name and found by owner uid.
pub struct Owned<K: Keep> {
    objects: RwLock<Relisted<K::Kept>>,
}

/// The objects, and while the watch relists, the relisted ones: like a reflector's store, they
/// replace the live ones when the relist is done. The same for the owners that finished.
struct Relisted<K> {
    live: Objects<K>,
    relist: Option<Objects<K>>,
    finished: HashSet<Box<str>>,
    finished_relist: Option<HashSet<Box<str>>>,
}

impl<T> Relisted<T> {
    /// Whether one of the owners of `kept` finished.
    fn of_finished<K: Keep<Kept = T>>(&self, kept: &T) -> bool {
        K::owner_uids(kept).any(|uid| self.finished.contains(uid))
    }
}

/// An object's namespace and name.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    namespace: Option<Arc<str>>,
    name: Arc<str>,
}

struct Objects<K> {
    by_key: HashMap<Key, Arc<K>>,
    /// The keys of each owner's objects (an owner's objects are in its namespace).
    by_owner: HashMap<Box<str>, Vec<Key>>,
    /// Each namespace's name once, shared by the keys.
    namespaces: HashSet<Arc<str>>,
}

impl<K> Default for Objects<K> {
    fn default() -> Self {
        Objects {
            by_key: HashMap::new(),
            by_owner: HashMap::new(),
            namespaces: HashSet::new(),
        }
    }
}

impl<T> Objects<T> {
    fn key<K: Resource>(&mut self, object: &K) -> Key {
        let namespace = object.meta().namespace.as_deref().map(|ns| {
            if let Some(shared) = self.namespaces.get(ns) {
                shared.clone()
            } else {
                let shared: Arc<str> = ns.into();
                self.namespaces.insert(shared.clone());
                shared
            }
        });
        Key {
            namespace,
            name: object.meta().name.as_deref().unwrap_or_default().into(),
        }
    }

    fn insert<K: Keep<Kept = T>>(&mut self, object: &K, kept: Arc<T>) {
        let mut key = self.key(object);
        if let Some((old_key, old)) = self.by_key.remove_entry(&key) {
            self.unlink::<K>(&old_key, &old);
            key = old_key;
        }
        for uid in K::owner_uids(&kept) {
            let keys = self.by_owner.entry(uid.into()).or_default();
            if !keys.contains(&key) {
                keys.push(key.clone());
            }
        }
        self.by_key.insert(key, kept);
    }

    fn remove<K: Keep<Kept = T>>(&mut self, object: &K) {
        let key = self.key(object);
        if let Some(old) = self.by_key.remove(&key) {
            self.unlink::<K>(&key, &old);
        }
    }

    /// Lets go of the objects of the owner `uid`.
    fn drop_owner<K: Keep<Kept = T>>(&mut self, uid: &str) {
        for key in self.by_owner.remove(uid).unwrap_or_default() {
            if let Some(old) = self.by_key.remove(&key) {
                self.unlink::<K>(&key, &old);
            }
        }
    }

    /// Takes `key` out of the lists of `old`'s owners.
    fn unlink<K: Keep<Kept = T>>(&mut self, key: &Key, old: &T) {
        for uid in K::owner_uids(old) {
            if let Some(keys) = self.by_owner.get_mut(uid) {
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    self.by_owner.remove(uid);
                }
            }
        }
    }
}

/// The uids of the owners `object`'s metadata names.
pub fn owner_uids<K: Resource>(object: &K) -> impl Iterator<Item = &str> {
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .map(|o| o.uid.as_str())
}

/// ApprovalRequests are kept whole: a reconcile verifies their decisions.
impl Keep for ApprovalRequest {
    type Kept = ApprovalRequest;

    fn keep(&self) -> ApprovalRequest {
        self.clone()
    }

    fn owner_uids(kept: &ApprovalRequest) -> impl Iterator<Item = &str> {
        owner_uids(kept)
    }

    fn restore(kept: &ApprovalRequest, _: Option<&str>, _: &str) -> ApprovalRequest {
        kept.clone()
    }
}

impl<K: Keep> Owned<K> {
    /// An empty cache, filled by [`Owned::observe_event`].
    pub fn new() -> Owned<K> {
        Owned {
            objects: RwLock::new(Relisted {
                live: Objects::default(),
                relist: None,
                finished: HashSet::new(),
                finished_relist: None,
            }),
        }
    }

    /// Follows the watch (call it on each of its events, in order).
    pub fn observe_event(&self, event: &watcher::Event<K>) {
        // Objects are kept (copied) before the lock is taken: reconciles read while the watch
        // writes.
        let lock = || self.objects.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(object) => {
                let kept = Arc::new(object.keep());
                let mut objects = lock();
                if objects.of_finished::<K>(&kept) {
                    objects.live.remove(object);
                } else {
                    objects.live.insert(object, kept);
                }
            }
            watcher::Event::InitApply(object) => {
                let kept = Arc::new(object.keep());
                let mut objects = lock();
                if !objects.of_finished::<K>(&kept) {
                    let relist = objects.relist.get_or_insert_with(Objects::default);
                    relist.insert(object, kept);
                }
            }
            watcher::Event::Delete(object) => lock().live.remove(object),
            watcher::Event::Init => lock().relist = Some(Objects::default()),
            watcher::Event::InitDone => {
                let mut objects = lock();
                if let Some(relisted) = objects.relist.take() {
                    objects.live = relisted;
                }
            }
        }
    }

    /// Follows the watch of the owners (call it on each of its events, in order): the objects of
    /// an owner that is `finished` are let go, and those its watch reports later are not kept,
    /// until the owner is deleted or no longer finished. A reconcile reads nothing of a finished
    /// run's Pods and requests, and they stay until the run is deleted: the cache holds the runs
    /// in progress, not the history.
    pub fn observe_owner_event<O: Resource>(
        &self,
        event: &watcher::Event<O>,
        finished: impl Fn(&O) -> bool,
    ) {
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(owner) | watcher::Event::InitApply(owner) => {
                let Some(uid) = owner.meta().uid.as_deref() else {
                    return;
                };
                if !finished(owner) {
                    objects.finished.remove(uid);
                    return;
                }
                if let (watcher::Event::InitApply(_), Some(relisted)) =
                    (event, objects.finished_relist.as_mut())
                {
                    relisted.insert(uid.into());
                }
                if objects.finished.insert(uid.into()) {
                    objects.live.drop_owner::<K>(uid);
                    if let Some(relist) = objects.relist.as_mut() {
                        relist.drop_owner::<K>(uid);
                    }
                }
            }
            watcher::Event::Delete(owner) => {
                if let Some(uid) = owner.meta().uid.as_deref() {
                    objects.finished.remove(uid);
                }
            }
            watcher::Event::Init => objects.finished_relist = Some(HashSet::new()),
            watcher::Event::InitDone => {
                if let Some(relisted) = objects.finished_relist.take() {
                    objects.finished = relisted;
                }
            }
        }
    }

    /// The cached objects in `owner`'s namespace that `owner` owns.
    pub fn of<O: Resource>(&self, owner: &O) -> Vec<K> {
        let (Some(uid), ns) = (owner.uid(), owner.namespace()) else {
            return vec![];
        };
        let owned: Vec<(Key, Arc<K::Kept>)> = {
            let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
            let Some(keys) = objects.live.by_owner.get(uid.as_str()) else {
                return vec![];
            };
            keys.iter()
                .filter(|key| key.namespace.as_deref() == ns.as_deref())
                .filter_map(|key| Some((key.clone(), objects.live.by_key.get(key)?.clone())))
                .collect()
        };
        // Restored (copied) once the lock is released.
        owned
            .iter()
            .map(|(key, kept)| K::restore(kept, key.namespace.as_deref(), &key.name))
            .collect()
    }

    /// What is kept of the object `name` in `namespace`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K::Kept>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let key = Key {
            namespace: Some(namespace.into()),
            name: name.into(),
        };
        objects.live.by_key.get(&key).cloned()
    }

    /// What is kept of every cached object.
    pub fn state(&self) -> Vec<Arc<K::Kept>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects.live.by_key.values().cloned().collect()
    }
}

impl<K: Keep> Default for Owned<K> {
    fn default() -> Self {
        Owned::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use crate::controller::cached_pod::CachedPod;

    fn pod(name: &str, owners: &[&str]) -> CachedPod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.owner_references = Some(
            owners
                .iter()
                .map(|uid| OwnerReference {
                    uid: (*uid).into(),
                    ..Default::default()
                })
                .collect(),
        );
        CachedPod::from(pod)
    }

    fn owner(uid: &str) -> Pod {
        let mut owner = Pod::default();
        owner.metadata.namespace = Some("ns".into());
        owner.metadata.uid = Some(uid.into());
        owner
    }

    fn apply(owned: &Owned<CachedPod>, event: watcher::Event<CachedPod>) {
        owned.observe_event(&event);
    }

    fn names(owned: &Owned<CachedPod>, uid: &str) -> Vec<String> {
        let mut names: Vec<String> = owned.of(&owner(uid)).iter().map(|p| p.name_any()).collect();
        names.sort();
        names
    }

    #[test]
    fn finds_what_an_owner_owns_across_changes_deletes_and_relists() {
        let owned = Owned::new();
        apply(&owned, watcher::Event::Apply(pod("a", &["u1"])));
        apply(&owned, watcher::Event::Apply(pod("b", &["u1", "u2"])));
        apply(&owned, watcher::Event::Apply(pod("c", &["u2"])));
        assert_eq!(names(&owned, "u1"), ["a", "b"]);
        assert_eq!(names(&owned, "u2"), ["b", "c"]);
        apply(&owned, watcher::Event::Apply(pod("c", &["u2"])));
        assert_eq!(
            names(&owned, "u2"),
            ["b", "c"],
            "an update replaces the object"
        );
        apply(&owned, watcher::Event::Apply(pod("b", &["u2"])));
        assert_eq!(names(&owned, "u1"), ["a"], "b changed owners");
        apply(&owned, watcher::Event::Delete(pod("c", &["u2"])));
        assert_eq!(names(&owned, "u2"), ["b"]);
        let mut elsewhere = pod("d", &["u1"]);
        elsewhere.metadata.namespace = Some("other".into());
        apply(&owned, watcher::Event::Apply(elsewhere));
        assert_eq!(names(&owned, "u1"), ["a"], "another namespace's");

        apply(&owned, watcher::Event::Init);
        apply(&owned, watcher::Event::InitApply(pod("x", &["u1"])));
        assert_eq!(names(&owned, "u1"), ["a"], "the relist is not done");
        apply(&owned, watcher::Event::InitDone);
        assert_eq!(names(&owned, "u1"), ["x"], "a and b went away meanwhile");
        assert_eq!(names(&owned, "u2"), Vec::<String>::new());
        assert_eq!(names(&owned, "nobody"), Vec::<String>::new());
        assert!(owned.get("ns", "x").is_some());
        assert!(owned.get("other", "x").is_none());
        assert_eq!(owned.state().len(), 1);
    }

    #[test]
    fn a_delete_unlinks_the_object_from_the_owners_it_was_cached_with() {
        let owned = Owned::new();
        apply(&owned, watcher::Event::Apply(pod("a", &["u1"])));
        apply(&owned, watcher::Event::Delete(pod("a", &[])));
        assert_eq!(names(&owned, "u1"), Vec::<String>::new());
        assert!(owned.get("ns", "a").is_none());
    }

    fn owners(owned: &Owned<CachedPod>, event: watcher::Event<Pod>) {
        // An owner has finished when it is labelled so.
        owned.observe_owner_event(&event, |o| o.labels().contains_key("finished"));
    }

    fn finished(uid: &str) -> Pod {
        let mut owner = owner(uid);
        owner.labels_mut().insert("finished".into(), "yes".into());
        owner
    }

    #[test]
    fn the_objects_of_a_finished_owner_are_let_go_until_it_is_deleted_or_unfinished() {
        let owned = Owned::new();
        apply(&owned, watcher::Event::Apply(pod("a", &["u1"])));
        apply(&owned, watcher::Event::Apply(pod("b", &["u2"])));
        owners(&owned, watcher::Event::Apply(owner("u1")));
        assert_eq!(names(&owned, "u1"), ["a"], "u1 is in progress");
        owners(&owned, watcher::Event::Apply(finished("u1")));
        assert_eq!(names(&owned, "u1"), Vec::<String>::new());
        assert!(owned.get("ns", "a").is_none());
        apply(&owned, watcher::Event::Apply(pod("a", &["u1"])));
        apply(&owned, watcher::Event::Apply(pod("c", &["u1"])));
        assert_eq!(names(&owned, "u1"), Vec::<String>::new(), "nor kept later");
        assert_eq!(names(&owned, "u2"), ["b"], "another owner's stay");

        owners(&owned, watcher::Event::Apply(owner("u1")));
        apply(&owned, watcher::Event::Apply(pod("c", &["u1"])));
        assert_eq!(names(&owned, "u1"), ["c"], "unfinished: kept again");

        owners(&owned, watcher::Event::Apply(finished("u2")));
        owners(&owned, watcher::Event::Delete(finished("u2")));
        apply(&owned, watcher::Event::Apply(pod("b", &["u2"])));
        assert_eq!(names(&owned, "u2"), ["b"], "a deleted owner is forgotten");
    }

    #[test]
    fn relists_of_objects_and_of_owners_keep_the_finished_ones_out() {
        let owned = Owned::new();
        owners(&owned, watcher::Event::Apply(finished("u1")));
        apply(&owned, watcher::Event::Init);
        apply(&owned, watcher::Event::InitApply(pod("a", &["u1"])));
        apply(&owned, watcher::Event::InitApply(pod("b", &["u2"])));
        owners(&owned, watcher::Event::Apply(finished("u2")));
        apply(&owned, watcher::Event::InitDone);
        assert_eq!(names(&owned, "u1"), Vec::<String>::new());
        assert_eq!(
            names(&owned, "u2"),
            Vec::<String>::new(),
            "finished mid-relist"
        );

        // The owners relist: u1 is gone meanwhile, u2 still finished.
        owners(&owned, watcher::Event::Init);
        owners(&owned, watcher::Event::InitApply(finished("u2")));
        owners(&owned, watcher::Event::InitDone);
        apply(&owned, watcher::Event::Apply(pod("a", &["u1"])));
        apply(&owned, watcher::Event::Apply(pod("b", &["u2"])));
        assert_eq!(names(&owned, "u1"), ["a"]);
        assert_eq!(names(&owned, "u2"), Vec::<String>::new());
    }
}
