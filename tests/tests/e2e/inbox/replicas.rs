//! The inbox on two approval replicas sharing one PostgreSQL database: alice's page on one
//! replica follows a decision bob makes in the inbox of the other, as fast as one made on her
//! own (the replicas' change feed is the same one `WatchApprovals` follows).

use std::net::SocketAddr;

use arbor_testkit::PgCluster;
use arbor_tests::{Profile, auth::Tokens, process::Replicas};

use super::{people, playwright, services_env};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_on_another_replica_reaches_the_page() {
    arbor_tests::tools::chromium();
    let _one = super::ONE_BROWSER.lock().await;
    let url = PgCluster::shared().fresh_database("inbox_replicas");
    let mut r = Replicas::prepare(Profile::Debug, &url, (1, 2), Vec::new(), Vec::new());
    let tokens = Tokens::write_with(r.dir.path(), &people());
    r.runners[0].extra_args.extend(tokens.runner_args());
    let webs: Vec<SocketAddr> = (0..2)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], arbor_tests::process::free_port())))
        .collect();
    for (s, web) in r.approvals.iter_mut().zip(&webs) {
        s.extra_args.extend(tokens.approval_args());
        s.extra_args
            .extend(["--web-listen".to_string(), web.to_string()]);
    }
    r.start_all().await;
    for web in &webs {
        super::listening(*web).await;
    }
    let mut env = services_env((&r.runners[0], &r.approvals[0]), &tokens, webs[0]);
    env.push(("INBOX_URL_2".into(), format!("http://{}", webs[1])));
    let services = [&r.runners[0], &r.approvals[0], &r.approvals[1]];
    tokio::task::block_in_place(|| {
        playwright("replicas", &env, &["--grep", "@replicas"], &services)
    });
    r.stop_all().await;
}
