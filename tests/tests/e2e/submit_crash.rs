//! SIGKILL runner-svc in the middle of a burst of 1,000 submissions from several clients: after a
//! restart every submission that was answered OK is present exactly once and runs to completion.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use arbor_runner_svc::{counts::Tally, store::T};
use arbor_shared::proto::runner::v1::{self as rpb, runner_service_client::RunnerServiceClient};
use arbor_tests::{Binaries, Profile, Service, ServiceKind, WAIT, eventually};

const CLIENTS: usize = 4;
const PER_CLIENT: usize = 250;

const TREE: &str = r#"{"id": "burst", "version": 1, "root": {"type": "sequence", "name": "main", "children": [
  {"type": "tool", "name": "effect", "tool": "ledger.append", "args": {"entry": {"$ref": "n"}}, "output": "receipt"},
  {"type": "set", "name": "done", "key": "done", "value": true}
]}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_submission_survives_a_kill_and_completes_once() {
    let bins = Binaries::get(Profile::Debug);
    let dir = tempfile::tempdir().unwrap();
    let mut runner = Service::new(ServiceKind::Runner, bins.runner, dir.path(), Vec::new());
    runner.start().await;
    let mut client = RunnerServiceClient::new(runner.channel().await);
    client
        .register_tree(rpb::RegisterTreeRequest {
            document: TREE.into(),
            format: 0,
        })
        .await
        .unwrap();

    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let mut client = RunnerServiceClient::new(runner.channel().await);
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..PER_CLIENT {
                let input = serde_json::json!({"n": format!("{c}-{n}")});
                let req = rpb::SubmitRunRequest {
                    tree_id: "burst".into(),
                    thread_id: format!("client-{c}-{n}"),
                    input: Some(arbor_shared::json::to_proto_struct(
                        input.as_object().unwrap(),
                    )),
                    ..Default::default()
                };
                match client.submit_run(req).await {
                    Ok(resp) => acked
                        .lock()
                        .unwrap()
                        .push(resp.into_inner().run.unwrap().run_id),
                    Err(_) => return n,
                }
            }
            PER_CLIENT
        }));
    }
    // Kill in the middle of the burst.
    let acked_probe = acked.clone();
    eventually("a third of the burst to be acknowledged", WAIT, || {
        let n = acked_probe.lock().unwrap().len();
        async move { (n >= CLIENTS * PER_CLIENT / 3).then_some(()) }
    })
    .await;
    runner.kill().await;
    let mut sent = 0;
    for t in tasks {
        sent += t.await.unwrap();
    }
    let acked: Vec<String> = acked.lock().unwrap().clone();
    assert!(
        acked.len() < CLIENTS * PER_CLIENT,
        "the kill landed mid-burst"
    );
    println!(
        "acknowledged before the kill: {} of {sent} attempted",
        acked.len()
    );

    runner.start().await;
    let client = RunnerServiceClient::new(runner.channel().await);
    let runs = eventually("every acknowledged run to finish", WAIT * 2, || {
        let mut client = client.clone();
        let acked = acked.clone();
        async move {
            let mut all: Vec<rpb::Run> = Vec::new();
            let mut token = String::new();
            loop {
                let page = client
                    .list_runs(rpb::ListRunsRequest {
                        page_size: 1000,
                        page_token: token.clone(),
                        ..Default::default()
                    })
                    .await
                    .ok()?
                    .into_inner();
                all.extend(page.runs);
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            let by_id: HashMap<&str, &rpb::Run> =
                all.iter().map(|r| (r.run_id.as_str(), r)).collect();
            let finished = acked.iter().all(|id| {
                by_id
                    .get(id.as_str())
                    .is_some_and(|r| r.status == rpb::RunStatus::Succeeded as i32)
            });
            finished.then_some(all)
        }
    })
    .await;

    let ids: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len(), "no run is listed twice");
    for id in &acked {
        assert!(
            unique.contains(id.as_str()),
            "acknowledged run {id} was lost"
        );
    }

    // Exactly one success and one side effect per run.
    let mut client = client.clone();
    let mut stream = client
        .stream_events(rpb::StreamEventsRequest {
            after_seq: Some(0),
            filter: Some(rpb::EventFilter {
                kinds: vec![rpb::EventKind::RunSucceeded as i32],
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut succeeded: HashMap<String, usize> = HashMap::new();
    while let Some(item) = stream.message().await.unwrap() {
        *succeeded.entry(item.event.unwrap().run_id).or_default() += 1;
    }
    for id in &acked {
        assert_eq!(
            succeeded.get(id),
            Some(&1),
            "run {id} succeeded exactly once"
        );
    }
    runner.stop().await;
    let runner_data = runner.data_dir.clone();
    let cfg = arbor_runner_svc::ServeConfig {
        data_dir: runner_data,
        ..Default::default()
    };
    let opened = arbor_runner_svc::open_runner(&cfg).await.unwrap();
    // The state counts `/metrics` reports came through the kill exactly: they equal a pass over
    // every record.
    let counts = Tally::stored(opened.store()).unwrap();
    assert_eq!(counts, Tally::scan(opened.store()).unwrap());
    assert_eq!(counts.runs.iter().sum::<u64>(), runs.len() as u64);
    let ledger = opened.store().tree(T::Ledger);
    let ledger_runs: Vec<String> = ledger
        .iter()
        .keys()
        .map(|k| {
            let k = String::from_utf8(k.unwrap().to_vec()).unwrap();
            k.split(':').next().unwrap().to_string()
        })
        .collect();
    let per_run: HashMap<&str, usize> = ledger_runs.iter().fold(HashMap::new(), |mut m, r| {
        *m.entry(r.as_str()).or_default() += 1;
        m
    });
    for id in &acked {
        assert_eq!(
            per_run.get(id.as_str()),
            Some(&1),
            "one ledger record for {id}"
        );
    }
}
