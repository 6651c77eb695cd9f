//! [`Value`] in other JSON models: serde serialization and conversions from and to
//! `serde_json::Value`.

use super::{Int, JsonError, Value};

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
                    map.serialize_entry(k.as_str(), v)?;
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
                    map.insert(k.to_string(), serde_json::Value::try_from(v)?);
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
