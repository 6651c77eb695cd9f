//! One sink's outbox: the events minted for it and not yet delivered (with their exact bodies),
//! and the ids it has received (with the events' times), for deduplication until the horizon.
//! Pure; [`store`](super::store) persists it.
//!
//! Bounds: [`Outbox::expire`] drops pending events and marks older than the horizon, and
//! [`Outbox::fit`] keeps the serialized outbox within a byte budget by evicting the oldest marks
//! first (an evicted mark can at worst make a restart send that event once more, same id and
//! same bytes, if its object still exists), then the oldest pending events (lost, and counted).

use std::collections::{BTreeMap, HashSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::events::Candidate;

/// An event minted for a sink and not yet delivered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// The event id.
    pub id: String,
    /// The event's time, Unix seconds.
    pub time: i64,
    /// The event as sent, CloudEvents structured JSON.
    pub body: String,
}

/// The outbox of one sink.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outbox {
    /// The uid of the sink: an outbox found for a sink of the same name but another uid (deleted
    /// and created again) is discarded.
    pub sink_uid: String,
    /// Events to deliver, oldest minted first (the order they are sent in).
    #[serde(default)]
    pub pending: VecDeque<Pending>,
    /// Ids delivered, with the events' times (Unix seconds).
    #[serde(default)]
    pub delivered: BTreeMap<String, i64>,
    #[serde(skip)]
    pending_ids: HashSet<String>,
}

/// What [`Outbox::expire`] or [`Outbox::fit`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Pending events dropped: they will not be delivered.
    pub pending: usize,
    /// Delivery marks dropped.
    pub marks: usize,
}

impl Outbox {
    /// An empty outbox of the sink with this uid.
    pub fn new(sink_uid: &str) -> Outbox {
        Outbox {
            sink_uid: sink_uid.to_owned(),
            ..Default::default()
        }
    }

    /// Reads an outbox as [`Outbox::to_json`] wrote it.
    pub fn from_json(text: &str) -> Result<Outbox, serde_json::Error> {
        let mut outbox: Outbox = serde_json::from_str(text)?;
        outbox.pending_ids = outbox.pending.iter().map(|p| p.id.clone()).collect();
        Ok(outbox)
    }

    /// The outbox as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether the event is pending or was delivered.
    pub fn knows(&self, id: &str) -> bool {
        self.pending_ids.contains(id) || self.delivered.contains_key(id)
    }

    /// Whether nothing is pending or remembered.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.delivered.is_empty()
    }

    /// Adds the event to the pending ones unless it is known; returns whether it was added.
    pub fn mint(&mut self, candidate: &Candidate) -> bool {
        if self.knows(&candidate.id) {
            return false;
        }
        self.pending_ids.insert(candidate.id.clone());
        self.pending.push_back(Pending {
            id: candidate.id.clone(),
            time: candidate.time.timestamp(),
            body: candidate.body.to_string(),
        });
        true
    }

    /// Records the delivery of a pending event; returns whether it was pending.
    pub fn delivered(&mut self, id: &str) -> bool {
        let Some(index) = self.pending.iter().position(|p| p.id == id) else {
            return false;
        };
        if let Some(done) = self.pending.remove(index) {
            self.pending_ids.remove(&done.id);
            self.delivered.insert(done.id, done.time);
        }
        true
    }

    /// Drops pending events and marks whose events happened before `oldest` (Unix seconds).
    pub fn expire(&mut self, oldest: i64) -> Removed {
        let before = (self.pending.len(), self.delivered.len());
        let ids = &mut self.pending_ids;
        self.pending.retain(|p| {
            let keep = p.time >= oldest;
            if !keep {
                ids.remove(&p.id);
            }
            keep
        });
        self.delivered.retain(|_, time| *time >= oldest);
        Removed {
            pending: before.0 - self.pending.len(),
            marks: before.1 - self.delivered.len(),
        }
    }

    /// Evicts the oldest marks, then the oldest pending events, until [`Outbox::to_json`] takes at
    /// most `budget` bytes.
    pub fn fit(&mut self, budget: usize) -> Removed {
        let mut size = self.to_json().len();
        let mut removed = Removed::default();
        if size <= budget {
            return removed;
        }
        let mut marks: Vec<(i64, String)> = self
            .delivered
            .iter()
            .map(|(id, time)| (*time, id.clone()))
            .collect();
        marks.sort();
        for (time, id) in marks {
            if size <= budget {
                // The estimate says it fits: make sure.
                size = self.to_json().len();
                if size <= budget {
                    return removed;
                }
            }
            self.delivered.remove(&id);
            // `"<id>":<time>,`
            size = size.saturating_sub(id.len() + time.to_string().len() + 4);
            removed.marks += 1;
        }
        size = self.to_json().len();
        while size > budget {
            let Some(oldest) = self.pending.pop_front() else {
                break;
            };
            self.pending_ids.remove(&oldest.id);
            removed.pending += 1;
            size = self.to_json().len();
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::NotificationType;
    use chrono::DateTime;

    fn candidate(id: &str, time: i64, body_len: usize) -> Candidate {
        Candidate {
            id: id.to_owned(),
            kind: NotificationType::ApprovalRequested,
            namespace: "ns".into(),
            time: DateTime::from_timestamp(time, 0).unwrap(),
            body: "x".repeat(body_len).into(),
        }
    }

    #[test]
    fn an_event_is_minted_once_and_delivered_once() {
        let mut outbox = Outbox::new("sink-uid");
        assert!(outbox.mint(&candidate("a:requested", 100, 10)));
        assert!(!outbox.mint(&candidate("a:requested", 100, 10)));
        assert!(outbox.mint(&candidate("a:decided", 110, 10)));
        assert_eq!(outbox.pending.len(), 2);
        assert!(outbox.delivered("a:requested"));
        assert!(!outbox.delivered("a:requested"));
        assert!(
            !outbox.mint(&candidate("a:requested", 100, 10)),
            "delivered"
        );
        assert_eq!(outbox.pending[0].id, "a:decided");

        // Persisted and read back: the same, including what it knows.
        let back = Outbox::from_json(&outbox.to_json()).unwrap();
        assert_eq!(back, outbox);
        assert!(back.knows("a:decided") && back.knows("a:requested"));
    }

    #[test]
    fn the_horizon_drops_old_events_and_marks() {
        let mut outbox = Outbox::new("u");
        outbox.mint(&candidate("old", 100, 10));
        outbox.mint(&candidate("new", 200, 10));
        outbox.mint(&candidate("done", 150, 10));
        outbox.delivered("done");
        assert_eq!(
            outbox.expire(160),
            Removed {
                pending: 1,
                marks: 1
            }
        );
        assert!(!outbox.knows("old") && !outbox.knows("done") && outbox.knows("new"));
    }

    #[test]
    fn fit_evicts_the_oldest_marks_then_the_oldest_pending_events() {
        let mut outbox = Outbox::new("u");
        for i in 0..100 {
            let id = format!("mark-{i:03}");
            outbox.mint(&candidate(&id, 1000 + i, 10));
            outbox.delivered(&id);
        }
        for i in 0..10 {
            outbox.mint(&candidate(&format!("pending-{i}"), 2000 + i, 1000));
        }
        let full = outbox.to_json().len();
        let removed = outbox.fit(full - 500);
        assert!(removed.marks > 0 && removed.pending == 0, "{removed:?}");
        assert!(outbox.to_json().len() <= full - 500);
        assert!(!outbox.knows("mark-000"), "the oldest mark goes first");
        assert!(outbox.knows("mark-099"));

        let marks_left = outbox.delivered.len();
        let removed = outbox.fit(3500);
        assert_eq!(
            removed.marks, marks_left,
            "every mark goes before a pending event"
        );
        assert!(outbox.delivered.is_empty());
        assert!(removed.pending > 0);
        assert!(outbox.to_json().len() <= 3500);
        assert_eq!(
            outbox.pending.back().unwrap().id,
            "pending-9",
            "the newest pending event is kept"
        );
        assert!(!outbox.knows("pending-0"));
    }

    /// Whatever the budget, the outbox fits it once `fit` returns (or holds nothing but its
    /// sink's uid): the size estimate per mark is checked, never trusted.
    #[test]
    fn fit_always_ends_within_the_budget() {
        let mut full = Outbox::new("u");
        for i in 0..5 {
            let id = format!("m{i}");
            full.mint(&candidate(&id, 1_000_000 + i, 3));
            full.delivered(&id);
        }
        for i in 0..3 {
            full.mint(&candidate(&format!("p{i}"), 2_000_000 + i, 20));
        }
        let empty = Outbox::new("u").to_json().len();
        for budget in 0..=full.to_json().len() + 1 {
            let mut outbox = full.clone();
            outbox.fit(budget);
            let size = outbox.to_json().len();
            assert!(
                size <= budget || (outbox.is_empty() && size == empty),
                "budget {budget}: {size} bytes left: {}",
                outbox.to_json()
            );
            // Nothing pending is dropped while dropping marks would do.
            if !outbox.delivered.is_empty() {
                assert_eq!(outbox.pending.len(), 3, "budget {budget}");
            }
        }
    }
}
