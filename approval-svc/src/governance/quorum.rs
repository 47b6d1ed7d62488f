//! The counting rules of a governed request, written once: who is eligible when a stage opens,
//! what a vote and an edit do, and when a stage has passed or can no longer pass. Pure
//! functions over [`Governance`]; the store calls them inside the transaction of each change.

use arbor_shared::{
    auth::{Directory, Role},
    domain::DecisionKind,
};

use super::{ApprovalRule, Governance, OnReject, Proposal, Vote};

/// Where a stage stands after a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tally {
    Pending,
    Passed,
    /// It can no longer pass: the reason, for the decision and the audit.
    Rejected(String),
}

/// The principals `refs` name (`user:`, `group:`, `role:`), sorted, without repeats. A user
/// reference names the user even when the tokens file does not (a principal added later).
pub fn resolve(refs: &[String], dir: &Directory) -> Vec<String> {
    let mut names = Vec::new();
    for r in refs {
        match r.split_once(':') {
            Some(("user", name)) => names.push(name.to_string()),
            Some(("group", group)) => names.extend(dir.members(group)),
            Some(("role", role)) => {
                names.extend(Role::parse(role).map_or_else(Vec::new, |role| dir.holders(role)))
            }
            _ => {}
        }
    }
    names.sort();
    names.dedup();
    names
}

/// A new request's governance under `rule`, its first stage open (`Err`: the stage cannot
/// reach its quorum, with the reason; the request is then decided REJECT at once).
pub fn start(
    rule: &ApprovalRule,
    digest: String,
    dir: &Directory,
    submitter: &str,
    now_ms: u64,
) -> (Governance, Result<(), String>) {
    let mut g = Governance {
        rule: rule.name.clone(),
        editor_counts: rule.editor_counts,
        stages: rule.stages.clone(),
        current: 0,
        eligible: Vec::new(),
        groups: Vec::new(),
        required: 0,
        stage_deadline_ms: 0,
        votes: Vec::new(),
        proposal: Proposal {
            kind: DecisionKind::Approve,
            payload: serde_json::Value::Null,
            digest,
            by: String::new(),
        },
    };
    let opened = open(&mut g, 0, dir, submitter, now_ms);
    (g, opened)
}

/// Opens stage `index`: its eligible set is fixed now, from the directory, without the run's
/// submitter, the stage's `exclude` and whoever counted in an earlier stage.
pub fn open(
    g: &mut Governance,
    index: u32,
    dir: &Directory,
    submitter: &str,
    now_ms: u64,
) -> Result<(), String> {
    g.current = index;
    let spec = g.stages[index as usize].clone();
    g.eligible.clear();
    g.stage_deadline_ms = match spec.deadline_ms {
        0 => 0,
        d => now_ms.saturating_add(d),
    };
    widen(g, &spec.approvers, dir, submitter)
}

/// Adds the principals `refs` name to the open stage (an opening, or an escalation that keeps
/// the votes cast), and fixes its quorum and groups again.
pub fn widen(
    g: &mut Governance,
    refs: &[String],
    dir: &Directory,
    submitter: &str,
) -> Result<(), String> {
    let spec = g.stage().clone();
    let excluded = resolve(&spec.exclude, dir);
    let counted: Vec<String> = g.counted_before().into_iter().map(String::from).collect();
    let keep =
        |name: &String| name != submitter && !excluded.contains(name) && !counted.contains(name);
    g.eligible
        .extend(resolve(refs, dir).into_iter().filter(keep));
    g.eligible.sort();
    g.eligible.dedup();
    let all_refs: Vec<&String> = spec.approvers.iter().chain(&spec.escalate_to).collect();
    g.groups = match spec.per_group {
        0 => Vec::new(),
        _ => all_refs
            .iter()
            .filter_map(|r| r.strip_prefix("group:"))
            .map(|group| {
                let members = dir
                    .members(group)
                    .into_iter()
                    .filter(|m| g.eligible.contains(m))
                    .collect();
                (group.to_string(), members)
            })
            .collect(),
    };
    let required = spec.required.of(g.eligible.len()).max(1);
    g.required = required as u32;
    let name = &spec.name;
    if g.eligible.len() < required {
        return Err(format!(
            "stage '{name}' needs {required} approvals and has {} eligible approvers ({})",
            g.eligible.len(),
            g.eligible.join(", ")
        ));
    }
    if let Some((group, members)) = g
        .groups
        .iter()
        .find(|(_, m)| m.len() < spec.per_group as usize)
    {
        return Err(format!(
            "stage '{name}' needs {} approvals from group '{group}', which has {} eligible",
            spec.per_group,
            members.len()
        ));
    }
    Ok(())
}

/// Records `vote` as its seat's live vote in the open stage (a vote cast before by the seat
/// stays, marked stale).
pub fn cast(g: &mut Governance, vote: Vote) {
    for v in g.votes.iter_mut() {
        if !v.stale && v.stage == vote.stage && v.seat == vote.seat {
            v.stale = true;
        }
    }
    g.votes.push(vote);
}

/// An edit or a response by `seat`: what is voted on from now. Every APPROVE of the open
/// stage is stale (kept, for the audit); the proposer's own approval counts only when the rule
/// says `editor_counts`.
pub fn propose(g: &mut Governance, proposal: Proposal, at_ms: u64, reason: &str) {
    for v in g.votes.iter_mut() {
        if !v.stale && v.stage == g.current && v.kind == DecisionKind::Approve {
            v.stale = true;
        }
    }
    let seat = proposal.by.clone();
    let digest = proposal.digest.clone();
    g.proposal = proposal;
    if g.editor_counts {
        let stage = g.current;
        cast(
            g,
            Vote {
                seat: seat.clone(),
                by: seat,
                kind: DecisionKind::Approve,
                digest,
                stage,
                at_ms,
                reason: reason.to_string(),
                stale: false,
            },
        );
    }
}

/// Whether the open stage has passed, can no longer pass, or waits.
pub fn tally(g: &Governance) -> Tally {
    let spec = g.stage();
    let eligible = |seat: &str| g.eligible.iter().any(|e| e == seat);
    let approvals: Vec<&str> = g
        .live()
        .filter(|v| v.kind == DecisionKind::Approve && v.digest == g.proposal.digest)
        .map(|v| v.seat.as_str())
        .filter(|s| eligible(s))
        .collect();
    let rejections: Vec<&Vote> = g
        .live()
        .filter(|v| v.kind == DecisionKind::Reject && eligible(&v.seat))
        .collect();
    if spec.on_reject == OnReject::Veto
        && let Some(v) = rejections.first()
    {
        return Tally::Rejected(format!("vetoed by {} in stage '{}'", v.by, spec.name));
    }
    let from = |members: &[String], seats: &[&str]| {
        seats
            .iter()
            .filter(|s| members.iter().any(|m| m == *s))
            .count()
    };
    let per_group = spec.per_group as usize;
    let groups_met = g
        .groups
        .iter()
        .all(|(_, members)| from(members, &approvals) >= per_group);
    if approvals.len() >= g.required as usize && groups_met {
        return Tally::Passed;
    }
    let rejected: Vec<&str> = rejections.iter().map(|v| v.seat.as_str()).collect();
    let possible = g.eligible.len() - rejected.len();
    let group_out_of_reach = g
        .groups
        .iter()
        .find(|(_, members)| members.len() - from(members, &rejected) < per_group);
    if possible < g.required as usize {
        return Tally::Rejected(format!(
            "stage '{}' can no longer reach {} approvals: {} of {} eligible rejected",
            spec.name,
            g.required,
            rejected.len(),
            g.eligible.len()
        ));
    }
    if let Some((group, _)) = group_out_of_reach {
        return Tally::Rejected(format!(
            "stage '{}' can no longer reach {per_group} approvals from group '{group}'",
            spec.name
        ));
    }
    Tally::Pending
}

/// `2 of 3 in payments`-style progress of the open stage, and the eligible seats that have not
/// voted on what is proposed now.
pub fn progress(g: &Governance) -> (u32, Vec<String>) {
    let approvals = g
        .live()
        .filter(|v| v.kind == DecisionKind::Approve && v.digest == g.proposal.digest)
        .filter(|v| g.eligible.contains(&v.seat))
        .count() as u32;
    let voted: Vec<&str> = g
        .live()
        .filter(|v| v.kind == DecisionKind::Reject || v.digest == g.proposal.digest)
        .map(|v| v.seat.as_str())
        .collect();
    let left = g
        .eligible
        .iter()
        .filter(|e| !voted.contains(&e.as_str()))
        .cloned()
        .collect();
    (approvals, left)
}

#[cfg(test)]
mod tests;
