//! The one owner of delivery state, shared by the façade (`approvals`) and delivery
//! (`runner::delivery`): how delivery learns what to deliver (approvals named or handed over
//! after a change, "look at everything", and "the runner is back" from the event subscription),
//! and the runner's acceptances of decisions waiting to be recorded ([`Marks`]).

use std::{
    collections::HashMap,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::{sync::Notify, time::Instant};

use crate::{model::Approval, store::DeliveryOutcome};

/// Approvals named to delivery and not taken yet beyond which it is told to look at everything
/// instead: nobody takes them while another replica leads.
const MAX_NAMED: usize = 1024;

/// How delivery learns what to deliver: the approvals whose decision a change may have left
/// waiting, handed over as just written (a decision taken in this process, with the
/// `traceparent` it carries on) or by id, or "everything" (changes may have been missed).
/// Handed approvals are sent without being read back; named ones are read by id, in one
/// statement on PostgreSQL; the whole outbox is read only at start and when told to look at
/// everything.
#[derive(Default)]
pub struct DeliveryWake {
    notify: tokio::sync::Notify,
    due: Mutex<Due>,
    /// The event subscription reached the runner since delivery last looked.
    runner_back: AtomicBool,
}

/// What delivery has been told to look at since it last looked.
#[derive(Debug, Default, PartialEq)]
pub struct Due {
    /// Each id once, in the order named.
    pub ids: Vec<String>,
    /// Approvals whose decision awaits delivery, as written, each with its `traceparent`;
    /// each once, in the order handed.
    pub handed: Vec<(Approval, Option<String>)>,
    pub everything: bool,
}

impl DeliveryWake {
    /// The decisions of `ids` may be waiting to be delivered.
    pub fn named<I: Into<String>>(&self, ids: impl IntoIterator<Item = I>) {
        {
            let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
            if !due.everything {
                for id in ids {
                    let id = id.into();
                    if !due.ids.contains(&id) {
                        due.ids.push(id);
                    }
                }
                due.overflow();
            }
        }
        self.notify.notify_one();
    }

    /// `approval`'s decision, just written here, awaits delivery (the caller has checked that
    /// it does), which sends it as it is, continuing the trace `traceparent` (`None`: the
    /// request has none).
    pub fn handed(&self, approval: Approval, traceparent: Option<String>) {
        {
            let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
            if !due.everything && !due.handed.iter().any(|(a, _)| a.id() == approval.id()) {
                due.handed.push((approval, traceparent));
                due.overflow();
            }
        }
        self.notify.notify_one();
    }

    /// Any decision may be waiting: delivery reads the whole outbox.
    pub fn everything(&self) {
        *self.due.lock().unwrap_or_else(PoisonError::into_inner) = Due::everything();
        self.notify.notify_one();
    }

    /// The event subscription has just reached the runner: a delivery paused while the runner
    /// was unreachable tries again now instead of at its next probe.
    pub fn runner_back(&self) {
        self.runner_back.store(true, Ordering::Relaxed);
        self.notify.notify_one();
    }

    /// Whether [`runner_back`](Self::runner_back) was called since the last call, and forgets it.
    pub fn take_runner_back(&self) -> bool {
        self.runner_back.swap(false, Ordering::Relaxed)
    }

    /// Resolves once something was named since the last [`take`](Self::take) (or is named
    /// after this call).
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// What was named since the last call, and forgets it.
    pub fn take(&self) -> Due {
        std::mem::take(&mut *self.due.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Due {
    fn everything() -> Self {
        Self {
            everything: true,
            ..Self::default()
        }
    }

    /// Beyond [`MAX_NAMED`] approvals named or handed, "everything" instead.
    fn overflow(&mut self) {
        if self.ids.len() + self.handed.len() > MAX_NAMED {
            *self = Self::everything();
        }
    }
}

/// Deliveries the runner accepted whose record waits for the decision's consumption, by
/// request id.
#[derive(Default)]
pub struct Marks {
    waiting: Mutex<HashMap<String, Mark>>,
    /// Woken when a mark is added.
    pub added: Notify,
}

pub struct Mark {
    pub decision_id: String,
    pub run_id: String,
    /// When the runner accepted it.
    pub at: Instant,
}

impl Marks {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Mark>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the acceptance of `decision_id` of `request_id` waits to be recorded.
    pub fn holds(&self, request_id: &str, decision_id: &str) -> bool {
        held(&self.lock(), request_id, decision_id)
    }

    /// Forgets the mark of `decision_id` of `request_id`: it is recorded.
    pub fn forget(&self, request_id: &str, decision_id: &str) {
        let mut waiting = self.lock();
        if held(&waiting, request_id, decision_id) {
            waiting.remove(request_id);
        }
    }
}

/// Whether `waiting` holds the mark of `decision_id` of `request_id`.
fn held(waiting: &HashMap<String, Mark>, request_id: &str, decision_id: &str) -> bool {
    waiting
        .get(request_id)
        .is_some_and(|m| m.decision_id == decision_id)
}

/// A delivery attempt to record: request id, decision id, outcome.
pub type Attempt = (String, String, DeliveryOutcome);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn each_named_approval_is_told_once_until_taken() {
        let wake = DeliveryWake::default();
        wake.named(["a", "b"]);
        wake.named(["b", "c"]);
        let due = wake.take();
        assert_eq!(due.ids, ["a", "b", "c"]);
        assert!(!due.everything);
        assert_eq!(wake.take(), Due::default(), "taking forgets");
    }

    #[test]
    fn too_many_names_become_everything_and_hold_no_memory() {
        let wake = DeliveryWake::default();
        wake.named((0..=MAX_NAMED).map(|i| i.to_string()));
        wake.named(["late"]);
        assert_eq!(wake.take(), Due::everything());
        wake.named(["x"]);
        wake.everything();
        wake.named(["y"]);
        assert!(
            wake.take().everything,
            "everything covers what is named after it"
        );
    }

    pub(crate) fn approval(id: &str) -> Approval {
        let (request, _) = crate::convert::request_from_event(
            &arbor_shared::proto::runner::v1::ApprovalRequested {
                request_id: id.into(),
                run_id: "run".into(),
                ..Default::default()
            },
        )
        .unwrap();
        Approval {
            request,
            unknown_kind: None,
            state: crate::lifecycle::ApprovalState::Resolved,
            decision: None,
            created_at_ms: 0,
            arrival: 0,
            updated_at_ms: 0,
            version: 0,
            delivery_attempts: 0,
            last_delivery_error: String::new(),
            delivered_at_ms: 0,
            cancel_reason: String::new(),
            ext: Default::default(),
        }
    }

    #[test]
    fn the_runner_coming_back_is_told_once() {
        let wake = DeliveryWake::default();
        assert!(!wake.take_runner_back());
        wake.runner_back();
        wake.everything();
        assert!(wake.take_runner_back(), "everything does not hide it");
        assert!(!wake.take_runner_back(), "taking forgets");
    }

    #[test]
    fn each_handed_approval_is_kept_once_with_its_trace_and_counts_toward_everything() {
        let wake = DeliveryWake::default();
        wake.handed(approval("a"), Some("00-trace-a".into()));
        wake.handed(approval("a"), None);
        wake.handed(approval("b"), None);
        wake.named(["c"]);
        let due = wake.take();
        assert_eq!(
            due.handed,
            [
                (approval("a"), Some("00-trace-a".to_string())),
                (approval("b"), None)
            ]
        );
        assert_eq!(due.ids, ["c"]);
        assert_eq!(wake.take(), Due::default(), "taking forgets");

        wake.named((0..MAX_NAMED).map(|i| i.to_string()));
        wake.handed(approval("last straw"), None);
        assert_eq!(
            wake.take(),
            Due::everything(),
            "more than {MAX_NAMED} in all"
        );
        wake.everything();
        wake.handed(approval("after"), None);
        assert_eq!(
            wake.take(),
            Due::everything(),
            "everything covers what is handed after it"
        );
    }
}
