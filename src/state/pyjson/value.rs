//! The value model: [`Value`], [`Int`] and [`Dict`], with their constructors and accessors.

use std::fmt;

use compact_str::CompactString;
use num_bigint::BigInt;

use super::{Dict, JsonError, dumps};

/// A JSON value as CPython's `json` module models it.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum Value {
    /// `null` (Python `None`).
    #[default]
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer literal (no fraction, no exponent), unbounded like a Python `int`.
    Int(Int),
    /// A number literal with a fraction or an exponent. Always finite when produced by [`loads`](super::loads).
    Float(f64),
    /// A string.
    Str(String),
    /// An array (Python `list`).
    List(Vec<Value>),
    /// An object (Python `dict`), keys in insertion order.
    Dict(Dict),
}

/// A Python `int`: an `i64` when it fits, otherwise a [`BigInt`].
///
/// Equality is numeric: `Int::Big(5.into()) == Int::Small(5)`. Constructors (`From`) always pick the
/// `Small` form when the value fits in an `i64`.
#[derive(Clone, Debug)]
pub enum Int {
    /// A value that fits in an `i64`.
    Small(i64),
    /// Any other value (normally one outside the `i64` range).
    Big(BigInt),
}

impl Int {
    /// Builds an `Int` from a [`BigInt`], using the `Small` form when the value fits in an `i64`.
    pub fn from_bigint(value: BigInt) -> Self {
        match i64::try_from(&value) {
            Ok(small) => Int::Small(small),
            Err(_) => Int::Big(value),
        }
    }

    /// The value as an `i64`, if it fits.
    pub fn to_i64(&self) -> Option<i64> {
        match self {
            Int::Small(v) => Some(*v),
            Int::Big(b) => i64::try_from(b).ok(),
        }
    }

    /// The value as a `u64`, if it fits (i.e. it is non-negative and small enough).
    pub fn to_u64(&self) -> Option<u64> {
        match self {
            Int::Small(v) => u64::try_from(*v).ok(),
            Int::Big(b) => u64::try_from(b).ok(),
        }
    }

    /// The value as an `i128`, if it fits.
    pub fn to_i128(&self) -> Option<i128> {
        match self {
            Int::Small(v) => Some(i128::from(*v)),
            Int::Big(b) => i128::try_from(b).ok(),
        }
    }

    /// The value as a `u128`, if it fits.
    pub fn to_u128(&self) -> Option<u128> {
        match self {
            Int::Small(v) => u128::try_from(*v).ok(),
            Int::Big(b) => u128::try_from(b).ok(),
        }
    }

    /// The value as a [`BigInt`].
    pub fn to_bigint(&self) -> BigInt {
        match self {
            Int::Small(v) => BigInt::from(*v),
            Int::Big(b) => b.clone(),
        }
    }

    /// `true` when the value is below zero.
    pub fn is_negative(&self) -> bool {
        match self {
            Int::Small(v) => *v < 0,
            Int::Big(b) => b.sign() == num_bigint::Sign::Minus,
        }
    }
}

impl PartialEq for Int {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Int::Small(a), Int::Small(b)) => a == b,
            (Int::Big(a), Int::Big(b)) => a == b,
            (Int::Small(a), Int::Big(b)) | (Int::Big(b), Int::Small(a)) => {
                i64::try_from(b).is_ok_and(|b| b == *a)
            }
        }
    }
}

impl Eq for Int {}

impl fmt::Display for Int {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Int::Small(v) => write!(f, "{v}"),
            Int::Big(b) => write!(f, "{b}"),
        }
    }
}

impl From<i64> for Int {
    fn from(value: i64) -> Self {
        Int::Small(value)
    }
}

impl From<i32> for Int {
    fn from(value: i32) -> Self {
        Int::Small(i64::from(value))
    }
}

impl From<u32> for Int {
    fn from(value: u32) -> Self {
        Int::Small(i64::from(value))
    }
}

impl From<u64> for Int {
    fn from(value: u64) -> Self {
        match i64::try_from(value) {
            Ok(v) => Int::Small(v),
            Err(_) => Int::Big(BigInt::from(value)),
        }
    }
}

impl From<i128> for Int {
    fn from(value: i128) -> Self {
        Int::from_bigint(BigInt::from(value))
    }
}

impl From<u128> for Int {
    fn from(value: u128) -> Self {
        Int::from_bigint(BigInt::from(value))
    }
}

impl From<BigInt> for Int {
    fn from(value: BigInt) -> Self {
        Int::from_bigint(value)
    }
}

impl Value {
    /// The Python-ish name of the value's type, for error messages: `null`, `bool`, `int`, `float`,
    /// `str`, `list` or `dict`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
        }
    }

    /// `true` for [`Value::Null`].
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The string, if this is a [`Value::Str`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if this is a [`Value::Bool`].
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The integer, if this is a [`Value::Int`].
    pub fn as_int(&self) -> Option<&Int> {
        match self {
            Value::Int(i) => Some(i),
            _ => None,
        }
    }

    /// The integer as an `i64`, if this is a [`Value::Int`] that fits.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_int().and_then(Int::to_i64)
    }

    /// The integer as a `u64`, if this is a [`Value::Int`] that fits.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_int().and_then(Int::to_u64)
    }

    /// The float, if this is a [`Value::Float`] (integers are not converted).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The items, if this is a [`Value::List`].
    pub fn as_list(&self) -> Option<&Vec<Value>> {
        match self {
            Value::List(items) => Some(items),
            _ => None,
        }
    }

    /// The items, mutably, if this is a [`Value::List`].
    pub fn as_list_mut(&mut self) -> Option<&mut Vec<Value>> {
        match self {
            Value::List(items) => Some(items),
            _ => None,
        }
    }

    /// The dict, if this is a [`Value::Dict`].
    pub fn as_dict(&self) -> Option<&Dict> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    /// The dict, mutably, if this is a [`Value::Dict`].
    pub fn as_dict_mut(&mut self) -> Option<&mut Dict> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    /// `self[key]` when this is a dict holding `key`; `None` otherwise.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_dict().and_then(|d| d.get(key))
    }

    /// `self[index]` when this is a list long enough; `None` otherwise.
    pub fn get_index(&self, index: usize) -> Option<&Value> {
        self.as_list().and_then(|l| l.get(index))
    }

    /// Shorthand for [`dumps`].
    pub fn to_json(&self) -> Result<String, JsonError> {
        dumps(self)
    }
}

static NULL: Value = Value::Null;

/// `value["key"]`: the entry of a dict, or `null` when this is not a dict or has no such key (never
/// panics, like `serde_json::Value`).
impl std::ops::Index<&str> for Value {
    type Output = Value;

    fn index(&self, key: &str) -> &Value {
        self.get(key).unwrap_or(&NULL)
    }
}

/// `value[i]`: the item of a list, or `null` when this is not a list or is too short (never panics).
impl std::ops::Index<usize> for Value {
    type Output = Value;

    fn index(&self, index: usize) -> &Value {
        self.get_index(index).unwrap_or(&NULL)
    }
}

impl From<bool> for Value {
    fn from(value: bool) -> Self {
        Value::Bool(value)
    }
}

impl From<i64> for Value {
    fn from(value: i64) -> Self {
        Value::Int(Int::Small(value))
    }
}

impl From<i32> for Value {
    fn from(value: i32) -> Self {
        Value::Int(Int::from(value))
    }
}

impl From<u64> for Value {
    fn from(value: u64) -> Self {
        Value::Int(Int::from(value))
    }
}

impl From<Int> for Value {
    fn from(value: Int) -> Self {
        Value::Int(value)
    }
}

impl From<BigInt> for Value {
    fn from(value: BigInt) -> Self {
        Value::Int(Int::from_bigint(value))
    }
}

impl From<f64> for Value {
    fn from(value: f64) -> Self {
        Value::Float(value)
    }
}

impl From<&str> for Value {
    fn from(value: &str) -> Self {
        Value::Str(value.to_owned())
    }
}

impl From<String> for Value {
    fn from(value: String) -> Self {
        Value::Str(value)
    }
}

impl From<Vec<Value>> for Value {
    fn from(value: Vec<Value>) -> Self {
        Value::List(value)
    }
}

impl From<Dict> for Value {
    fn from(value: Dict) -> Self {
        Value::Dict(value)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(value: Option<T>) -> Self {
        value.map_or(Value::Null, Into::into)
    }
}

impl FromIterator<Value> for Value {
    fn from_iter<I: IntoIterator<Item = Value>>(iter: I) -> Self {
        Value::List(iter.into_iter().collect())
    }
}

impl<K: Into<CompactString>> FromIterator<(K, Value)> for Value {
    fn from_iter<I: IntoIterator<Item = (K, Value)>>(iter: I) -> Self {
        Value::Dict(iter.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}
