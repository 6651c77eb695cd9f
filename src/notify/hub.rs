//! The notifier: matches the events the [`tap`](super::tap) derives against the sinks, records the
//! new ones in the sinks' outboxes, persists the outboxes before anything is sent, hands what is
//! persisted to each sink's [`sender`](super::sender), and records what the senders report
//! (deliveries in the outbox, the sink's condition, the metrics).
//!
//! One task owns all the state; it waits for the sinks and the namespaces to be listed before it
//! mints anything (until then events are only remembered, within the horizon). An event is minted
//! for a sink when its type is one the sink wants, its namespace matches the sink's selector, it
//! happened no earlier than the sink was created and within the horizon, and the sink's outbox
//! does not know its id.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use tracing::{info, warn};

use super::events::Candidate;
use super::metrics::NotifyMetrics;
use super::outbox::{Outbox, Removed};
use super::remembered::Remembered;
use super::sender::{Outgoing, Report, Sender, Settings};
use super::sink_status::{self, Outcome};
use super::store::OutboxStore;
use super::tap::{self, Tap};
use super::{NotifyConfig, http};
use crate::crd::NotificationSink;

/// How often expired events are dropped, delivery marks persisted and the gauges set.
const TICK: Duration = Duration::from_secs(1);
/// The wait before a failed write of the outbox is tried again.
const SAVE_RETRY: Duration = Duration::from_secs(5);

/// The notifier of one controller: create it, give its [`Tap`] to the watches, then run it.
pub struct Notifier {
    client: Client,
    config: NotifyConfig,
    scope: Option<String>,
    metrics: NotifyMetrics,
    events: mpsc::UnboundedSender<Vec<Candidate>>,
    received: mpsc::UnboundedReceiver<Vec<Candidate>>,
}

impl Notifier {
    /// A notifier for the objects of `scope` (one namespace, or all when `None`), counting in
    /// `metrics`.
    pub fn new(
        client: Client,
        config: NotifyConfig,
        scope: Option<String>,
        metrics: NotifyMetrics,
    ) -> Notifier {
        let (events, received) = mpsc::unbounded_channel();
        Notifier {
            client,
            config,
            scope,
            metrics,
            events,
            received,
        }
    }

    /// The tap to put into the watches of runs and requests.
    pub fn tap(&self) -> Tap {
        Tap::new(self.events.clone(), self.config.horizon)
    }

    /// Runs until the controller stops (the task is dropped).
    pub async fn run(self) {
        let Notifier {
            client,
            config,
            scope,
            metrics,
            events,
            mut received,
        } = self;
        // Only the taps send from now on.
        drop(events);
        let http = match http::build_client() {
            Ok(http) => http,
            Err(error) => {
                warn!(%error, "notifications are off: the HTTP client cannot be built");
                return;
            }
        };
        let settings = Arc::new(Settings {
            client: client.clone(),
            namespace: config.namespace.clone(),
            http,
            min_backoff: config.min_backoff,
            max_backoff: config.max_backoff,
        });
        let mut store =
            OutboxStore::new(client.clone(), &config.namespace, &config.outbox_config_map);
        let saved = loop {
            match store.load().await {
                Ok(saved) => break saved,
                Err(error) => {
                    warn!(%error, "cannot read the notification outbox; retrying");
                    tokio::time::sleep(SAVE_RETRY).await;
                }
            }
        };
        let namespaces_synced = Arc::new(AtomicBool::new(false));
        let (namespaces, namespace_writer) = reflector::store::<Namespace>();
        let namespace_config = match &scope {
            Some(ns) => watcher::Config::default().fields(&format!("metadata.name={ns}")),
            None => watcher::Config::default(),
        };
        let synced = namespaces_synced.clone();
        let _namespace_watch = AbortOnDropHandle::new(tokio::spawn(
            watcher(Api::<Namespace>::all(client.clone()), namespace_config)
                .default_backoff()
                .modify(|n: &mut Namespace| n.metadata.managed_fields = None)
                .reflect(namespace_writer)
                .for_each(move |event| {
                    match event {
                        Ok(watcher::Event::InitDone) => synced.store(true, Ordering::Relaxed),
                        Ok(_) => {}
                        Err(error) => {
                            warn!(%error, "notifications: cannot watch namespaces");
                        }
                    }
                    future::ready(())
                }),
        ));
        let mut sink_events = watcher(
            Api::<NotificationSink>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .boxed();
        let (reports, mut reported) = mpsc::unbounded_channel();
        let mut hub = Hub {
            client,
            config,
            metrics,
            settings,
            reports,
            store,
            saved,
            namespaces,
            namespaces_synced,
            sinks: BTreeMap::new(),
            listed: None,
            sinks_synced: false,
            ready: false,
            index: Remembered::default(),
            dirty: false,
            marks_dirty: false,
            next_save: Instant::now(),
        };
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        info!("notifications started");
        loop {
            tokio::select! {
                event = sink_events.next() => match event {
                    Some(Ok(event)) => hub.on_sink_event(event),
                    Some(Err(error)) => warn!(%error, "notifications: cannot watch NotificationSinks"),
                    None => return,
                },
                batch = received.recv() => {
                    let Some(batch) = batch else { return };
                    hub.on_candidates(batch);
                    while let Ok(batch) = received.try_recv() {
                        hub.on_candidates(batch);
                    }
                },
                report = reported.recv() => {
                    let Some(report) = report else { return };
                    hub.on_report(report).await;
                },
                _ = tick.tick() => hub.on_tick(),
            }
            hub.check_ready();
            if hub.dirty {
                hub.persist().await;
            }
        }
    }
}

/// Counts and logs pending events of `sink` dropped for `reason`.
fn dropped(metrics: &NotifyMetrics, sink: &str, reason: &str, removed: Removed) {
    if removed.pending > 0 {
        warn!(%sink, count = removed.pending, reason, "notifications dropped undelivered");
    }
    metrics.drop(sink, reason, removed.pending);
}

/// What the notifier knows of one sink.
struct SinkEntry {
    sink: Arc<NotificationSink>,
    uid: String,
    /// The sink's namespace selector, `None` when it does not parse (nothing matches).
    selector: Option<Selector>,
    outbox: Outbox,
    /// Minted but not persisted yet: handed to the sender once they are.
    unsent: Vec<Outgoing>,
    sender: Option<Sender>,
    /// The outcome last recorded in the sink's condition.
    recorded: Option<Outcome>,
}

impl SinkEntry {
    fn new(sink: NotificationSink, outbox: Outbox) -> SinkEntry {
        let uid = sink.uid().unwrap_or_default();
        let selector = selector_of(&sink);
        SinkEntry {
            sink: Arc::new(sink),
            uid,
            selector,
            outbox,
            unsent: Vec::new(),
            sender: None,
            recorded: None,
        }
    }

    /// Whether `candidate` is for this sink (the outbox aside).
    fn wants(&self, candidate: &Candidate, labels: Option<&BTreeMap<String, String>>) -> bool {
        let spec = &self.sink.spec;
        let created = self
            .sink
            .metadata
            .creation_timestamp
            .as_ref()
            .map(crate::time::from_k8s)
            .unwrap_or_default();
        let empty = BTreeMap::new();
        (spec.types.is_empty() || spec.types.contains(&candidate.kind))
            && candidate.time >= created
            && self
                .selector
                .as_ref()
                .is_some_and(|s| s.selects_all() || s.matches(labels.unwrap_or(&empty)))
    }

    /// (Re)starts the sender with every persisted pending event, in order.
    fn restart_sender(
        &mut self,
        settings: &Arc<Settings>,
        reports: &mpsc::UnboundedSender<Report>,
    ) {
        self.sender = None;
        let unsent: HashSet<&str> = self.unsent.iter().map(|o| o.id.as_str()).collect();
        let persisted: Vec<Outgoing> = self
            .outbox
            .pending
            .iter()
            .filter(|p| !unsent.contains(p.id.as_str()))
            .map(|p| Outgoing {
                id: p.id.clone(),
                body: Arc::from(p.body.as_str()),
            })
            .collect();
        if persisted.is_empty() {
            return;
        }
        let sender = Sender::start(self.sink.clone(), settings.clone(), reports.clone());
        for event in persisted {
            sender.push(event);
        }
        self.sender = Some(sender);
    }

    /// Keeps only the unsent events still pending (after some were dropped).
    fn retain_unsent(&mut self) {
        let outbox = &self.outbox;
        self.unsent
            .retain(|o| outbox.pending.iter().any(|p| p.id == o.id));
    }
}

/// The selector of a sink's namespaces (`None`, with a warning, when it does not parse).
fn selector_of(sink: &NotificationSink) -> Option<Selector> {
    match sink.spec.namespace_selector.clone() {
        None => Some(Selector::default()),
        Some(selector) => match Selector::try_from(selector) {
            Ok(selector) => Some(selector),
            Err(error) => {
                warn!(sink = %sink.name_any(), %error, "the sink's namespaceSelector does not parse: no event matches it");
                None
            }
        },
    }
}

/// The notifier's state.
struct Hub {
    client: Client,
    config: NotifyConfig,
    metrics: NotifyMetrics,
    settings: Arc<Settings>,
    reports: mpsc::UnboundedSender<Report>,
    store: OutboxStore,
    /// Outboxes read at start and not yet claimed by a sink.
    saved: BTreeMap<String, Outbox>,
    namespaces: Store<Namespace>,
    namespaces_synced: Arc<AtomicBool>,
    sinks: BTreeMap<String, SinkEntry>,
    /// The sinks seen since the sinks' watch (re)started listing.
    listed: Option<HashSet<String>>,
    sinks_synced: bool,
    /// Sinks and namespaces listed: events are minted.
    ready: bool,
    /// The events derived recently, for the sinks not seen yet.
    index: Remembered,
    /// The outboxes changed in a way that must be persisted before anything more is sent.
    dirty: bool,
    /// Deliveries recorded but not persisted (persisted at the next tick).
    marks_dirty: bool,
    next_save: Instant,
}

impl Hub {
    fn on_sink_event(&mut self, event: watcher::Event<NotificationSink>) {
        match event {
            watcher::Event::Init => self.listed = Some(HashSet::new()),
            watcher::Event::InitApply(sink) => {
                if let Some(listed) = self.listed.as_mut() {
                    listed.insert(sink.name_any());
                }
                self.upsert(sink);
            }
            watcher::Event::Apply(sink) => self.upsert(sink),
            watcher::Event::InitDone => {
                if let Some(listed) = self.listed.take() {
                    let gone: Vec<String> = self
                        .sinks
                        .keys()
                        .filter(|name| !listed.contains(*name))
                        .cloned()
                        .collect();
                    for name in gone {
                        self.remove(&name);
                    }
                }
                if !self.sinks_synced {
                    // Outboxes of sinks that no longer exist.
                    if !self.saved.is_empty() {
                        self.saved.clear();
                        self.dirty = true;
                    }
                    self.sinks_synced = true;
                }
            }
            watcher::Event::Delete(sink) => self.remove(&sink.name_any()),
        }
    }

    fn upsert(&mut self, sink: NotificationSink) {
        let name = sink.name_any();
        let uid = sink.uid().unwrap_or_default();
        if let Some(entry) = self.sinks.get_mut(&name)
            && entry.uid == uid
        {
            let changed = entry.sink.spec != sink.spec;
            entry.selector = selector_of(&sink);
            entry.sink = Arc::new(sink);
            if changed && let Some(sender) = entry.sender.as_ref() {
                sender.update(entry.sink.clone());
            }
            return;
        }
        if self.sinks.contains_key(&name) {
            // Deleted and created again: a new outbox.
            self.remove(&name);
        }
        let outbox = self
            .saved
            .remove(&name)
            .filter(|o| o.sink_uid == uid)
            .unwrap_or_else(|| Outbox::new(&uid));
        let mut entry = SinkEntry::new(sink, outbox);
        entry.restart_sender(&self.settings, &self.reports);
        self.sinks.insert(name.clone(), entry);
        if self.ready {
            self.replay(&name);
        }
    }

    fn remove(&mut self, name: &str) {
        if let Some(entry) = self.sinks.remove(name) {
            self.metrics.forget(name);
            if !entry.outbox.is_empty() {
                self.dirty = true;
            }
        }
    }

    fn check_ready(&mut self) {
        if !self.ready && self.sinks_synced && self.namespaces_synced.load(Ordering::Relaxed) {
            self.ready = true;
            let names: Vec<String> = self.sinks.keys().cloned().collect();
            for name in names {
                self.replay(&name);
            }
        }
    }

    /// Mints every remembered event for the sink `name`, oldest first.
    fn replay(&mut self, name: &str) {
        for candidate in &self.index.oldest_first() {
            self.mint(name, candidate);
        }
    }

    fn on_candidates(&mut self, batch: Vec<Candidate>) {
        for candidate in batch {
            if self.index.contains(&candidate.id) {
                continue;
            }
            if self.ready {
                let names: Vec<String> = self.sinks.keys().cloned().collect();
                for name in names {
                    self.mint(&name, &candidate);
                }
            }
            self.index.insert(candidate, Instant::now());
        }
    }

    /// Adds `candidate` to the outbox of sink `name` if the sink wants it and it is new.
    fn mint(&mut self, name: &str, candidate: &Candidate) {
        let oldest = tap::oldest(self.config.horizon);
        if candidate.time < oldest {
            return;
        }
        let labels = self
            .namespaces
            .get(&ObjectRef::new(&candidate.namespace))
            .map(|ns| ns.labels().clone());
        let Some(entry) = self.sinks.get_mut(name) else {
            return;
        };
        if entry.wants(candidate, labels.as_ref()) && entry.outbox.mint(candidate) {
            entry.unsent.push(Outgoing {
                id: candidate.id.clone(),
                body: candidate.body.clone(),
            });
            self.dirty = true;
        }
    }

    async fn on_report(&mut self, report: Report) {
        let Some(entry) = self.sinks.get_mut(&report.sink) else {
            return;
        };
        if entry.uid != report.sink_uid {
            return;
        }
        let labels = NotifyMetrics::sink(&report.sink);
        match &report.outcome {
            Outcome::Delivered => {
                if entry.outbox.delivered(&report.id) {
                    self.metrics.delivered.get_or_create(&labels).inc();
                    self.marks_dirty = true;
                }
                self.metrics.failing.get_or_create(&labels).set(0);
            }
            Outcome::Failed(_, message) => {
                self.metrics.failures.get_or_create(&labels).inc();
                self.metrics.failing.get_or_create(&labels).set(1);
                tracing::debug!(sink = %report.sink, id = %report.id, %message, "delivery failed");
            }
        }
        if entry.recorded.as_ref() == Some(&report.outcome) {
            return;
        }
        if let Some(conditions) = sink_status::conditions_after(&entry.sink, &report.outcome) {
            if let Err(error) = sink_status::write(&self.client, &entry.sink, conditions).await {
                warn!(sink = %report.sink, %error, "cannot write the sink's condition");
                return;
            }
            if let Outcome::Failed(_, message) = &report.outcome {
                warn!(sink = %report.sink, %message, "notifications to this sink are failing");
            } else {
                info!(sink = %report.sink, "the sink accepts notifications");
            }
        }
        entry.recorded = Some(report.outcome);
    }

    fn on_tick(&mut self) {
        let oldest = tap::oldest(self.config.horizon);
        self.index.expire(oldest, self.ready, Instant::now());
        for (name, entry) in &mut self.sinks {
            let removed = entry.outbox.expire(oldest.timestamp());
            dropped(&self.metrics, name, "expired", removed);
            if removed.pending > 0 {
                entry.retain_unsent();
                entry.restart_sender(&self.settings, &self.reports);
            }
            if removed != Removed::default() {
                self.dirty = true;
            }
            self.metrics
                .pending
                .get_or_create(&NotifyMetrics::sink(name))
                .set(i64::try_from(entry.outbox.pending.len()).unwrap_or(i64::MAX));
        }
        if self.marks_dirty {
            self.dirty = true;
        }
    }

    /// Writes the outboxes, within their bound; once written, hands the new events to the
    /// senders. A failed write is retried a few seconds later (nothing new is sent meanwhile).
    async fn persist(&mut self) {
        if Instant::now() < self.next_save {
            return;
        }
        let used = self
            .sinks
            .values()
            .filter(|e| !e.outbox.is_empty())
            .count()
            .max(1);
        let budget = self.config.outbox_bytes / used;
        let mut data = BTreeMap::new();
        let mut evicted = Vec::new();
        for (name, entry) in &mut self.sinks {
            let removed = entry.outbox.fit(budget);
            if removed.pending > 0 {
                entry.retain_unsent();
                evicted.push((name.clone(), removed));
            }
            if !entry.outbox.is_empty() {
                data.insert(name.clone(), entry.outbox.to_json());
            }
        }
        for (name, removed) in evicted {
            dropped(&self.metrics, &name, "capacity", removed);
            if let Some(entry) = self.sinks.get_mut(&name) {
                entry.restart_sender(&self.settings, &self.reports);
            }
        }
        if let Err(error) = self.store.save(data).await {
            warn!(%error, "cannot write the notification outbox; nothing new is sent until it is written");
            self.next_save = Instant::now() + SAVE_RETRY;
            return;
        }
        self.dirty = false;
        self.marks_dirty = false;
        for entry in self.sinks.values_mut() {
            if entry.unsent.is_empty() {
                continue;
            }
            let unsent = std::mem::take(&mut entry.unsent);
            let sender = entry.sender.get_or_insert_with(|| {
                Sender::start(
                    entry.sink.clone(),
                    self.settings.clone(),
                    self.reports.clone(),
                )
            });
            for event in unsent {
                sender.push(event);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{NotificationSinkSpec, NotificationType};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn candidate(kind: NotificationType, time: i64) -> Candidate {
        Candidate {
            id: format!("uid:{}", kind.suffix()),
            kind,
            namespace: "team".into(),
            time: chrono::DateTime::from_timestamp(time, 0).unwrap(),
            body: "{}".into(),
        }
    }

    fn sink(types: Vec<NotificationType>, selector: Option<LabelSelector>) -> SinkEntry {
        let mut sink = NotificationSink::new(
            "ops",
            NotificationSinkSpec {
                types,
                namespace_selector: selector,
                ..Default::default()
            },
        );
        sink.metadata.uid = Some("sink-uid".into());
        sink.metadata.creation_timestamp = Some(crate::time::to_k8s(
            chrono::DateTime::from_timestamp(1000, 0).unwrap(),
        ));
        SinkEntry::new(sink, Outbox::new("sink-uid"))
    }

    #[test]
    fn a_sink_wants_its_types_its_namespaces_and_nothing_older_than_itself() {
        let tier = |t: &str| Some([("tier".to_owned(), t.to_owned())].into());
        let all = sink(vec![], None);
        let requested = candidate(NotificationType::ApprovalRequested, 1000);
        assert!(all.wants(&requested, None));
        assert!(!all.wants(&candidate(NotificationType::ApprovalRequested, 999), None));

        let prod = sink(
            vec![NotificationType::RunFailed],
            Some(LabelSelector {
                match_labels: tier("prod"),
                ..Default::default()
            }),
        );
        let failed = candidate(NotificationType::RunFailed, 1001);
        assert!(prod.wants(&failed, tier("prod").as_ref()));
        assert!(!prod.wants(&failed, tier("dev").as_ref()));
        assert!(
            !prod.wants(&failed, None),
            "an unknown namespace matches no selector"
        );
        assert!(
            !prod.wants(&requested, tier("prod").as_ref()),
            "not its type"
        );
    }
}
