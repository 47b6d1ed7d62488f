"""The synchronous client: runs (register, submit, get, list, cancel, follow), approvals (list,
watch, decide, claim, comment, delegate…), user input and external results.

    from arbor_client import Client

    with Client(runner="127.0.0.1:50051", approval="127.0.0.1:50052", token="…") as arbor:
        tree = arbor.register_tree(document)
        run = arbor.submit_run(tree.id, input={"ticket": 42}).run
        for event in arbor.follow(run_id=run.run_id, until_run_ends=True):
            print(event.seq, event.kind)
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterable, Iterator, Mapping
from typing import Any, Callable, Optional, TypeVar, Union

import grpc

from . import _base as b
from ._convert import JSON
from ._gen.arbor.approval.v1 import approval_service_pb2 as apb
from ._gen.arbor.approval.v1 import approval_service_pb2_grpc as apb_grpc
from ._gen.arbor.runner.v1 import events_pb2 as epb
from ._gen.arbor.runner.v1 import runner_service_pb2 as rpb
from ._gen.arbor.runner.v1 import runner_service_pb2_grpc as rpb_grpc
from ._gen.arbor.runner.v1 import types_pb2 as tpb
from .errors import ArborError, from_rpc_error

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class Client:
    """A connection to runner-svc and (optionally) approval-svc.

    `token` is sent as `authorization: Bearer …`; `tls` is True (system roots), a `Tls`, or
    None for plaintext. `timeout` (seconds) bounds every unary call. Every method raises an
    `arbor_client.errors.ArborError` subclass on failure."""

    def __init__(self, runner: Optional[str] = "127.0.0.1:50051",
                 approval: Optional[str] = "127.0.0.1:50052", *, token: Optional[str] = None,
                 tls: b.TlsLike = None, timeout: float = 30.0):
        self.token, self.timeout = token, timeout
        self._channels: list[grpc.Channel] = []
        self._runner: Optional[rpb_grpc.RunnerServiceStub] = None
        self._approvals: Optional[apb_grpc.ApprovalServiceStub] = None
        if runner:
            ch = b.sync_channel(runner, tls)
            self._channels.append(ch)
            self._runner = rpb_grpc.RunnerServiceStub(ch)
        if approval:
            ch = b.sync_channel(approval, tls)
            self._channels.append(ch)
            self._approvals = apb_grpc.ApprovalServiceStub(ch)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def runner(self) -> rpb_grpc.RunnerServiceStub:
        """The raw RunnerService stub (every RPC, including those without a method here)."""
        if self._runner is None:
            raise ValueError("this client was made without a runner address")
        return self._runner

    @property
    def approvals(self) -> apb_grpc.ApprovalServiceStub:
        """The raw ApprovalService stub."""
        if self._approvals is None:
            raise ValueError("this client was made without an approval address")
        return self._approvals

    def metadata(self) -> b.Metadata:
        """What every call carries: the token and the caller's trace context."""
        return b.call_metadata(self.token)

    def _call(self, method: Callable[..., Resp], request: Any) -> Resp:
        try:
            return method(request, metadata=self.metadata(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def close(self) -> None:
        for ch in self._channels:
            ch.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- trees and runs ---------------------------------------------------------------------

    def register_tree(self, document: Union[str, Mapping[str, JSON]]) -> tpb.Tree:
        """Registers a tree version (a JSON document or the dict it parses to). The same id and
        version again with the same document is fine; with another it is AlreadyExists."""
        return self._call(self.runner.RegisterTree, b.register_request(document)).tree

    def submit_run(self, tree_id: str, *, version: int = 0,
                   input: Optional[Mapping[str, JSON]] = None, thread_id: str = "",
                   dedupe_key: str = "", run_id: str = "", restore: Union[int, str] = 0,
                   priority: int = 0, max_attempts: int = 0) -> rpb.SubmitRunResponse:
        """Starts a run of a tree (version 0: the latest) with `input` as its blackboard, in
        `thread_id` (empty: a new thread). A second submission with a live `dedupe_key` returns
        the first run (`deduplicated`). `restore` ("never", "if_exists", "required") with
        `run_id` continues that run's checkpoint."""
        return self._call(self.runner.SubmitRun, b.submit_request(
            tree_id, version, input, thread_id, dedupe_key, run_id, restore, priority,
            max_attempts))

    def get_run(self, run_id: str) -> tpb.Run:
        """The run as of its latest durable step."""
        return self._call(self.runner.GetRun, rpb.GetRunRequest(run_id=run_id)).run

    def list_runs(self, *, thread_id: str = "", tree_id: str = "",
                  statuses: Iterable[Union[int, str]] = (), page_size: int = 100
                  ) -> Iterator[tpb.Run]:
        """Every matching run, page after page."""
        token = ""
        while True:
            page = self._call(self.runner.ListRuns, b.list_runs_request(
                thread_id, tree_id, list(statuses), page_size, token))
            yield from page.runs
            token = page.next_page_token
            if not token:
                return

    def cancel_run(self, run_id: str, reason: str = "") -> tpb.Run:
        return self._call(self.runner.CancelRun,
                          rpb.CancelRunRequest(run_id=run_id, reason=reason)).run

    def follow(self, *, run_id: str = "", thread_id: str = "",
               kinds: Iterable[Union[int, str]] = (), subscriber_id: str = "",
               after_seq: Optional[int] = None, until_run_ends: bool = False,
               stop: Optional[threading.Event] = None,
               on_reconnect: Optional[Callable[[ArborError, float], None]] = None,
               ) -> Generator[epb.Event, None, None]:
        """The events of a run, a thread or everything, live: the backlog after `after_seq`
        (for a named `subscriber_id` without one: after its acked cursor), then each new event.

        When the stream breaks (the runner restarts, the network drops) it reconnects with
        backoff and resumes after the last event it yielded: every event comes once, in order.
        With `subscriber_id`, each event is acked once the loop body that got it is done, so a
        new process with the same id goes on from there. Ends after a run's last event with
        `until_run_ends`, when `stop` is set, or when the caller stops iterating. `on_reconnect(error,
        delay_s)` is told each time the stream broke, before the wait."""
        filt = b.event_filter(run_id, thread_id, kinds)
        last = after_seq
        backoff = 0.1
        stopping = stop or threading.Event()
        while not stopping.is_set():
            stream = self.runner.StreamEvents(b.stream_request(subscriber_id, last, filt),
                                              metadata=self.metadata())
            if stop is not None:  # a stream waits for its next event: cancelling ends the wait
                threading.Thread(target=lambda s=stream: (stop.wait(), s.cancel()),
                                 daemon=True).start()
            try:
                for item in stream:
                    e = item.event
                    if last is not None and e.seq <= last:
                        continue  # replayed because an ack did not get through
                    backoff = 0.1
                    yield e
                    last = e.seq
                    if subscriber_id:
                        self._ack(subscriber_id, e.seq)
                    if until_run_ends and e.kind in b.RUN_END_KINDS:
                        return
            except grpc.RpcError as err:
                error = from_rpc_error(err)
                if stopping.is_set():
                    return
                if not error.transient:
                    raise error from None
                if on_reconnect is not None:
                    on_reconnect(error, backoff)
            finally:
                stream.cancel()
            stopping.wait(backoff)
            backoff = min(backoff * 2, b.BACKOFF_CAP_S)

    def _ack(self, subscriber_id: str, seq: int) -> None:
        try:
            self._call(self.runner.Ack, rpb.AckRequest(subscriber_id=subscriber_id, seq=seq))
        except ArborError as e:
            # The stream resumes after `seq` anyway; a later ack covers this one.
            if not e.transient:
                raise

    # -- user input and external results ----------------------------------------------------

    def answer_input(self, run_id: str, request_id: str, value: JSON, *,
                     decision_id: Optional[str] = None, reason: str = "") -> rpb.ResolveResponse:
        """Answers a `user_input` suspension with `value`."""
        return self._call(self.runner.Resolve, b.answer_request(
            run_id, request_id, b.decision_id_for(request_id, decision_id), {"value": value},
            reason, cancel=False))

    def complete_external(self, run_id: str, request_id: str, result: JSON, *,
                          failed: bool = False, decision_id: Optional[str] = None,
                          reason: str = "") -> rpb.ResolveResponse:
        """Reports the result of an `external` suspension (`failed`: it did not succeed)."""
        return self._call(self.runner.Resolve, b.answer_request(
            run_id, request_id, b.decision_id_for(request_id, decision_id),
            b.external_result(result, failed), reason, cancel=False))

    def cancel_suspension(self, run_id: str, request_id: str, reason: str = "", *,
                          decision_id: Optional[str] = None) -> rpb.ResolveResponse:
        """Cancels a user input or external suspension (the node fails)."""
        return self._call(self.runner.Resolve, b.answer_request(
            run_id, request_id, b.decision_id_for(request_id, decision_id), None, reason,
            cancel=True))

    # -- approvals --------------------------------------------------------------------------

    def list_approvals(self, filter: Optional[apb.ApprovalFilter] = None, *,
                       page_size: int = 100, **by: Any) -> Iterator[apb.Approval]:
        """Every matching approval, page after page: `filter`, or its fields as keywords
        (states=["pending"], run_id=…, thread_id=…, actionable=True…)."""
        filt = filter or b.approval_filter(**by)
        token = ""
        while True:
            page = self._call(self.approvals.ListApprovals, apb.ListApprovalsRequest(
                filter=filt, page_size=page_size, page_token=token))
            yield from page.approvals
            token = page.next_page_token
            if not token:
                return

    def get_approval(self, request_id: str) -> apb.Approval:
        return self._call(self.approvals.GetApproval,
                          apb.GetApprovalRequest(request_id=request_id)).approval

    def watch_approvals(self, filter: Optional[apb.ApprovalFilter] = None,
                        **by: Any) -> Iterator[apb.WatchApprovalsResponse]:
        """The matching approvals now (SNAPSHOT… then SNAPSHOT_END), then every change."""
        stream = self.approvals.WatchApprovals(
            apb.WatchApprovalsRequest(filter=filter or b.approval_filter(**by)),
            metadata=self.metadata())
        try:
            yield from stream
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            stream.cancel()

    def decide(self, request_id: str, decision: b.DecisionLike, *, reason: str = "",
               args: JSON = None, result: JSON = None,
               expected_digest: str = "") -> apb.ResolveResponse:
        """Decides (or, under a quorum, votes on) an approval: "approve", "reject", "edit" (with
        the new `args`) or "respond" (with a stand-in `result`). `expected_digest` is the
        `args_digest` you looked at: if the arguments changed since, FailedPrecondition."""
        return self._call(self.approvals.Resolve, b.decide_request(
            request_id, decision, reason, args, result, expected_digest))

    def approve(self, request_id: str, reason: str = "", *,
                expected_digest: str = "") -> apb.ResolveResponse:
        return self.decide(request_id, "approve", reason=reason, expected_digest=expected_digest)

    def reject(self, request_id: str, reason: str = "") -> apb.ResolveResponse:
        return self.decide(request_id, "reject", reason=reason)

    def bulk_decide(self, request_ids: Iterable[str], decision: b.DecisionLike, *,
                    reason: str = "", expected_digests: Optional[Mapping[str, str]] = None,
                    limit: int = 0) -> apb.BulkResolveResponse:
        """One decision for many approvals; each item says how it went."""
        return self._call(self.approvals.BulkResolve, b.bulk_decide_request(
            request_ids, decision, reason, expected_digests, limit))

    def claim(self, request_id: str, ttl_ms: int = 0) -> apb.Approval:
        """Claims an approval for the caller (0: until released)."""
        return self._call(self.approvals.Claim,
                          apb.ClaimRequest(request_id=request_id, ttl_ms=ttl_ms)).approval

    def release_claim(self, request_id: str) -> apb.Approval:
        return self._call(self.approvals.Claim,
                          apb.ClaimRequest(request_id=request_id, release=True)).approval

    def reassign(self, request_id: str, to: str) -> apb.Approval:
        return self._call(self.approvals.Reassign,
                          apb.ReassignRequest(request_id=request_id, to=to)).approval

    def comment(self, request_id: str, text: str) -> apb.Approval:
        return self._call(self.approvals.Comment,
                          apb.CommentRequest(request_id=request_id, text=text)).approval

    def delegate(self, to: str, *, from_: str = "", scope: str = "") -> apb.Delegation:
        """Lets `to` decide in the caller's (or, for an operator, `from_`'s) place."""
        req = apb.DelegateRequest(to=to, scope=scope)
        setattr(req, "from", from_)  # `from` is a Python keyword
        return self._call(self.approvals.Delegate, req).delegation

    def revoke_delegation(self, delegation_id: str) -> None:
        self._call(self.approvals.RevokeDelegation,
                   apb.RevokeDelegationRequest(id=delegation_id))

    def list_delegations(self, principal: str = "") -> list[apb.Delegation]:
        return list(self._call(self.approvals.ListDelegations,
                               apb.ListDelegationsRequest(principal=principal)).delegations)

    def audit_log(self, *, request_id: str = "", run_id: str = "",
                  page_size: int = 100) -> Iterator[apb.AuditEntry]:
        token = ""
        while True:
            page = self._call(self.approvals.GetAuditLog, apb.GetAuditLogRequest(
                request_id=request_id, run_id=run_id, page_size=page_size, page_token=token))
            yield from page.entries
            token = page.next_page_token
            if not token:
                return
