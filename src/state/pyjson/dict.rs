//! [`Dict`]: a JSON object as Python holds it, keys in insertion order.

use std::fmt;

use compact_str::CompactString;
use indexmap::IndexMap;

use super::Value;

/// The most entries a dict keeps in a plain list, found by comparing keys one by one. Nearly
/// every object of a chat conversation (a message, a tool call, its function) is this small;
/// a list of a few entries is built, read and freed faster than a hash table.
const SMALL: usize = 8;

type Large = IndexMap<CompactString, Value, foldhash::fast::RandomState>;

/// A JSON object as Python holds it: keys in insertion order; assigning to an existing key
/// replaces its value in place. Keys of up to 24 bytes (nearly all of them) are stored inline.
///
/// Up to 8 entries sit in a list and lookups compare keys; a larger dict is an [`IndexMap`]
/// hashed with foldhash (randomly seeded), so a dict of many keys from hostile input costs
/// no more than a hash table. Equality ignores the order, like Python's `dict`.
#[derive(Clone, Default)]
pub struct Dict(Repr);

#[derive(Clone)]
enum Repr {
    Small(Vec<(CompactString, Value)>),
    Large(Box<Large>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Small(Vec::new())
    }
}

impl Dict {
    /// An empty dict.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty dict with room for `capacity` entries.
    pub fn with_capacity(capacity: usize) -> Self {
        if capacity <= SMALL {
            Dict(Repr::Small(Vec::with_capacity(capacity)))
        } else {
            Dict(Repr::Large(Box::new(Large::with_capacity_and_hasher(
                capacity,
                Default::default(),
            ))))
        }
    }

    /// The dict of `entries`, in their order; a repeated key keeps its first position and its
    /// last value (what assigning them one by one into a Python dict does).
    pub(crate) fn from_entries(entries: std::vec::Drain<'_, (CompactString, Value)>) -> Self {
        let slice = entries.as_slice();
        if slice.len() <= SMALL
            && !slice
                .iter()
                .enumerate()
                .any(|(i, (key, _))| slice[..i].iter().any(|(k, _)| k == key))
        {
            return Dict(Repr::Small(entries.collect()));
        }
        let mut dict = Dict::with_capacity(entries.len());
        for (key, value) in entries {
            dict.insert(key, value);
        }
        dict
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Small(entries) => entries.len(),
            Repr::Large(map) => map.len(),
        }
    }

    /// `true` when the dict has no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn position(entries: &[(CompactString, Value)], key: &str) -> Option<usize> {
        entries.iter().position(|(k, _)| k.as_str() == key)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match &self.0 {
            Repr::Small(entries) => Self::position(entries, key).map(|i| &entries[i].1),
            Repr::Large(map) => map.get(key),
        }
    }

    /// The value of `key`, mutably.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Value> {
        match &mut self.0 {
            Repr::Small(entries) => Self::position(entries, key).map(|i| &mut entries[i].1),
            Repr::Large(map) => map.get_mut(key),
        }
    }

    /// `true` when the dict holds `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Sets `key` to `value`: at the end for a new key, in place for an existing one (whose old
    /// value is returned).
    pub fn insert(&mut self, key: impl Into<CompactString>, value: Value) -> Option<Value> {
        let key = key.into();
        match &mut self.0 {
            Repr::Small(entries) => {
                if let Some(i) = Self::position(entries, &key) {
                    return Some(std::mem::replace(&mut entries[i].1, value));
                }
                if entries.len() < SMALL {
                    entries.push((key, value));
                    return None;
                }
                let mut map = Large::with_capacity_and_hasher(SMALL * 2, Default::default());
                map.extend(entries.drain(..));
                map.insert(key, value);
                self.0 = Repr::Large(Box::new(map));
                None
            }
            Repr::Large(map) => map.insert(key, value),
        }
    }

    /// Removes `key` and returns its value; the entries after it keep their order.
    pub fn shift_remove(&mut self, key: &str) -> Option<Value> {
        match &mut self.0 {
            Repr::Small(entries) => Self::position(entries, key).map(|i| entries.remove(i).1),
            Repr::Large(map) => map.shift_remove(key),
        }
    }

    /// The entries in order.
    pub fn iter(&self) -> Iter<'_> {
        match &self.0 {
            Repr::Small(entries) => Iter::Small(entries.iter()),
            Repr::Large(map) => Iter::Large(map.iter()),
        }
    }

    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &CompactString> {
        self.iter().map(|(k, _)| k)
    }

    /// The values in order.
    pub fn values(&self) -> impl Iterator<Item = &Value> {
        self.iter().map(|(_, v)| v)
    }
}

/// The entries of a [`Dict`] in order: see [`Dict::iter`].
pub enum Iter<'d> {
    /// Of a dict held as a list.
    #[doc(hidden)]
    Small(std::slice::Iter<'d, (CompactString, Value)>),
    /// Of a dict held as a hash table.
    #[doc(hidden)]
    Large(indexmap::map::Iter<'d, CompactString, Value>),
}

impl<'d> Iterator for Iter<'d> {
    type Item = (&'d CompactString, &'d Value);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Small(it) => it.next().map(|(k, v)| (k, v)),
            Iter::Large(it) => it.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Iter::Small(it) => it.size_hint(),
            Iter::Large(it) => it.size_hint(),
        }
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'d> IntoIterator for &'d Dict {
    type Item = (&'d CompactString, &'d Value);
    type IntoIter = Iter<'d>;

    fn into_iter(self) -> Iter<'d> {
        self.iter()
    }
}

/// The entries of a [`Dict`] in order, by value: see [`Dict::into_iter`].
pub enum IntoIter {
    /// Of a dict held as a list.
    #[doc(hidden)]
    Small(std::vec::IntoIter<(CompactString, Value)>),
    /// Of a dict held as a hash table.
    #[doc(hidden)]
    Large(indexmap::map::IntoIter<CompactString, Value>),
}

impl Iterator for IntoIter {
    type Item = (CompactString, Value);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            IntoIter::Small(it) => it.next(),
            IntoIter::Large(it) => it.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            IntoIter::Small(it) => it.size_hint(),
            IntoIter::Large(it) => it.size_hint(),
        }
    }
}

impl ExactSizeIterator for IntoIter {}

impl IntoIterator for Dict {
    type Item = (CompactString, Value);
    type IntoIter = IntoIter;

    fn into_iter(self) -> IntoIter {
        match self.0 {
            Repr::Small(entries) => IntoIter::Small(entries.into_iter()),
            Repr::Large(map) => IntoIter::Large(map.into_iter()),
        }
    }
}

impl<K: Into<CompactString>> FromIterator<(K, Value)> for Dict {
    fn from_iter<I: IntoIterator<Item = (K, Value)>>(iter: I) -> Self {
        let mut dict = Dict::new();
        dict.extend(iter);
        dict
    }
}

impl<K: Into<CompactString>> Extend<(K, Value)> for Dict {
    fn extend<I: IntoIterator<Item = (K, Value)>>(&mut self, iter: I) {
        for (key, value) in iter {
            self.insert(key, value);
        }
    }
}

/// `dict["key"]`: the entry, or `null` when the dict has no such key (never panics, like
/// [`Value`]'s index).
impl std::ops::Index<&str> for Dict {
    type Output = Value;

    fn index(&self, key: &str) -> &Value {
        static NULL: Value = Value::Null;
        self.get(key).unwrap_or(&NULL)
    }
}

impl PartialEq for Dict {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl fmt::Debug for Dict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(d: &Dict) -> Vec<&str> {
        d.keys().map(CompactString::as_str).collect()
    }

    #[test]
    fn a_repeated_key_keeps_its_place_and_takes_the_last_value_small_and_large() {
        for n in [3, SMALL, SMALL + 1, 50] {
            let mut entries: Vec<(CompactString, Value)> = (0..n)
                .map(|i| (format!("k{i}").into(), Value::from(i as i64)))
                .collect();
            entries.push(("k1".into(), Value::from("last")));
            let d = Dict::from_entries(entries.drain(..));
            assert_eq!(d.len(), n);
            assert_eq!(keys(&d)[1], "k1");
            assert_eq!(d.get("k1"), Some(&Value::from("last")));
            assert_eq!(
                d.get(&format!("k{}", n - 1)),
                Some(&Value::from((n - 1) as i64))
            );
            assert_eq!(d.get("missing"), None);
        }
    }

    #[test]
    fn a_small_dict_grows_into_a_table_without_losing_order_or_entries() {
        let mut d = Dict::new();
        for i in 0..20 {
            assert_eq!(d.insert(format!("k{i}"), Value::from(i)), None);
            assert_eq!(d.len(), i as usize + 1);
        }
        let expected: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        assert_eq!(keys(&d), expected);
        assert_eq!(d.insert("k3", Value::Null), Some(Value::from(3)));
        assert_eq!(d.shift_remove("k0"), Some(Value::from(0)));
        assert_eq!(keys(&d)[..2], ["k1", "k2"]);
    }

    #[test]
    fn equality_ignores_order_like_a_python_dict() {
        let a: Dict = [("x", Value::from(1)), ("y", Value::from(2))]
            .into_iter()
            .collect();
        let b: Dict = [("y", Value::from(2)), ("x", Value::from(1))]
            .into_iter()
            .collect();
        let c: Dict = [("y", Value::from(2)), ("x", Value::from(3))]
            .into_iter()
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let large_a: Dict = (0..20).map(|i| (format!("k{i}"), Value::from(i))).collect();
        let large_b: Dict = (0..20)
            .rev()
            .map(|i| (format!("k{i}"), Value::from(i)))
            .collect();
        assert_eq!(large_a, large_b);
    }
}
