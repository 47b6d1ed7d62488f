//! Signed webhooks end to end: the real approval-svc binary with `--webhooks`, a receiver in
//! the test that verifies every signature with the published `standardwebhooks` crate. Messages
//! queued while the endpoint hangs are shown as its backlog, survive a SIGKILL of approval-svc,
//! and after the restart reach the receiver, which fails its first answers and deduplicates by
//! `webhook-id`: every event is seen exactly once.

use arbor_shared::proto::approval::v1 as apb;
use arbor_testkit::webhooks::WebhookReceiver;
use arbor_tests::{Cluster, Profile, WAIT, eventually, flow, gate_tree, scrape::scrape};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn backlog(cluster: &Cluster) -> Option<f64> {
    scrape(&cluster.approval.metrics_url())
        .await
        .get("arbor_approval_webhook_backlog", &[("endpoint", "inbox")])
}

#[tokio::test]
async fn webhooks_pending_across_a_sigkill_reach_the_receiver_once_each() {
    let receiver = WebhookReceiver::start(SECRET).await;
    receiver.hang(true);
    let mut cluster = Cluster::prepare(Profile::Debug, Vec::new(), Vec::new());
    let file = cluster.dir.path().join("webhooks.toml");
    std::fs::write(
        &file,
        format!(
            "link_base = \"https://inbox.example\"\nretry_min_ms = 50\nretry_max_ms = 500\n\
             timeout_ms = 1000\n[[endpoint]]\nname = \"inbox\"\nurl = \"{}\"\n\
             secret = \"{SECRET}\"\nevents = [\"requested\", \"decided\", \"expired\"]\n",
            receiver.url()
        ),
    )
    .unwrap();
    cluster
        .approval
        .extra_args
        .extend(["--webhooks".to_string(), file.display().to_string()]);
    let runner_url = cluster.runner.url();
    cluster.start_routed(&runner_url).await;

    let mut requests = Vec::new();
    for name in ["hooked-a", "hooked-b"] {
        let run = flow::submit(&cluster, gate_tree(name, "failure"), None).await;
        let pending = flow::approval_of(&cluster, &run.run_id, apb::ApprovalState::Pending).await;
        requests.push(pending.request_id);
    }
    flow::approve(&cluster, &requests[0]).await;
    eventually(
        "three messages waiting for the hanging endpoint",
        WAIT,
        || async { (backlog(&cluster).await == Some(3.0)).then_some(()) },
    )
    .await;
    assert!(receiver.unique().is_empty());

    cluster.approval.kill().await;
    receiver.hang(false);
    receiver.fail_next(2);
    cluster.approval.start().await;
    flow::approve(&cluster, &requests[1]).await;

    let expected = [
        ("approval.requested", &requests[0]),
        ("approval.requested", &requests[1]),
        ("approval.decided", &requests[0]),
        ("approval.decided", &requests[1]),
    ];
    eventually("every message at the receiver", WAIT, || async {
        (receiver.unique().len() >= expected.len()).then_some(())
    })
    .await;
    for (kind, id) in expected {
        let seen = receiver.about(kind, id);
        assert_eq!(seen.len(), 1, "{kind} of {id}: {:?}", receiver.unique());
        assert_eq!(
            seen[0].body["data"]["link"],
            format!("https://inbox.example/approvals/{id}")
        );
    }
    assert_eq!(receiver.unique().len(), expected.len());
    assert!(receiver.forged().is_empty(), "{:?}", receiver.forged());
    eventually("the backlog emptied", WAIT, || async {
        (backlog(&cluster).await == Some(0.0)).then_some(())
    })
    .await;
    let log = cluster.approval.log_since_start();
    let failures = log.lines().filter(|l| l.contains("not delivered")).count();
    assert!(
        (1..=2).contains(&failures),
        "failures are logged, once per interval: {failures} lines"
    );
}
