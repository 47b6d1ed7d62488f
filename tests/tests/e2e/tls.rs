//! Optional TLS for deployments without a mesh: both services serve TLS with a certificate from
//! files, approval-svc reaches the runner over TLS trusting a given CA, the whole approval loop
//! works through it, and a plaintext client gets nowhere.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbor_shared::proto::{
    approval::v1::{self as apb, approval_service_client::ApprovalServiceClient},
    runner::v1::{self as rpb, runner_service_client::RunnerServiceClient},
};
use arbor_tests::{Binaries, Profile, Service, ServiceKind, WAIT, eventually, gate_tree};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_loop_runs_over_tls_and_plaintext_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let tls_args = || {
        vec![
            "--tls-cert".to_string(),
            cert.display().to_string(),
            "--tls-key".to_string(),
            key.display().to_string(),
        ]
    };

    let bins = Binaries::get(Profile::Debug);
    let mut runner = Service::new(ServiceKind::Runner, bins.runner, dir.path(), tls_args());
    runner.tls_ca = Some(cert.clone());
    runner.start().await;
    let mut approval_args = tls_args();
    approval_args.extend([
        "--runner".to_string(),
        runner.url(),
        "--runner-ca".to_string(),
        cert.display().to_string(),
    ]);
    let mut approval = Service::new(
        ServiceKind::Approval,
        bins.approval,
        dir.path(),
        approval_args,
    );
    approval.tls_ca = Some(cert.clone());
    approval.start().await;

    let mut client = RunnerServiceClient::new(runner.channel().await);
    let tree = client
        .register_tree(rpb::RegisterTreeRequest {
            document: gate_tree("tls-gate", "failure"),
            format: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .tree
        .unwrap();
    let run = client
        .submit_run(rpb::SubmitRunRequest {
            tree_id: tree.id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    let approvals = ApprovalServiceClient::new(approval.channel().await);
    let pending = eventually("the approval over TLS", WAIT, || {
        let mut approvals = approvals.clone();
        let run_id = run.run_id.clone();
        async move {
            approvals
                .list_approvals(apb::ListApprovalsRequest {
                    filter: Some(apb::ApprovalFilter {
                        run_id,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner()
                .approvals
                .into_iter()
                .next()
        }
    })
    .await;
    approvals
        .clone()
        .resolve(apb::ResolveRequest {
            request_id: pending.request_id,
            decision: rpb::DecisionKind::Approve as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    eventually("the run to succeed after delivery over TLS", WAIT, || {
        let mut client = client.clone();
        let run_id = run.run_id.clone();
        async move {
            let r = client
                .get_run(rpb::GetRunRequest { run_id })
                .await
                .ok()?
                .into_inner()
                .run?;
            (r.status == rpb::RunStatus::Succeeded as i32).then_some(())
        }
    })
    .await;

    // Plaintext to a TLS port fails instead of talking in the clear.
    let plain = format!("http://{}", runner.addr);
    let refused = match tonic::transport::Channel::from_shared(plain)
        .unwrap()
        .connect()
        .await
    {
        Err(_) => true,
        Ok(channel) => RunnerServiceClient::new(channel)
            .get_run(rpb::GetRunRequest {
                run_id: run.run_id.clone(),
            })
            .await
            .is_err(),
    };
    assert!(refused, "a plaintext client must not get an answer");
    approval.stop().await;
    runner.stop().await;
}
