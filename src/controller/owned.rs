//! [`Owned`]: a cache of the objects runs own (worker Pods, ApprovalRequests), indexed by the uid
//! of their owners, so that a reconcile finds its run's objects without scanning every cached
//! object (at 10,000 runs, tens of thousands of them).

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

/// A reflector's store, and an index of its objects by owner uid that follows the same watch.
pub struct Owned<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    index: RwLock<Relisted<K>>,
}

/// The index, and while the watch relists, the index of the relisted objects: like the
/// reflector's store, it replaces the live one when the relist is done.
struct Relisted<K: Resource<DynamicType = ()>> {
    live: Index<K>,
    relist: Option<Index<K>>,
}

struct Index<K: Resource<DynamicType = ()>> {
    by_owner: HashMap<String, HashSet<ObjectRef<K>>>,
    owners: HashMap<ObjectRef<K>, Vec<String>>,
}

impl<K: Resource<DynamicType = ()>> Default for Index<K> {
    fn default() -> Self {
        Index {
            by_owner: HashMap::new(),
            owners: HashMap::new(),
        }
    }
}

impl<K: Resource<DynamicType = ()>> Index<K> {
    fn insert(&mut self, object: &K) {
        let key = slim_key(object);
        self.remove(&key);
        let owners: Vec<String> = object
            .owner_references()
            .iter()
            .map(|o| o.uid.clone())
            .collect();
        for uid in &owners {
            self.by_owner
                .entry(uid.clone())
                .or_default()
                .insert(key.clone());
        }
        if !owners.is_empty() {
            self.owners.insert(key, owners);
        }
    }

    fn remove(&mut self, key: &ObjectRef<K>) {
        for uid in self.owners.remove(key).unwrap_or_default() {
            if let Some(keys) = self.by_owner.get_mut(&uid) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_owner.remove(&uid);
                }
            }
        }
    }
}

/// The object's key without its resourceVersion and uid: keys are compared by kind, namespace and
/// name, and the index keeps two copies of each object's key.
fn slim_key<K: Resource<DynamicType = ()>>(object: &K) -> ObjectRef<K> {
    let mut key = ObjectRef::from_obj(object);
    key.extra = Default::default();
    key
}

impl<K> Owned<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// The objects of `store`, indexed from the events of the watch that fills it.
    pub fn new(store: Store<K>) -> Owned<K> {
        Owned {
            store,
            index: RwLock::new(Relisted {
                live: Index::default(),
                relist: None,
            }),
        }
    }

    /// Follows the watch (call it on each event once the store has it).
    pub fn observe_event(&self, event: &watcher::Event<K>) {
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(object) => index.live.insert(object),
            watcher::Event::Delete(object) => index.live.remove(&slim_key(object)),
            watcher::Event::Init => index.relist = Some(Index::default()),
            watcher::Event::InitApply(object) => index
                .relist
                .get_or_insert_with(Index::default)
                .insert(object),
            watcher::Event::InitDone => {
                if let Some(relisted) = index.relist.take() {
                    index.live = relisted;
                }
            }
        }
    }

    /// The cached objects in `owner`'s namespace that `owner` owns.
    pub fn of<O: Resource>(&self, owner: &O) -> Vec<K> {
        let (Some(uid), ns) = (owner.uid(), owner.namespace()) else {
            return vec![];
        };
        let keys: Vec<ObjectRef<K>> = {
            let index = self.index.read().unwrap_or_else(|e| e.into_inner());
            match index.live.by_owner.get(&uid) {
                Some(keys) => keys.iter().cloned().collect(),
                None => return vec![],
            }
        };
        keys.iter()
            .filter_map(|key| self.store.get(key))
            .filter(|o| o.namespace() == ns && o.owner_references().iter().any(|r| r.uid == uid))
            .map(|o| (*o).clone())
            .collect()
    }

    /// The cached object `key`.
    pub fn get(&self, key: &ObjectRef<K>) -> Option<std::sync::Arc<K>> {
        self.store.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::runtime::reflector::{self, store::Writer};

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

    /// Applies `event` to the store, then to the index, as the watch does.
    fn apply(writer: &mut Writer<Pod>, owned: &Owned<Pod>, event: watcher::Event<Pod>) {
        writer.apply_watcher_event(&event);
        owned.observe_event(&event);
    }

    fn names(owned: &Owned<Pod>, uid: &str) -> Vec<String> {
        let mut names: Vec<String> = owned.of(&owner(uid)).iter().map(|p| p.name_any()).collect();
        names.sort();
        names
    }

    #[test]
    fn finds_what_an_owner_owns_across_changes_deletes_and_relists() {
        let (reader, mut writer) = reflector::store();
        let owned = Owned::new(reader);
        let e = &mut writer;
        apply(e, &owned, watcher::Event::Apply(pod("a", &["u1"])));
        apply(e, &owned, watcher::Event::Apply(pod("b", &["u1", "u2"])));
        apply(e, &owned, watcher::Event::Apply(pod("c", &["u2"])));
        assert_eq!(names(&owned, "u1"), ["a", "b"]);
        assert_eq!(names(&owned, "u2"), ["b", "c"]);
        apply(e, &owned, watcher::Event::Apply(pod("b", &["u2"])));
        assert_eq!(names(&owned, "u1"), ["a"], "b changed owners");
        apply(e, &owned, watcher::Event::Delete(pod("c", &["u2"])));
        assert_eq!(names(&owned, "u2"), ["b"]);
        let mut elsewhere = pod("d", &["u1"]);
        elsewhere.metadata.namespace = Some("other".into());
        apply(e, &owned, watcher::Event::Apply(elsewhere));
        assert_eq!(names(&owned, "u1"), ["a"], "another namespace's");

        apply(e, &owned, watcher::Event::Init);
        apply(e, &owned, watcher::Event::InitApply(pod("x", &["u1"])));
        assert_eq!(names(&owned, "u1"), ["a"], "the relist is not done");
        apply(e, &owned, watcher::Event::InitDone);
        assert_eq!(names(&owned, "u1"), ["x"], "a and b went away meanwhile");
        assert_eq!(names(&owned, "u2"), Vec::<String>::new());
        assert_eq!(names(&owned, "nobody"), Vec::<String>::new());
    }
}
