//! The interaction namespace of a run: suspension records, the decision inbox
//! (`resolved_approvals`), acknowledged pops (`resolved_approval_acks`), approval progress records
//! and tool-call records. It is serialised inside the checkpoint, so all of it survives a restore.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use arbor_shared::domain::SuspensionState;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::{Decision, SuspensionEvent, SuspensionRecord, suspension_transition};
use crate::engine::Effect;

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct Interaction {
    /// request_id → record, with the pre-order index of the node that owns it.
    pub suspensions: BTreeMap<String, Owned>,
    /// Delivered decisions not yet popped by their node.
    pub resolved_approvals: BTreeMap<String, Decision>,
    /// request_id → decision_id of every popped decision.
    pub resolved_approval_acks: BTreeMap<String, String>,
    /// `node:{locator}:{name}` (gates) and `tool:{locator}:{tool_call_id}` (tool approvals).
    pub progress: BTreeMap<String, ProgressEntry>,
    /// tool_call_id → record.
    pub tool_calls: BTreeMap<String, ToolCallRecord>,
    /// Tool calls admitted by the guard in this run (the per-run budget).
    pub budget_used: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Owned {
    pub node: u32,
    pub record: SuspensionRecord,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ProgressEntry {
    pub node: u32,
    pub progress: Progress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum GateStage {
    AskBefore,
    Child,
    AskAfter,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Progress {
    Gate(GateStage),
    ToolApproval { request_id: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ToolCallRecord {
    pub node: u32,
    pub tool: String,
    #[serde(with = "arbor_shared::json::as_text")]
    pub args: Json,
    pub state: ToolCallState,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum ToolCallState {
    AwaitingApproval { request_id: String },
    Approved,
    Succeeded,
    Failed { error: String },
    Cancelled { reason: String },
}

impl Interaction {
    /// Puts a decision into the inbox. A repeat of an accepted or consumed decision is a no-op;
    /// anything for a request that is not active (or already has another decision) is dropped.
    pub fn deliver(&mut self, decision: Decision, effects: &mut Vec<Effect>) {
        let rid = decision.request_id.clone();
        let discard = |effects: &mut Vec<Effect>, d: &Decision| {
            effects.push(Effect::Discarded {
                request_id: d.request_id.clone(),
                decision_id: d.decision_id.clone(),
            })
        };
        match self.suspensions.get(&rid) {
            Some(o) if o.record.state == SuspensionState::Active => {
                match self.resolved_approvals.get(&rid) {
                    Some(first) if first.decision_id == decision.decision_id => {}
                    Some(_) => discard(effects, &decision),
                    None => {
                        self.resolved_approvals.insert(rid, decision);
                    }
                }
            }
            Some(o)
                if o.record.consumed_decision_id.as_deref()
                    == Some(decision.decision_id.as_str()) => {}
            _ => discard(effects, &decision),
        }
    }

    /// Records a suspension unless one with the same id exists; returns whether it is new (the
    /// existing record, whatever its state, is left unchanged).
    pub fn suspend(
        &mut self,
        node: u32,
        record: SuspensionRecord,
        effects: &mut Vec<Effect>,
    ) -> bool {
        if self.suspensions.contains_key(&record.request_id) {
            return false;
        }
        effects.push(Effect::Suspended {
            record: record.clone(),
        });
        self.suspensions
            .insert(record.request_id.clone(), Owned { node, record });
        true
    }

    /// Pops the delivered decision for an active request: inbox → acks, record Cleared.
    pub fn take(&mut self, request_id: &str, effects: &mut Vec<Effect>) -> Option<Decision> {
        let owned = self.suspensions.get_mut(request_id)?;
        let cleared = suspension_transition(owned.record.state, SuspensionEvent::Consume).ok()?;
        let decision = self.resolved_approvals.remove(request_id)?;
        owned.record.state = cleared;
        owned.record.consumed_decision_id = Some(decision.decision_id.clone());
        self.resolved_approval_acks
            .insert(request_id.to_string(), decision.decision_id.clone());
        effects.push(Effect::Consumed {
            request_id: request_id.to_string(),
            decision_id: decision.decision_id.clone(),
        });
        Some(decision)
    }

    /// Nodes that own an active suspension.
    pub fn active_owners(&self) -> BTreeSet<u32> {
        self.suspensions
            .values()
            .filter(|o| o.record.state == SuspensionState::Active)
            .map(|o| o.node)
            .collect()
    }

    /// Withdraws every active suspension owned by a node in `nodes` (a halted subtree), drops
    /// their undelivered decisions, and forgets the subtree's progress records; tool calls waiting
    /// for approval there are marked cancelled.
    pub fn withdraw(&mut self, nodes: Range<u32>, reason: &str, effects: &mut Vec<Effect>) {
        for (rid, owned) in &mut self.suspensions {
            if !nodes.contains(&owned.node) {
                continue;
            }
            let Ok(inactive) = suspension_transition(owned.record.state, SuspensionEvent::Withdraw)
            else {
                continue;
            };
            owned.record.state = inactive;
            effects.push(Effect::Withdrawn {
                request_id: rid.clone(),
                reason: reason.to_string(),
            });
            if let Some(d) = self.resolved_approvals.remove(rid) {
                effects.push(Effect::Discarded {
                    request_id: d.request_id,
                    decision_id: d.decision_id,
                });
            }
        }
        self.progress.retain(|_, p| !nodes.contains(&p.node));
        for call in self.tool_calls.values_mut() {
            if nodes.contains(&call.node)
                && matches!(
                    call.state,
                    ToolCallState::AwaitingApproval { .. } | ToolCallState::Approved
                )
            {
                call.state = ToolCallState::Cancelled {
                    reason: reason.to_string(),
                };
            }
        }
    }
}
