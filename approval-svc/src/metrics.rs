//! Counters an operator needs to see that the loop with the runner is healthy, and how long
//! approvals wait for a decision. The counters are logged with every notable change and
//! exported, with the decision-latency histogram and the pending gauge, on `/metrics`.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use arbor_shared::{
    domain::{DecisionKind, DecisionSource},
    metrics::ScrapeCollector,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub source: &'static str,
    pub decision: &'static str,
}

/// A webhook endpoint, by its name in the webhooks file.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: String,
}

/// How one delivery to a webhook endpoint went (`delivered`, `rejected`, `failed`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub endpoint: String,
    pub outcome: &'static str,
}

/// People take minutes to days; policies and timeouts milliseconds. Seconds, 10 ms to 1 week.
const LATENCY_BUCKETS: [f64; 14] = [
    0.01, 0.1, 1.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0, 86400.0,
    604800.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

#[derive(Debug)]
pub struct Metrics {
    pub events_processed: AtomicU64,
    /// The runner compacted the event log past our cursor: events may have been lost.
    pub cursor_lost: AtomicU64,
    pub malformed_events: AtomicU64,
    pub stream_reconnects: AtomicU64,
    pub acks_sent: AtomicU64,
    pub deliveries_accepted: AtomicU64,
    /// Attempts that failed and will be retried.
    pub delivery_failures: AtomicU64,
    pub deliveries_refused: AtomicU64,
    /// Gauge: decisions delivery holds to send (queued, in flight or waiting for a retry).
    pub delivery_backlog: AtomicU64,
    /// Gauge, 1 or 0: the runner is unreachable and delivery only probes it.
    pub delivery_paused: AtomicU64,
    /// Final approvals (and their audit entries) retention deleted.
    pub retained_approvals: AtomicU64,
    pub retained_audit_entries: AtomicU64,
    /// Seconds from the request's arrival here to its decision, by source.
    pub decision_latency: Family<SourceLabels, Histogram, fn() -> Histogram>,
    pub decisions: Family<DecisionLabels, Counter>,
    /// Gauge: webhook messages waiting for each endpoint (kept by the leader's delivery).
    pub webhook_backlog: Family<EndpointLabels, Gauge>,
    pub webhook_deliveries: Family<WebhookLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            events_processed: AtomicU64::new(0),
            cursor_lost: AtomicU64::new(0),
            malformed_events: AtomicU64::new(0),
            stream_reconnects: AtomicU64::new(0),
            acks_sent: AtomicU64::new(0),
            deliveries_accepted: AtomicU64::new(0),
            delivery_failures: AtomicU64::new(0),
            deliveries_refused: AtomicU64::new(0),
            delivery_backlog: AtomicU64::new(0),
            delivery_paused: AtomicU64::new(0),
            retained_approvals: AtomicU64::new(0),
            retained_audit_entries: AtomicU64::new(0),
            decision_latency: Family::new_with_constructor(latency_histogram),
            decisions: Family::default(),
            webhook_backlog: Family::default(),
            webhook_deliveries: Family::default(),
        }
    }
}

pub fn source_label(source: DecisionSource) -> &'static str {
    match source {
        DecisionSource::Person => "person",
        DecisionSource::Policy => "policy",
        DecisionSource::Timeout => "timeout",
    }
}

impl Metrics {
    pub fn inc(counter: &AtomicU64) -> u64 {
        counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn add(counter: &AtomicU64, n: u64) -> u64 {
        counter.fetch_add(n, Ordering::Relaxed) + n
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Sets a gauge kept as an atomic.
    pub fn set(gauge: &AtomicU64, value: u64) {
        gauge.store(value, Ordering::Relaxed);
    }

    /// One new decision (not a duplicate) that waited `waited_ms` since the request arrived.
    pub fn observe_decision(&self, source: DecisionSource, kind: DecisionKind, waited_ms: u64) {
        let source = source_label(source);
        self.decision_latency
            .get_or_create(&SourceLabels { source })
            .observe(waited_ms as f64 / 1000.0);
        self.decisions
            .get_or_create(&DecisionLabels {
                source,
                decision: kind.as_str(),
            })
            .inc();
    }
}

/// What the registry reads of the service at each scrape (metrics depend on nothing else of it).
pub struct Scraped {
    /// This replica's name.
    pub replica: String,
    /// Whether it leads.
    pub leading: bool,
    /// How many approvals are PENDING; `None`: the count could not be read.
    pub pending: Option<u64>,
    /// The store's fsyncs so far.
    pub fsyncs: u64,
}

/// The registry `/metrics` serves: the histogram and decision counter as they are kept, the
/// atomic counters and what `scrape` reads, at scrape time.
pub fn registry(
    metrics: Arc<Metrics>,
    scrape: impl Fn() -> Scraped + Send + Sync + 'static,
) -> Registry {
    let mut registry = Registry::default();
    // Every source appears from the first scrape, so rate() and absent() behave.
    for source in [
        DecisionSource::Person,
        DecisionSource::Policy,
        DecisionSource::Timeout,
    ] {
        let _ = metrics.decision_latency.get_or_create(&SourceLabels {
            source: source_label(source),
        });
    }
    registry.register(
        "arbor_approval_decision_latency_seconds",
        "Time from an approval request's arrival to its decision, by source.",
        metrics.decision_latency.clone(),
    );
    registry.register(
        "arbor_approval_decisions",
        "Decisions taken (duplicates not counted), by source and decision.",
        metrics.decisions.clone(),
    );
    registry.register(
        "arbor_approval_webhook_backlog",
        "Webhook messages waiting for delivery, by endpoint (kept by the leader).",
        metrics.webhook_backlog.clone(),
    );
    registry.register(
        "arbor_approval_webhook_deliveries",
        "Webhook delivery attempts, by endpoint and outcome (delivered, rejected, failed).",
        metrics.webhook_deliveries.clone(),
    );
    registry.register_collector(Box::new(ScrapeCollector::new(move |s| {
        let m = &*metrics;
        let Scraped {
            replica,
            leading,
            pending,
            fsyncs,
        } = scrape();
        let counters: [(&str, &str, &AtomicU64); 10] = [
            (
                "arbor_approval_delivery_retries",
                "Deliveries to the runner that failed and will be retried.",
                &m.delivery_failures,
            ),
            (
                "arbor_approval_cursor_lost",
                "Times the runner had compacted its event log past this service's cursor.",
                &m.cursor_lost,
            ),
            (
                "arbor_approval_deliveries_accepted",
                "Decisions the runner accepted.",
                &m.deliveries_accepted,
            ),
            (
                "arbor_approval_deliveries_refused",
                "Decisions the runner refused as stale (the approval was cancelled).",
                &m.deliveries_refused,
            ),
            (
                "arbor_approval_events_processed",
                "Runner events applied to the store.",
                &m.events_processed,
            ),
            (
                "arbor_approval_malformed_events",
                "Runner events that could not be stored and were passed over.",
                &m.malformed_events,
            ),
            (
                "arbor_approval_stream_reconnects",
                "Reconnects of the event subscription.",
                &m.stream_reconnects,
            ),
            (
                "arbor_approval_acks_sent",
                "Cursor acks sent to the runner.",
                &m.acks_sent,
            ),
            (
                "arbor_approval_retention_approvals_removed",
                "Final approvals deleted by retention.",
                &m.retained_approvals,
            ),
            (
                "arbor_approval_retention_audit_entries_removed",
                "Audit entries deleted by retention with their approvals.",
                &m.retained_audit_entries,
            ),
        ];
        for (name, help, value) in counters {
            s.counter(name, help, &[], Metrics::get(value));
        }
        s.counter(
            "arbor_approval_fsyncs",
            "Group-commit flushes (fsyncs) of the approval database.",
            &[],
            fsyncs,
        );
        let gauges: [(&str, &str, &AtomicU64); 2] = [
            (
                "arbor_approval_delivery_backlog",
                "Decisions the leader holds to deliver to the runner: queued, in flight or \
                 waiting for a retry.",
                &m.delivery_backlog,
            ),
            (
                "arbor_approval_delivery_paused",
                "1 while the runner is unreachable and delivery only probes it, else 0.",
                &m.delivery_paused,
            ),
        ];
        for (name, help, value) in gauges {
            s.gauge(name, help, &[], Metrics::get(value) as f64);
        }
        s.gauge(
            "arbor_approval_leader",
            "1 while this replica leads (follows the runner and delivers decisions), else 0.",
            &[("replica", replica.as_str())],
            f64::from(u8::from(leading)),
        );
        match pending {
            Some(n) => s.gauge(
                "arbor_approval_pending",
                "Approvals waiting for a decision.",
                &[],
                n as f64,
            ),
            None => tracing::warn!("metrics: could not count pending approvals"),
        }
    })));
    registry
}
