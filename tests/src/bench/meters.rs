//! What both services' `/metrics` say around a measured section: the counters a cycle row
//! reports per cycle, summed over the replicas.

use super::cluster;

/// What both services' `/metrics` say so far, from one scrape of each replica: fsyncs of both,
/// the runners' transactions run again after a conflict, the events their streams read from
/// the store, and approval-svc's decision latency histogram for `source` (sum of seconds,
/// count).
#[derive(Debug, Clone, Copy, Default)]
pub struct Meters {
    pub fsyncs: Option<f64>,
    pub conflicts: Option<f64>,
    pub streamed_from_store: Option<f64>,
    pub decided: Option<(f64, f64)>,
}

impl Meters {
    /// Summed over every replica: each counts its own flushes, and the leader of approval-svc
    /// takes the policy decisions (a follower's histogram stays empty).
    pub async fn read(cluster: &cluster::BenchCluster, source: &str) -> Self {
        let labels = [("source", source)];
        let (mut fsyncs, mut conflicts, mut streamed_from_store) =
            (Some(0.0), Some(0.0), Some(0.0));
        let mut decided = None::<(f64, f64)>;
        for r in &cluster.runners {
            let runner = crate::scrape::scrape(&r.metrics_url()).await;
            fsyncs = fsyncs
                .zip(runner.get("arbor_runner_fsyncs_total", &[]))
                .map(|(a, b)| a + b);
            conflicts = conflicts
                .zip(runner.get("arbor_runner_store_conflicts_total", &[]))
                .map(|(a, b)| a + b);
            let from_store = [("from", "store")];
            streamed_from_store = streamed_from_store
                .zip(runner.get("arbor_runner_stream_events_read_total", &from_store))
                .map(|(a, b)| a + b);
        }
        for a in &cluster.approvals {
            let approval = crate::scrape::scrape(&a.metrics_url()).await;
            fsyncs = fsyncs
                .zip(approval.get("arbor_approval_fsyncs_total", &[]))
                .map(|(a, b)| a + b);
            if let Some((s, n)) = approval
                .get("arbor_approval_decision_latency_seconds_sum", &labels)
                .zip(approval.get("arbor_approval_decision_latency_seconds_count", &labels))
            {
                let (s0, n0) = decided.unwrap_or_default();
                decided = Some((s0 + s, n0 + n));
            }
        }
        Self {
            fsyncs,
            conflicts,
            streamed_from_store,
            decided,
        }
    }

    /// fsyncs since `before`.
    pub fn fsyncs_since(&self, before: &Self) -> Option<u64> {
        counted_since(before.fsyncs, self.fsyncs)
    }

    /// The runners' conflicts since `before`.
    pub fn conflicts_since(&self, before: &Self) -> Option<u64> {
        counted_since(before.conflicts, self.conflicts)
    }

    /// Events the runners' streams read from the store since `before`.
    pub fn streamed_from_store_since(&self, before: &Self) -> Option<u64> {
        counted_since(before.streamed_from_store, self.streamed_from_store)
    }

    /// Mean decision latency (ms) of the decisions taken since `before`.
    pub fn decide_ms_since(&self, before: &Self) -> Option<f64> {
        let ((s0, n0), (s1, n1)) = before.decided.zip(self.decided)?;
        (n1 > n0).then(|| (s1 - s0) / (n1 - n0) * 1e3)
    }
}

/// How far a counter moved from `then` to `now`, when both were read.
fn counted_since(then: Option<f64>, now: Option<f64>) -> Option<u64> {
    let (a, b) = then.zip(now)?;
    Some((b - a).max(0.0) as u64)
}
