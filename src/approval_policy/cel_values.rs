//! The values a policy condition sees, converted to CEL as Kubernetes does for JSON: integers
//! are `int` (so `args.amount > 1000` compares ints), other numbers `double`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cel::Value;
use cel::objects::Key;

/// `json` as a CEL value.
pub fn from_json(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::Int(i),
            (None, Some(u)) => Value::UInt(u),
            _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::String(Arc::new(s.clone())),
        serde_json::Value::Array(items) => {
            Value::List(Arc::new(items.iter().map(from_json).collect()))
        }
        serde_json::Value::Object(map) => {
            let map: HashMap<Key, Value> = map
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), from_json(v)))
                .collect();
            Value::from(map)
        }
    }
}

/// A string map (labels) as a CEL map.
pub fn from_labels(labels: &BTreeMap<String, String>) -> Value {
    let map: HashMap<Key, Value> = labels
        .iter()
        .map(|(k, v)| {
            (
                Key::String(Arc::new(k.clone())),
                Value::String(Arc::new(v.clone())),
            )
        })
        .collect();
    Value::from(map)
}
