//! OpenTelemetry export through the real binaries: both services pointed at a collector in the
//! test, a run submitted by the Python client inside a span the caller exports to the same
//! collector, approval-svc killed between the suspension and the decision, the decision made
//! by the Python client too; the collector gets one trace whose spans link caller → submit →
//! step → suspension → storing → deciding → delivery → Resolve → resume step. Without an
//! endpoint nothing is sent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::HashMap, process::Command};

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::{
    Cluster, Profile, WAIT, eventually, flow, gate_tree,
    otlp::{Collector, Received},
    process::workspace_root,
    tools::{python_client, run},
};

/// The `service.name` of the traced Python caller (`tests/clients/python/traced_call.py`).
const CALLER: &str = "arbor-python-caller";

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

/// Runs `traced_call.py` with the arbor-client package: one call inside a span exported to
/// `collector`; the `key=value` fields it prints (`trace`, `span`, and `run` for a submit).
async fn traced_call(collector: &Collector, args: &[&str]) -> HashMap<String, String> {
    let python = python_client();
    let mut cmd = Command::new(python);
    cmd.arg(workspace_root().join("tests/clients/python/traced_call.py"))
        .args(["--otlp", &collector.endpoint()])
        .args(args)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let what = format!("traced_call.py {}", args[0]);
    let out = tokio::task::spawn_blocking(move || run(&mut cmd, &what))
        .await
        .unwrap();
    let last = out.lines().last().unwrap_or_default();
    last.split_whitespace()
        .filter_map(|field| field.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
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

    // The caller's span, made and exported by the caller: the Python client injects its
    // `traceparent` into SubmitRun.
    let tree = flow::register(&cluster, gate_tree("otlp", "failure")).await;
    let version = tree.version.to_string();
    let submitted = traced_call(
        &collector,
        &[
            "submit",
            "--runner",
            &cluster.runner.addr.to_string(),
            "--tree",
            &tree.id,
            "--version",
            &version,
        ],
    )
    .await;
    let (trace, caller, run_id) = (
        submitted["trace"].clone(),
        submitted["span"].clone(),
        submitted["run"].clone(),
    );
    let pending = flow::approval_of(&cluster, &run_id, apb::ApprovalState::Pending).await;
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
    flow::approval_of(&cluster, &run_id, apb::ApprovalState::Pending).await;
    // The person's decision, from Python under a span of its own (a trace of its own).
    let approved = traced_call(
        &collector,
        &[
            "approve",
            "--approval",
            &cluster.approval.addr.to_string(),
            "--request",
            &pending.request_id,
        ],
    )
    .await;
    flow::wait_run(&cluster, &run_id, rpb::RunStatus::Succeeded).await;

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
    // The person's Resolve, in the trace of the Python span that made it.
    let asked = eventually(
        "approval-svc to export the person's Resolve",
        WAIT,
        || async {
            collector.spans().into_iter().find(|s| {
                s.trace_id() == approved["trace"]
                    && s.service() == "approval-svc"
                    && s.name() == "Resolve"
            })
        },
    )
    .await;
    assert_eq!(
        asked.parent_id(),
        approved["span"],
        "the person's Resolve continues the Python caller's span"
    );

    let runner = "runner-svc";
    let approval = "approval-svc";
    let roots: Vec<_> = spans.iter().filter(|s| s.parent_id().is_empty()).collect();
    assert_eq!(roots.len(), 1, "one root span in the trace");
    let root = roots[0];
    assert_eq!(
        (root.service(), root.name(), root.span_id()),
        (CALLER, "submit", caller.clone()),
        "the Python caller's span is the root"
    );
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
        assert_eq!(step.attr("run_id"), run_id, "every step names its run");
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
    // The decision links the person's call: a span of the Python caller's trace.
    let links = decide.links();
    let (_, linked) = links
        .iter()
        .find(|(t, _)| *t == approved["trace"])
        .unwrap_or_else(|| panic!("the decision links no span of the person's call: {links:?}"));
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
    // Stopped, approval-svc has sent every span: the linked one descends from the caller's.
    let asking: Vec<Received> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_id() == approved["trace"])
        .collect();
    let mut at = linked.clone();
    while at != approved["span"] {
        let span = asking
            .iter()
            .find(|s| s.span_id() == at)
            .unwrap_or_else(|| {
                panic!(
                    "the decision links {linked}, which is not under the person's span: {:#?}",
                    asking
                        .iter()
                        .map(|s| (s.service(), s.name(), s.span_id(), s.parent_id()))
                        .collect::<Vec<_>>()
                )
            });
        at = span.parent_id();
    }
    for span in spans.iter().filter(|s| s.service() != CALLER) {
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
