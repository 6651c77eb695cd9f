//! Status conditions: the standard Kubernetes `Condition` list with helpers to set one by type.
//!
//! The helpers follow the API conventions: one condition per `type`; `lastTransitionTime` changes
//! only when the condition's `status` changes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The most conditions one status holds (the schema's `maxItems`).
pub const MAX_CONDITIONS: usize = 32;
/// The longest condition `message` the schema accepts; [`set_condition`] truncates longer ones.
pub const MAX_CONDITION_MESSAGE_LENGTH: usize = 32768;
/// The longest condition `reason` the schema accepts.
pub const MAX_CONDITION_REASON_LENGTH: usize = 1024;
/// The longest condition `type` the schema accepts.
pub const MAX_CONDITION_TYPE_LENGTH: usize = 316;

/// The status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::Display, strum::IntoStaticStr)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// It is not known whether the condition holds.
    Unknown,
}

impl ConditionStatus {
    /// The value written to `status` (`True`, `False` or `Unknown`).
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl From<bool> for ConditionStatus {
    fn from(value: bool) -> Self {
        if value {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// A new condition observed at `now` for the object's `observed_generation`.
pub fn new_condition(
    type_: impl AsRef<str>,
    status: ConditionStatus,
    reason: impl AsRef<str>,
    message: &str,
    observed_generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: type_.as_ref().to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.as_ref().to_owned(),
        message: message.to_owned(),
        observed_generation,
        last_transition_time: now,
    }
}

/// The condition of this type, if any.
pub fn find_condition(conditions: &[Condition], type_: impl AsRef<str>) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == type_.as_ref())
}

/// True when the condition of this type exists and its status is `True`.
pub fn is_condition_true(conditions: &[Condition], type_: impl AsRef<str>) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == ConditionStatus::True.as_str())
}

/// Sets `condition` in the list, replacing the one of the same type. When the status is unchanged,
/// the existing `lastTransitionTime` is kept. A message longer than
/// [`MAX_CONDITION_MESSAGE_LENGTH`] characters is truncated (ending with `…`) so the status
/// stays within the schema. Returns whether the list changed.
pub fn set_condition(conditions: &mut Vec<Condition>, mut condition: Condition) -> bool {
    condition.message = truncate_chars(&condition.message, MAX_CONDITION_MESSAGE_LENGTH);
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => {
            if existing.status == condition.status {
                condition.last_transition_time = existing.last_transition_time.clone();
            }
            if *existing == condition {
                false
            } else {
                *existing = condition;
                true
            }
        }
        None => {
            conditions.push(condition);
            true
        }
    }
}

/// Removes the condition of this type. Returns whether there was one.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// `text` cut to at most `max` characters, the last one `…` when it was cut.
fn truncate_chars(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Schema of a `conditions` list: the standard Kubernetes `Condition` with the bounds of the API
/// conventions, kept as a map keyed by `type` so server-side apply merges per condition.
pub fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "The latest observations of the object's state, one per type.",
        "type": "array",
        "maxItems": MAX_CONDITIONS,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "description": "One aspect of the object's current state.",
            "type": "object",
            "required": ["type", "status", "reason", "message", "lastTransitionTime"],
            "properties": {
                "type": {
                    "description": "The condition's type, in CamelCase.",
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_CONDITION_TYPE_LENGTH,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                },
                "status": {
                    "description": "Whether the condition holds: True, False or Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"]
                },
                "reason": {
                    "description": "A CamelCase identifier of the reason for the last transition.",
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_CONDITION_REASON_LENGTH,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "message": {
                    "description": "A human-readable message with details about the transition.",
                    "type": "string",
                    "maxLength": MAX_CONDITION_MESSAGE_LENGTH
                },
                "observedGeneration": {
                    "description": "The metadata.generation the condition was set for.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0
                },
                "lastTransitionTime": {
                    "description": "When the condition's status last changed.",
                    "type": "string",
                    "format": "date-time"
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("valid timestamp"))
    }

    #[test]
    fn set_adds_a_new_condition() {
        let mut list = Vec::new();
        let c = new_condition(
            "Ready",
            ConditionStatus::True,
            "Done",
            "ok",
            Some(1),
            time(10),
        );
        assert!(set_condition(&mut list, c.clone()));
        assert_eq!(list, vec![c]);
        assert!(is_condition_true(&list, "Ready"));
        assert!(!is_condition_true(&list, "Other"));
    }

    #[test]
    fn same_status_keeps_the_transition_time() {
        let mut list = vec![new_condition(
            "Ready",
            ConditionStatus::False,
            "Waiting",
            "first",
            Some(1),
            time(10),
        )];
        let changed = set_condition(
            &mut list,
            new_condition(
                "Ready",
                ConditionStatus::False,
                "Waiting",
                "second",
                Some(2),
                time(20),
            ),
        );
        assert!(changed);
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].message, "second");
        assert_eq!(list[0].observed_generation, Some(2));
        assert_eq!(list[0].last_transition_time, time(10));
    }

    #[test]
    fn changed_status_moves_the_transition_time() {
        let mut list = vec![new_condition(
            "Ready",
            ConditionStatus::False,
            "Waiting",
            "m",
            Some(1),
            time(10),
        )];
        set_condition(
            &mut list,
            new_condition(
                "Ready",
                ConditionStatus::True,
                "Done",
                "m",
                Some(1),
                time(20),
            ),
        );
        assert_eq!(list[0].last_transition_time, time(20));
        assert_eq!(list[0].status, "True");
    }

    #[test]
    fn identical_condition_is_not_a_change() {
        let c = new_condition(
            "Ready",
            ConditionStatus::True,
            "Done",
            "m",
            Some(1),
            time(10),
        );
        let mut list = vec![c.clone()];
        let mut later = c.clone();
        later.last_transition_time = time(99);
        assert!(!set_condition(&mut list, later));
        assert_eq!(list, vec![c]);
    }

    #[test]
    fn other_types_are_kept_in_order() {
        let mut list = vec![
            new_condition("A", ConditionStatus::True, "R", "", None, time(1)),
            new_condition("B", ConditionStatus::True, "R", "", None, time(1)),
        ];
        set_condition(
            &mut list,
            new_condition("A", ConditionStatus::False, "R", "", None, time(2)),
        );
        let types: Vec<_> = list.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["A", "B"]);
        assert!(remove_condition(&mut list, "A"));
        assert!(!remove_condition(&mut list, "A"));
        assert_eq!(list.len(), 1);
        assert_eq!(
            find_condition(&list, "B").map(|c| c.status.as_str()),
            Some("True")
        );
    }

    #[test]
    fn long_messages_are_truncated_to_the_schema_bound() {
        let mut list = Vec::new();
        let long = "é".repeat(MAX_CONDITION_MESSAGE_LENGTH + 10);
        set_condition(
            &mut list,
            new_condition(
                "Failed",
                ConditionStatus::True,
                "Error",
                &long,
                None,
                time(1),
            ),
        );
        assert_eq!(
            list[0].message.chars().count(),
            MAX_CONDITION_MESSAGE_LENGTH
        );
        assert!(list[0].message.ends_with('…'));
    }

    #[test]
    fn status_display_and_from_bool() {
        assert_eq!(ConditionStatus::from(true).to_string(), "True");
        assert_eq!(ConditionStatus::from(false).to_string(), "False");
        assert_eq!(ConditionStatus::Unknown.to_string(), "Unknown");
    }
}
