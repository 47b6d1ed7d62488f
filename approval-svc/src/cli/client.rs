//! The client subcommands: thin calls to the ApprovalService that print for people.

use anyhow::{Context, anyhow};
use arbor_shared::{
    auth::BearerToken,
    json::to_proto_value,
    proto::{
        approval::v1::{self as pb, approval_service_client::ApprovalServiceClient},
        runner::v1::DecisionKind,
    },
    server::MAX_MESSAGE_BYTES,
    status::field_violations,
};
use tonic::{Status, service::interceptor::InterceptedService, transport::Channel};

use super::{Command, Conn, render};

type Client = ApprovalServiceClient<InterceptedService<Channel, BearerToken>>;

async fn connect(conn: &Conn) -> anyhow::Result<Client> {
    let mut endpoint = Channel::from_shared(conn.addr.clone())
        .with_context(|| format!("bad --addr {}", conn.addr))?;
    if let Some(ca) = &conn.ca {
        endpoint = endpoint
            .tls_config(arbor_shared::tls::client_config(ca).map_err(anyhow::Error::msg)?)
            .context("TLS settings")?;
    }
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("cannot connect to {}", conn.addr))?;
    let token = BearerToken::new(conn.token.as_deref()).map_err(status_error)?;
    Ok(ApprovalServiceClient::with_interceptor(channel, token)
        .max_decoding_message_size(arbor_shared::server::MAX_RESPONSE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// A failed call as people read it: code, message and any bad fields.
fn status_error(s: Status) -> anyhow::Error {
    let mut text = format!("{:?}: {}", s.code(), s.message());
    for v in field_violations(&s) {
        text.push_str(&format!("\n  {}: {}", v.field, v.description));
    }
    anyhow!(text)
}

/// Prints for people; a closed pipe (`| head`) is not an error worth a panic.
fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

fn json_arg(text: &str, flag: &str) -> anyhow::Result<prost_types::Value> {
    let json: serde_json::Value =
        serde_json::from_str(text).with_context(|| format!("{flag} is not valid JSON"))?;
    Ok(to_proto_value(&json))
}

pub(super) async fn connect_to(conn: &Conn) -> anyhow::Result<Client> {
    connect(conn).await
}

pub(super) fn print(text: &str) {
    emit(text)
}

pub(super) fn failed(s: Status) -> anyhow::Error {
    status_error(s)
}

pub async fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(_) => Err(anyhow!("serve is not a client command")),
        Command::Pending {
            conn,
            run,
            tool,
            mine,
        } => {
            let filter = pb::ApprovalFilter {
                states: vec![pb::ApprovalState::Pending as i32],
                run_id: run.unwrap_or_default(),
                tool_name: tool.unwrap_or_default(),
                actionable: mine,
                ..Default::default()
            };
            pending(&mut connect(&conn).await?, filter).await
        }
        Command::Show { conn, id } => {
            let resp = connect(&conn)
                .await?
                .get_approval(pb::GetApprovalRequest { request_id: id })
                .await
                .map_err(status_error)?
                .into_inner();
            let approval = resp.approval.unwrap_or_default();
            let json = serde_json::to_string_pretty(&render::approval_json(&approval))?;
            emit(&format!("{json}\n"));
            Ok(())
        }
        Command::Approve {
            conn,
            id,
            reason,
            digest,
        } => {
            let d = Decide::new(id, DecisionKind::Approve, reason).digest(digest);
            decide(&conn, d).await
        }
        Command::Reject { conn, id, reason } => {
            decide(&conn, Decide::new(id, DecisionKind::Reject, reason)).await
        }
        Command::Vote {
            conn,
            id,
            vote,
            reason,
            digest,
        } => {
            let kind = match vote.as_str() {
                "reject" => DecisionKind::Reject,
                _ => DecisionKind::Approve,
            };
            decide(&conn, Decide::new(id, kind, reason).digest(digest)).await
        }
        command @ (Command::Delegate { .. }
        | Command::Claim { .. }
        | Command::Reassign { .. }
        | Command::Comment { .. }) => super::govern::execute(command).await,
        Command::Edit {
            conn,
            id,
            args,
            reason,
        } => {
            let mut d = Decide::new(id, DecisionKind::Edit, reason);
            d.args = Some(json_arg(&args, "--args")?);
            decide(&conn, d).await
        }
        Command::Respond {
            conn,
            id,
            result,
            reason,
        } => {
            let mut d = Decide::new(id, DecisionKind::Respond, reason);
            d.result = Some(json_arg(&result, "--result")?);
            decide(&conn, d).await
        }
        Command::Watch { conn, pending } => {
            let filter = pending.then(|| pb::ApprovalFilter {
                states: vec![pb::ApprovalState::Pending as i32],
                ..Default::default()
            });
            watch(&mut connect(&conn).await?, filter).await
        }
        Command::Leader { conn } => {
            let resp = connect(&conn)
                .await?
                .get_leader(pb::GetLeaderRequest {})
                .await
                .map_err(status_error)?
                .into_inner();
            emit(&render::leader_line(&resp));
            Ok(())
        }
    }
}

async fn pending(client: &mut Client, filter: pb::ApprovalFilter) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let mut page_token = String::new();
    loop {
        let resp = client
            .list_approvals(pb::ListApprovalsRequest {
                filter: Some(filter.clone()),
                page_size: 1000,
                page_token,
            })
            .await
            .map_err(status_error)?
            .into_inner();
        rows.extend(resp.approvals);
        if resp.next_page_token.is_empty() {
            break;
        }
        page_token = resp.next_page_token;
    }
    emit(&render::pending_table(&rows, arbor_shared::time::now_ms()));
    Ok(())
}

/// One decision (or vote) as the command line asks for it.
struct Decide {
    request_id: String,
    kind: DecisionKind,
    reason: String,
    args: Option<prost_types::Value>,
    result: Option<prost_types::Value>,
    expected_digest: String,
}

impl Decide {
    fn new(request_id: String, kind: DecisionKind, reason: String) -> Self {
        Self {
            request_id,
            kind,
            reason,
            args: None,
            result: None,
            expected_digest: String::new(),
        }
    }

    fn digest(mut self, digest: String) -> Self {
        self.expected_digest = digest;
        self
    }
}

async fn decide(conn: &Conn, d: Decide) -> anyhow::Result<()> {
    let kind = d.kind;
    let resp = connect(conn)
        .await?
        .resolve(pb::ResolveRequest {
            request_id: d.request_id,
            decision: kind as i32,
            reason: d.reason,
            args: d.args,
            result: d.result,
            expected_digest: d.expected_digest,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    let approval = resp.approval.unwrap_or_default();
    if let Some(g) = &approval.governance
        && approval.state == pb::ApprovalState::Pending as i32
    {
        emit(&render::vote_line(&approval, g, kind as i32));
        return Ok(());
    }
    let decision_id = approval
        .decision
        .as_ref()
        .map(|d| d.decision_id.as_str())
        .unwrap_or("");
    emit(&format!(
        "{} {} ({}, decision {decision_id}){}\n",
        approval.request_id,
        render::state_name(approval.state),
        render::decision_name(kind as i32),
        if resp.duplicate {
            " — already decided the same way"
        } else {
            ""
        }
    ));
    Ok(())
}

async fn watch(client: &mut Client, filter: Option<pb::ApprovalFilter>) -> anyhow::Result<()> {
    let mut stream = client
        .watch_approvals(pb::WatchApprovalsRequest { filter })
        .await
        .map_err(status_error)?
        .into_inner();
    let now = arbor_shared::time::now_ms;
    while let Some(item) = stream.message().await.map_err(status_error)? {
        emit(&format!("{}\n", render::change_line(&item, now())));
    }
    Ok(())
}
