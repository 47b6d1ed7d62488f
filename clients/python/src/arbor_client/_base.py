"""What the sync and asyncio clients share: channels (address, token, TLS), call metadata, and
the requests each method sends, built in one place."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Optional, Union

import grpc

from ._convert import JSON, enum_number, to_struct, to_value
from ._gen.arbor.approval.v1 import approval_service_pb2 as apb
from ._gen.arbor.runner.v1 import events_pb2 as epb
from ._gen.arbor.runner.v1 import runner_service_pb2 as rpb
from ._gen.arbor.runner.v1 import types_pb2 as tpb
from .tracing import trace_metadata

#: A decision kind: "approve", "reject", "edit", "respond" (or the DecisionKind number).
DecisionLike = Union[str, int]

#: Events after which a run has nothing more to say.
RUN_END_KINDS = frozenset({
    epb.EVENT_KIND_RUN_SUCCEEDED, epb.EVENT_KIND_RUN_FAILED,
    epb.EVENT_KIND_RUN_CANCELLED, epb.EVENT_KIND_RUN_SUPERSEDED,
})

#: Suspension events: what a person, a tool or a system has to answer.
SUSPENSION_KINDS = (epb.EVENT_KIND_APPROVAL_REQUESTED, epb.EVENT_KIND_EXECUTION_SUSPENDED)

BACKOFF_CAP_S = 2.0
# grpc's own reconnect backoff grows to minutes; keep it in step with the clients' retries, and
# let keepalive notice a dead connection under a stream that may stay idle for hours.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", int(BACKOFF_CAP_S * 1000)),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.max_receive_message_length", 64 << 20),
]


@dataclass(frozen=True)
class Tls:
    """TLS for a connection: the CA that signed the server (None: the system's roots), and a
    client certificate and key for mutual TLS. PEM bytes."""

    ca: Optional[bytes] = None
    cert: Optional[bytes] = None
    key: Optional[bytes] = None
    #: Override the name checked against the server's certificate.
    server_name: Optional[str] = None

    @classmethod
    def from_files(cls, ca: Optional[str] = None, cert: Optional[str] = None,
                   key: Optional[str] = None, server_name: Optional[str] = None) -> "Tls":
        def read(path: Optional[str]) -> Optional[bytes]:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()
        return cls(read(ca), read(cert), read(key), server_name)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)

    def options(self) -> list[tuple[str, object]]:
        if self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []


TlsLike = Union[Tls, bool, None]


def _tls(tls: TlsLike) -> Optional[Tls]:
    if tls is True:
        return Tls()
    return tls or None


def sync_channel(address: str, tls: TlsLike = None) -> grpc.Channel:
    t = _tls(tls)
    if t is None:
        return grpc.insecure_channel(address, CHANNEL_OPTIONS)
    return grpc.secure_channel(address, t.credentials(), CHANNEL_OPTIONS + t.options())


def aio_channel(address: str, tls: TlsLike = None) -> grpc.aio.Channel:
    t = _tls(tls)
    if t is None:
        return grpc.aio.insecure_channel(address, CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(address, t.credentials(), CHANNEL_OPTIONS + t.options())


#: Call metadata as grpc takes it.
Metadata = tuple[tuple[str, str], ...]


def call_metadata(token: Optional[str]) -> Metadata:
    """The bearer token, and the trace context of the caller's current span."""
    md = [("authorization", f"Bearer {token}")] if token else []
    return tuple(md + trace_metadata())


def event_filter(run_id: str, thread_id: str,
                 kinds: Iterable[int | str]) -> epb.EventFilter:
    return epb.EventFilter(run_id=run_id, thread_id=thread_id,
                           kinds=[enum_number(epb.EventKind, "EVENT_KIND_", k) for k in kinds])


def stream_request(subscriber_id: str, after_seq: Optional[int],
                   filt: epb.EventFilter) -> rpb.StreamEventsRequest:
    req = rpb.StreamEventsRequest(subscriber_id=subscriber_id, filter=filt, follow=True)
    if after_seq is not None:
        req.after_seq = after_seq
    return req


def register_request(document: Union[str, Mapping[str, JSON]]) -> rpb.RegisterTreeRequest:
    if not isinstance(document, str):
        document = json.dumps(document)
    return rpb.RegisterTreeRequest(document=document)


def submit_request(tree_id: str, version: int, input: Optional[Mapping[str, JSON]],
                   thread_id: str, dedupe_key: str, run_id: str, restore: int | str,
                   priority: int, max_attempts: int) -> rpb.SubmitRunRequest:
    return rpb.SubmitRunRequest(
        tree_id=tree_id, tree_version=version, input=to_struct(input), thread_id=thread_id,
        dedupe_key=dedupe_key, run_id=run_id, priority=priority, max_attempts=max_attempts,
        restore_policy=enum_number(tpb.RestorePolicy, "RESTORE_POLICY_", restore))


def list_runs_request(thread_id: str, tree_id: str, statuses: Iterable[int | str],
                      page_size: int, page_token: str) -> rpb.ListRunsRequest:
    return rpb.ListRunsRequest(
        thread_id=thread_id, tree_id=tree_id, page_size=page_size, page_token=page_token,
        statuses=[enum_number(tpb.RunStatus, "RUN_STATUS_", s) for s in statuses])


def approval_filter(states: Iterable[int | str] = (), run_id: str = "", thread_id: str = "",
                    tool_name: str = "", tree_id: str = "", actionable: bool = False,
                    group: str = "", overdue: bool = False, stage: str = "",
                    args_digest: str = "") -> apb.ApprovalFilter:
    """Which approvals a list or watch is about (every field optional; states by name, e.g.
    "pending")."""
    return apb.ApprovalFilter(
        states=[enum_number(apb.ApprovalState, "APPROVAL_STATE_", s) for s in states],
        run_id=run_id, thread_id=thread_id, tool_name=tool_name, tree_id=tree_id,
        actionable=actionable, group=group, overdue=overdue, stage=stage,
        args_digest=args_digest)


def decide_request(request_id: str, decision: DecisionLike, reason: str, args: JSON,
                   result: JSON, expected_digest: str) -> apb.ResolveRequest:
    req = apb.ResolveRequest(
        request_id=request_id, reason=reason, expected_digest=expected_digest,
        decision=enum_number(tpb.DecisionKind, "DECISION_KIND_", decision))
    if args is not None:
        req.args.CopyFrom(to_value(args))
    if result is not None:
        req.result.CopyFrom(to_value(result))
    return req


def bulk_decide_request(request_ids: Iterable[str], decision: DecisionLike, reason: str,
                        expected_digests: Optional[Mapping[str, str]],
                        limit: int) -> apb.BulkResolveRequest:
    return apb.BulkResolveRequest(
        request_ids=list(request_ids), reason=reason, limit=limit,
        decision=enum_number(tpb.DecisionKind, "DECISION_KIND_", decision),
        expected_digests=dict(expected_digests or {}))


def answer_request(run_id: str, request_id: str, decision_id: str, result: JSON,
                   reason: str, cancel: bool) -> rpb.ResolveRequest:
    """User input ({value} / {text}) and external results ({status, result}) go to the runner
    itself; `decision_id` makes a repeat harmless."""
    req = rpb.ResolveRequest(
        run_id=run_id, request_id=request_id, decision_id=decision_id, reason=reason,
        action=tpb.RESOLVE_ACTION_CANCEL if cancel else tpb.RESOLVE_ACTION_RESUME)
    if result is not None:
        req.result.CopyFrom(to_value(result))
    return req


def external_result(result: JSON, failed: bool) -> JSON:
    return {"status": "failed" if failed else "succeeded", "result": result}


def decision_id_for(request_id: str, decision_id: Optional[str]) -> str:
    """A caller's decision id, or one made once per answer (a retry of the same call reuses
    it, so a repeat after a lost reply changes nothing)."""
    if decision_id:
        return decision_id
    import uuid
    return f"{request_id}:{uuid.uuid4().hex}"
