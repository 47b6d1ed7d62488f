//! The job status machine of DESIGN §5, as one transition function so the diagram is readable in
//! code and an illegal move is a typed error rather than a silent overwrite.
//!
//! ```text
//! Queued  --claim-->            Claimed --ack--> Accepted
//! Claimed --nack(retry)-->      Queued            (available_at = now + backoff)
//! Claimed --nack(permanent)-->  DeadLetter        (also when attempts are exhausted)
//! Claimed --lease expired-->    Queued            (or DeadLetter when attempts are exhausted)
//! Queued/Claimed --cancel-->    Cancelled
//! Queued  --interrupt-->        Superseded        (generation bump)
//! DeadLetter --requeue-->       Queued            (operator)
//! ```

use arbor_shared::domain::JobStatus;

/// What happens to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEvent {
    Claim,
    Ack,
    NackRetry,
    NackPermanent,
    /// A nack or lease expiry after the last allowed attempt.
    AttemptsExhausted,
    LeaseExpired,
    Cancel,
    Supersede,
    Requeue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("job cannot go from {from:?} on {event:?}")]
pub struct InvalidTransition {
    pub from: JobStatus,
    pub event: JobEvent,
}

/// The next status, or the typed reason the move is illegal.
pub fn transition(from: JobStatus, event: JobEvent) -> Result<JobStatus, InvalidTransition> {
    use JobEvent as E;
    use JobStatus as S;
    let to = match (from, event) {
        (S::Queued, E::Claim) => S::Claimed,
        (S::Claimed, E::Ack) => S::Accepted,
        (S::Claimed, E::NackRetry | E::LeaseExpired) => S::Queued,
        (S::Claimed, E::NackPermanent | E::AttemptsExhausted) => S::DeadLetter,
        (S::Queued | S::Claimed, E::Cancel) => S::Cancelled,
        (S::Queued, E::Supersede) => S::Superseded,
        (S::DeadLetter, E::Requeue) => S::Queued,
        _ => return Err(InvalidTransition { from, event }),
    };
    Ok(to)
}

/// Jobs in these states will never run again.
pub fn is_final(status: JobStatus) -> bool {
    matches!(
        status,
        JobStatus::Accepted | JobStatus::Cancelled | JobStatus::Superseded
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobEvent as E;
    use JobStatus as S;

    const ALL_STATUSES: [S; 6] = [
        S::Queued,
        S::Claimed,
        S::Accepted,
        S::DeadLetter,
        S::Cancelled,
        S::Superseded,
    ];
    const ALL_EVENTS: [E; 9] = [
        E::Claim,
        E::Ack,
        E::NackRetry,
        E::NackPermanent,
        E::AttemptsExhausted,
        E::LeaseExpired,
        E::Cancel,
        E::Supersede,
        E::Requeue,
    ];

    #[test]
    fn exactly_the_diagrams_moves_are_legal() {
        let legal = [
            (S::Queued, E::Claim, S::Claimed),
            (S::Claimed, E::Ack, S::Accepted),
            (S::Claimed, E::NackRetry, S::Queued),
            (S::Claimed, E::LeaseExpired, S::Queued),
            (S::Claimed, E::NackPermanent, S::DeadLetter),
            (S::Claimed, E::AttemptsExhausted, S::DeadLetter),
            (S::Queued, E::Cancel, S::Cancelled),
            (S::Claimed, E::Cancel, S::Cancelled),
            (S::Queued, E::Supersede, S::Superseded),
            (S::DeadLetter, E::Requeue, S::Queued),
        ];
        for from in ALL_STATUSES {
            for event in ALL_EVENTS {
                let expected = legal
                    .iter()
                    .find(|(f, e, _)| *f == from && *e == event)
                    .map(|(_, _, to)| *to);
                match (transition(from, event), expected) {
                    (Ok(to), Some(want)) => assert_eq!(to, want, "{from:?} {event:?}"),
                    (Err(err), None) => assert_eq!(err, InvalidTransition { from, event }),
                    (got, want) => panic!("{from:?} on {event:?}: got {got:?}, want {want:?}"),
                }
            }
        }
    }

    #[test]
    fn final_states_have_no_way_out() {
        for from in ALL_STATUSES.into_iter().filter(|s| is_final(*s)) {
            for event in ALL_EVENTS {
                assert!(transition(from, event).is_err());
            }
        }
    }
}
