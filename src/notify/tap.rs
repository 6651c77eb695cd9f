//! What the notifier sees of the controller's own watches: every AgentRun and ApprovalRequest
//! they bring (added, changed, listed or deleted) is turned into the events its state implies
//! ([`events`](super::events)) and handed to the [`hub`](super::hub). No extra watch, no write.
//!
//! The tap runs inside the watch streams, before the controller reconciles what they bring, so a
//! run's last state is seen even when the run is deleted right after. It only derives and queues;
//! events older than the horizon are not even queued.

use std::time::Duration;

use kube::runtime::watcher;
use tokio::sync::mpsc;

use super::events::{self, Candidate};
use crate::crd::{AgentRun, ApprovalRequest};

/// Hands the events of watched objects to the notifier.
#[derive(Clone, Debug)]
pub struct Tap {
    events: mpsc::UnboundedSender<Vec<Candidate>>,
    horizon: Duration,
}

impl Tap {
    /// A tap sending to `events`; events older than `horizon` are left out.
    pub fn new(events: mpsc::UnboundedSender<Vec<Candidate>>, horizon: Duration) -> Tap {
        Tap { events, horizon }
    }

    /// Observes one event of the runs' watch.
    pub fn run(&self, event: &watcher::Event<AgentRun>) {
        if let Some(run) = object(event) {
            self.send(events::of_run(run));
        }
    }

    /// Observes one event of the ApprovalRequests' watch.
    pub fn request(&self, event: &watcher::Event<ApprovalRequest>) {
        if let Some(request) = object(event) {
            self.send(events::of_request(request));
        }
    }

    fn send(&self, mut candidates: Vec<Candidate>) {
        let oldest = oldest(self.horizon);
        candidates.retain(|c| c.time >= oldest);
        if !candidates.is_empty() {
            // The notifier is gone only when the controller stops.
            let _ = self.events.send(candidates);
        }
    }
}

/// The oldest event time within `horizon` of now.
pub fn oldest(horizon: Duration) -> chrono::DateTime<chrono::Utc> {
    chrono::TimeDelta::from_std(horizon)
        .ok()
        .and_then(|horizon| chrono::Utc::now().checked_sub_signed(horizon))
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC)
}

fn object<K>(event: &watcher::Event<K>) -> Option<&K> {
    match event {
        watcher::Event::Apply(object)
        | watcher::Event::InitApply(object)
        | watcher::Event::Delete(object) => Some(object),
        watcher::Event::Init | watcher::Event::InitDone => None,
    }
}
