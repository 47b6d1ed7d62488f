"""Calls made inside an OpenTelemetry span carry that span's W3C trace context (`traceparent`),
seen by a small RunnerService in the test; calls outside any span carry none."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from arbor_client import Client, runner_pb, types_pb
from arbor_client._gen.arbor.runner.v1 import runner_service_pb2_grpc as rpb_grpc
from arbor_client.aio import AsyncClient


class Recorder(rpb_grpc.RunnerServiceServicer):
    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def SubmitRun(self, request: Any, context: Any) -> runner_pb.SubmitRunResponse:
        self.seen.append({k: v for k, v in context.invocation_metadata()})
        return runner_pb.SubmitRunResponse(run=types_pb.Run(run_id="r-1"))


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, str]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = Recorder()  # type: ignore[abstract]
    rpb_grpc.add_RunnerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def test_a_call_inside_a_span_carries_its_trace_id(recorder: tuple[Recorder, str]) -> None:
    servicer, address = recorder
    tracer = TracerProvider().get_tracer("arbor-client-test")
    with Client(address, None) as client:
        client.submit_run("t")  # no span: nothing to propagate
        with tracer.start_as_current_span("agent-step") as span:
            client.submit_run("t")
            ctx = span.get_span_context()

        async def in_asyncio() -> None:
            async with AsyncClient(address, None) as aio:
                with tracer.start_as_current_span("async-step"):
                    await aio.submit_run("t")
        import asyncio
        asyncio.run(in_asyncio())

    outside, inside, in_aio = servicer.seen
    assert "traceparent" not in outside
    version, trace_id, span_id, flags = inside["traceparent"].split("-")
    assert version == "00" and int(flags, 16) & 1, "version 00, sampled"
    assert trace_id == trace.format_trace_id(ctx.trace_id)
    assert span_id == trace.format_span_id(ctx.span_id)
    assert in_aio["traceparent"].split("-")[1] != trace_id, "a new root span, a new trace"
