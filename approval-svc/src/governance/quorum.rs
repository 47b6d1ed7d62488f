//! The counting rules of a governed request, written once: who is eligible when a stage opens,
//! what a vote and an edit do, and when a stage has passed or can no longer pass. Pure
//! functions over [`Governance`]; the store calls them inside the transaction of each change.

use arbor_shared::{
    auth::{Directory, Role},
    domain::DecisionKind,
};

use super::{ApprovalRule, Governance, OnReject, Proposal, Roster, Vote};

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
    let rosters = rule
        .stages
        .iter()
        .map(|s| Roster {
            approvers: resolve(&s.approvers, dir),
            excluded: resolve(&s.exclude, dir),
            escalate_to: resolve(&s.escalate_to, dir),
            groups: s
                .approvers
                .iter()
                .chain(&s.escalate_to)
                .filter_map(|r| r.strip_prefix("group:"))
                .map(|group| (group.to_string(), dir.members(group)))
                .collect(),
        })
        .collect();
    let mut g = Governance {
        rule: rule.name.clone(),
        editor_counts: rule.editor_counts,
        stages: rule.stages.clone(),
        rosters,
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
    let opened = open(&mut g, 0, submitter, now_ms);
    (g, opened)
}

/// Opens stage `index`: its eligible set is fixed now, without the run's submitter, the
/// stage's `exclude` and whoever counted in an earlier stage.
pub fn open(g: &mut Governance, index: u32, submitter: &str, now_ms: u64) -> Result<(), String> {
    g.current = index;
    g.eligible.clear();
    let spec = g.stage().clone();
    g.stage_deadline_ms = match spec.deadline_ms {
        0 => 0,
        d => now_ms.saturating_add(d),
    };
    let approvers = g.rosters[index as usize].approvers.clone();
    widen(g, &approvers, submitter)
}

/// Whether escalating would add anyone to the open stage: an `escalate_to` principal who is
/// not eligible yet and may be (not the submitter, not excluded, not counted before). Once
/// they all joined, a stage's next deadline moves on to the next stage, or rejects.
pub fn can_escalate(g: &Governance, submitter: &str) -> bool {
    let roster = &g.rosters[g.current as usize];
    let counted = g.counted_before();
    roster.escalate_to.iter().any(|p| {
        p != submitter
            && !roster.excluded.contains(p)
            && !counted.contains(&p.as_str())
            && !g.eligible.contains(p)
    })
}

/// The open stage's escalation: its `escalate_to` principals join it, votes kept.
pub fn escalate(g: &mut Governance, submitter: &str) -> Result<(), String> {
    let more = g.rosters[g.current as usize].escalate_to.clone();
    widen(g, &more, submitter)
}

/// Adds `names` to the open stage's eligible set, and fixes its quorum and groups again.
fn widen(g: &mut Governance, names: &[String], submitter: &str) -> Result<(), String> {
    let spec = g.stage().clone();
    let roster = g.rosters[g.current as usize].clone();
    let counted: Vec<String> = g.counted_before().into_iter().map(String::from).collect();
    let keep = |name: &&String| {
        name.as_str() != submitter && !roster.excluded.contains(name) && !counted.contains(name)
    };
    g.eligible.extend(names.iter().filter(keep).cloned());
    g.eligible.sort();
    g.eligible.dedup();
    g.groups = match spec.per_group {
        0 => Vec::new(),
        _ => roster
            .groups
            .iter()
            .map(|(group, members)| {
                let members = members
                    .iter()
                    .filter(|m| g.eligible.contains(m))
                    .cloned()
                    .collect();
                (group.clone(), members)
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

/// The live approvals of the open stage that count: of what is proposed now, by an eligible
/// seat, and not the proposer's own unless the rule says `editor_counts`.
fn counting(g: &Governance) -> impl Iterator<Item = &Vote> {
    g.live().filter(move |v| {
        v.kind == DecisionKind::Approve
            && v.digest == g.proposal.digest
            && g.eligible.contains(&v.seat)
            && (g.editor_counts || v.seat != g.proposal.by)
    })
}

/// Whether the open stage has passed, can no longer pass, or waits.
pub fn tally(g: &Governance) -> Tally {
    let spec = g.stage();
    let eligible = |seat: &str| g.eligible.iter().any(|e| e == seat);
    let approvals: Vec<&str> = counting(g).map(|v| v.seat.as_str()).collect();
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
    let approvals = counting(g).count() as u32;
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
