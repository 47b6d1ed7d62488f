//! Signed webhooks end to end: the real approval-svc binary with `--webhooks`, a receiver in
//! the test that verifies every signature with the published `standardwebhooks` crate. Messages
//! queued while the endpoint hangs are shown as its backlog, survive a SIGKILL of approval-svc,
//! and after the restart reach the receiver, which fails its first answers and deduplicates by
//! `webhook-id`: every event is seen exactly once. A bad webhooks file stops start-up.

use std::time::Duration;

use arbor_shared::proto::approval::v1 as apb;
use arbor_testkit::webhooks::WebhookReceiver;
use arbor_tests::{
    Binaries, Cluster, Profile, WAIT, eventually, flow, gate_tree,
    process::{free_port, run_to_exit},
    scrape::scrape,
};

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

/// A mistake in the webhooks file stops start-up, non-zero, naming the file, the endpoint and
/// the accepted values, and never showing the secret.
#[tokio::test]
async fn a_bad_webhooks_file_stops_start_up_and_says_what_is_accepted() {
    let bins = Binaries::get(Profile::Debug);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("webhooks.toml");
    for (toml, wanted) in [
        (
            format!(
                "link_base = \"https://inbox.example\"\n[[endpoint]]\nname = \"chat\"\n\
                 url = \"https://hooks.example/x\"\nsecret = \"{SECRET}\"\n\
                 events = [\"decided\", \"approved\"]\n"
            ),
            vec![
                "endpoint \"chat\"",
                "\"approved\"",
                "requested, voted, stage_opened",
            ],
        ),
        (
            "[[endpoint]]\nname = \"chat\"\nurl = \"https://hooks.example/x\"\n\
             secret = \"whsec_c2hvcnQ=\"\nevents = [\"decided\"]\n"
                .to_string(),
            vec!["endpoint \"chat\"", "secret decodes to 5 bytes", "24 to 64"],
        ),
    ] {
        std::fs::write(&file, toml).unwrap();
        let args = vec![
            "serve".to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", free_port()),
            "--data-dir".into(),
            dir.path().join("data").display().to_string(),
            "--metrics-listen".into(),
            "off".into(),
            "--webhooks".into(),
            file.display().to_string(),
        ];
        let exited = run_to_exit(&bins.approval, &args, Duration::from_secs(20)).await;
        assert!(
            !exited.timed_out && exited.code.is_some_and(|c| c != 0),
            "{exited:?}"
        );
        for w in wanted.into_iter().chain([file.to_str().unwrap()]) {
            assert!(exited.stderr.contains(w), "{w:?} in {}", exited.stderr);
        }
        assert!(!exited.stderr.contains("MfKQ9r8"), "{}", exited.stderr);
        assert!(!exited.stderr.contains("panicked"), "{}", exited.stderr);
    }
}
