//! JSON exactly as CPython's `json` module reads and writes it.
//!
//! [`loads`] behaves like `json.loads(text)` and [`dumps`] produces the very bytes `json.dumps(value)`
//! produces (default arguments: `ensure_ascii=True`, separators `", "` and `": "`, keys in insertion
//! order). The value model, [`Value`], mirrors what Python builds: `dict`s keep key order, integers are
//! unbounded ([`Int`]) and floats are `f64`.
//!
//! Deliberate differences from CPython, all of them refusals of input that CPython would accept:
//!
//! * `NaN`, `Infinity` and `-Infinity` are rejected by [`loads`] (CPython accepts them by default) and
//!   non-finite floats are rejected by [`dumps`] (CPython writes `NaN`/`Infinity`, which is not JSON).
//! * A number literal too large for a float (`1e400`) is rejected instead of becoming `inf`.
//! * A `\uXXXX` escape of a lone UTF-16 surrogate is rejected: a Rust [`String`] cannot hold it.
//! * Integers of more than 4300 digits are rejected on both sides, like CPython 3.11+ does by default
//!   (`sys.get_int_max_str_digits()`).
//! * Lists and dicts may be nested at most [`MAX_DEPTH`] levels deep (CPython's default recursion limit
//!   stops at a similar depth).
//!
//! Both directions are hand-written for speed and exactness: the parser follows CPython's `_json.c`
//! scanner (same grammar, same error messages and positions) and scans strings eight bytes at a time;
//! the writer scans for bytes to escape the same way and uses [`ryu`] for the shortest round-trip
//! float digits, re-formatted to Python's `float.__repr__` rules. Both are iterative, so deeply
//! nested input cannot overflow the stack.

use std::fmt;

use indexmap::IndexMap;
use num_bigint::BigInt;

/// The deepest nesting of lists and dicts that [`loads`] accepts and [`dumps`] writes.
pub const MAX_DEPTH: usize = 1000;

/// The most decimal digits an integer may have, as in CPython's default `int_max_str_digits`.
pub const MAX_INT_DIGITS: usize = 4300;

/// A JSON object as Python holds it: keys in insertion order.
pub type Dict = IndexMap<String, Value>;

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
    /// A number literal with a fraction or an exponent. Always finite when produced by [`loads`].
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

/// Errors of [`loads`], [`dumps`] and the conversions to other JSON models.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JsonError {
    /// The text is not JSON that this module accepts. `line` and `column` are 1-based; the column
    /// counts characters (not bytes), like CPython's `json.JSONDecodeError`.
    #[error("invalid JSON at line {line} column {column}: {message}")]
    Syntax {
        /// 1-based line of the offending character.
        line: usize,
        /// 1-based column (in characters) of the offending character.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A float that is NaN or infinite cannot be written as JSON.
    #[error("cannot write the non-finite float {value} as JSON")]
    NonFiniteFloat {
        /// The offending value.
        value: f64,
    },
    /// An integer with more than [`MAX_INT_DIGITS`] digits (CPython refuses to convert it to text).
    #[error("cannot write an integer of {digits} digits as JSON (the limit is {MAX_INT_DIGITS})")]
    IntTooLong {
        /// Number of decimal digits.
        digits: usize,
    },
    /// Lists/dicts nested deeper than [`MAX_DEPTH`].
    #[error("cannot write a value nested more than {MAX_DEPTH} levels deep as JSON")]
    TooDeep,
    /// The value has no equivalent in the target model (e.g. `serde_json::Value`).
    #[error("cannot convert {what}")]
    NotRepresentable {
        /// What could not be converted, and why.
        what: String,
    },
}

// ---------------------------------------------------------------------------------------------------
// Int
// ---------------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------------
// Value helpers
// ---------------------------------------------------------------------------------------------------

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

impl<K: Into<String>> FromIterator<(K, Value)> for Value {
    fn from_iter<I: IntoIterator<Item = (K, Value)>>(iter: I) -> Self {
        Value::Dict(iter.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

// ---------------------------------------------------------------------------------------------------
// serde / serde_json interop
// ---------------------------------------------------------------------------------------------------

/// Serializes the value into any serde format (e.g. to embed it in an HTTP body with `serde_json`).
///
/// * Dict keys keep their order.
/// * An [`Int::Big`] is serialized as an `i128`/`u128` when it fits one; a larger one is a serde error
///   naming the problem (serde has no unbounded integer).
/// * A non-finite float is a serde error (`serde_json` would otherwise silently write `null`).
impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeMap, SerializeSeq};
        match self {
            Value::Null => serializer.serialize_unit(),
            Value::Bool(b) => serializer.serialize_bool(*b),
            Value::Int(Int::Small(v)) => serializer.serialize_i64(*v),
            Value::Int(big @ Int::Big(_)) => {
                if let Some(v) = big.to_i64() {
                    serializer.serialize_i64(v)
                } else if let Some(v) = big.to_u64() {
                    serializer.serialize_u64(v)
                } else if let Some(v) = big.to_i128() {
                    serializer.serialize_i128(v)
                } else if let Some(v) = big.to_u128() {
                    serializer.serialize_u128(v)
                } else {
                    Err(S::Error::custom(format_args!(
                        "integer {big} does not fit in 128 bits and cannot be serialized"
                    )))
                }
            }
            Value::Float(f) => {
                if f.is_finite() {
                    serializer.serialize_f64(*f)
                } else {
                    Err(S::Error::custom(format_args!(
                        "the non-finite float {f} cannot be serialized as JSON"
                    )))
                }
            }
            Value::Str(s) => serializer.serialize_str(s),
            Value::List(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Dict(dict) => {
                let mut map = serializer.serialize_map(Some(dict.len()))?;
                for (k, v) in dict {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl From<serde_json::Value> for Value {
    fn from(value: serde_json::Value) -> Self {
        match value {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(b),
            serde_json::Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Value::Int(Int::Small(i))
                } else if let Some(u) = n.as_u64() {
                    Value::Int(Int::from(u))
                } else {
                    // Without serde_json's `arbitrary_precision`, any other number is an f64.
                    Value::Float(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            serde_json::Value::String(s) => Value::Str(s),
            serde_json::Value::Array(items) => {
                Value::List(items.into_iter().map(Value::from).collect())
            }
            serde_json::Value::Object(map) => {
                Value::Dict(map.into_iter().map(|(k, v)| (k, Value::from(v))).collect())
            }
        }
    }
}

impl TryFrom<&Value> for serde_json::Value {
    type Error = JsonError;

    /// Converts to a `serde_json::Value` (key order kept). Fails for non-finite floats and for
    /// integers outside the `i64`/`u64` range, which `serde_json::Number` cannot hold.
    fn try_from(value: &Value) -> Result<Self, Self::Error> {
        Ok(match value {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => {
                if let Some(v) = i.to_i64() {
                    serde_json::Value::from(v)
                } else if let Some(v) = i.to_u64() {
                    serde_json::Value::from(v)
                } else {
                    return Err(JsonError::NotRepresentable {
                        what: format!("the integer {i} to serde_json (outside the i64/u64 range)"),
                    });
                }
            }
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map(serde_json::Value::Number)
                .ok_or_else(|| JsonError::NotRepresentable {
                    what: format!("the non-finite float {f} to serde_json"),
                })?,
            Value::Str(s) => serde_json::Value::String(s.clone()),
            Value::List(items) => serde_json::Value::Array(
                items
                    .iter()
                    .map(serde_json::Value::try_from)
                    .collect::<Result<_, _>>()?,
            ),
            Value::Dict(dict) => {
                let mut map = serde_json::Map::with_capacity(dict.len());
                for (k, v) in dict {
                    map.insert(k.clone(), serde_json::Value::try_from(v)?);
                }
                serde_json::Value::Object(map)
            }
        })
    }
}

impl TryFrom<Value> for serde_json::Value {
    type Error = JsonError;

    /// See the implementation for `&Value`.
    fn try_from(value: Value) -> Result<Self, Self::Error> {
        serde_json::Value::try_from(&value)
    }
}

// ---------------------------------------------------------------------------------------------------
// loads
// ---------------------------------------------------------------------------------------------------

/// A parse failure at a byte offset, before the offset is turned into line/column.
struct Fail {
    index: usize,
    message: String,
}

fn fail(index: usize, message: impl Into<String>) -> Fail {
    Fail {
        index,
        message: message.into(),
    }
}

/// Parses JSON text like CPython's `json.loads(text)`.
///
/// Duplicate keys keep the last value at the first key's position (as assigning into a Python dict
/// does). Errors carry CPython's message and position (`Expecting ',' delimiter` at line 3
/// column 7, ...). Additionally rejected (see the module docs): `NaN`/`Infinity`, float literals
/// out of the `f64` range (`1e400`), lone-surrogate escapes, integers of more than
/// [`MAX_INT_DIGITS`] digits and nesting deeper than [`MAX_DEPTH`].
pub fn loads(text: &str) -> Result<Value, JsonError> {
    if text.starts_with('\u{feff}') {
        return Err(syntax_error(
            text,
            0,
            "Unexpected UTF-8 BOM (decode using utf-8-sig)".to_owned(),
        ));
    }
    let mut parser = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
        refusal: None,
        items: Vec::new(),
        entries: Vec::new(),
        scratch: String::new(),
    };
    let result = parser.document().and_then(|value| {
        parser.skip_ws();
        if parser.pos != parser.bytes.len() {
            Err(fail(parser.pos, "Extra data"))
        } else if let Some(refusal) = parser.refusal.take() {
            Err(refusal)
        } else {
            Ok(value)
        }
    });
    result.map_err(|f| syntax_error(text, f.index, f.message))
}

/// An open container while parsing. Its items so far sit at the end of the parser's shared
/// `items`/`entries` stacks from `start` on, so each container is allocated once, at its exact size,
/// when it closes.
enum Open {
    List { start: usize },
    Dict { start: usize, key: String },
}

/// A recursive-descent parser following CPython's `_json.c` scanner (same grammar, same error
/// messages and positions), made iterative so that nesting cannot exhaust the thread's stack.
struct Parser<'t> {
    text: &'t str,
    bytes: &'t [u8],
    pos: usize,
    /// The first construct CPython accepts but we refuse (`NaN`, `1e400`, a lone surrogate). Parsing
    /// carries on like CPython, so that an error later in the text is reported exactly as CPython
    /// reports it; the refusal is reported if the text is otherwise valid.
    refusal: Option<Fail>,
    /// Items of the open lists, innermost last.
    items: Vec<Value>,
    /// Entries of the open dicts, innermost last.
    entries: Vec<(String, Value)>,
    /// Reused buffer for decoding strings with escapes.
    scratch: String,
}

impl Parser<'_> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    #[inline]
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Records a refusal (only the first one is kept).
    fn refuse(&mut self, index: usize, message: String) {
        self.refusal.get_or_insert(Fail { index, message });
    }

    /// Reads one value (after leading whitespace).
    fn document(&mut self) -> Result<Value, Fail> {
        let mut stack: Vec<Open> = Vec::new();
        self.skip_ws();
        'value: loop {
            // At the start of a value: read a complete value, or open a non-empty container and go
            // on with its first value.
            let mut value = match self.peek() {
                Some(b'[') => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(too_deep(self.pos));
                    }
                    self.pos += 1;
                    self.skip_ws();
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                        Value::List(Vec::new())
                    } else {
                        stack.push(Open::List {
                            start: self.items.len(),
                        });
                        continue 'value;
                    }
                }
                Some(b'{') => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(too_deep(self.pos));
                    }
                    self.pos += 1;
                    self.skip_ws();
                    if self.peek() == Some(b'}') {
                        self.pos += 1;
                        Value::Dict(Dict::new())
                    } else {
                        let key = self.key()?;
                        stack.push(Open::Dict {
                            start: self.entries.len(),
                            key,
                        });
                        continue 'value;
                    }
                }
                _ => self.scalar()?,
            };
            // Hand the complete value to its container, closing every container that ends here.
            loop {
                let Some(open) = stack.pop() else {
                    return Ok(value);
                };
                self.skip_ws();
                match open {
                    Open::List { start } => {
                        self.items.push(value);
                        match self.peek() {
                            Some(b']') => {
                                self.pos += 1;
                                value = Value::List(self.items.drain(start..).collect());
                            }
                            Some(b',') => {
                                self.pos += 1;
                                self.skip_ws();
                                stack.push(Open::List { start });
                                continue 'value;
                            }
                            _ => return Err(fail(self.pos, "Expecting ',' delimiter")),
                        }
                    }
                    Open::Dict { start, key } => {
                        self.entries.push((key, value));
                        match self.peek() {
                            Some(b'}') => {
                                self.pos += 1;
                                let entries = self.entries.drain(start..);
                                let mut dict = Dict::with_capacity(entries.len());
                                // `insert` keeps an existing key's position and replaces its value:
                                // what assigning into a Python dict does with duplicate keys.
                                for (k, v) in entries {
                                    dict.insert(k, v);
                                }
                                value = Value::Dict(dict);
                            }
                            Some(b',') => {
                                self.pos += 1;
                                self.skip_ws();
                                let key = self.key()?;
                                stack.push(Open::Dict { start, key });
                                continue 'value;
                            }
                            _ => return Err(fail(self.pos, "Expecting ',' delimiter")),
                        }
                    }
                }
            }
        }
    }

    /// Reads `"key" :` and the whitespace after it.
    fn key(&mut self) -> Result<String, Fail> {
        if self.peek() != Some(b'"') {
            return Err(fail(
                self.pos,
                "Expecting property name enclosed in double quotes",
            ));
        }
        let key = self.string()?;
        self.skip_ws();
        if self.peek() != Some(b':') {
            return Err(fail(self.pos, "Expecting ':' delimiter"));
        }
        self.pos += 1;
        self.skip_ws();
        Ok(key)
    }

    /// Reads a string, a literal or a number.
    fn scalar(&mut self) -> Result<Value, Fail> {
        let rest = &self.bytes[self.pos..];
        let literal =
            |word: &[u8], value: Value| rest.starts_with(word).then_some((word.len(), value));
        let found = match rest.first() {
            None => return Err(fail(self.pos, "Expecting value")),
            Some(b'"') => return self.string().map(Value::Str),
            Some(b'n') => literal(b"null", Value::Null),
            Some(b't') => literal(b"true", Value::Bool(true)),
            Some(b'f') => literal(b"false", Value::Bool(false)),
            _ => None,
        };
        if let Some((len, value)) = found {
            self.pos += len;
            return Ok(value);
        }
        for (word, value) in [
            ("NaN", f64::NAN),
            ("Infinity", f64::INFINITY),
            ("-Infinity", f64::NEG_INFINITY),
        ] {
            if rest.starts_with(word.as_bytes()) {
                self.refuse(
                    self.pos,
                    format!("`{word}` is not valid JSON (non-finite numbers are rejected)"),
                );
                self.pos += word.len();
                return Ok(Value::Float(value));
            }
        }
        self.number()
    }

    /// Reads a number with CPython's rules: `-?(0|[1-9][0-9]*)`, then a fraction only when a digit
    /// follows the `.`, then an exponent only when it has digits (otherwise the number ends before
    /// the `.`/`e`, and the caller reports what follows).
    fn number(&mut self) -> Result<Value, Fail> {
        let b = self.bytes;
        let start = self.pos;
        let mut i = start;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        let digits_start = i;
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while b.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
            }
            _ => return Err(fail(start, "Expecting value")),
        }
        let int_end = i;
        let mut is_float = false;
        if b.get(i) == Some(&b'.') && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            is_float = true;
            i += 2;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        if let Some(b'e' | b'E') = b.get(i) {
            let mut j = i + 1;
            if let Some(b'+' | b'-') = b.get(j) {
                j += 1;
            }
            let exp_digits = j;
            while b.get(j).is_some_and(u8::is_ascii_digit) {
                j += 1;
            }
            if j > exp_digits {
                is_float = true;
                i = j;
            }
        }
        self.pos = i;
        let literal = &self.text[start..i];
        if is_float {
            return match literal.parse::<f64>() {
                Ok(f) => {
                    if !f.is_finite() {
                        self.refuse(
                            start,
                            format!("number `{literal}` is out of range for a float"),
                        );
                    }
                    Ok(Value::Float(f))
                }
                Err(e) => Err(fail(start, format!("invalid number `{literal}`: {e}"))),
            };
        }
        let digits = int_end - digits_start;
        if digits <= 18 {
            let mut v: i64 = 0;
            for &d in &b[digits_start..int_end] {
                v = v * 10 + i64::from(d - b'0');
            }
            return Ok(Value::Int(Int::Small(if digits_start > start {
                -v
            } else {
                v
            })));
        }
        if digits > MAX_INT_DIGITS {
            return Err(fail(
                start,
                format!(
                    "integer of {digits} digits exceeds the limit of {MAX_INT_DIGITS} digits \
                     (as CPython's int_max_str_digits)"
                ),
            ));
        }
        literal
            .parse::<BigInt>()
            .map(|big| Value::Int(Int::from_bigint(big)))
            .map_err(|e| fail(start, format!("invalid integer `{literal}`: {e}")))
    }

    /// Reads a string literal starting at the opening quote.
    fn string(&mut self) -> Result<String, Fail> {
        let b = self.bytes;
        let begin = self.pos;
        let start = begin + 1;
        let mut i = scan_string_plain(b, start);
        if b.get(i) == Some(&b'"') {
            // No escapes: one allocation, one copy.
            self.pos = i + 1;
            return Ok(self.text[start..i].to_owned());
        }
        // Decode into the reusable scratch buffer, then copy once into an exact-size string.
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        out.push_str(&self.text[start..i]);
        let result = loop {
            match b.get(i) {
                None => break Err(fail(begin, "Unterminated string starting at")),
                Some(b'"') => {
                    self.pos = i + 1;
                    break Ok(out.as_str().to_owned());
                }
                Some(b'\\') => match self.escape(i, begin, &mut out) {
                    Ok(next) => i = next,
                    Err(e) => break Err(e),
                },
                Some(_) => break Err(fail(i, "Invalid control character at")),
            }
            let run = i;
            i = scan_string_plain(b, i);
            out.push_str(&self.text[run..i]);
        };
        self.scratch = out;
        result
    }

    /// Decodes the escape whose backslash is at `at` into `out`; returns the index after it.
    fn escape(&mut self, at: usize, begin: usize, out: &mut String) -> Result<usize, Fail> {
        let b = self.bytes;
        let Some(&kind) = b.get(at + 1) else {
            return Err(fail(begin, "Unterminated string starting at"));
        };
        let simple = match kind {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                // CPython wants at least one character after the 4 hex digits (`end >= len`).
                let u_at = at + 1;
                if u_at + 5 >= b.len() {
                    return Err(fail(u_at, "Invalid \\uXXXX escape"));
                }
                let unit = hex4(&b[u_at + 1..u_at + 5])
                    .ok_or_else(|| fail(u_at, "Invalid \\uXXXX escape"))?;
                let mut next = u_at + 5;
                let mut code = unit;
                if (0xD800..0xDC00).contains(&unit)
                    && next + 6 < b.len()
                    && b[next] == b'\\'
                    && b[next + 1] == b'u'
                {
                    // A high surrogate: CPython joins it with a following `\uDC00`-`\uDFFF` escape
                    // (and otherwise reads that escape on its own).
                    let low = hex4(&b[next + 2..next + 6])
                        .ok_or_else(|| fail(next + 1, "Invalid \\uXXXX escape"))?;
                    if (0xDC00..0xE000).contains(&low) {
                        next += 6;
                        code = 0x1_0000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                    }
                }
                match char::from_u32(code) {
                    Some(c) => out.push(c),
                    None => {
                        // A lone surrogate: CPython keeps it; a Rust string cannot.
                        self.refuse(at, LONE_SURROGATE.to_owned());
                        out.push(char::REPLACEMENT_CHARACTER);
                    }
                }
                return Ok(next);
            }
            _ => return Err(fail(at, "Invalid \\escape")),
        };
        out.push(simple);
        Ok(at + 2)
    }
}

/// The value of 4 hex digits.
#[inline]
fn hex4(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0u32, |acc, &d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            b'A'..=b'F' => d - b'A' + 10,
            _ => return None,
        };
        Some(acc << 4 | u32::from(v))
    })
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Bit 7 of each byte of the result is set where the byte of `w` is zero (exact for the lowest
/// such byte, which is all the callers use).
#[inline]
fn zero_bytes(w: u64) -> u64 {
    w.wrapping_sub(ONES) & !w & HIGHS
}

/// Bit 7 set where the byte of `w` is below 0x20 (exact for the lowest such byte).
#[inline]
fn control_bytes(w: u64) -> u64 {
    w.wrapping_sub(ONES * 0x20) & !w & HIGHS
}

/// The first index from `i` of a `"`, a `\` or a control character (or the end): the end of a run
/// that can be copied as is while parsing a string. Eight bytes at a time.
#[inline]
fn scan_string_plain(b: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = b.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        let hits = zero_bytes(w ^ (ONES * u64::from(b'"')))
            | zero_bytes(w ^ (ONES * u64::from(b'\\')))
            | control_bytes(w);
        if hits != 0 {
            return i + (hits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        i += 1;
    }
    i
}

fn too_deep(index: usize) -> Fail {
    fail(
        index,
        format!("lists/dicts nested more than {MAX_DEPTH} levels deep"),
    )
}

const LONE_SURROGATE: &str =
    "lone UTF-16 surrogate in \\u escape (CPython keeps it, but it cannot be represented in UTF-8)";

fn syntax_error(text: &str, index: usize, message: String) -> JsonError {
    let (line, column) = line_column(text.as_bytes(), index);
    JsonError::Syntax {
        line,
        column,
        message,
    }
}

/// 1-based line and character column of byte `index` (clamped to the end of `data`), computed as
/// CPython does for `JSONDecodeError` (`lineno`, `colno`).
fn line_column(data: &[u8], index: usize) -> (usize, usize) {
    let index = index.min(data.len());
    let before = &data[..index];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    // Count characters, not bytes: skip UTF-8 continuation bytes.
    let column = before[line_start..]
        .iter()
        .filter(|&&b| (b & 0xC0) != 0x80)
        .count()
        + 1;
    (line, column)
}

// ---------------------------------------------------------------------------------------------------
// dumps
// ---------------------------------------------------------------------------------------------------

/// Writes `value` exactly as CPython's `json.dumps(value)` does (default arguments).
///
/// Fails for non-finite floats, integers of more than [`MAX_INT_DIGITS`] digits, and nesting deeper
/// than [`MAX_DEPTH`].
pub fn dumps(value: &Value) -> Result<String, JsonError> {
    let mut writer = Writer::strict();
    writer.value(value)?;
    Ok(writer.finish())
}

/// The byte-level encoder behind [`dumps`], usable to write a document piece by piece (the RunState
/// writer emits its top-level dict this way without building it first).
pub(crate) struct Writer {
    /// Only ASCII is ever written (`ensure_ascii`), so this is always valid UTF-8.
    out: Vec<u8>,
    /// When set, values [`dumps`] refuses are written the way CPython's `json.dumps` writes them
    /// (`NaN`, `Infinity`, `-Infinity`, integers in full) and values nested too deep become `null`.
    lenient: bool,
    depth: usize,
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// For each byte: 0 = copy as is, b'u' = `\u00XX`, other = the short escape letter.
/// Bytes >= 0x80 are marked 1: start (or continuation) of a non-ASCII character.
static ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        table[i] = b'u';
        i += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table[0x7f] = b'u';
    let mut i = 0x80;
    while i < 0x100 {
        table[i] = 1;
        i += 1;
    }
    table
};

impl Writer {
    /// A writer that fails where [`dumps`] fails.
    pub(crate) fn strict() -> Self {
        Writer {
            out: Vec::with_capacity(256),
            lenient: false,
            depth: 0,
        }
    }

    /// A writer that never fails (see the `lenient` field).
    pub(crate) fn lenient() -> Self {
        Writer {
            out: Vec::with_capacity(256),
            lenient: true,
            depth: 0,
        }
    }

    /// The text written so far.
    pub(crate) fn finish(self) -> String {
        // Everything written is ASCII; the lossy branch cannot be taken.
        String::from_utf8(self.out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// Appends raw, already-encoded JSON punctuation (must be ASCII).
    pub(crate) fn raw(&mut self, text: &str) {
        self.out.extend_from_slice(text.as_bytes());
    }

    /// Appends a JSON string literal.
    pub(crate) fn str(&mut self, s: &str) {
        write_str(&mut self.out, s);
    }

    /// Appends an unsigned integer.
    pub(crate) fn u64(&mut self, v: u64) {
        push_u64(&mut self.out, v);
    }

    /// Appends a value that sits inside `open` containers written with [`Writer::raw`] (so that the
    /// depth limit counts them, exactly as [`dumps`] of the whole document would).
    pub(crate) fn nested_value(&mut self, value: &Value, open: usize) -> Result<(), JsonError> {
        let saved = self.depth;
        self.depth = open;
        let result = self.value(value);
        self.depth = saved;
        result
    }

    /// Appends any value. Iterative (an explicit stack of open containers), so deep values cannot
    /// exhaust the thread's stack.
    pub(crate) fn value(&mut self, root: &Value) -> Result<(), JsonError> {
        enum Open<'v> {
            List(std::slice::Iter<'v, Value>),
            Dict(indexmap::map::Iter<'v, String, Value>),
        }
        let mut stack: Vec<Open<'_>> = Vec::new();
        let mut current = root;
        loop {
            // Write `current`, or open it and continue with its first item.
            let mut next = None;
            match current {
                Value::List(items) if !items.is_empty() => {
                    if self.enter(stack.len())? {
                        self.out.push(b'[');
                        let mut iter = items.iter();
                        next = iter.next();
                        stack.push(Open::List(iter));
                    }
                }
                Value::Dict(dict) if !dict.is_empty() => {
                    if self.enter(stack.len())? {
                        self.out.push(b'{');
                        let mut iter = dict.iter();
                        if let Some((k, v)) = iter.next() {
                            write_str(&mut self.out, k);
                            self.out.extend_from_slice(b": ");
                            next = Some(v);
                        }
                        stack.push(Open::Dict(iter));
                    }
                }
                scalar => self.scalar(scalar)?,
            }
            // Move on to the next item, closing every container that ends here.
            while next.is_none() {
                match stack.last_mut() {
                    None => return Ok(()),
                    Some(Open::List(iter)) => match iter.next() {
                        Some(item) => {
                            self.out.extend_from_slice(b", ");
                            next = Some(item);
                        }
                        None => {
                            self.out.push(b']');
                            stack.pop();
                        }
                    },
                    Some(Open::Dict(iter)) => match iter.next() {
                        Some((k, v)) => {
                            self.out.extend_from_slice(b", ");
                            write_str(&mut self.out, k);
                            self.out.extend_from_slice(b": ");
                            next = Some(v);
                        }
                        None => {
                            self.out.push(b'}');
                            stack.pop();
                        }
                    },
                }
            }
            if let Some(item) = next {
                current = item;
            }
        }
    }

    /// Appends a value that is not a non-empty list or dict.
    fn scalar(&mut self, value: &Value) -> Result<(), JsonError> {
        match value {
            Value::Null => self.out.extend_from_slice(b"null"),
            Value::Bool(true) => self.out.extend_from_slice(b"true"),
            Value::Bool(false) => self.out.extend_from_slice(b"false"),
            Value::Int(Int::Small(v)) => {
                if *v < 0 {
                    self.out.push(b'-');
                }
                push_u64(&mut self.out, v.unsigned_abs());
            }
            Value::Int(Int::Big(b)) => {
                let text = b.to_string();
                let digits = text.len() - usize::from(text.starts_with('-'));
                if digits > MAX_INT_DIGITS && !self.lenient {
                    return Err(JsonError::IntTooLong { digits });
                }
                self.out.extend_from_slice(text.as_bytes());
            }
            Value::Float(f) => {
                if f.is_finite() {
                    write_float(&mut self.out, *f);
                } else if self.lenient {
                    self.out.extend_from_slice(if f.is_nan() {
                        b"NaN"
                    } else if *f > 0.0 {
                        b"Infinity"
                    } else {
                        b"-Infinity"
                    });
                } else {
                    return Err(JsonError::NonFiniteFloat { value: *f });
                }
            }
            Value::Str(s) => write_str(&mut self.out, s),
            Value::List(_) => self.out.extend_from_slice(b"[]"),
            Value::Dict(_) => self.out.extend_from_slice(b"{}"),
        }
        Ok(())
    }

    /// Checks that one more container fits inside the `open` ones. `Ok(false)`: it does not, and the
    /// lenient writer wrote `null` instead.
    fn enter(&mut self, open: usize) -> Result<bool, JsonError> {
        if self.depth + open >= MAX_DEPTH {
            if self.lenient {
                self.out.extend_from_slice(b"null");
                return Ok(false);
            }
            return Err(JsonError::TooDeep);
        }
        Ok(true)
    }
}

/// Appends `s` as a JSON string literal with CPython's `ensure_ascii=True` escaping.
fn write_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    loop {
        let i = scan_ascii_plain(bytes, start);
        out.extend_from_slice(&bytes[start..i]);
        let Some(&byte) = bytes.get(i) else {
            break;
        };
        if byte >= 0x80 {
            // Non-ASCII: decode one UTF-8 sequence (the input is valid UTF-8).
            let (cp, len) = decode_utf8(&bytes[i..]);
            if cp >= 0x1_0000 {
                let v = cp - 0x1_0000;
                push_u_escape(out, 0xD800 | (v >> 10));
                push_u_escape(out, 0xDC00 | (v & 0x3FF));
            } else {
                push_u_escape(out, cp);
            }
            start = i + len;
        } else {
            match ESCAPE[usize::from(byte)] {
                0 => out.push(byte),
                b'u' => push_u_escape(out, u32::from(byte)),
                short => out.extend_from_slice(&[b'\\', short]),
            }
            start = i + 1;
        }
    }
    out.push(b'"');
}

/// The first index from `i` of a byte that `ensure_ascii` escapes (`"`, `\`, controls, DEL,
/// non-ASCII), or the end. Eight bytes at a time.
#[inline]
fn scan_ascii_plain(b: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = b.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        let hits = zero_bytes(w ^ (ONES * u64::from(b'"')))
            | zero_bytes(w ^ (ONES * u64::from(b'\\')))
            | zero_bytes(w ^ (ONES * 0x7f))
            | control_bytes(w)
            | (w & HIGHS);
        if hits != 0 {
            return i + (hits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if ESCAPE[usize::from(c)] != 0 {
            break;
        }
        i += 1;
    }
    i
}

/// Decodes the UTF-8 sequence at the start of `b` (known to be valid, non-ASCII).
#[inline]
fn decode_utf8(b: &[u8]) -> (u32, usize) {
    let byte = |k: usize| u32::from(b.get(k).copied().unwrap_or(0x80) & 0x3F);
    let b0 = u32::from(b[0]);
    if b0 < 0xE0 {
        (((b0 & 0x1F) << 6) | byte(1), 2)
    } else if b0 < 0xF0 {
        (((b0 & 0x0F) << 12) | (byte(1) << 6) | byte(2), 3)
    } else {
        (
            ((b0 & 0x07) << 18) | (byte(1) << 12) | (byte(2) << 6) | byte(3),
            4,
        )
    }
}

#[inline]
fn push_u_escape(out: &mut Vec<u8>, unit: u32) {
    let hex = |shift: u32| HEX[((unit >> shift) & 0xF) as usize];
    out.extend_from_slice(&[b'\\', b'u', hex(12), hex(8), hex(4), hex(0)]);
}

/// Appends the decimal digits of `v`.
#[inline]
fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[at..]);
}

/// Appends a finite float the way Python's `repr(float)` writes it.
fn write_float(out: &mut Vec<u8>, f: f64) {
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(f);
    // Split ryu's output into sign, significant digits and decimal point position `decpt`
    // (value = 0.DIGITS * 10^decpt), then lay it out with Python's rules.
    let bytes = text.as_bytes();
    let (negative, rest) = match bytes.first() {
        Some(b'-') => (true, &bytes[1..]),
        _ => (false, bytes),
    };
    let (mantissa, exponent) = match rest.iter().position(|&b| b == b'e' || b == b'E') {
        Some(p) => (&rest[..p], parse_exponent(&rest[p + 1..])),
        None => (rest, 0),
    };
    let mut digits = [0u8; 40];
    let mut n = 0usize;
    let mut int_len = 0i32;
    let mut seen_dot = false;
    for &b in mantissa {
        if b == b'.' {
            seen_dot = true;
        } else if n < digits.len() {
            digits[n] = b;
            n += 1;
            if !seen_dot {
                int_len += 1;
            }
        }
    }
    let lead = digits[..n].iter().take_while(|&&d| d == b'0').count();
    let digits_all = &digits[lead..n];
    let trail = digits_all.iter().rev().take_while(|&&d| d == b'0').count();
    let sig = &digits_all[..digits_all.len() - trail];
    if negative {
        out.push(b'-');
    }
    let Some((&first, more)) = sig.split_first() else {
        out.extend_from_slice(b"0.0");
        return;
    };
    let decpt = int_len + exponent - lead as i32;
    let len = sig.len() as i32;
    if decpt <= -4 || decpt > 16 {
        out.push(first);
        if !more.is_empty() {
            out.push(b'.');
            out.extend_from_slice(more);
        }
        let e = decpt - 1;
        out.extend_from_slice(if e < 0 { b"e-" } else { b"e+" });
        if e.unsigned_abs() < 10 {
            out.push(b'0');
        }
        push_u64(out, u64::from(e.unsigned_abs()));
    } else if decpt <= 0 {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + decpt.unsigned_abs() as usize, b'0');
        out.extend_from_slice(sig);
    } else if decpt < len {
        out.extend_from_slice(&sig[..decpt as usize]);
        out.push(b'.');
        out.extend_from_slice(&sig[decpt as usize..]);
    } else {
        out.extend_from_slice(sig);
        out.resize(out.len() + (decpt - len) as usize, b'0');
        out.extend_from_slice(b".0");
    }
}

fn parse_exponent(b: &[u8]) -> i32 {
    let (neg, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    let mut v = 0i32;
    for &d in digits {
        v = v * 10 + i32::from(d - b'0');
    }
    if neg { -v } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float_repr(f: f64) -> String {
        let mut out = Vec::new();
        write_float(&mut out, f);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn float_repr_follows_python_rules() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789.123, "123456789.123"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (-2.5, "-2.5"),
            (1e22, "1e+22"),
            (9007199254740993.0, "9007199254740992.0"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(*f), *want, "repr of {f:e}");
        }
    }

    #[test]
    fn strings_are_escaped_like_ensure_ascii() {
        let v = Value::from("a\"b\\c\n\r\t\u{8}\u{c}\u{0}\u{1f}\u{7f}é€😀");
        assert_eq!(
            dumps(&v).unwrap(),
            r#""a\"b\\c\n\r\t\b\f\u0000\u001f\u007f\u00e9\u20ac\ud83d\ude00""#
        );
    }

    #[test]
    fn separators_and_order() {
        let v = loads(r#"{"b": [1, 2.5, null, true, false], "a": {}, "c": []}"#).unwrap();
        assert_eq!(
            dumps(&v).unwrap(),
            r#"{"b": [1, 2.5, null, true, false], "a": {}, "c": []}"#
        );
    }

    #[test]
    fn duplicate_keys_keep_first_position_last_value() {
        let v = loads(r#"{"a": 1, "b": 2, "a": 3}"#).unwrap();
        assert_eq!(dumps(&v).unwrap(), r#"{"a": 3, "b": 2}"#);
    }

    #[test]
    fn big_ints_round_trip() {
        let text = "[1180591620717411303424, -1267650600228229401496703205376, 9223372036854775807, -9223372036854775808, 9223372036854775808]";
        let v = loads(text).unwrap();
        assert!(matches!(v.get_index(0), Some(Value::Int(Int::Big(_)))));
        assert!(matches!(
            v.get_index(2),
            Some(Value::Int(Int::Small(i64::MAX)))
        ));
        assert_eq!(dumps(&v).unwrap(), text);
    }

    #[test]
    fn rejects_non_finite_and_out_of_range() {
        for (text, needle) in [
            ("NaN", "NaN"),
            ("[Infinity]", "Infinity"),
            ("[1, -Infinity]", "-Infinity"),
            ("1e400", "out of range"),
            ("-1e400", "out of range"),
        ] {
            let err = loads(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
        assert_eq!(
            loads("1e-400").unwrap(),
            Value::Float(0.0),
            "underflow is fine, as in Python"
        );
        assert!(matches!(
            dumps(&Value::Float(f64::NAN)),
            Err(JsonError::NonFiniteFloat { .. })
        ));
    }

    #[test]
    fn errors_carry_line_and_character_column() {
        let err = loads("{\n  \"é\": [1,\n  2,, 3]\n}").unwrap_err();
        match err {
            JsonError::Syntax { line, column, .. } => {
                assert_eq!((line, column), (3, 5));
            }
            other => panic!("unexpected {other:?}"),
        }
        let err = loads("[\"éé\" x]").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid JSON at line 1 column 7:"),
            "{err}"
        );
    }

    #[test]
    fn rejects_lone_surrogates_bom_and_garbage() {
        for text in [
            r#""\ud800""#,
            r#""\udc00x""#,
            "\u{feff}{}",
            "",
            "   ",
            "01",
            "1.",
            ".5",
            "+1",
            "[1,]",
            "{\"a\" 1}",
            "{1: 2}",
            "[1] x",
            "tru",
            "\"a\u{1}\"",
            "'a'",
            "-",
            "-x",
            "nul",
        ] {
            assert!(loads(text).is_err(), "{text:?} should be rejected");
        }
        // A valid surrogate pair is fine.
        assert_eq!(loads(r#""\ud83d\ude00""#).unwrap(), Value::from("😀"));
    }

    #[test]
    fn depth_limit() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        let v = loads(&ok).unwrap();
        assert_eq!(dumps(&v).unwrap(), ok);
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(loads(&deep).unwrap_err().to_string().contains("nested"));
        // Empty containers are written without counting (like CPython), so nest a non-empty one.
        let mut v = Value::List(vec![Value::Null]);
        for _ in 0..MAX_DEPTH {
            v = Value::List(vec![v]);
        }
        assert_eq!(dumps(&v), Err(JsonError::TooDeep));
    }

    #[test]
    fn int_digit_limit() {
        let ok = "7".repeat(MAX_INT_DIGITS);
        assert_eq!(dumps(&loads(&ok).unwrap()).unwrap(), ok);
        let long = "7".repeat(MAX_INT_DIGITS + 1);
        assert!(loads(&long).unwrap_err().to_string().contains("digits"));
        let big: BigInt = long.parse().unwrap();
        assert!(matches!(
            dumps(&Value::from(big)),
            Err(JsonError::IntTooLong { digits }) if digits == MAX_INT_DIGITS + 1
        ));
    }

    #[test]
    fn int_equality_is_numeric() {
        assert_eq!(Int::Big(BigInt::from(5)), Int::Small(5));
        assert_ne!(Int::Big(BigInt::from(6)), Int::Small(5));
        assert_eq!(Int::from(u64::MAX).to_u64(), Some(u64::MAX));
    }

    #[test]
    fn serde_interop() {
        let v = loads(
            r#"{"z": 1, "a": [1.5, "x", null], "big": 170141183460469231731687303715884105727}"#,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"z":1,"a":[1.5,"x",null],"big":170141183460469231731687303715884105727}"#
        );
        let huge = Value::from("1".repeat(50).parse::<BigInt>().unwrap());
        let err = serde_json::to_string(&huge).unwrap_err().to_string();
        assert!(err.contains("does not fit in 128 bits"), "{err}");
        assert!(serde_json::to_string(&Value::Float(f64::INFINITY)).is_err());

        let sj: serde_json::Value =
            serde_json::from_str(r#"{"b": 2, "a": [18446744073709551615, -1, 0.5]}"#).unwrap();
        let ours = Value::from(sj.clone());
        assert_eq!(
            ours.get("a")
                .and_then(|a| a.get_index(0))
                .and_then(Value::as_u64),
            Some(u64::MAX)
        );
        assert_eq!(serde_json::Value::try_from(&ours).unwrap(), sj);
        assert!(serde_json::Value::try_from(&huge).is_err());
    }
}
