#!/usr/bin/env python3
"""One arbor_client call inside an OpenTelemetry span exported over OTLP/gRPC.

The client injects that span's `traceparent`, so the services' spans continue the caller's trace.

    python traced_call.py --otlp http://HOST:PORT submit --runner HOST:PORT --tree ID [--version N]
    python traced_call.py --otlp http://HOST:PORT approve --approval HOST:PORT --request ID

Prints `trace=<trace id> span=<span id>` of its span (and `run=<run id>` for submit), exports
the span before it exits, and exits non-zero on any failure.
"""

import argparse
import sys

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from arbor_client import Client
from arbor_client.errors import ArborError

SERVICE = "arbor-python-caller"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--otlp", required=True, help="the collector's OTLP/gRPC endpoint")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds for the call")
    calls = p.add_subparsers(dest="call", required=True)
    submit = calls.add_parser("submit", help="submit a run of a registered tree")
    submit.add_argument("--runner", required=True)
    submit.add_argument("--tree", required=True)
    submit.add_argument("--version", type=int, default=0)
    approve = calls.add_parser("approve", help="approve a pending approval")
    approve.add_argument("--approval", required=True)
    approve.add_argument("--request", required=True)
    args = p.parse_args()

    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    # Exported as each span ends: the process is short-lived and the test waits for the span.
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=args.otlp, insecure=True, timeout=args.timeout)))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("arbor-tests")
    try:
        with tracer.start_as_current_span(args.call) as span:
            ctx = span.get_span_context()
            line = f"trace={trace.format_trace_id(ctx.trace_id)} " \
                   f"span={trace.format_span_id(ctx.span_id)}"
            if args.call == "submit":
                with Client(args.runner, None, timeout=args.timeout) as arbor:
                    run = arbor.submit_run(args.tree, version=args.version).run
                line += f" run={run.run_id}"
            else:
                with Client(None, args.approval, timeout=args.timeout) as arbor:
                    arbor.approve(args.request, reason="approved from a traced caller")
    except ArborError as e:
        print(f"FAIL: {e}", flush=True)
        sys.exit(1)
    finally:
        provider.shutdown()
    print(line, flush=True)


if __name__ == "__main__":
    main()
