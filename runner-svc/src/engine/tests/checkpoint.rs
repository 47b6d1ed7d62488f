//! Checkpoint encoding, corrupt input, spec mismatch, and restore semantics.

use serde_json::json;

use super::harness::{Harness, approve, spec, suspended, tree};
use crate::engine::{Checkpoint, CheckpointError, NodeStatus, TickStatus};

fn two_gates() -> serde_json::Value {
    json!({"type": "sequence", "children": [
        {"type": "set", "key": "a", "value": 1},
        {"type": "approval", "name": "g1", "child": {"type": "set", "key": "b", "value": 2}},
        {"type": "approval", "name": "g2", "child": {"type": "set", "key": "c", "value": 3}}
    ]})
}

#[test]
fn encode_decode_round_trips_mid_run() {
    let mut h = Harness::new(two_gates());
    h.tick();
    let bytes = h.ck.encode();
    assert_eq!(bytes[0], 3, "format version byte");
    let back = Checkpoint::decode(&bytes).unwrap();
    assert_eq!(back.blackboard(), h.ck.blackboard());
    assert_eq!(back.step(), 1);
    assert_eq!(back.suspensions().count(), 1);
    assert_eq!(back.root_status(), NodeStatus::Running);
    back.check_matches(&h.spec).unwrap();
}

#[test]
fn truncated_or_corrupt_bytes_are_errors_not_panics() {
    let mut h = Harness::new(two_gates());
    h.tick();
    let bytes = h.ck.encode();
    assert_eq!(Checkpoint::decode(&[]), Err(CheckpointError::Empty));
    assert_eq!(
        Checkpoint::decode(&[9, 1, 2]),
        Err(CheckpointError::UnsupportedVersion(9))
    );
    for cut in 1..bytes.len() {
        assert!(Checkpoint::decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    let mut extra = bytes.clone();
    extra.push(0);
    assert!(matches!(
        Checkpoint::decode(&extra),
        Err(CheckpointError::Corrupt(_))
    ));
    for i in 1..bytes.len() {
        let mut flipped = bytes.clone();
        flipped[i] ^= 0xff;
        let _ = Checkpoint::decode(&flipped);
    }
}

#[test]
fn a_checkpoint_of_another_tree_fails_the_tick_without_touching_it() {
    let mut h = Harness::new(two_gates());
    let other = spec(&tree(json!({"type": "succeed"})));
    assert!(matches!(
        h.ck.check_matches(&other),
        Err(CheckpointError::ShapeMismatch(_))
    ));
    let env = h.env();
    let mut ck = h.ck.clone();
    let out = crate::engine::tick(&other, &mut ck, vec![], &env);
    assert_eq!(out.status, TickStatus::Failure);
    assert!(out.error.contains("does not fit"), "{}", out.error);
    assert_eq!(ck, h.ck);
    let mut v2 = json!({"id": "t", "version": 2, "root": two_gates()});
    v2["id"] = json!("t");
    assert!(matches!(
        h.ck.check_matches(&spec(&v2)),
        Err(CheckpointError::TreeMismatch { .. })
    ));
    h.tick();
}

#[test]
fn restore_mid_run_continues_identically_without_a_second_suspended_effect() {
    let mut plain = Harness::new(two_gates());
    let mut restored = Harness::new(two_gates());
    let first = plain.tick();
    let first_r = restored.tick();
    assert_eq!(first, first_r);
    let rid = plain.only_active();
    restored.restore();
    assert_eq!(restored.only_active(), rid, "same request id after restore");
    // Ticking the restored run re-enters the gate: it finds its record, emits nothing new.
    let again = restored.tick();
    assert!(suspended(&again.effects).is_empty(), "{:?}", again.effects);
    plain.tick();
    let a = plain.decide(vec![approve(&rid)]);
    let b = restored.decide(vec![approve(&rid)]);
    assert_eq!(a, b);
    let rid2 = plain.only_active();
    restored.restore();
    assert_eq!(restored.only_active(), rid2);
    let a = plain.decide(vec![approve(&rid2)]);
    let b = restored.decide(vec![approve(&rid2)]);
    assert_eq!(a, b);
    assert_eq!(a.status, TickStatus::Success);
    assert_eq!(plain.ck.blackboard(), restored.ck.blackboard());
}

#[test]
fn restore_brings_running_leaves_back_idle_and_composites_running() {
    let mut h = Harness::new(two_gates());
    h.tick();
    h.restore();
    let statuses: Vec<NodeStatus> = h.ck.nodes.iter().map(|n| n.status).collect();
    assert_eq!(statuses[0], NodeStatus::Running);
    assert_eq!(statuses[2], NodeStatus::Running, "the gate is a decorator");
    assert!(statuses[3..].iter().all(|s| *s == NodeStatus::Idle));
}

#[test]
fn replayed_runs_reproduce_request_ids() {
    let mut a = Harness::new(two_gates());
    let mut b = Harness::new(two_gates());
    a.tick();
    b.tick();
    assert_eq!(a.only_active(), b.only_active());
    b.run_id = "run-2".into();
    let mut c = Harness::new(two_gates());
    c.run_id = "run-2".into();
    c.tick();
    assert_ne!(a.only_active(), c.only_active());
}

/// A gate's child that ran is still known to have succeeded once the gate has finished (its
/// status is idle again); a version 2 checkpoint, from before outcomes were kept, reads with
/// none.
#[test]
fn outcomes_outlive_the_status_reset_and_older_checkpoints_read_without_them() {
    let mut h = Harness::new(two_gates());
    let out = h.tick();
    let first = suspended(&out.effects)[0].request_id.clone();
    h.decide(vec![approve(&first)]);
    // Pre-order: 0 sequence, 1 set a, 2 g1, 3 set b, 4 g2, 5 set c.
    assert_eq!(
        h.ck.nodes[3].status,
        NodeStatus::Idle,
        "reset when g1 finished"
    );
    let back = Checkpoint::decode(&h.ck.encode()).unwrap();
    let outcomes: Vec<NodeStatus> = (0..6).map(|i| back.outcome(i)).collect();
    use NodeStatus::{Idle, Success};
    assert_eq!(outcomes, [Idle, Success, Success, Success, Idle, Idle]);

    let mut ck = h.ck.clone();
    ck.outcomes.clear();
    let v3 = ck.encode();
    let mut v2 = v3[..v3.len() - 1].to_vec();
    v2[0] = 2;
    let old = Checkpoint::decode(&v2).unwrap();
    assert!((0..6).all(|i| old.outcome(i) == Idle));
    assert_eq!(old.step(), h.ck.step());
    old.check_matches(&h.spec).unwrap();
}
