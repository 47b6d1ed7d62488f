//! Counting approvals on every backend: whatever path a backend counts a filter by (its state
//! indexes, or a listing), the count is what a listing of the same filter holds, stops at its
//! limit, and moves with every transition.

use arbor_approval_svc::{
    ApprovalStore,
    lifecycle::ApprovalState as St,
    model::{Filter, NewDecision},
};
use arbor_shared::{domain::DecisionKind, time::now_ms};

use super::{Backend, in_state, tool};

/// The count of `filter` and the length of its listing, both up to 100.
fn both<S: ApprovalStore>(store: &S, filter: &Filter) -> (usize, usize) {
    let now = now_ms();
    let listed = store.list(filter, 100, None, now).unwrap().items.len();
    (store.count(filter, 100, now).unwrap(), listed)
}

fn states(states: &[St]) -> Filter {
    Filter {
        states: states.to_vec(),
        ..Filter::default()
    }
}

pub async fn counts_agree_with_the_listing_and_stop_at_their_limit<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    for (i, state) in [
        St::Pending,
        St::Resolved,
        St::Expired,
        St::Acked,
        St::Pruned,
        St::Cancelled,
    ]
    .into_iter()
    .enumerate()
    {
        in_state(&store, &format!("s{i}"), state).await;
    }
    // Two more pending: one past its deadline, one before it.
    let mut late = tool("late", "run-2");
    late.deadline_ms = now_ms().saturating_sub(1_000);
    store.put_request(late, None).await.unwrap();
    let mut early = tool("early", "run-2");
    early.deadline_ms = now_ms() + 3_600_000;
    store.put_request(early, None).await.unwrap();

    let decided = [
        St::Resolved,
        St::Expired,
        St::Acked,
        St::Pruned,
        St::Cancelled,
    ];
    let overdue = Filter {
        overdue: true,
        ..Filter::default()
    };
    let cases = [
        (Filter::default(), 8),
        (states(&[St::Pending]), 3),
        (states(&decided), 5),
        (states(&[St::Resolved, St::Acked]), 2),
        (overdue.clone(), 1),
        (
            Filter {
                states: vec![St::Resolved],
                ..overdue.clone()
            },
            0,
        ),
        (
            Filter {
                run_id: "run-2".into(),
                ..states(&[St::Pending])
            },
            2,
        ),
    ];
    for (filter, want) in &cases {
        assert_eq!(both(&store, filter), (*want, *want), "{filter:?}");
    }
    // A count stops at its limit, by whatever path it is answered.
    let now = now_ms();
    assert_eq!(store.count(&Filter::default(), 2, now).unwrap(), 2);
    assert_eq!(store.count(&states(&[St::Pending]), 2, now).unwrap(), 2);
    assert_eq!(store.count(&states(&decided), 4, now).unwrap(), 4);

    // Deciding the overdue one moves it from the pending counts to the decided one.
    store
        .resolve_request("late", NewDecision::person(DecisionKind::Approve, "ana"))
        .await
        .unwrap();
    assert_eq!(both(&store, &overdue), (0, 0));
    assert_eq!(both(&store, &states(&[St::Pending])), (2, 2));
    assert_eq!(both(&store, &states(&decided)), (6, 6));
}
