//! Sixteen people vote on one request at the same moment, through every approval replica: each
//! vote is answered OK and kept, the decision is taken once (by the last vote), the audit shows
//! every vote, the run takes the decision in once and the ledger holds one record.

use std::sync::Arc;

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::flow::vote;
use rpb::DecisionKind as K;
use tokio::sync::Barrier;

use super::{Env, Expect, board, payment, progress, quorum::settled, votes};
use apb::{ApprovalState as S, AuditAction as A};

pub async fn sixteen_vote_at_once(env: Arc<Env>) -> Vec<Expect> {
    let args = payment(250_000, "board-co");
    let a = env.submit("board", &args).await;
    assert_eq!(progress(&a), "0 of 16 in board");
    let start = Arc::new(Barrier::new(16));
    let voting = board().into_iter().enumerate().map(|(i, who)| {
        let (mut client, id, start) = (env.approvals(&who, i), a.request_id.clone(), start.clone());
        tokio::spawn(async move {
            start.wait().await;
            let answer = vote(&mut client, &id, K::Approve, None, "").await;
            (who, answer)
        })
    });
    let mut deciding = Vec::new();
    for task in voting.collect::<Vec<_>>() {
        let (who, answer) = task.await.unwrap();
        let a = answer.unwrap_or_else(|e| panic!("{who}'s vote: {e}"));
        if a.state != S::Pending as i32 {
            deciding.push((who, a));
        }
    }
    assert_eq!(deciding.len(), 1, "one vote decides: {deciding:?}");
    let d = deciding[0].1.decision.clone().unwrap();
    assert_eq!(d.kind(), K::Approve);
    let mut voters = d.voters.clone();
    voters.sort();
    assert_eq!(voters, board());

    let (_, audit) = settled(&env, "board", rpb::RunStatus::Succeeded).await;
    let mut voted: Vec<String> = votes(&audit).into_iter().map(|(who, _, _)| who).collect();
    voted.sort();
    assert_eq!(voted, board(), "every vote is in the audit, once");
    let count = |action| audit.iter().filter(|e| e.action() == action).count();
    assert_eq!((count(A::Decided), count(A::Delivered)), (1, 1));
    vec![("board".into(), Some(args))]
}
