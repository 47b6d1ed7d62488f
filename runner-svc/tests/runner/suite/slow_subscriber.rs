//! A subscriber that stops reading never slows the runner: runs keep completing while its buffer
//! is full, and after the lag timeout it is dropped with RESOURCE_EXHAUSTED — after every event it
//! was sent, so it can resume from its cursor without a gap.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::Backend;

use std::time::Duration;

use arbor_runner_svc::{
    ServeConfig, engine::TreeFormat, open_runner, runs::SubmitInput, serve_runner,
};
use arbor_shared::{
    domain::RunStatus,
    proto::runner::v1::{self as pb, runner_service_client::RunnerServiceClient},
};

/// A tree whose finishing event carries a 4 KiB blackboard, so that a few thousand events
/// overflow every buffer between the runner and a client that does not read (the HTTP/2 window
/// alone holds 2 MiB).
fn big_tree() -> String {
    serde_json::json!({"id": "big", "version": 1,
        "root": {"type": "set", "name": "s", "key": "x", "value": "x".repeat(4096)}})
    .to_string()
}

pub async fn a_subscriber_that_stops_reading_is_dropped_and_resumes_from_its_cursor(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ServeConfig {
        data_dir: dir.path().to_path_buf(),
        store_url: b.store_url(dir.path()),
        workers: 2,
        stream_lag_timeout: Duration::from_millis(300),
        ..ServeConfig::default()
    };
    let runner = open_runner(&cfg).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (health, health_svc) = tonic_health::server::health_reporter();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_runner(
        cfg,
        runner.clone(),
        listener,
        async move {
            let _ = stop_rx.await;
        },
        health,
        health_svc,
    ));
    runner
        .register_tree(&big_tree(), TreeFormat::Json)
        .await
        .unwrap();

    let mut client = RunnerServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut stuck = client
        .stream_events(pb::StreamEventsRequest {
            after_seq: Some(0),
            follow: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();

    // Plenty of events while nobody reads; the runner must not wait for the subscriber.
    let mut last_run = String::new();
    for _ in 0..2_500 {
        last_run = runner
            .submit(SubmitInput {
                tree_id: "big".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .run
            .run_id;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while runner.get_run(&last_run).unwrap().run.status != RunStatus::Succeeded {
        assert!(
            tokio::time::Instant::now() < deadline,
            "runs stalled behind a slow subscriber"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;

    // Now read: every event up to the drop arrives in order, then the clear status.
    let mut expected = 1;
    let status = loop {
        let next = tokio::time::timeout(Duration::from_secs(30), stuck.message())
            .await
            .expect("the stream neither delivered nor ended: it was never dropped");
        match next {
            Ok(Some(item)) => {
                assert_eq!(item.event.unwrap().seq, expected, "no gap before the drop");
                expected += 1;
            }
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let total = runner.events().durable_seq();
    assert!(
        expected - 1 < total,
        "it was dropped before the end ({expected} of {total})"
    );

    // It resumes from its cursor and sees the rest.
    let mut resumed = client
        .stream_events(pb::StreamEventsRequest {
            after_seq: Some(expected - 1),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while let Some(item) = resumed.message().await.unwrap() {
        assert_eq!(item.event.unwrap().seq, expected);
        expected += 1;
    }
    assert_eq!(expected - 1, total);
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}
