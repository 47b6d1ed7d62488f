//! The façade's governance operations: claims, reassignment, comments and delegations, each
//! one durable store operation whose change watchers are told of.

use arbor_shared::auth::Principal;

use super::Approvals;
use crate::{
    error::{Error, Result},
    governance::seat::Delegation,
    model::Approval,
    store::ApprovalStore,
};

/// Longest delegation accepted: a year.
pub const MAX_DELEGATION_MS: u64 = 366 * 86_400_000;

impl<S: ApprovalStore> Approvals<S> {
    /// `who` takes `request_id` for `ttl_ms` (0: until released), or gives it back.
    pub async fn claim(
        &self,
        request_id: &str,
        who: &str,
        ttl_ms: u64,
        release: bool,
    ) -> Result<Approval> {
        let a = self.store().claim(request_id, who, ttl_ms, release).await?;
        self.tell_watchers(&a);
        Ok(a)
    }

    /// `actor` moves the claim of `request_id` to `to`; `overrides` (an operator) may move a
    /// claim someone else holds.
    pub async fn reassign(
        &self,
        request_id: &str,
        actor: &str,
        to: &str,
        overrides: bool,
    ) -> Result<Approval> {
        let a = self
            .store()
            .reassign(request_id, actor, to, overrides)
            .await?;
        self.tell_watchers(&a);
        Ok(a)
    }

    pub async fn comment(&self, request_id: &str, author: &str, text: &str) -> Result<Approval> {
        let a = self.store().comment(request_id, author, text).await?;
        self.tell_watchers(&a);
        Ok(a)
    }

    /// Records `d` after checking it: a delegate other than the delegator, a window that ends
    /// after it starts and within a year, and a delegate who is not away themselves then
    /// (delegations are not chained: a delegate's own delegate never gets the seat).
    pub async fn delegate(&self, mut d: Delegation) -> Result<Delegation> {
        if d.from == d.to {
            return Err(Error::invalid("to", "must not be the delegator"));
        }
        if d.ends_ms <= d.starts_ms {
            return Err(Error::invalid("ends", "must be after starts"));
        }
        if d.ends_ms - d.starts_ms > MAX_DELEGATION_MS {
            return Err(Error::invalid("ends", "at most a year after starts"));
        }
        if !d.scope.is_empty() {
            globset::Glob::new(&d.scope)
                .map_err(|e| Error::invalid("scope", format!("not a glob: {e}")))?;
        }
        let overlaps = |o: &Delegation| o.starts_ms < d.ends_ms && d.starts_ms < o.ends_ms;
        let existing = self.store().delegations().await?;
        if let Some(o) = existing.iter().find(|o| o.from == d.to && overlaps(o)) {
            return Err(Error::invalid(
                "to",
                format!(
                    "{} delegates to {} then: delegations are not chained",
                    d.to, o.to
                ),
            ));
        }
        d.id = uuid::Uuid::now_v7().to_string();
        self.store().delegate(d).await
    }

    /// Ends delegation `id`: its delegator, its delegate or an operator may.
    pub async fn revoke_delegation(&self, id: &str, caller: &Principal) -> Result<Delegation> {
        let (name, operator) = (
            caller.name.clone(),
            caller.has(arbor_shared::auth::Role::Operator),
        );
        self.store()
            .revoke_delegation(id, move |d| {
                match operator || d.from == name || d.to == name {
                    true => Ok(()),
                    false => Err(Error::RoleRequired {
                        principal: name.clone(),
                        action: "revoke another principal's delegation",
                        roles: "operator".into(),
                    }),
                }
            })
            .await
    }

    pub async fn delegations(&self) -> Result<Vec<Delegation>> {
        self.store().delegations().await
    }
}
