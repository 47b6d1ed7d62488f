//! Turning a wire decision (Resolve / BulkResolve) into a `NewDecision`, and picking the
//! targets of a bulk decision. Malformed input is INVALID_ARGUMENT naming the field, before
//! anything is touched.

use arbor_shared::{
    auth::Principal, domain::DecisionKind, json::from_proto_value, proto::approval::v1 as pb,
    status::FieldViolation,
};
use prost_types::Value;

use super::{BULK_STATES, MAX_PAGE_SIZE, required};
use crate::{
    convert::filter_from_pb,
    error::{Error, Result},
    model::NewDecision,
    store::ApprovalStore,
};

/// Longest reason kept; reasons end up in every audit entry of the approval.
pub const MAX_REASON_BYTES: usize = 4096;

pub fn from_wire(
    kind: i32,
    reason: &str,
    args: Option<&Value>,
    result: Option<&Value>,
    principal: &Principal,
) -> Result<NewDecision> {
    let kind = DecisionKind::from_wire(kind, "decision")?;
    let mut violations = Vec::new();
    match (kind, args.is_some()) {
        (DecisionKind::Edit, false) => {
            violations.push(FieldViolation::new("args", "required for an EDIT decision"))
        }
        (DecisionKind::Edit, true) | (_, false) => {}
        (_, true) => violations.push(FieldViolation::new(
            "args",
            "only an EDIT decision carries args",
        )),
    }
    match (kind, result.is_some()) {
        (DecisionKind::Respond, false) => violations.push(FieldViolation::new(
            "result",
            "required for a RESPOND decision",
        )),
        (DecisionKind::Respond, true) | (_, false) => {}
        (_, true) => violations.push(FieldViolation::new(
            "result",
            "only a RESPOND decision carries a result",
        )),
    }
    if reason.len() > MAX_REASON_BYTES {
        violations.push(FieldViolation::new(
            "reason",
            format!("at most {MAX_REASON_BYTES} bytes"),
        ));
    }
    if !violations.is_empty() {
        return Err(Error::InvalidDecision(violations));
    }
    let mut d = NewDecision::person(kind, principal.name.clone()).with_reason(reason);
    if let Some(args) = args {
        d.args = from_proto_value(args);
    }
    if let Some(result) = result {
        d.result = from_proto_value(result);
    }
    Ok(d)
}

/// The request ids a bulk decision covers: the given ids, or the PENDING approvals matching the
/// filter (at most `limit`), never both.
pub fn bulk_targets<S: ApprovalStore>(
    store: &S,
    r: &pb::BulkResolveRequest,
) -> Result<Vec<String>> {
    match (r.request_ids.is_empty(), r.filter.as_ref()) {
        (false, Some(_)) => Err(Error::invalid(
            "filter",
            "give either request_ids or a filter, not both",
        )),
        (true, None) => Err(Error::invalid(
            "request_ids",
            "give either request_ids or a filter",
        )),
        (false, None) => {
            if r.request_ids.len() > MAX_PAGE_SIZE {
                return Err(Error::invalid(
                    "request_ids",
                    format!("at most {MAX_PAGE_SIZE} ids"),
                ));
            }
            let mut ids = Vec::with_capacity(r.request_ids.len());
            for (i, id) in r.request_ids.iter().enumerate() {
                required(id, &format!("request_ids[{i}]"))?;
                if !ids.contains(id) {
                    ids.push(id.clone());
                }
            }
            Ok(ids)
        }
        (true, Some(f)) => {
            let mut filter = filter_from_pb(Some(f), "filter")?;
            filter.states = BULK_STATES.to_vec();
            let limit = match r.limit as usize {
                0 => MAX_PAGE_SIZE,
                n => n.min(MAX_PAGE_SIZE),
            };
            let page = store.list(&filter, limit, None, store.now_ms())?;
            Ok(page.items.iter().map(|a| a.id().to_string()).collect())
        }
    }
}
