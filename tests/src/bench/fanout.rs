//! Event fan-out: S live StreamEvents subscribers while policy-approved cycles run; delivery
//! latency from the event's append (its timestamp) to its receipt, and events delivered per
//! second across all subscribers.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;

use arbor_shared::proto::runner::v1 as rpb;

use super::{
    cluster::{BenchCluster, READER, SUBMITTER},
    cycle::TREE,
};

#[derive(Debug, Clone)]
pub struct FanoutResult {
    pub subscribers: usize,
    pub rate: usize,
    pub cycles: usize,
    pub delivered: usize,
    pub elapsed: Duration,
    pub latencies_ms: Vec<u64>,
}

impl FanoutResult {
    pub fn events_per_s(&self) -> f64 {
        self.delivered as f64 / self.elapsed.as_secs_f64()
    }

    pub fn pct_ms(&self, q: f64) -> u64 {
        if self.latencies_ms.is_empty() {
            return 0;
        }
        let i = ((self.latencies_ms.len() as f64 - 1.0) * q).round() as usize;
        self.latencies_ms[i.min(self.latencies_ms.len() - 1)]
    }
}

pub async fn run(subscribers: usize, cycles: usize, rate: usize) -> FanoutResult {
    let cluster = BenchCluster::start(true, &[]).await;
    let runner = cluster.runner_as(SUBMITTER).await;
    let mut registrar = runner.clone();
    registrar
        .register_tree(rpb::RegisterTreeRequest {
            document: TREE.into(),
            format: 0,
        })
        .await
        .expect("register");
    let delivered = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let mut subs = Vec::new();
    // 100 streams over 10 connections, as 100 separate consumers behind a few hosts would be.
    let mut channels = Vec::new();
    for _ in 0..10 {
        channels.push(cluster.runner_as(READER).await);
    }
    let t = Instant::now();
    for i in 0..subscribers {
        let mut client = channels[i % channels.len()].clone();
        let (delivered, stop) = (delivered.clone(), stop.clone());
        subs.push(tokio::spawn(async move {
            let mut stream = client
                .stream_events(rpb::StreamEventsRequest {
                    after_seq: Some(0),
                    follow: true,
                    ..Default::default()
                })
                .await
                .expect("subscribe")
                .into_inner();
            let mut latencies = Vec::new();
            let mut last = t;
            loop {
                let item = tokio::select! {
                    item = stream.message() => item,
                    _ = stop.cancelled() => break,
                };
                let Ok(Some(item)) = item else { break };
                last = Instant::now();
                let now = arbor_shared::time::now_ms();
                if let Some(time) = item.event.and_then(|e| e.time) {
                    latencies.push(now.saturating_sub(arbor_shared::time::from_timestamp(&time)));
                }
                delivered.fetch_add(1, Ordering::Relaxed);
            }
            (latencies, last)
        }));
    }
    // A steady producer: `rate` submissions per second, each cycle then runs to completion.
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1) as f64));
    let mut inflight = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        tick.tick().await;
        let mut runner = runner.clone();
        inflight.push(tokio::spawn(async move {
            runner
                .submit_run(rpb::SubmitRunRequest {
                    tree_id: "bench-cycle".into(),
                    ..Default::default()
                })
                .await
                .expect("submit");
        }));
    }
    for d in inflight {
        d.await.expect("submit");
    }
    // Let the last cycles finish and reach every subscriber.
    let settle_until = Instant::now() + Duration::from_secs(60);
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = delivered.load(Ordering::Relaxed);
        if now == last || Instant::now() > settle_until {
            break;
        }
        last = now;
    }
    stop.cancel();
    let mut latencies_ms = Vec::new();
    let mut last = t;
    for sub in subs {
        let (mine, at) = sub.await.expect("subscriber");
        latencies_ms.extend(mine);
        last = last.max(at);
    }
    let elapsed = last - t;
    latencies_ms.sort_unstable();
    let result = FanoutResult {
        subscribers,
        rate,
        cycles,
        delivered: delivered.load(Ordering::Relaxed),
        elapsed,
        latencies_ms,
    };
    cluster.stop().await;
    result
}
