//! The `approval` gate: asks before and/or after running its child. Phase progress is kept in a
//! progress record (`node:{locator}:{name}`), so a restore after an approved `before` phase goes
//! straight on to the child and never asks again.

use arbor_shared::domain::{
    ApprovalKind, ApprovalPhase, ApprovalRequest, DecisionKind, SuspensionCategory, SuspensionState,
};
use serde_json::{Map, Value as Json, json};

use super::Ctx;
use crate::engine::interaction::SuspensionRecord;
use crate::engine::interaction::store::{GateStage, Progress, ProgressEntry};
use crate::engine::spec::{GateSpec, OnReject};
use crate::engine::{TickStatus, blackboard};

/// What a gate honours: it lets its child run or it does not.
const GATE_DECISIONS: &[DecisionKind] = &[DecisionKind::Approve, DecisionKind::Reject];

pub(super) fn approval(cx: &mut Ctx<'_>, idx: usize, gate: &GateSpec) -> TickStatus {
    let node = cx.node(idx);
    let Some(&child) = node.children.first() else {
        return cx.fail("approval gate without a child");
    };
    let key = format!("node:{}:{}", node.locator, node.name_or_empty());
    let mut stage = match cx.ck.interaction.progress.get(&key) {
        Some(ProgressEntry {
            progress: Progress::Gate(stage),
            ..
        }) => *stage,
        _ if gate.before => GateStage::AskBefore,
        _ => GateStage::Child,
    };
    let outcome = loop {
        match stage {
            GateStage::AskBefore => match ask(cx, idx, gate, ApprovalPhase::Before) {
                None => break None,
                Some(Ok(())) => stage = GateStage::Child,
                Some(Err(reason)) => break Some(rejected(cx, idx, gate, &reason)),
            },
            GateStage::Child => match cx.tick(child) {
                TickStatus::Running => break None,
                TickStatus::Failure => break Some(TickStatus::Failure),
                TickStatus::Success if gate.after => stage = GateStage::AskAfter,
                TickStatus::Success => break Some(TickStatus::Success),
            },
            GateStage::AskAfter => match ask(cx, idx, gate, ApprovalPhase::After) {
                None => break None,
                Some(Ok(())) => break Some(TickStatus::Success),
                Some(Err(reason)) => break Some(rejected(cx, idx, gate, &reason)),
            },
        }
    };
    match outcome {
        None => {
            let entry = ProgressEntry {
                node: idx as u32,
                progress: Progress::Gate(stage),
            };
            cx.ck.interaction.progress.insert(key, entry);
            TickStatus::Running
        }
        Some(done) => {
            cx.ck.interaction.progress.remove(&key);
            done
        }
    }
}

fn rejected(cx: &mut Ctx<'_>, idx: usize, gate: &GateSpec, reason: &str) -> TickStatus {
    match gate.on_reject {
        OnReject::SuccessSkip => TickStatus::Success,
        OnReject::Failure => {
            let loc = cx.locator(idx);
            cx.fail(format!("approval '{loc}' rejected: {reason}"))
        }
    }
}

/// `None` while waiting; `Some(Ok)` approved; `Some(Err(reason))` rejected.
fn ask(
    cx: &mut Ctx<'_>,
    idx: usize,
    gate: &GateSpec,
    phase: ApprovalPhase,
) -> Option<Result<(), String>> {
    let phase_name = match phase {
        ApprovalPhase::Before => "before",
        ApprovalPhase::After => "after",
    };
    let rid = cx.request_id(idx, phase_name);
    if let Some(decision) = cx.take_decision(&rid) {
        return Some(match decision.approval_kind(GATE_DECISIONS) {
            DecisionKind::Approve => Ok(()),
            DecisionKind::Reject => Err(decision.reason),
            // `validate_decision` refuses these for a gate; fail closed all the same.
            other => Err(format!("a gate cannot apply a {} decision", other.as_str())),
        });
    }
    if !cx.ck.interaction.suspensions.contains_key(&rid) {
        let record = gate_record(cx, idx, gate, phase, phase_name, rid);
        cx.suspend(idx, record);
    }
    None
}

fn gate_record(
    cx: &Ctx<'_>,
    idx: usize,
    gate: &GateSpec,
    phase: ApprovalPhase,
    phase_name: &str,
    request_id: String,
) -> SuspensionRecord {
    let env = cx.env;
    let node = cx.node(idx);
    let context: Map<String, Json> = gate
        .context
        .iter()
        .map(|k| {
            let v = blackboard::get(cx.board(), k)
                .cloned()
                .unwrap_or(Json::Null);
            (k.clone(), v)
        })
        .collect();
    let title = if gate.title.is_empty() {
        format!("Approve '{}'?", node.locator)
    } else {
        gate.title.clone()
    };
    let payload = json!({
        "kind": "node",
        "phase": phase_name,
        "title": title,
        "context": context,
    });
    let approval = ApprovalRequest {
        request_id: request_id.clone(),
        run_id: env.run_id.to_string(),
        thread_id: env.thread_id.to_string(),
        tree_id: env.tree_id.to_string(),
        tree_version: env.tree_version,
        node_locator: node.locator.clone(),
        node_name: node.name_or_empty().to_string(),
        kind: ApprovalKind::Node,
        tool_name: String::new(),
        tool_args: Json::Null,
        tool_call_id: String::new(),
        title: title.clone(),
        context,
        phase,
        deadline_ms: if gate.deadline_ms == 0 {
            0
        } else {
            env.now_ms.saturating_add(gate.deadline_ms)
        },
        on_timeout: gate.on_timeout,
        allowed_decisions: GATE_DECISIONS.to_vec(),
        submitted_by: env.submitted_by.to_string(),
        requested_at_ms: env.now_ms,
    };
    SuspensionRecord {
        request_id,
        category: SuspensionCategory::RequireApproval,
        message: title,
        payload,
        state: SuspensionState::Active,
        node_locator: node.locator.clone(),
        created_at_ms: env.now_ms,
        approval: Some(approval),
        consumed_decision_id: None,
    }
}
