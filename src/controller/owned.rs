//! [`Owned`]: the cache of the objects runs own (worker Pods, ApprovalRequests), kept by the uid
//! of their owners, so that a reconcile finds its run's objects without scanning every cached
//! object (at 10,000 runs, tens of thousands of them).
//!
//! It is its own store rather than a reflector's `Store` plus an index: a reflector keys each
//! object by a full `ObjectRef` (kind, namespace, name, resourceVersion and uid, four strings),
//! and an index beside it would key each object twice more. Here an object costs one map slot
//! keyed by its namespace (shared) and name, and a place in its owner's list.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

/// The objects a watch reports, kept by namespace and name and found by owner uid.
pub struct Owned<K: Resource<DynamicType = ()>> {
    objects: RwLock<Relisted<K>>,
}

/// The objects, and while the watch relists, the relisted ones: like a reflector's store, they
/// replace the live ones when the relist is done.
struct Relisted<K> {
    live: Objects<K>,
    relist: Option<Objects<K>>,
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

impl<K: Resource<DynamicType = ()>> Objects<K> {
    fn key(&mut self, object: &K) -> Key {
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

    fn insert(&mut self, object: Arc<K>) {
        let mut key = self.key(&object);
        if let Some((old_key, old)) = self.by_key.remove_entry(&key) {
            self.unlink(&old_key, &old);
            key = old_key;
        }
        for uid in owner_uids(&*object) {
            let keys = self.by_owner.entry(uid.into()).or_default();
            if !keys.contains(&key) {
                keys.push(key.clone());
            }
        }
        self.by_key.insert(key, object);
    }

    fn remove(&mut self, object: &K) {
        let key = self.key(object);
        if let Some(old) = self.by_key.remove(&key) {
            self.unlink(&key, &old);
        }
    }

    /// Takes `key` out of the lists of `old`'s owners.
    fn unlink(&mut self, key: &Key, old: &K) {
        for uid in owner_uids(old) {
            if let Some(keys) = self.by_owner.get_mut(uid) {
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    self.by_owner.remove(uid);
                }
            }
        }
    }
}

fn owner_uids<K: Resource>(object: &K) -> impl Iterator<Item = &str> {
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .map(|o| o.uid.as_str())
}

impl<K> Owned<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// An empty cache, filled by [`Owned::observe_event`].
    pub fn new() -> Owned<K> {
        Owned {
            objects: RwLock::new(Relisted {
                live: Objects::default(),
                relist: None,
            }),
        }
    }

    /// Follows the watch (call it on each of its events, in order).
    pub fn observe_event(&self, event: &watcher::Event<K>) {
        // Objects are copied before the lock is taken: reconciles read while the watch writes.
        let lock = || self.objects.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(object) => {
                let object = Arc::new(object.clone());
                lock().live.insert(object);
            }
            watcher::Event::InitApply(object) => {
                let object = Arc::new(object.clone());
                lock()
                    .relist
                    .get_or_insert_with(Objects::default)
                    .insert(object);
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

    /// The cached objects in `owner`'s namespace that `owner` owns.
    pub fn of<O: Resource>(&self, owner: &O) -> Vec<K> {
        let (Some(uid), ns) = (owner.uid(), owner.namespace()) else {
            return vec![];
        };
        let owned: Vec<Arc<K>> = {
            let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
            let Some(keys) = objects.live.by_owner.get(uid.as_str()) else {
                return vec![];
            };
            keys.iter()
                .filter(|key| key.namespace.as_deref() == ns.as_deref())
                .filter_map(|key| objects.live.by_key.get(key).cloned())
                .collect()
        };
        // Copied once the lock is released.
        owned.iter().map(|o| (**o).clone()).collect()
    }

    /// The cached object `name` in `namespace`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let key = Key {
            namespace: Some(namespace.into()),
            name: name.into(),
        };
        objects.live.by_key.get(&key).cloned()
    }

    /// Every cached object.
    pub fn state(&self) -> Vec<Arc<K>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects.live.by_key.values().cloned().collect()
    }
}

impl<K> Default for Owned<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn default() -> Self {
        Owned::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn pod(name: &str, owners: &[&str]) -> Pod {
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
        pod
    }

    fn owner(uid: &str) -> Pod {
        let mut owner = pod("owner", &[]);
        owner.metadata.uid = Some(uid.into());
        owner
    }

    fn apply(owned: &Owned<Pod>, event: watcher::Event<Pod>) {
        owned.observe_event(&event);
    }

    fn names(owned: &Owned<Pod>, uid: &str) -> Vec<String> {
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
        assert_eq!(owned.get("ns", "x").map(|p| p.name_any()), Some("x".into()));
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
}
