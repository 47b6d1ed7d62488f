//! The interaction namespace of a run: suspension records, the decision inbox
//! (`resolved_approvals`), acknowledged pops (`resolved_approval_acks`), approval progress records
//! and tool-call records. It is serialised inside the checkpoint, so all of it survives a restore.
//!
//! It stays bounded however long a run loops: a record is kept only while its node can still
//! refer to it. Suspension ids and tool call ids carry the owning node's attempt, so once that
//! attempt moves on (the node finished, or was halted while in flight) the node asks anew under
//! new ids and never looks its old records up again; [`Interaction::prune`] then drops them. A
//! crash replays from the last committed checkpoint, in which the node's attempt and records are
//! still the old ones, so a replay finds its in-flight call, and a pruned call (its node's attempt
//! has moved on in every later checkpoint) is never run again. What a caller may still ask about a
//! pruned suspension (whether a repeated `Resolve` is a duplicate) is answered from `past`: the
//! last [`PAST_KEPT`] settled requests with their decision id, or none if withdrawn.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;

use arbor_shared::domain::{SuspensionCategory, SuspensionState};
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
    /// The most recently pruned suspensions, oldest first, at most [`PAST_KEPT`].
    pub past: VecDeque<PastRequest>,
}

/// How many pruned suspensions a run remembers (about 80 bytes each): a repeated `Resolve` of one
/// of them still answers as before (duplicate, already decided, withdrawn); older ones are
/// unknown.
pub const PAST_KEPT: usize = 256;

/// What is left of a suspension once its node moved on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PastRequest {
    pub request_id: String,
    pub category: SuspensionCategory,
    /// The decision that cleared it; `None` if it was withdrawn.
    pub decision_id: Option<String>,
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
            None if self.past(&rid).is_some_and(|p| {
                p.decision_id.as_deref() == Some(decision.decision_id.as_str())
            }) => {}
            _ => discard(effects, &decision),
        }
    }

    /// A pruned suspension, if it is among the last [`PAST_KEPT`].
    pub fn past(&self, request_id: &str) -> Option<&PastRequest> {
        self.past.iter().rev().find(|p| p.request_id == request_id)
    }

    /// Forgets the settled suspensions and the tool calls of the nodes `moved_on` says have a new
    /// attempt (no id of theirs can come up again), keeping a short note of each suspension in
    /// `past`. Active suspensions stay: halting withdraws them first.
    pub fn prune(&mut self, moved_on: impl Fn(u32) -> bool) {
        let past = &mut self.past;
        let acks = &mut self.resolved_approval_acks;
        self.suspensions.retain(|rid, owned| {
            if owned.record.state == SuspensionState::Active || !moved_on(owned.node) {
                return true;
            }
            acks.remove(rid);
            if past.len() >= PAST_KEPT {
                past.pop_front();
            }
            past.push_back(PastRequest {
                request_id: rid.clone(),
                category: owned.record.category,
                decision_id: owned.record.consumed_decision_id.take(),
            });
            false
        });
        self.tool_calls.retain(|_, call| !moved_on(call.node));
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
