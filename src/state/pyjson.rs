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
//! Parsing is done with [`jiter`] (pydantic's parser); writing is a hand-written byte-level encoder with
//! [`ryu`] for the shortest round-trip float digits, re-formatted to Python's `float.__repr__` rules.

use std::fmt;
use std::fmt::Write as _;

use indexmap::IndexMap;
use jiter::{Jiter, JiterError, NumberAny, NumberInt, Peek};
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

/// A parse failure before its position is turned into line/column.
enum Fail {
    Jiter(JiterError),
    At { index: usize, message: String },
}

impl From<JiterError> for Fail {
    fn from(e: JiterError) -> Self {
        Fail::Jiter(e)
    }
}

/// Parses JSON text like CPython's `json.loads(text)`.
///
/// Duplicate keys keep the last value at the first key's position (as assigning into a Python dict
/// does). Rejected, with the line and column of the problem: anything that is not strict JSON,
/// `NaN`/`Infinity`, float literals out of the `f64` range (`1e400`), lone-surrogate escapes,
/// integers of more than [`MAX_INT_DIGITS`] digits, nesting deeper than [`MAX_DEPTH`], and a leading
/// byte-order mark (as CPython does).
pub fn loads(text: &str) -> Result<Value, JsonError> {
    let data = text.as_bytes();
    if text.starts_with('\u{feff}') {
        return Err(JsonError::Syntax {
            line: 1,
            column: 1,
            message: "unexpected UTF-8 byte-order mark".to_owned(),
        });
    }
    let mut jiter = Jiter::new(data);
    let result = (|| -> Result<Value, Fail> {
        let value = parse_document(&mut jiter)?;
        jiter.finish()?;
        Ok(value)
    })();
    result.map_err(|fail| fail_to_error(data, fail))
}

/// An open container while parsing: its items so far (and, for a dict, the key being read).
enum Open {
    List(Vec<Value>),
    Dict(Dict, String),
}

/// Parses one complete value. Iterative (an explicit stack of open containers) so that deeply nested
/// input cannot exhaust the thread's stack.
fn parse_document(jiter: &mut Jiter<'_>) -> Result<Value, Fail> {
    let mut stack: Vec<Open> = Vec::new();
    let mut peek = jiter.peek()?;
    loop {
        // Read the value starting at `peek`: either a complete value, or the first item of a
        // non-empty container (then continue with that item).
        let mut value = match peek {
            Peek::Array | Peek::Object => {
                if stack.len() >= MAX_DEPTH {
                    return Err(too_deep(jiter.current_index()));
                }
                if peek == Peek::Array {
                    match jiter.known_array()? {
                        Some(first) => {
                            stack.push(Open::List(Vec::new()));
                            peek = first;
                            continue;
                        }
                        None => Value::List(Vec::new()),
                    }
                } else {
                    match jiter.known_object()? {
                        Some(key) => {
                            stack.push(Open::Dict(Dict::new(), key.to_owned()));
                            peek = jiter.peek()?;
                            continue;
                        }
                        None => Value::Dict(Dict::new()),
                    }
                }
            }
            _ => take_scalar(jiter, peek)?,
        };
        // Hand the complete value to its container, closing every container that ends here.
        loop {
            let Some(open) = stack.pop() else {
                return Ok(value);
            };
            match open {
                Open::List(mut items) => {
                    items.push(value);
                    match jiter.array_step()? {
                        Some(next) => {
                            stack.push(Open::List(items));
                            peek = next;
                            break;
                        }
                        None => value = Value::List(items),
                    }
                }
                Open::Dict(mut dict, key) => {
                    // `insert` keeps an existing key's position and replaces its value: exactly what
                    // assigning into a Python dict does with duplicate keys.
                    dict.insert(key, value);
                    match jiter.next_key()? {
                        Some(next_key) => {
                            stack.push(Open::Dict(dict, next_key.to_owned()));
                            peek = jiter.peek()?;
                            break;
                        }
                        None => value = Value::Dict(dict),
                    }
                }
            }
        }
    }
}

/// Reads a string, `null`, a boolean or a number.
fn take_scalar(jiter: &mut Jiter<'_>, peek: Peek) -> Result<Value, Fail> {
    match peek {
        Peek::String => Ok(Value::Str(jiter.known_str()?.to_owned())),
        Peek::Null => {
            jiter.known_null()?;
            Ok(Value::Null)
        }
        Peek::True | Peek::False => Ok(Value::Bool(jiter.known_bool(peek)?)),
        _ => {
            let start = jiter.current_index();
            // Anything else must be a number; jiter reports non-numbers (and `NaN`/`Infinity`, which
            // are not enabled) as errors, which `fail_to_error` words clearly.
            match jiter.known_number(peek)? {
                NumberAny::Int(NumberInt::Int(v)) => Ok(Value::Int(Int::Small(v))),
                NumberAny::Int(NumberInt::BigInt(b)) => Ok(Value::Int(Int::from_bigint(b))),
                NumberAny::Float(f) if f.is_finite() => Ok(Value::Float(f)),
                NumberAny::Float(_) => {
                    let literal = String::from_utf8_lossy(jiter.slice_to_current(start)).into_owned();
                    Err(Fail::At {
                        index: start,
                        message: format!("number `{literal}` is out of range for a float"),
                    })
                }
            }
        }
    }
}

fn too_deep(index: usize) -> Fail {
    Fail::At {
        index,
        message: format!("lists/dicts nested more than {MAX_DEPTH} levels deep"),
    }
}

fn fail_to_error(data: &[u8], fail: Fail) -> JsonError {
    let (index, message) = match fail {
        Fail::At { index, message } => (index, message),
        Fail::Jiter(e) => {
            let message = match &e.error_type {
                jiter::JiterErrorType::JsonError(jiter::JsonErrorType::NumberOutOfRange) => {
                    format!("integer has more than {MAX_INT_DIGITS} digits")
                }
                jiter::JiterErrorType::JsonError(
                    jiter::JsonErrorType::LoneLeadingSurrogateInHexEscape
                    | jiter::JsonErrorType::InvalidUnicodeCodePoint,
                ) => LONE_SURROGATE.to_owned(),
                jiter::JiterErrorType::JsonError(jiter::JsonErrorType::UnexpectedEndOfHexEscape)
                    if follows_surrogate_escape(data, e.index) =>
                {
                    LONE_SURROGATE.to_owned()
                }
                other => match non_finite_literal_near(data, e.index) {
                    Some((index, literal)) => {
                        return syntax_error(
                            data,
                            index,
                            format!("`{literal}` is not valid JSON (non-finite numbers are rejected)"),
                        );
                    }
                    None => other.to_string(),
                },
            };
            (e.index, message)
        }
    };
    syntax_error(data, index, message)
}

const LONE_SURROGATE: &str =
    "lone UTF-16 surrogate in \\u escape (CPython keeps it, but it cannot be represented in UTF-8)";

/// `true` when the last `\uXXXX` escape shortly before `index` is a UTF-16 surrogate (so a
/// "bad hex escape" there really is a lone surrogate).
fn follows_surrogate_escape(data: &[u8], index: usize) -> bool {
    let end = index.min(data.len());
    let window = &data[end.saturating_sub(12)..end];
    window
        .windows(6)
        .rev()
        .find(|w| w.starts_with(b"\\u"))
        .and_then(|w| std::str::from_utf8(&w[2..]).ok())
        .and_then(|hex| u16::from_str_radix(hex, 16).ok())
        .is_some_and(|unit| (0xD800..=0xDFFF).contains(&unit))
}

fn syntax_error(data: &[u8], index: usize, message: String) -> JsonError {
    let (line, column) = line_column(data, index);
    JsonError::Syntax {
        line,
        column,
        message,
    }
}

/// When a parse error at `index` is due to a `NaN`, `Infinity` or `-Infinity` literal (which jiter
/// rejects since they are not enabled), its start and text.
fn non_finite_literal_near(data: &[u8], index: usize) -> Option<(usize, &'static str)> {
    const LITERALS: [&str; 3] = ["-Infinity", "Infinity", "NaN"];
    (index.saturating_sub(1)..=index).find_map(|at| {
        let rest = data.get(at..)?;
        LITERALS
            .iter()
            .find(|lit| rest.starts_with(lit.as_bytes()))
            .map(|lit| (at, *lit))
    })
}

/// 1-based line and character column of byte `index` (clamped to the end of `data`).
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
    let mut out = String::with_capacity(128);
    Writer::strict(&mut out).value(value)?;
    Ok(out)
}

/// The byte-level encoder behind [`dumps`], usable to write a document piece by piece (the RunState
/// writer emits its top-level dict this way without building it first).
pub(crate) struct Writer<'o> {
    out: &'o mut String,
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

impl<'o> Writer<'o> {
    /// A writer that fails where [`dumps`] fails.
    pub(crate) fn strict(out: &'o mut String) -> Self {
        Writer {
            out,
            lenient: false,
            depth: 0,
        }
    }

    /// A writer that never fails (see the `lenient` field).
    pub(crate) fn lenient(out: &'o mut String) -> Self {
        Writer {
            out,
            lenient: true,
            depth: 0,
        }
    }

    /// Appends raw, already-encoded JSON punctuation (must be ASCII).
    pub(crate) fn raw(&mut self, text: &str) {
        self.out.push_str(text);
    }

    /// Appends a JSON string literal.
    pub(crate) fn str(&mut self, s: &str) {
        write_str(self.out, s);
    }

    /// Appends an unsigned integer.
    pub(crate) fn u64(&mut self, v: u64) {
        let _ = write!(self.out, "{v}");
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
                        self.out.push('[');
                        let mut iter = items.iter();
                        next = iter.next();
                        stack.push(Open::List(iter));
                    }
                }
                Value::Dict(dict) if !dict.is_empty() => {
                    if self.enter(stack.len())? {
                        self.out.push('{');
                        let mut iter = dict.iter();
                        if let Some((k, v)) = iter.next() {
                            write_str(self.out, k);
                            self.out.push_str(": ");
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
                            self.out.push_str(", ");
                            next = Some(item);
                        }
                        None => {
                            self.out.push(']');
                            stack.pop();
                        }
                    },
                    Some(Open::Dict(iter)) => match iter.next() {
                        Some((k, v)) => {
                            self.out.push_str(", ");
                            write_str(self.out, k);
                            self.out.push_str(": ");
                            next = Some(v);
                        }
                        None => {
                            self.out.push('}');
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
            Value::Null => self.out.push_str("null"),
            Value::Bool(true) => self.out.push_str("true"),
            Value::Bool(false) => self.out.push_str("false"),
            Value::Int(Int::Small(v)) => {
                let _ = write!(self.out, "{v}");
            }
            Value::Int(Int::Big(b)) => {
                let text = b.to_string();
                let digits = text.len() - usize::from(text.starts_with('-'));
                if digits > MAX_INT_DIGITS && !self.lenient {
                    return Err(JsonError::IntTooLong { digits });
                }
                self.out.push_str(&text);
            }
            Value::Float(f) => {
                if f.is_finite() {
                    write_float(self.out, *f);
                } else if self.lenient {
                    self.out.push_str(if f.is_nan() {
                        "NaN"
                    } else if *f > 0.0 {
                        "Infinity"
                    } else {
                        "-Infinity"
                    });
                } else {
                    return Err(JsonError::NonFiniteFloat { value: *f });
                }
            }
            Value::Str(s) => write_str(self.out, s),
            Value::List(_) => self.out.push_str("[]"),
            Value::Dict(_) => self.out.push_str("{}"),
        }
        Ok(())
    }

    /// Checks that one more container fits inside the `open` ones. `Ok(false)`: it does not, and the
    /// lenient writer wrote `null` instead.
    fn enter(&mut self, open: usize) -> Result<bool, JsonError> {
        if self.depth + open >= MAX_DEPTH {
            if self.lenient {
                self.out.push_str("null");
                return Ok(false);
            }
            return Err(JsonError::TooDeep);
        }
        Ok(true)
    }
}

/// Appends `s` as a JSON string literal with CPython's `ensure_ascii=True` escaping.
fn write_str(out: &mut String, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push('"');
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let esc = ESCAPE[bytes[i] as usize];
        if esc == 0 {
            i += 1;
            continue;
        }
        // `start..i` are printable ASCII bytes, so it is a valid `str` slice.
        out.push_str(&s[start..i]);
        if esc == 1 {
            // Non-ASCII: decode one UTF-8 sequence (the input is valid UTF-8).
            let (cp, len) = decode_utf8(&bytes[i..]);
            if cp >= 0x1_0000 {
                let v = cp - 0x1_0000;
                push_u_escape(out, 0xD800 | (v >> 10));
                push_u_escape(out, 0xDC00 | (v & 0x3FF));
            } else {
                push_u_escape(out, cp);
            }
            i += len;
        } else if esc == b'u' {
            push_u_escape(out, u32::from(bytes[i]));
            i += 1;
        } else {
            out.push('\\');
            out.push(esc as char);
            i += 1;
        }
        start = i;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Decodes the UTF-8 sequence at the start of `b` (known to be valid, non-ASCII).
#[inline]
fn decode_utf8(b: &[u8]) -> (u32, usize) {
    let b0 = u32::from(b[0]);
    if b0 < 0xE0 {
        (((b0 & 0x1F) << 6) | (u32::from(b[1]) & 0x3F), 2)
    } else if b0 < 0xF0 {
        (
            ((b0 & 0x0F) << 12) | ((u32::from(b[1]) & 0x3F) << 6) | (u32::from(b[2]) & 0x3F),
            3,
        )
    } else {
        (
            ((b0 & 0x07) << 18)
                | ((u32::from(b[1]) & 0x3F) << 12)
                | ((u32::from(b[2]) & 0x3F) << 6)
                | (u32::from(b[3]) & 0x3F),
            4,
        )
    }
}

#[inline]
fn push_u_escape(out: &mut String, unit: u32) {
    let buf = [
        b'\\',
        b'u',
        HEX[((unit >> 12) & 0xF) as usize],
        HEX[((unit >> 8) & 0xF) as usize],
        HEX[((unit >> 4) & 0xF) as usize],
        HEX[(unit & 0xF) as usize],
    ];
    // All bytes are ASCII.
    out.push_str(std::str::from_utf8(&buf).unwrap_or_default());
}

/// Appends a finite float the way Python's `repr(float)` writes it.
fn write_float(out: &mut String, f: f64) {
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
        out.push('-');
    }
    if sig.is_empty() {
        out.push_str("0.0");
        return;
    }
    let decpt = int_len + exponent - lead as i32;
    let sig_str = std::str::from_utf8(sig).unwrap_or_default();
    let len = sig.len() as i32;
    if decpt <= -4 || decpt > 16 {
        out.push_str(&sig_str[..1]);
        if sig.len() > 1 {
            out.push('.');
            out.push_str(&sig_str[1..]);
        }
        let e = decpt - 1;
        let _ = write!(out, "e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    } else if decpt <= 0 {
        out.push_str("0.");
        for _ in 0..(-decpt) {
            out.push('0');
        }
        out.push_str(sig_str);
    } else if decpt < len {
        out.push_str(&sig_str[..decpt as usize]);
        out.push('.');
        out.push_str(&sig_str[decpt as usize..]);
    } else {
        out.push_str(sig_str);
        for _ in 0..(decpt - len) {
            out.push('0');
        }
        out.push_str(".0");
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
        let mut s = String::new();
        write_float(&mut s, f);
        s
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
        assert!(matches!(v.get_index(2), Some(Value::Int(Int::Small(i64::MAX)))));
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
            err.to_string().starts_with("invalid JSON at line 1 column 7:"),
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
        let v = loads(r#"{"z": 1, "a": [1.5, "x", null], "big": 170141183460469231731687303715884105727}"#)
            .unwrap();
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"z":1,"a":[1.5,"x",null],"big":170141183460469231731687303715884105727}"#
        );
        let huge = Value::from("1".repeat(50).parse::<BigInt>().unwrap());
        let err = serde_json::to_string(&huge).unwrap_err().to_string();
        assert!(err.contains("does not fit in 128 bits"), "{err}");
        assert!(serde_json::to_string(&Value::Float(f64::INFINITY)).is_err());

        let sj: serde_json::Value = serde_json::from_str(r#"{"b": 2, "a": [18446744073709551615, -1, 0.5]}"#).unwrap();
        let ours = Value::from(sj.clone());
        assert_eq!(ours.get("a").and_then(|a| a.get_index(0)).and_then(Value::as_u64), Some(u64::MAX));
        assert_eq!(serde_json::Value::try_from(&ours).unwrap(), sj);
        assert!(serde_json::Value::try_from(&huge).is_err());
    }
}
