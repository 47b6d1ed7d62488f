//! Shared test harness: the service started through `run` on 127.0.0.1:0 with fast timings, a
//! fake runner, request builders and an `eventually` helper instead of bare sleeps.
#![allow(
    dead_code,
    unused_imports,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

pub mod fake_runner;

use std::{net::SocketAddr, path::Path, time::Duration};

use arbor_approval_svc::{ServeConfig, ServeError, Tuning};
use arbor_shared::{
    auth::BearerToken,
    json::{to_proto_struct, to_proto_value},
    proto::{
        approval::v1::{self as pb, approval_service_client::ApprovalServiceClient},
        runner::v1 as runner_pb,
    },
    time::{now_ms, timestamp},
};
use serde_json::json;
use tokio::{sync::oneshot, task::JoinHandle};
use tonic::{service::interceptor::InterceptedService, transport::Channel};

pub use fake_runner::FakeRunner;

pub type Client = ApprovalServiceClient<InterceptedService<Channel, BearerToken>>;

pub use arbor_shared::testing::eventually;

pub const WAIT: Duration = Duration::from_secs(10);

pub fn fast_tuning() -> Tuning {
    Tuning {
        ack_every: 64,
        ack_interval: Duration::from_millis(20),
        reconnect_min: Duration::from_millis(20),
        reconnect_max: Duration::from_millis(200),
        delivery_min: Duration::from_millis(20),
        delivery_max: Duration::from_millis(200),
        rpc_timeout: Duration::from_secs(5),
        drain_timeout: Duration::from_secs(3),
    }
}

pub fn config(data_dir: &Path, runner_url: &str) -> ServeConfig {
    let mut cfg = ServeConfig::new(data_dir, runner_url);
    cfg.tuning = fast_tuning();
    cfg
}

/// A running approval-svc.
pub struct Svc {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServeError>>,
}

impl Svc {
    pub async fn start(cfg: ServeConfig) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(arbor_approval_svc::run(cfg, listener, async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// The service with its web inbox on a port of its own; answers the inbox's address.
    pub async fn start_web(cfg: ServeConfig) -> (Self, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let web = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (addr, web_addr) = (listener.local_addr().unwrap(), web.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(arbor_approval_svc::run_with_web(
            cfg,
            listener,
            Some(web),
            async move {
                let _ = stopped.await;
            },
        ));
        let svc = Self {
            addr,
            stop: Some(stop),
            task,
        };
        (svc, web_addr)
    }

    pub async fn client(&self) -> Client {
        self.client_as(None).await
    }

    pub async fn client_as(&self, token: Option<&str>) -> Client {
        let channel = Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        ApprovalServiceClient::with_interceptor(channel, BearerToken::new(token).unwrap())
    }

    pub fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect_lazy()
    }

    /// Sends the shutdown signal and waits until `run` has returned (store flushed).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("run did not return after shutdown")
            .unwrap()
            .unwrap();
    }
}

/// A node-gate approval request as the runner would send it.
pub fn node_request(request_id: &str, run_id: &str) -> runner_pb::ApprovalRequested {
    runner_pb::ApprovalRequested {
        request_id: request_id.into(),
        run_id: run_id.into(),
        thread_id: format!("thread-{run_id}"),
        tree_id: "deploy-service".into(),
        tree_version: 1,
        node_locator: "0/1".into(),
        node_name: "approve-deploy".into(),
        kind: runner_pb::ApprovalKind::Node as i32,
        tool_name: String::new(),
        tool_args: None,
        tool_call_id: String::new(),
        title: "Deploy billing with 3 replicas?".into(),
        context: json!({"plan": {"service": "billing", "replicas": 3}})
            .as_object()
            .map(to_proto_struct),
        phase: runner_pb::ApprovalPhase::Before as i32,
        deadline: None,
        on_timeout: runner_pb::TimeoutAction::Reject as i32,
        allowed_decisions: vec![
            runner_pb::DecisionKind::Approve as i32,
            runner_pb::DecisionKind::Reject as i32,
        ],
        submitted_by: "sam".into(),
        requested_at: Some(timestamp(now_ms())),
        args_digest: String::new(),
    }
}

/// A tool-call approval that allows every decision.
pub fn tool_request(request_id: &str, run_id: &str, tool: &str) -> runner_pb::ApprovalRequested {
    runner_pb::ApprovalRequested {
        kind: runner_pb::ApprovalKind::Tool as i32,
        tool_name: tool.into(),
        tool_args: Some(to_proto_value(&json!({"entry": {"replicas": 3}}))),
        tool_call_id: format!("call-{request_id}"),
        node_name: "deploy".into(),
        phase: runner_pb::ApprovalPhase::Unspecified as i32,
        allowed_decisions: vec![
            runner_pb::DecisionKind::Approve as i32,
            runner_pb::DecisionKind::Reject as i32,
            runner_pb::DecisionKind::Edit as i32,
            runner_pb::DecisionKind::Respond as i32,
        ],
        ..node_request(request_id, run_id)
    }
}

pub async fn get(client: &mut Client, id: &str) -> pb::Approval {
    client
        .get_approval(pb::GetApprovalRequest {
            request_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap()
}

/// The approval once it exists and satisfies `pred`.
pub async fn wait_for(
    client: &Client,
    id: &str,
    what: &str,
    pred: impl Fn(&pb::Approval) -> bool,
) -> pb::Approval {
    eventually(what, WAIT, || {
        let mut c = client.clone();
        let id = id.to_string();
        let pred = &pred;
        async move {
            c.get_approval(pb::GetApprovalRequest { request_id: id })
                .await
                .ok()
                .and_then(|r| r.into_inner().approval)
                .filter(|a| pred(a))
        }
    })
    .await
}

pub fn state(s: pb::ApprovalState) -> impl Fn(&pb::Approval) -> bool {
    move |a| a.state == s as i32
}

pub fn resolve_req(id: &str, kind: runner_pb::DecisionKind) -> pb::ResolveRequest {
    pb::ResolveRequest {
        request_id: id.into(),
        decision: kind as i32,
        reason: String::new(),
        args: None,
        result: None,
        expected_digest: String::new(),
    }
}

pub async fn audit_actions(client: &mut Client, id: &str) -> Vec<pb::AuditEntry> {
    client
        .get_audit_log(pb::GetAuditLogRequest {
            request_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries
}
