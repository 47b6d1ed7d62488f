//! The governance subcommands: delegations, claims, reassignment and comments.

use anyhow::{Context, anyhow};
use arbor_shared::proto::approval::v1 as pb;

use super::{
    Command,
    client::{connect_to, failed, print},
    render,
};

fn duration_ms(text: &str, flag: &str) -> anyhow::Result<u64> {
    let d = humantime::parse_duration(text)
        .with_context(|| format!("{flag} {text:?} is not a duration such as 30m or 7d"))?;
    Ok(d.as_millis() as u64)
}

fn delegation_line(d: &pb::Delegation) -> String {
    let until = d
        .ends
        .as_ref()
        .map(arbor_shared::time::from_timestamp)
        .map(|ms| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
            )
            .to_string()
        })
        .unwrap_or_default();
    let scope = match d.scope.is_empty() {
        true => "everything".to_string(),
        false => d.scope.clone(),
    };
    format!(
        "{}  {} → {}  until {until}  scope {scope}\n",
        d.id, d.from, d.to
    )
}

pub(super) async fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Delegate {
            conn,
            to,
            duration,
            from,
            scope,
            list,
            revoke,
        } => {
            let mut client = connect_to(&conn).await?;
            if list {
                let resp = client
                    .list_delegations(pb::ListDelegationsRequest::default())
                    .await
                    .map_err(failed)?
                    .into_inner();
                if resp.delegations.is_empty() {
                    print("no delegations\n");
                }
                for d in &resp.delegations {
                    print(&delegation_line(d));
                }
                return Ok(());
            }
            if let Some(id) = revoke {
                client
                    .revoke_delegation(pb::RevokeDelegationRequest { id: id.clone() })
                    .await
                    .map_err(failed)?;
                print(&format!("delegation {id} revoked\n"));
                return Ok(());
            }
            let to = to.ok_or_else(|| anyhow!("--to is required"))?;
            let ms = duration_ms(duration.as_deref().unwrap_or_default(), "--for")?;
            let ends = arbor_shared::time::now_ms().saturating_add(ms);
            let resp = client
                .delegate(pb::DelegateRequest {
                    from,
                    to,
                    starts: None,
                    ends: Some(arbor_shared::time::timestamp(ends)),
                    scope,
                })
                .await
                .map_err(failed)?
                .into_inner();
            print(&delegation_line(&resp.delegation.unwrap_or_default()));
            Ok(())
        }
        Command::Claim {
            conn,
            id,
            ttl,
            release,
        } => {
            let ttl_ms = ttl
                .map(|t| duration_ms(&t, "--ttl"))
                .transpose()?
                .unwrap_or(0);
            let resp = connect_to(&conn)
                .await?
                .claim(pb::ClaimRequest {
                    request_id: id,
                    ttl_ms,
                    release,
                })
                .await
                .map_err(failed)?
                .into_inner();
            let a = resp.approval.unwrap_or_default();
            print(&match a.claim {
                Some(c) => format!("{} claimed by {}\n", a.request_id, c.principal),
                None => format!("{} is not claimed\n", a.request_id),
            });
            Ok(())
        }
        Command::Reassign { conn, id, to } => {
            let resp = connect_to(&conn)
                .await?
                .reassign(pb::ReassignRequest { request_id: id, to })
                .await
                .map_err(failed)?
                .into_inner();
            let a = resp.approval.unwrap_or_default();
            let holder = a.claim.map(|c| c.principal).unwrap_or_default();
            print(&format!("{} claimed by {holder}\n", a.request_id));
            Ok(())
        }
        Command::Comment { conn, id, text } => {
            let resp = connect_to(&conn)
                .await?
                .comment(pb::CommentRequest {
                    request_id: id,
                    text,
                })
                .await
                .map_err(failed)?
                .into_inner();
            let a = resp.approval.unwrap_or_default();
            print(&format!(
                "{} {} ({} comments)\n",
                a.request_id,
                render::state_name(a.state),
                a.comments.len()
            ));
            Ok(())
        }
        _ => Err(anyhow!("not a governance command")),
    }
}
