//! Domain → proto conversions for the runner's responses, and proto → domain for requests.

use arbor_shared::{
    convert::ConvertError,
    domain::{JobOrigin, RestorePolicy, RunMode, RunStatus},
    json::{from_proto_struct, to_proto_struct, to_proto_value},
    proto::runner::v1 as pb,
    time::{opt_timestamp, timestamp},
};

use crate::{
    engine::SuspensionRecord,
    mailbox::Job,
    runs::{NodeState, RunNode, RunView, SubmitInput, TreeRecord},
};

pub fn run_node(n: &RunNode) -> pb::RunNode {
    let status = match n.state {
        NodeState::Idle => pb::NodeStatus::Idle,
        NodeState::Running => pb::NodeStatus::Running,
        NodeState::Success => pb::NodeStatus::Success,
        NodeState::Failure => pb::NodeStatus::Failure,
        NodeState::Waiting => pb::NodeStatus::Waiting,
    };
    pb::RunNode {
        locator: n.locator.clone(),
        kind: n.kind.to_string(),
        name: n.name.clone(),
        depth: n.depth,
        status: status.into(),
    }
}

pub fn tree(t: &TreeRecord) -> pb::Tree {
    pb::Tree {
        id: t.id.clone(),
        version: t.version,
        document: t.document.clone(),
        node_count: t.node_count,
        registered_at: Some(timestamp(t.registered_at_ms)),
        digest: t.digest.clone(),
    }
}

pub fn suspension(s: &SuspensionRecord) -> pb::Suspension {
    pb::Suspension {
        request_id: s.request_id.clone(),
        category: s.category.into(),
        reason: s.category.reason().into(),
        message: s.message.clone(),
        payload: Some(to_proto_value(&s.payload)),
        state: s.state.into(),
        node_locator: s.node_locator.clone(),
        created_at: opt_timestamp(s.created_at_ms),
    }
}

pub fn run(v: &RunView) -> pb::Run {
    let r = &v.run;
    pb::Run {
        run_id: r.run_id.clone(),
        thread_id: r.thread_id.clone(),
        tree_id: r.tree_id.clone(),
        tree_version: r.tree_version,
        status: r.status.into(),
        blackboard: Some(to_proto_struct(&v.blackboard)),
        suspensions: v.suspensions.iter().map(suspension).collect(),
        error: r.error.clone(),
        step: r.step,
        created_at: Some(timestamp(r.created_at_ms)),
        updated_at: Some(timestamp(r.updated_at_ms)),
        submitted_by: r.submitted_by.clone(),
        priority: r.priority,
        mode: r.mode.into(),
        generation: r.generation,
    }
}

pub fn job(j: &Job) -> pb::Job {
    pb::Job {
        job_id: j.job_id.clone(),
        mailbox_id: j.mailbox_id.clone(),
        run_id: j.run_id.clone(),
        origin: j.origin.into(),
        kind: j.kind.into(),
        priority: j.priority,
        dedupe_key: j.dedupe_key.clone(),
        generation: j.generation,
        status: j.status.into(),
        available_at: opt_timestamp(j.available_at_ms),
        attempt_count: j.attempt_count,
        max_attempts: j.max_attempts,
        last_error: j.last_error.clone(),
        claim_token: j.claim_token.clone(),
        claimed_by: j.claimed_by.clone(),
        lease_until: opt_timestamp(j.lease_until_ms),
        created_at: Some(timestamp(j.created_at_ms)),
        updated_at: Some(timestamp(j.updated_at_ms)),
    }
}

pub fn submit_input(
    r: &pb::SubmitRunRequest,
    submitted_by: &str,
) -> Result<SubmitInput, ConvertError> {
    Ok(SubmitInput {
        tree_id: r.tree_id.clone(),
        tree_version: r.tree_version,
        thread_id: r.thread_id.clone(),
        input: r.input.as_ref().map(from_proto_struct).unwrap_or_default(),
        priority: r.priority,
        dedupe_key: r.dedupe_key.clone(),
        origin: JobOrigin::from_wire_opt(r.origin, "origin")?.unwrap_or_default(),
        mode: RunMode::from_wire_opt(r.mode, "mode")?.unwrap_or_default(),
        run_id: r.run_id.clone(),
        restore_policy: RestorePolicy::from_wire_opt(r.restore_policy, "restore_policy")?
            .unwrap_or_default(),
        max_attempts: r.max_attempts,
        submitted_by: submitted_by.to_string(),
        trace: None,
    })
}

pub fn statuses(values: &[i32]) -> Result<Vec<RunStatus>, ConvertError> {
    values
        .iter()
        .map(|v| RunStatus::from_wire(*v, "statuses"))
        .collect()
}
