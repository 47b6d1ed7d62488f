//! How the client prints approvals: a table for `pending`, JSON for `show`, one line per change
//! for `watch`, and which replica leads for `leader`.

use arbor_shared::{
    json::{from_optional_value, from_proto_struct},
    proto::{
        approval::v1::{self as pb, ApprovalState, ChangeKind},
        runner::v1::{self as runner_pb, ApprovalKind},
    },
    time::from_timestamp,
};
use serde_json::{Value as Json, json};

pub fn state_name(state: i32) -> &'static str {
    ApprovalState::try_from(state)
        .map(|s| s.as_str_name().trim_start_matches("APPROVAL_STATE_"))
        .unwrap_or("?")
}

pub fn decision_name(kind: i32) -> &'static str {
    runner_pb::DecisionKind::try_from(kind)
        .map(|k| k.as_str_name().trim_start_matches("DECISION_KIND_"))
        .unwrap_or("?")
}

fn enum_name<E>(value: i32, prefix: &str) -> String
where
    E: TryFrom<i32>,
    E: AsName,
{
    E::try_from(value)
        .map(|e| e.name().trim_start_matches(prefix).to_string())
        .unwrap_or_else(|_| value.to_string())
}

trait AsName {
    fn name(&self) -> &'static str;
}

macro_rules! as_name {
    ($($t:ty),*) => { $(impl AsName for $t { fn name(&self) -> &'static str { self.as_str_name() } })* };
}
as_name!(
    ApprovalKind,
    runner_pb::ApprovalPhase,
    runner_pb::TimeoutAction,
    runner_pb::DecisionSource
);

fn time(ts: Option<&prost_types::Timestamp>) -> Json {
    ts.map(|t| {
        let ms = from_timestamp(t);
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
        Json::String(humantime::format_rfc3339_millis(at).to_string())
    })
    .unwrap_or(Json::Null)
}

/// Milliseconds as a short age: `42s`, `7m`, `3h`, `2d`.
pub fn short_duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

pub fn approval_json(a: &pb::Approval) -> Json {
    let mut v = core_json(a);
    v["args_digest"] = json!(a.args_digest);
    v["next_deadline"] = time(a.next_deadline.as_ref());
    v["on_deadline"] = json!(a.on_deadline);
    v["governance"] = a.governance.as_ref().map_or(Json::Null, governance_json);
    v["claim"] = a.claim.as_ref().map_or(
        Json::Null,
        |c| json!({"principal": c.principal, "until": time(c.until.as_ref())}),
    );
    v["comments"] = a
        .comments
        .iter()
        .map(|c| json!({"author": c.author, "text": c.text, "args_digest": c.args_digest, "at": time(c.at.as_ref())}))
        .collect();
    v
}

fn governance_json(g: &pb::Governance) -> Json {
    let votes: Vec<Json> = g
        .votes
        .iter()
        .map(|v| {
            json!({
                "principal": v.principal,
                "delegate": v.delegate,
                "vote": decision_name(v.kind),
                "args_digest": v.args_digest,
                "stage": v.stage,
                "stale": v.stale,
                "at": time(v.at.as_ref()),
                "reason": v.reason,
            })
        })
        .collect();
    json!({
        "rule": g.rule,
        "stage": g.stages.get(g.stage as usize),
        "stages": g.stages,
        "progress": g.progress,
        "eligible": g.eligible,
        "waiting_on": g.seats_left,
        "proposal": decision_name(g.proposal),
        "proposed_by": g.proposed_by,
        "votes": votes,
    })
}

fn core_json(a: &pb::Approval) -> Json {
    let r = a.request.clone().unwrap_or_default();
    json!({
        "request_id": a.request_id,
        "state": state_name(a.state),
        "run_id": r.run_id,
        "thread_id": r.thread_id,
        "tree": {"id": r.tree_id, "version": r.tree_version},
        "node": {"locator": r.node_locator, "name": r.node_name},
        "kind": enum_name::<ApprovalKind>(r.kind, "APPROVAL_KIND_"),
        "phase": enum_name::<runner_pb::ApprovalPhase>(r.phase, "APPROVAL_PHASE_"),
        "title": r.title,
        "tool": {"name": r.tool_name, "args": from_optional_value(r.tool_args.as_ref()),
                 "call_id": r.tool_call_id},
        "context": r.context.as_ref().map(from_proto_struct).unwrap_or_default(),
        "deadline": time(r.deadline.as_ref()),
        "on_timeout": enum_name::<runner_pb::TimeoutAction>(r.on_timeout, "TIMEOUT_ACTION_"),
        "allowed_decisions": r.allowed_decisions.iter().map(|d| decision_name(*d)).collect::<Vec<_>>(),
        "submitted_by": r.submitted_by,
        "requested_at": time(r.requested_at.as_ref()),
        "decision": a.decision.as_ref().map(|d| json!({
            "decision_id": d.decision_id,
            "kind": decision_name(d.kind),
            "reason": d.reason,
            "args": from_optional_value(d.args.as_ref()),
            "result": from_optional_value(d.result.as_ref()),
            "decided_by": d.decided_by,
            "source": enum_name::<runner_pb::DecisionSource>(d.source, "DECISION_SOURCE_"),
            "rule": d.rule,
            "decided_at": time(d.decided_at.as_ref()),
        })),
        "created_at": time(a.created_at.as_ref()),
        "updated_at": time(a.updated_at.as_ref()),
        "delivery_attempts": a.delivery_attempts,
        "last_delivery_error": a.last_delivery_error,
    })
}

/// After a vote that left the approval pending: the quorum as it stands.
pub fn vote_line(a: &pb::Approval, g: &pb::Governance, vote: i32) -> String {
    let waiting = match g.seats_left.is_empty() {
        true => String::new(),
        false => format!("; waiting on {}", g.seats_left.join(", ")),
    };
    format!(
        "{} PENDING (voted {}; {}{waiting})\n",
        a.request_id,
        decision_name(vote),
        g.progress
    )
}

fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// What a person needs to recognise an approval in one cell.
fn subject(r: &runner_pb::ApprovalRequested) -> String {
    match (r.title.is_empty(), r.tool_name.is_empty()) {
        (false, true) => r.title.clone(),
        (true, false) => r.tool_name.clone(),
        (false, false) => format!("{} [{}]", r.title, r.tool_name),
        (true, true) => r.node_name.clone(),
    }
}

pub fn pending_table(rows: &[pb::Approval], now_ms: u64) -> String {
    if rows.is_empty() {
        return "no pending approvals\n".into();
    }
    let mut cells = vec![[
        "ID".to_string(),
        "AGE".into(),
        "RUN".into(),
        "KIND".into(),
        "TITLE / TOOL".into(),
        "QUORUM".into(),
        "DEADLINE".into(),
    ]];
    for a in rows {
        let r = a.request.clone().unwrap_or_default();
        let created = a.created_at.as_ref().map(from_timestamp).unwrap_or(now_ms);
        let next = a.next_deadline.as_ref().or(r.deadline.as_ref());
        let deadline = match next.map(from_timestamp) {
            None => "-".to_string(),
            Some(d) if d <= now_ms => "due".to_string(),
            Some(d) => format!("in {}", short_duration(d - now_ms)),
        };
        cells.push([
            a.request_id.clone(),
            short_duration(now_ms.saturating_sub(created)),
            r.run_id.clone(),
            enum_name::<ApprovalKind>(r.kind, "APPROVAL_KIND_").to_lowercase(),
            clip(&subject(&r), 48),
            a.governance
                .as_ref()
                .map_or_else(|| "-".to_string(), |g| g.progress.clone()),
            deadline,
        ]);
    }
    let mut widths = [0usize; 7];
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

pub fn change_line(item: &pb::WatchApprovalsResponse, now_ms: u64) -> String {
    let change = ChangeKind::try_from(item.change)
        .map(|c| c.as_str_name().trim_start_matches("CHANGE_KIND_"))
        .unwrap_or("?");
    let Some(a) = &item.approval else {
        return format!("{change} ----");
    };
    let r = a.request.clone().unwrap_or_default();
    let created = a.created_at.as_ref().map(from_timestamp).unwrap_or(now_ms);
    let mut line = format!(
        "{change:<9} {} {:<9} age={} run={} {}",
        a.request_id,
        state_name(a.state),
        short_duration(now_ms.saturating_sub(created)),
        r.run_id,
        clip(&subject(&r), 48)
    );
    if let Some(d) = &a.decision {
        line.push_str(&format!(
            " decision={} by={}",
            decision_name(d.kind),
            d.decided_by
        ));
    }
    line
}

/// The line `leader` prints: the leading replica's name, and which replica answered.
pub fn leader_line(r: &pb::GetLeaderResponse) -> String {
    match (r.leading, r.leader.as_str()) {
        (true, _) => format!("leader: {} (the replica asked)\n", r.replica),
        (false, "") => format!(
            "leader: none at the moment, one is taking over (asked: {})\n",
            r.replica
        ),
        (false, leader) => format!("leader: {leader} (asked: {})\n", r.replica),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor_shared::time::timestamp;

    #[test]
    fn ages_are_short() {
        assert_eq!(short_duration(42_000), "42s");
        assert_eq!(short_duration(7 * 60_000), "7m");
        assert_eq!(short_duration(3 * 3_600_000), "3h");
        assert_eq!(short_duration(2 * 86_400_000), "2d");
    }

    #[test]
    fn the_pending_table_has_what_a_person_decides_by() {
        let now = 10_000_000;
        let a = pb::Approval {
            request_id: "req-1".into(),
            state: ApprovalState::Pending as i32,
            request: Some(runner_pb::ApprovalRequested {
                run_id: "run-1".into(),
                kind: ApprovalKind::Tool as i32,
                tool_name: "ledger.append".into(),
                title: "Deploy?".into(),
                deadline: Some(timestamp(now + 240_000)),
                ..Default::default()
            }),
            created_at: Some(timestamp(now - 90_000)),
            ..Default::default()
        };
        let table = pending_table(&[a], now);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("ID") && lines[0].contains("DEADLINE"));
        for cell in [
            "req-1",
            "1m",
            "run-1",
            "tool",
            "Deploy? [ledger.append]",
            "in 4m",
        ] {
            assert!(lines[1].contains(cell), "{cell} missing in {:?}", lines[1]);
        }
        assert_eq!(pending_table(&[], now), "no pending approvals\n");
    }

    #[test]
    fn the_leader_line_names_the_leader_and_who_answered() {
        let asked = |leading: bool, leader: &str| pb::GetLeaderResponse {
            replica: "host-a:50052".into(),
            leading,
            leader: leader.into(),
        };
        assert_eq!(
            leader_line(&asked(true, "host-a:50052")),
            "leader: host-a:50052 (the replica asked)\n"
        );
        assert_eq!(
            leader_line(&asked(false, "host-b:50052")),
            "leader: host-b:50052 (asked: host-a:50052)\n"
        );
        assert!(leader_line(&asked(false, "")).starts_with("leader: none at the moment"));
    }
}
