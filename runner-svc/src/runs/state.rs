//! The run status machine, as one transition function (like the job machine in
//! `mailbox/state.rs`), so the lifecycle is readable in code and an illegal move is a typed error
//! rather than a silent overwrite.
//!
//! ```text
//! Queued/Running/Suspended --step(outcome)-->  Running | Suspended | Succeeded | Failed
//! Queued/Running/Suspended --cancel-->         Cancelled
//! Queued                   --supersede-->      Superseded   (interrupt before the run started)
//! Queued/Running/Suspended --dead letter-->    Failed
//! Failed                   --revive-->         Queued (never started) | Running  (requeue)
//! ```

use arbor_shared::domain::RunStatus;

/// What happens to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEvent {
    /// A tick committed; the run is now `outcome` (not Cancelled or Superseded).
    Step(RunStatus),
    Cancel,
    Supersede,
    DeadLetter,
    /// An operator requeued the dead-lettered job; `started`: the run had ticked before.
    Revive {
        started: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("run cannot go from {from:?} on {event:?}")]
pub struct InvalidTransition {
    pub from: RunStatus,
    pub event: RunEvent,
}

// Here rather than in `error`, so that the error type does not import the application layer.
impl From<InvalidTransition> for crate::error::RunnerError {
    fn from(e: InvalidTransition) -> Self {
        Self::InvalidTransition(e.to_string())
    }
}

/// The next status, or the typed reason the move is illegal.
pub fn transition(from: RunStatus, event: RunEvent) -> Result<RunStatus, InvalidTransition> {
    use RunEvent as E;
    use RunStatus as S;
    let open = matches!(from, S::Queued | S::Running | S::Suspended);
    let to = match event {
        E::Step(to @ (S::Running | S::Suspended | S::Succeeded | S::Failed)) if open => to,
        E::Cancel if open => S::Cancelled,
        E::Supersede if from == S::Queued => S::Superseded,
        E::DeadLetter if open => S::Failed,
        E::Revive { started } if from == S::Failed => {
            if started {
                S::Running
            } else {
                S::Queued
            }
        }
        _ => return Err(InvalidTransition { from, event }),
    };
    Ok(to)
}

/// `transition` inside a transaction: an illegal move aborts it, so nothing is written.
pub(crate) fn apply<E: From<InvalidTransition>>(
    from: RunStatus,
    event: RunEvent,
) -> crate::store::TxResult<RunStatus, E> {
    transition(from, event).or_else(crate::store::abort)
}

#[cfg(test)]
mod tests {
    use super::*;
    use RunEvent as E;
    use RunStatus as S;

    const ALL: [S; 7] = [
        S::Queued,
        S::Running,
        S::Suspended,
        S::Succeeded,
        S::Failed,
        S::Cancelled,
        S::Superseded,
    ];

    #[test]
    fn the_diagram_holds_and_everything_else_is_refused() {
        let events = ALL.iter().map(|s| E::Step(*s)).chain([
            E::Cancel,
            E::Supersede,
            E::DeadLetter,
            E::Revive { started: true },
            E::Revive { started: false },
        ]);
        let mut legal = Vec::new();
        for event in events {
            for from in ALL {
                if let Ok(to) = transition(from, event) {
                    legal.push((from, event, to));
                }
            }
        }
        let open = [S::Queued, S::Running, S::Suspended];
        let mut want = Vec::new();
        for to in [S::Running, S::Suspended, S::Succeeded, S::Failed] {
            want.extend(open.map(|from| (from, E::Step(to), to)));
        }
        want.extend(open.map(|from| (from, E::Cancel, S::Cancelled)));
        want.push((S::Queued, E::Supersede, S::Superseded));
        want.extend(open.map(|from| (from, E::DeadLetter, S::Failed)));
        want.push((S::Failed, E::Revive { started: true }, S::Running));
        want.push((S::Failed, E::Revive { started: false }, S::Queued));
        assert_eq!(legal, want);
    }

    #[test]
    fn finished_runs_stay_finished() {
        for from in [S::Succeeded, S::Cancelled, S::Superseded] {
            assert!(transition(from, E::Step(S::Running)).is_err());
            assert!(transition(from, E::Cancel).is_err());
            assert!(transition(from, E::Revive { started: true }).is_err());
        }
    }
}
