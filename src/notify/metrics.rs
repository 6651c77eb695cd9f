//! The notifications' metrics, registered in the controller's Prometheus registry
//! ([`crate::controller::metrics`]), one series per sink.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of the per-sink series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkLabels {
    /// The NotificationSink's name.
    pub sink: String,
}

/// Labels of the dropped-events counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// The NotificationSink's name.
    pub sink: String,
    /// `expired` (older than the horizon) or `capacity` (evicted to keep the outbox's bound).
    pub reason: String,
}

/// The notifications' metrics.
#[derive(Clone, Debug, Default)]
pub struct NotifyMetrics {
    /// `agentrun_notifications_delivered_total`: events a sink accepted (2xx).
    pub delivered: Family<SinkLabels, Counter>,
    /// `agentrun_notification_delivery_failures_total`: failed attempts (network error, non-2xx,
    /// no usable key).
    pub failures: Family<SinkLabels, Counter>,
    /// `agentrun_notifications_dropped_total`: events that will not be delivered.
    pub dropped: Family<DropLabels, Counter>,
    /// `agentrun_notifications_pending`: events waiting in the sink's outbox.
    pub pending: Family<SinkLabels, Gauge>,
    /// `agentrun_notification_sink_failing`: 1 while the sink's last attempt failed.
    pub failing: Family<SinkLabels, Gauge>,
}

impl NotifyMetrics {
    /// New metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> NotifyMetrics {
        let metrics = NotifyMetrics::default();
        registry.register(
            "notifications_delivered",
            "Events a NotificationSink accepted",
            metrics.delivered.clone(),
        );
        registry.register(
            "notification_delivery_failures",
            "Failed attempts to deliver an event to a NotificationSink",
            metrics.failures.clone(),
        );
        registry.register(
            "notifications_dropped",
            "Events dropped undelivered: older than the horizon, or evicted to bound the outbox",
            metrics.dropped.clone(),
        );
        registry.register(
            "notifications_pending",
            "Events waiting in a NotificationSink's outbox",
            metrics.pending.clone(),
        );
        registry.register(
            "notification_sink_failing",
            "1 while the last delivery attempt to a NotificationSink failed",
            metrics.failing.clone(),
        );
        metrics
    }

    /// The labels of `sink`.
    pub fn sink(sink: &str) -> SinkLabels {
        SinkLabels {
            sink: sink.to_owned(),
        }
    }

    /// Counts `count` events of `sink` dropped for `reason`.
    pub fn drop(&self, sink: &str, reason: &str, count: usize) {
        if count > 0 {
            self.dropped
                .get_or_create(&DropLabels {
                    sink: sink.to_owned(),
                    reason: reason.to_owned(),
                })
                .inc_by(count as u64);
        }
    }

    /// Removes the series of a deleted sink.
    pub fn forget(&self, sink: &str) {
        let labels = Self::sink(sink);
        self.pending.remove(&labels);
        self.failing.remove(&labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_render_with_their_sink() {
        let mut registry = Registry::with_prefix("agentrun");
        let metrics = NotifyMetrics::register(&mut registry);
        metrics
            .delivered
            .get_or_create(&NotifyMetrics::sink("ops"))
            .inc();
        metrics
            .failures
            .get_or_create(&NotifyMetrics::sink("ops"))
            .inc();
        metrics
            .pending
            .get_or_create(&NotifyMetrics::sink("ops"))
            .set(3);
        metrics
            .failing
            .get_or_create(&NotifyMetrics::sink("ops"))
            .set(1);
        metrics.drop("ops", "expired", 2);
        metrics.drop("ops", "capacity", 0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "agentrun_notifications_delivered_total{sink=\"ops\"} 1",
            "agentrun_notification_delivery_failures_total{sink=\"ops\"} 1",
            "agentrun_notifications_dropped_total{sink=\"ops\",reason=\"expired\"} 2",
            "agentrun_notifications_pending{sink=\"ops\"} 3",
            "agentrun_notification_sink_failing{sink=\"ops\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        assert!(!text.contains("capacity"));
    }
}
