//! OpenTelemetry export through the real binaries: both services pointed at a collector in the
//! test, a run submitted under a caller's span, approval-svc killed between the suspension and
//! the decision; the collector gets one trace whose spans link submit → step → suspension →
//! storing → deciding → delivery → Resolve → resume step. Without an endpoint nothing is sent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::{
    Cluster, Profile, WAIT, eventually, flow, gate_tree,
    otlp::{Collector, Received},
};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Both services prepared to export to `endpoint` (none: no endpoint at all), batching briefly
/// so that spans leave within the test's waits.
fn prepared(endpoint: Option<&str>) -> Cluster {
    let args: Vec<String> = match endpoint {
        Some(e) => vec!["--otlp-endpoint".into(), e.into()],
        None => Vec::new(),
    };
    let mut cluster = Cluster::prepare(Profile::Debug, args.clone(), args);
    for service in [&mut cluster.runner, &mut cluster.approval] {
        service
            .env
            .push(("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
        if endpoint.is_none() {
            // Whatever the environment of the test says, these services get no endpoint.
            for var in [
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            ] {
                service.env.push((var.into(), String::new()));
            }
        }
    }
    cluster
}

fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02x}", fastrand::u8(1..)))
        .collect()
}

/// The spans of `trace` named `name` (an RPC's name is its method), exported by `service`.
fn named<'a>(spans: &'a [Received], service: &str, name: &str) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|s| s.name() == name && s.service() == service)
        .collect()
}

/// The one span of `candidates` whose parent is `parent`.
fn child_of<'a>(candidates: &[&'a Received], parent: &Received, what: &str) -> &'a Received {
    let found: Vec<_> = candidates
        .iter()
        .filter(|s| s.parent_id() == parent.span_id())
        .collect();
    assert!(
        !found.is_empty(),
        "no {what} is a child of {} {}: {:#?}",
        parent.name(),
        parent.span_id(),
        candidates
            .iter()
            .map(|s| (s.name(), s.span_id(), s.parent_id()))
            .collect::<Vec<_>>()
    );
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_links_an_approval_cycle_across_a_restart_of_approval_svc() {
    let collector = Collector::start().await;
    let mut cluster = prepared(Some(&collector.endpoint()));
    // What is logged does not decide what is exported.
    cluster.runner.env.push(("RUST_LOG".into(), "warn".into()));
    let runner_url = cluster.runner.url();
    cluster.start_routed(&runner_url).await;

    // The caller's span: what a client SDK injects as `traceparent`.
    let (trace, caller) = (random_hex(16), random_hex(8));
    let traceparent = format!("00-{trace}-{caller}-01");
    let run = flow::submit(&cluster, gate_tree("otlp", "failure"), Some(&traceparent)).await;
    let pending = flow::approval_of(&cluster, &run.run_id, apb::ApprovalState::Pending).await;
    // The storing span has left the first approval-svc before it is killed.
    let first = eventually("approval-svc to export the storing span", WAIT, || async {
        collector
            .spans()
            .into_iter()
            .find(|s| s.name() == "approval.store" && s.trace_id() == trace)
    })
    .await;
    cluster.approval.kill().await;
    cluster.approval.start().await;
    // A request not yet flushed when the process died comes back with the runner's replay.
    flow::approval_of(&cluster, &run.run_id, apb::ApprovalState::Pending).await;
    flow::approve(&cluster, &pending.request_id).await;
    flow::wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;

    // Each service exports on its own schedule: wait for the resume step (a step whose parent
    // is the runner's Resolve) and for the delivery that made that Resolve, which approval-svc
    // ends (and exports) after the decision's span.
    let spans = eventually("the cycle's spans to be exported", WAIT, || async {
        let spans: Vec<Received> = collector
            .spans()
            .into_iter()
            .filter(|s| s.trace_id() == trace)
            .collect();
        let resolves = named(&spans, "runner-svc", "Resolve");
        let resumed = spans.iter().any(|s| {
            s.name() == "run.step" && resolves.iter().any(|r| r.span_id() == s.parent_id())
        });
        let delivered = named(&spans, "approval-svc", "approval.deliver")
            .iter()
            .any(|d| resolves.iter().any(|r| r.parent_id() == d.span_id()));
        (resumed && delivered).then_some(spans)
    })
    .await;

    let runner = "runner-svc";
    let approval = "approval-svc";
    let submit = named(&spans, runner, "SubmitRun");
    assert_eq!(submit.len(), 1, "one SubmitRun span in the trace");
    let submit = submit[0];
    assert_eq!(
        submit.parent_id(),
        caller,
        "SubmitRun continues the caller's span"
    );
    assert_eq!(submit.attr("rpc.service"), "arbor.runner.v1.RunnerService");

    let steps = named(&spans, runner, "run.step");
    for step in &steps {
        assert_eq!(step.attr("run_id"), run.run_id, "every step names its run");
    }
    let first_step = child_of(&steps, submit, "run.step");
    let suspension = child_of(
        &named(&spans, runner, "run.suspend"),
        first_step,
        "run.suspend",
    );
    assert_eq!(suspension.attr("request_id"), pending.request_id);

    let stores = named(&spans, approval, "approval.store");
    let store = child_of(&stores, suspension, "approval.store");
    assert_eq!(store.attr("request_id"), pending.request_id);
    let decides = named(&spans, approval, "approval.decide");
    assert_eq!(decides.len(), 1, "one decision");
    let decide = decides[0];
    assert!(
        stores.iter().any(|s| s.span_id() == decide.parent_id()),
        "the decision continues from a storing span of the request"
    );
    assert_ne!(
        decide.resource["service.instance.id"], first.resource["service.instance.id"],
        "the decision was taken by the restarted approval-svc"
    );
    // An attempt the runner did not answer in time is retried: the one that got through.
    let resolves = named(&spans, runner, "Resolve");
    let delivers: Vec<_> = named(&spans, approval, "approval.deliver")
        .into_iter()
        .filter(|d| resolves.iter().any(|r| r.parent_id() == d.span_id()))
        .collect();
    let deliver = child_of(&delivers, decide, "approval.deliver");
    let resolve = child_of(&resolves, deliver, "the runner's Resolve");
    assert_eq!(resolve.attr("rpc.service"), "arbor.runner.v1.RunnerService");
    child_of(&steps, resolve, "the resume step");

    // Exporting does not stand in the way of a clean stop.
    assert_eq!(cluster.approval.stop().await, Some(0));
    assert_eq!(cluster.runner.stop().await, Some(0));
    for span in &spans {
        assert_eq!(span.resource["service.version"], VERSION, "{}", span.name());
        assert!(
            !span.resource["service.instance.id"].is_empty(),
            "{} has no instance id",
            span.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_exported() {
    // OTLP/gRPC's default address: where an exporter set up without an endpoint would send.
    let collector = Collector::start_on("127.0.0.1:4317").await;
    let mut cluster = prepared(None);
    let runner_url = cluster.runner.url();
    cluster.start_routed(&runner_url).await;
    let traceparent = format!("00-{}-{}-01", random_hex(16), random_hex(8));
    let run = flow::submit(&cluster, gate_tree("dark", "failure"), Some(&traceparent)).await;
    let pending = flow::approval_of(&cluster, &run.run_id, apb::ApprovalState::Pending).await;
    flow::approve(&cluster, &pending.request_id).await;
    flow::wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    // A clean stop is when batched spans would be flushed.
    assert_eq!(cluster.approval.stop().await, Some(0));
    assert_eq!(cluster.runner.stop().await, Some(0));
    assert_eq!(
        collector.connections(),
        0,
        "a service connected to the collector"
    );
    assert_eq!(collector.exports(), 0);
}
