//! A durable event subscriber as a client would write one: it follows `StreamEvents` under its
//! own subscriber id, acks what it has stored, and reconnects (resuming from its acked cursor)
//! whenever the stream breaks. It records every event by `seq` and notes any gap or any seq
//! that comes back with different content.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use arbor_shared::proto::runner::v1::{self as pb, event::Detail};
use tokio::task::JoinHandle;

use crate::clients::{RunnerClient, is_transient};

/// What the checks need of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub seq: u64,
    pub kind: i32,
    pub run_id: String,
    /// The suspension an event is about, if any.
    pub request_id: String,
    pub decision_id: String,
    /// SuspensionCategory of EXECUTION_SUSPENDED and APPROVAL_RESOLVED.
    pub category: i32,
}

impl Seen {
    pub fn of(e: &pb::Event) -> Seen {
        let (request_id, decision_id, category) = match &e.detail {
            Some(Detail::ApprovalRequested(d)) => (d.request_id.clone(), String::new(), 0),
            Some(Detail::ExecutionSuspended(d)) => {
                (d.request_id.clone(), String::new(), d.category)
            }
            Some(Detail::ApprovalResolved(d)) => {
                (d.request_id.clone(), d.decision_id.clone(), d.category)
            }
            Some(Detail::ApprovalConsumed(d)) => (d.request_id.clone(), d.decision_id.clone(), 0),
            Some(Detail::SuspensionWithdrawn(d)) => (d.request_id.clone(), String::new(), 0),
            _ => (String::new(), String::new(), 0),
        };
        Seen {
            seq: e.seq,
            kind: e.kind,
            run_id: e.run_id.clone(),
            request_id,
            decision_id,
            category,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    events: BTreeMap<u64, Seen>,
    problems: Vec<String>,
}

/// The running subscriber.
pub struct Recorder {
    state: Arc<Mutex<State>>,
    connects: Arc<AtomicU64>,
    acked: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

/// Acks after this many new events, or when the stream goes quiet.
const ACK_EVERY: usize = 64;

impl Recorder {
    pub fn start(client: RunnerClient, subscriber_id: &str) -> Recorder {
        Self::start_spread(vec![client], subscriber_id)
    }

    /// A subscriber that opens each new stream on the next of `clients` (runner replicas on one
    /// database): its cursor lives in the database, so any replica resumes it.
    pub fn start_spread(clients: Vec<RunnerClient>, subscriber_id: &str) -> Recorder {
        assert!(!clients.is_empty());
        let state = Arc::new(Mutex::new(State::default()));
        let connects = Arc::new(AtomicU64::new(0));
        let acked = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(follow(
            clients,
            subscriber_id.to_string(),
            state.clone(),
            connects.clone(),
            acked.clone(),
            stop.clone(),
        ));
        Recorder {
            state,
            connects,
            acked,
            stop,
            task,
        }
    }

    /// Highest seq received such that every seq below it was received too.
    pub fn contiguous(&self) -> u64 {
        let state = self.state.lock().expect("recorder state");
        contiguous(&state.events)
    }

    /// Streams opened (1 + reconnects).
    pub fn connects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Stops following and returns what was recorded and what looked wrong.
    pub async fn finish(self) -> (BTreeMap<u64, Seen>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.abort();
        let _ = self.task.await;
        let mut state = self.state.lock().expect("recorder state");
        (
            std::mem::take(&mut state.events),
            std::mem::take(&mut state.problems),
        )
    }
}

fn contiguous(events: &BTreeMap<u64, Seen>) -> u64 {
    let mut last = 0;
    for seq in events.keys() {
        if *seq != last + 1 {
            break;
        }
        last = *seq;
    }
    last
}

async fn follow(
    clients: Vec<RunnerClient>,
    subscriber_id: String,
    state: Arc<Mutex<State>>,
    connects: Arc<AtomicU64>,
    acked: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    let mut pause = Duration::from_millis(20);
    let mut attempt = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let mut client = clients[attempt % clients.len()].clone();
        attempt += 1;
        // No after_seq: the runner resumes from this subscriber's acked cursor.
        let request = pb::StreamEventsRequest {
            subscriber_id: subscriber_id.clone(),
            follow: true,
            ..Default::default()
        };
        // A follow stream lives long: no per-call deadline on it.
        let mut request = tonic::Request::new(request);
        request.set_timeout(Duration::from_secs(24 * 3600));
        let mut stream = match client.stream_events(request).await {
            Ok(s) => s.into_inner(),
            Err(e) => {
                if !is_transient(&e) {
                    state
                        .lock()
                        .expect("recorder state")
                        .problems
                        .push(format!("StreamEvents refused: {e}"));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
                continue;
            }
        };
        connects.fetch_add(1, Ordering::Relaxed);
        pause = Duration::from_millis(20);
        let mut unacked = 0usize;
        loop {
            let next = tokio::time::timeout(Duration::from_millis(100), stream.message()).await;
            match next {
                Ok(Ok(Some(item))) => {
                    let Some(event) = item.event else { continue };
                    record(&state, Seen::of(&event));
                    unacked += 1;
                    if unacked >= ACK_EVERY {
                        ack(&mut client, &subscriber_id, &state, &acked).await;
                        unacked = 0;
                    }
                }
                // Quiet for a moment: a good time to store the cursor.
                Err(_) => {
                    if unacked > 0 {
                        ack(&mut client, &subscriber_id, &state, &acked).await;
                        unacked = 0;
                    }
                }
                Ok(Ok(None)) | Ok(Err(_)) => break,
            }
        }
    }
}

fn record(state: &Mutex<State>, seen: Seen) {
    let mut state = state.lock().expect("recorder state");
    let top = state.events.keys().next_back().copied().unwrap_or(0);
    if seen.seq > top + 1 {
        let problem = format!(
            "gap: received seq {} right after {top} (nothing in between was streamed)",
            seen.seq
        );
        state.problems.push(problem);
    }
    match state.events.get(&seen.seq) {
        Some(before) if *before != seen => {
            let problem = format!(
                "seq {} streamed twice with different content: {before:?} then {seen:?}",
                seen.seq
            );
            state.problems.push(problem);
        }
        Some(_) => {}
        None => {
            state.events.insert(seen.seq, seen);
        }
    }
}

/// Stores the cursor (everything up to it is recorded). A failure is retried at the next ack.
async fn ack(
    client: &mut RunnerClient,
    subscriber_id: &str,
    state: &Mutex<State>,
    acked: &AtomicU64,
) {
    let upto = contiguous(&state.lock().expect("recorder state").events);
    if upto == 0 {
        return;
    }
    if let Ok(r) = client
        .ack(pb::AckRequest {
            subscriber_id: subscriber_id.to_string(),
            seq: upto,
        })
        .await
    {
        acked.fetch_max(r.into_inner().acked_seq, Ordering::Relaxed);
    }
}
