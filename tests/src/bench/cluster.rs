//! The system as it ships: both release binaries with authentication on (a tokens file with a
//! submitter, an approver, an operator and approval-svc's service identity) and, for the policy
//! path, an approval policy that auto-approves the benchmark's gate.

use std::path::Path;

use arbor_shared::{
    auth::{BearerToken, hash_token},
    proto::{
        approval::v1::approval_service_client::ApprovalServiceClient,
        runner::v1::runner_service_client::RunnerServiceClient,
    },
};
use tonic::{service::interceptor::InterceptedService, transport::Channel};

use crate::{Binaries, Profile, Service, ServiceKind};

pub type Runner = RunnerServiceClient<InterceptedService<Channel, BearerToken>>;
pub type Approvals = ApprovalServiceClient<InterceptedService<Channel, BearerToken>>;

pub const SUBMITTER: &str = "bench-submitter-token";
pub const APPROVER: &str = "bench-approver-token";
pub const OPERATOR: &str = "bench-operator-token";
pub const SERVICE: &str = "bench-approval-svc-token";

pub struct BenchCluster {
    pub dir: tempfile::TempDir,
    pub runner: Service,
    pub approval: Service,
}

fn write_tokens(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tokens.toml");
    let entry = |name: &str, role: &str, token: &str| {
        format!(
            "[[principal]]\nname = \"{name}\"\nroles = [\"{role}\"]\ntoken_sha256 = \"{}\"\n\n",
            hash_token(token)
        )
    };
    let text = [
        entry("bench", "submitter", SUBMITTER),
        entry("person", "approver", APPROVER),
        entry("ops", "operator", OPERATOR),
        entry("approval-svc", "service", SERVICE),
    ]
    .concat();
    std::fs::write(&path, text).expect("tokens file");
    path
}

impl BenchCluster {
    /// Starts runner-svc (with `runner_args`) and, unless `runner_only`, approval-svc; with
    /// `auto_approve` the policy approves every `gate` node of `bench-*` trees.
    pub async fn start(auto_approve: bool, runner_args: &[&str]) -> BenchCluster {
        let bins = Binaries::get(Profile::Release);
        let dir = tempfile::tempdir().expect("temp dir");
        let tokens = write_tokens(dir.path());
        let service_token = dir.path().join("service.token");
        std::fs::write(&service_token, SERVICE).expect("service token");
        let policy = dir.path().join("policy.toml");
        let rules = if auto_approve {
            "default = \"ask\"\n\n[[node]]\nname = \"bench-auto-approve\"\ntree = \"bench-*\"\nnode = \"gate\"\naction = \"allow\"\n"
        } else {
            "default = \"ask\"\n"
        };
        std::fs::write(&policy, rules).expect("policy file");

        let mut args: Vec<String> = vec!["--tokens".into(), tokens.display().to_string()];
        args.extend(runner_args.iter().map(|s| s.to_string()));
        let mut runner = Service::new(ServiceKind::Runner, bins.runner, dir.path(), args);
        runner.env.push(("RUST_LOG".into(), "warn".into()));
        runner.start().await;
        let mut approval = Service::new(
            ServiceKind::Approval,
            bins.approval,
            dir.path(),
            vec![
                "--tokens".into(),
                tokens.display().to_string(),
                "--runner-token-file".into(),
                service_token.display().to_string(),
                "--policy".into(),
                policy.display().to_string(),
                "--runner".into(),
                runner.url(),
            ],
        );
        approval.start().await;
        BenchCluster {
            dir,
            runner,
            approval,
        }
    }

    pub async fn runner_as(&self, token: &str) -> Runner {
        RunnerServiceClient::with_interceptor(
            self.runner.channel().await,
            BearerToken::new(Some(token)).expect("ascii token"),
        )
        .max_decoding_message_size(arbor_shared::server::MAX_RESPONSE_BYTES)
    }

    pub async fn approvals_as(&self, token: &str) -> Approvals {
        ApprovalServiceClient::with_interceptor(
            self.approval.channel().await,
            BearerToken::new(Some(token)).expect("ascii token"),
        )
    }

    pub async fn stop(mut self) {
        self.approval.stop().await;
        self.runner.stop().await;
    }
}
