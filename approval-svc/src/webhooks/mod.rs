//! Signed webhooks (Standard Webhooks 1.0): the event kinds an endpoint can want, what a
//! message says, the configuration (`config`), the signature (`sign`) and the delivery from the
//! durable outbox (`deliver`). Messages are queued by the store in the transaction of the change
//! they tell of (`store::webhooks`), so a change and its messages are one commit.

pub mod config;
pub mod deliver;
pub mod sign;
mod tls;

use std::fmt;

use serde_json::json;

use crate::model::Approval;

pub use config::{Endpoint, WebhookConfig};

/// What happened to an approval, as an endpoint subscribes to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A new approval is waiting for a decision.
    Requested,
    /// Someone voted (governance rules).
    Voted,
    /// A stage of a staged approval opened (governance rules).
    StageOpened,
    /// An approval was escalated (governance rules).
    Escalated,
    /// Approvers were reminded (governance rules).
    Reminded,
    /// A person or the policy decided.
    Decided,
    /// The deadline passed and the request's `on_timeout` decision was taken.
    Expired,
}

impl EventKind {
    pub const ALL: [EventKind; 7] = [
        Self::Requested,
        Self::Voted,
        Self::StageOpened,
        Self::Escalated,
        Self::Reminded,
        Self::Decided,
        Self::Expired,
    ];

    /// The name used in the configuration's `events`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::Voted => "voted",
            Self::StageOpened => "stage_opened",
            Self::Escalated => "escalated",
            Self::Reminded => "reminded",
            Self::Decided => "decided",
            Self::Expired => "expired",
        }
    }

    /// The payload's `type`.
    pub fn type_name(self) -> &'static str {
        match self {
            Self::Requested => "approval.requested",
            Self::Voted => "approval.voted",
            Self::StageOpened => "approval.stage_opened",
            Self::Escalated => "approval.escalated",
            Self::Reminded => "approval.reminded",
            Self::Decided => "approval.decided",
            Self::Expired => "approval.expired",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which endpoint wants which events, and where the deep links point: what the store needs to
/// queue messages (no secret, no URL).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    pub link_base: String,
    /// Each endpoint's name and the events it wants.
    pub endpoints: Vec<(String, Vec<EventKind>)>,
}

impl Routes {
    /// No endpoint: nothing is queued.
    pub const NONE: Routes = Routes {
        link_base: String::new(),
        endpoints: Vec::new(),
    };

    /// The endpoints that want `kind`.
    pub fn wanting(&self, kind: EventKind) -> impl Iterator<Item = &str> {
        self.endpoints
            .iter()
            .filter(move |(_, kinds)| kinds.contains(&kind))
            .map(|(name, _)| name.as_str())
    }

    /// The approval's page in the inbox: a page to look at, never a link that decides.
    pub fn link(&self, request_id: &str) -> String {
        format!(
            "{}/approvals/{}",
            self.link_base.trim_end_matches('/'),
            path_segment(request_id)
        )
    }
}

/// `s` percent-encoded as one URL path segment (RFC 3986 unreserved characters kept).
fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The JSON body of a message about `a`, at `now_ms`: `type`, `timestamp` (RFC 3339) and
/// `data` (the approval, its decision when it holds one, and the deep link).
pub fn payload(kind: EventKind, a: &Approval, now_ms: u64, routes: &Routes) -> String {
    let r = &a.request;
    let mut data = json!({
        "request_id": r.request_id,
        "run_id": r.run_id,
        "thread_id": r.thread_id,
        "tree_id": r.tree_id,
        "tool_name": r.tool_name,
        "title": r.title,
        "state": a.state.as_str(),
        "link": routes.link(&r.request_id),
    });
    if let (Some(d), Some(obj)) = (&a.decision, data.as_object_mut()) {
        obj.insert(
            "decision".into(),
            json!({
                "kind": d.kind.as_str().to_uppercase(),
                "decided_by": d.decided_by,
                "reason": d.reason,
                "source": crate::metrics::source_label(d.source).to_uppercase(),
            }),
        );
    }
    json!({
        "type": kind.type_name(),
        "timestamp": rfc3339(now_ms),
        "data": data,
    })
    .to_string()
}

/// `ms` since the epoch as RFC 3339 in UTC, to the millisecond.
pub fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_named_once_and_read_back() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_name(k.name()), Some(k));
            assert_eq!(k.type_name(), format!("approval.{}", k.name()));
        }
        assert_eq!(EventKind::from_name("approved"), None);
    }

    #[test]
    fn the_link_is_the_inbox_page_with_the_id_escaped() {
        let routes = Routes {
            link_base: "https://inbox.example/".into(),
            endpoints: Vec::new(),
        };
        assert_eq!(
            routes.link("req 1/x"),
            "https://inbox.example/approvals/req%201%2Fx"
        );
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
