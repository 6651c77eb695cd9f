//! The controller's Events, published beside the reconciles: a bounded queue drained by a few
//! publishers at once.
//!
//! An Event is best effort: the audit trail is the requests' status and the run's state, and a
//! reconcile never waits for an Event. So when the API server falls behind, the Events that do
//! not fit in the queue are dropped (and counted) instead of piling up in the controller's memory,
//! as client-go's event broadcaster drops what does not fit in its 1000.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc::{self, error::TrySendError};
use tracing::{Instrument, Span, warn};

use super::metrics::Metrics;

/// How many Events wait at most to be published; more are dropped.
pub const EVENTS_QUEUED: usize = 1024;

/// How many Events are published at once (so that a burst of completions does not open a
/// connection per Event).
pub const EVENTS_AT_ONCE: usize = 16;

/// One Event waiting to be published.
pub struct Queued {
    /// The Event.
    pub event: Event,
    /// The object it is about.
    pub regarding: ObjectReference,
    /// The span it was queued in (the reconcile's), for the publisher's logs.
    span: Span,
}

/// The sending side: where reconciles queue their Events.
#[derive(Clone)]
pub struct EventQueue {
    sender: mpsc::Sender<Queued>,
    metrics: Arc<Metrics>,
}

impl EventQueue {
    /// A queue of at most `capacity` Events, and its receiving side for [`publish_all`].
    pub fn new(capacity: usize, metrics: Arc<Metrics>) -> (EventQueue, mpsc::Receiver<Queued>) {
        let (sender, receiver) = mpsc::channel(capacity.max(1));
        (EventQueue { sender, metrics }, receiver)
    }

    /// Queues `event` about `regarding` without waiting; returns whether it was queued (a full
    /// queue drops it, counted in `agentrun_events_dropped_total`).
    pub fn enqueue(&self, event: Event, regarding: ObjectReference) -> bool {
        let queued = Queued {
            event,
            regarding,
            span: Span::current(),
        };
        // Counted before it is sent, so that a publisher taking it at once never counts below 0.
        self.metrics.events_queued.inc();
        let sent = self.sender.try_send(queued);
        if sent.is_err() {
            self.metrics.events_queued.dec();
        }
        match sent {
            Ok(()) => true,
            Err(TrySendError::Full(dropped)) => {
                let count = self.metrics.events_dropped.inc() + 1;
                if count == 1 || count.is_multiple_of(1000) {
                    warn!(
                        dropped = count,
                        reason = %dropped.event.reason,
                        "the Event queue is full, so Events are dropped"
                    );
                }
                false
            }
            Err(TrySendError::Closed(_)) => false,
        }
    }
}

/// Publishes the queued Events, `at_once` at a time, until every [`EventQueue`] is dropped.
pub async fn publish_all<F, Fut>(
    mut receiver: mpsc::Receiver<Queued>,
    at_once: usize,
    metrics: Arc<Metrics>,
    publish: F,
) where
    F: Fn(Queued) -> Fut,
    Fut: Future<Output = ()>,
{
    futures::stream::poll_fn(|cx| receiver.poll_recv(cx))
        .for_each_concurrent(at_once.max(1), |queued| {
            metrics.events_queued.dec();
            let span = queued.span.clone();
            publish(queued).instrument(span)
        })
        .await;
}

/// Publishes one Event with kube's [`Recorder`]. Warnings can repeat and share `warnings`, which
/// keeps each Event it published for six minutes so that a repeat counts in the first one's
/// series. A run's Normal Events announce its transitions, which do not repeat: each goes through
/// a recorder of its own that keeps nothing (kept, they took about 2 KiB each: tens of MiB while
/// 10,000 runs halt).
pub fn publisher(
    client: Client,
    reporter: Reporter,
) -> impl Fn(Queued) -> futures::future::BoxFuture<'static, ()> {
    let warnings = Recorder::new(client.clone(), reporter.clone());
    move |queued: Queued| {
        let recorder = match queued.event.type_ {
            EventType::Warning => warnings.clone(),
            EventType::Normal => Recorder::new(client.clone(), reporter.clone()),
        };
        Box::pin(async move {
            if let Err(error) = recorder.publish(&queued.event, &queued.regarding).await {
                warn!(%error, reason = %queued.event.reason, "could not publish an Event");
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    fn event(note: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: "WorkerStarted".into(),
            note: Some(note.into()),
            action: "WorkerStarted".into(),
            secondary: None,
        }
    }

    fn queued_gauge(metrics: &Metrics) -> i64 {
        metrics.events_queued.get()
    }

    #[test]
    fn a_full_queue_drops_what_does_not_fit_and_counts_it() {
        let metrics = Arc::new(Metrics::default());
        let (queue, mut receiver) = EventQueue::new(2, metrics.clone());
        let queued: Vec<bool> = (0..5)
            .map(|i| queue.enqueue(event(&i.to_string()), ObjectReference::default()))
            .collect();
        assert_eq!(queued, [true, true, false, false, false]);
        assert_eq!(metrics.events_dropped.get(), 3);
        assert_eq!(queued_gauge(&metrics), 2);
        let first = receiver.try_recv().expect("the first Event is queued");
        assert_eq!(first.event.note.as_deref(), Some("0"));
        assert!(queue.enqueue(event("5"), ObjectReference::default()));
        assert!(metrics.encode().contains("agentrun_events_dropped_total 3"));
    }

    #[tokio::test]
    async fn the_publishers_drain_the_queue_a_few_at_a_time() {
        let metrics = Arc::new(Metrics::default());
        let (queue, receiver) = EventQueue::new(64, metrics.clone());
        for i in 0..20 {
            assert!(queue.enqueue(event(&i.to_string()), ObjectReference::default()));
        }
        drop(queue);
        let (running, most, published) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let publish = |_queued: Queued| {
            let (running, most, published) = (running.clone(), most.clone(), published.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                published.fetch_add(1, Ordering::SeqCst);
            }
        };
        tokio::time::timeout(
            Duration::from_secs(10),
            publish_all(receiver, 3, metrics.clone(), publish),
        )
        .await
        .expect("the publishers stop once the queue is dropped and drained");
        assert_eq!(published.load(Ordering::SeqCst), 20);
        assert_eq!(most.load(Ordering::SeqCst), 3);
        assert_eq!(queued_gauge(&metrics), 0);
        assert_eq!(metrics.events_dropped.get(), 0);
    }
}
