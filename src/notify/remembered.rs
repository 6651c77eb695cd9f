//! [`Remembered`]: the events the notifier keeps for the sinks it has not seen yet.
//!
//! A sink that appears gets every remembered event that happened after its creation. Once the
//! notifier is ready (sinks and namespaces listed) the sinks it knows mint each event as it
//! arrives, so an event is only remembered for a sink the notifier has not seen yet: one created
//! while the event was on its way, whose watch event arrives a little later than the run's or
//! the request's. An event is therefore kept for [`REPLAY_WINDOW`] after it arrived, not for the
//! whole horizon: at 10,000 runs a day the horizon would keep tens of thousands of serialized
//! events (tens of MiB) for sinks that do not exist. Its id is kept for the horizon, so an event
//! derived again (each change of a run derives all its events) is never minted twice.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::events::Candidate;

/// How long an event is remembered after it arrived, once the notifier is ready: longer than the
/// watches of sinks and of runs can drift apart (a watch's backoff stays under 30 s).
pub const REPLAY_WINDOW: Duration = Duration::from_secs(120);

/// The ids of the events derived within the horizon (the first derivation is the one minted),
/// and the events themselves while they may still be replayed.
#[derive(Default)]
pub struct Remembered {
    ids: HashMap<String, DateTime<Utc>>,
    events: HashMap<String, (Candidate, Instant)>,
}

impl Remembered {
    /// Whether the event `id` was derived before (within the horizon).
    pub fn contains(&self, id: &str) -> bool {
        self.ids.contains_key(id)
    }

    /// Remembers `candidate`, arrived `now`, unless an event of its id was derived before.
    pub fn insert(&mut self, candidate: Candidate, now: Instant) {
        if self.ids.contains_key(&candidate.id) {
            return;
        }
        self.ids.insert(candidate.id.clone(), candidate.time);
        self.events.insert(candidate.id.clone(), (candidate, now));
    }

    /// Forgets the events older than `oldest` (the horizon) and, once the notifier is `ready`,
    /// the bodies of those that arrived more than [`REPLAY_WINDOW`] before `now`.
    pub fn expire(&mut self, oldest: DateTime<Utc>, ready: bool, now: Instant) {
        self.ids.retain(|_, time| *time >= oldest);
        self.events.retain(|_, (candidate, arrived)| {
            candidate.time >= oldest
                && (!ready || now.saturating_duration_since(*arrived) < REPLAY_WINDOW)
        });
        shrink(&mut self.ids);
        shrink(&mut self.events);
    }

    /// The events that may still be replayed, oldest first.
    pub fn oldest_first(&self) -> Vec<Candidate> {
        let mut candidates: Vec<Candidate> = self.events.values().map(|(c, _)| c.clone()).collect();
        candidates.sort_by(|a, b| (a.time, &a.id).cmp(&(b.time, &b.id)));
        candidates
    }

    /// How many events may still be replayed.
    pub fn replayable(&self) -> usize {
        self.events.len()
    }
}

/// Gives back the memory of a map that emptied (a burst of events has expired).
fn shrink<V>(map: &mut HashMap<String, V>) {
    if map.capacity() > 4 * map.len() + 64 {
        map.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::NotificationType;

    fn candidate(id: &str, time: i64) -> Candidate {
        Candidate {
            id: id.into(),
            kind: NotificationType::ApprovalRequested,
            namespace: "team".into(),
            time: DateTime::from_timestamp(time, 0).unwrap(),
            body: format!("{{\"id\":\"{id}\"}}").into(),
        }
    }

    #[test]
    fn the_first_derivation_is_kept_and_replayed_oldest_first() {
        let mut remembered = Remembered::default();
        let now = Instant::now();
        remembered.insert(candidate("b", 20), now);
        remembered.insert(candidate("a", 10), now);
        let mut again = candidate("b", 20);
        again.body = "changed".into();
        remembered.insert(again, now);
        let replayed = remembered.oldest_first();
        let ids: Vec<&str> = replayed.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(&*replayed[1].body, "{\"id\":\"b\"}");
        assert!(remembered.contains("a"));
    }

    #[test]
    fn events_are_kept_until_ready_then_for_the_replay_window_and_ids_until_the_horizon() {
        let mut remembered = Remembered::default();
        let start = Instant::now();
        remembered.insert(candidate("old", 100), start);
        remembered.insert(candidate("early", 500), start);
        let later = start + REPLAY_WINDOW * 3;
        remembered.insert(candidate("late", 600), later - REPLAY_WINDOW / 2);
        let horizon = DateTime::from_timestamp(200, 0).unwrap();
        let ids = |r: &Remembered| -> Vec<String> {
            r.oldest_first().into_iter().map(|c| c.id).collect()
        };

        remembered.expire(horizon, false, later);
        assert!(!remembered.contains("old"), "past the horizon");
        assert_eq!(ids(&remembered), ["early", "late"], "kept until ready");

        remembered.expire(horizon, true, later);
        assert_eq!(
            ids(&remembered),
            ["late"],
            "early arrived before the window"
        );
        assert!(remembered.contains("early"), "its id is still known");
        remembered.insert(candidate("early", 500), later);
        assert_eq!(ids(&remembered), ["late"], "derived again: not new");

        remembered.expire(horizon, true, later + REPLAY_WINDOW);
        assert_eq!(remembered.replayable(), 0);
        assert!(remembered.contains("late"));
        remembered.expire(DateTime::from_timestamp(700, 0).unwrap(), true, later);
        assert!(!remembered.contains("late"), "past the horizon");
    }
}
