"""The asyncio client (grpc.aio): the same methods as `arbor_client.Client`, awaited.

    from arbor_client.aio import AsyncClient

    async with AsyncClient(runner="127.0.0.1:50051", approval="127.0.0.1:50052") as arbor:
        run = (await arbor.submit_run("deploy", input={"service": "billing"})).run
        async for event in arbor.follow(run_id=run.run_id, until_run_ends=True):
            print(event.seq, event.kind)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from typing import Any, Callable, Optional, Union

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


class AsyncClient:
    """A connection to runner-svc and (optionally) approval-svc for asyncio code; see
    `arbor_client.Client` for what each method does. Make it inside the running loop."""

    def __init__(self, runner: Optional[str] = "127.0.0.1:50051",
                 approval: Optional[str] = "127.0.0.1:50052", *, token: Optional[str] = None,
                 tls: b.TlsLike = None, timeout: float = 30.0):
        self.token, self.timeout = token, timeout
        self._channels: list[grpc.aio.Channel] = []
        self._runner: Optional[rpb_grpc.RunnerServiceAsyncStub] = None
        self._approvals: Optional[apb_grpc.ApprovalServiceAsyncStub] = None
        if runner:
            ch = b.aio_channel(runner, tls)
            self._channels.append(ch)
            self._runner = rpb_grpc.RunnerServiceStub(ch)
        if approval:
            ch = b.aio_channel(approval, tls)
            self._channels.append(ch)
            self._approvals = apb_grpc.ApprovalServiceStub(ch)

    @property
    def runner(self) -> rpb_grpc.RunnerServiceAsyncStub:
        if self._runner is None:
            raise ValueError("this client was made without a runner address")
        return self._runner

    @property
    def approvals(self) -> apb_grpc.ApprovalServiceAsyncStub:
        if self._approvals is None:
            raise ValueError("this client was made without an approval address")
        return self._approvals

    def metadata(self) -> b.Metadata:
        return b.call_metadata(self.token)

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self.metadata(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def register_tree(self, document: Union[str, Mapping[str, JSON]]) -> tpb.Tree:
        resp: rpb.RegisterTreeResponse = await self._call(
            self.runner.RegisterTree, b.register_request(document))
        return resp.tree

    async def submit_run(self, tree_id: str, *, version: int = 0,
                         input: Optional[Mapping[str, JSON]] = None, thread_id: str = "",
                         dedupe_key: str = "", run_id: str = "", restore: Union[int, str] = 0,
                         priority: int = 0, max_attempts: int = 0) -> rpb.SubmitRunResponse:
        resp: rpb.SubmitRunResponse = await self._call(self.runner.SubmitRun, b.submit_request(
            tree_id, version, input, thread_id, dedupe_key, run_id, restore, priority,
            max_attempts))
        return resp

    async def get_run(self, run_id: str) -> tpb.Run:
        resp: rpb.GetRunResponse = await self._call(self.runner.GetRun,
                                                    rpb.GetRunRequest(run_id=run_id))
        return resp.run

    async def list_runs(self, *, thread_id: str = "", tree_id: str = "",
                        statuses: Iterable[Union[int, str]] = (), page_size: int = 100
                        ) -> AsyncIterator[tpb.Run]:
        token = ""
        while True:
            page: rpb.ListRunsResponse = await self._call(self.runner.ListRuns,
                                                          b.list_runs_request(
                thread_id, tree_id, list(statuses), page_size, token))
            for run in page.runs:
                yield run
            token = page.next_page_token
            if not token:
                return

    async def cancel_run(self, run_id: str, reason: str = "") -> tpb.Run:
        resp: rpb.CancelRunResponse = await self._call(
            self.runner.CancelRun, rpb.CancelRunRequest(run_id=run_id, reason=reason))
        return resp.run

    async def follow(self, *, run_id: str = "", thread_id: str = "",
                     kinds: Iterable[Union[int, str]] = (), subscriber_id: str = "",
                     after_seq: Optional[int] = None, until_run_ends: bool = False,
                     on_reconnect: Optional[Callable[[ArborError, float], None]] = None,
                     ) -> AsyncGenerator[epb.Event, None]:
        """As `Client.follow`: resumes after the last event it yielded when the stream breaks,
        acks each event (with `subscriber_id`) once the loop body that got it is done."""
        filt = b.event_filter(run_id, thread_id, kinds)
        last = after_seq
        backoff = 0.1
        while True:
            stream = self.runner.StreamEvents(b.stream_request(subscriber_id, last, filt),
                                              metadata=self.metadata())
            try:
                async for item in stream:
                    e = item.event
                    if last is not None and e.seq <= last:
                        continue
                    backoff = 0.1
                    yield e
                    last = e.seq
                    if subscriber_id:
                        await self._ack(subscriber_id, e.seq)
                    if until_run_ends and e.kind in b.RUN_END_KINDS:
                        return
            except grpc.RpcError as err:
                error = from_rpc_error(err)
                if not error.transient:
                    raise error from None
                if on_reconnect is not None:
                    on_reconnect(error, backoff)
            finally:
                stream.cancel()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, b.BACKOFF_CAP_S)

    async def _ack(self, subscriber_id: str, seq: int) -> None:
        try:
            await self._call(self.runner.Ack, rpb.AckRequest(subscriber_id=subscriber_id, seq=seq))
        except ArborError as e:
            if not e.transient:
                raise

    async def answer_input(self, run_id: str, request_id: str, value: JSON, *,
                           decision_id: Optional[str] = None,
                           reason: str = "") -> rpb.ResolveResponse:
        resp: rpb.ResolveResponse = await self._call(self.runner.Resolve, b.answer_request(
            run_id, request_id, b.decision_id_for(request_id, decision_id), {"value": value},
            reason, cancel=False))
        return resp

    async def complete_external(self, run_id: str, request_id: str, result: JSON, *,
                                failed: bool = False, decision_id: Optional[str] = None,
                                reason: str = "") -> rpb.ResolveResponse:
        resp: rpb.ResolveResponse = await self._call(self.runner.Resolve, b.answer_request(
            run_id, request_id, b.decision_id_for(request_id, decision_id),
            b.external_result(result, failed), reason, cancel=False))
        return resp

    async def cancel_suspension(self, run_id: str, request_id: str, reason: str = "", *,
                                decision_id: Optional[str] = None) -> rpb.ResolveResponse:
        resp: rpb.ResolveResponse = await self._call(self.runner.Resolve, b.answer_request(
            run_id, request_id, b.decision_id_for(request_id, decision_id), None, reason,
            cancel=True))
        return resp

    async def list_approvals(self, filter: Optional[apb.ApprovalFilter] = None, *,
                             page_size: int = 100, **by: Any) -> AsyncIterator[apb.Approval]:
        filt = filter or b.approval_filter(**by)
        token = ""
        while True:
            page: apb.ListApprovalsResponse = await self._call(
                self.approvals.ListApprovals,
                apb.ListApprovalsRequest(filter=filt, page_size=page_size, page_token=token))
            for approval in page.approvals:
                yield approval
            token = page.next_page_token
            if not token:
                return

    async def get_approval(self, request_id: str) -> apb.Approval:
        resp: apb.GetApprovalResponse = await self._call(
            self.approvals.GetApproval, apb.GetApprovalRequest(request_id=request_id))
        return resp.approval

    async def watch_approvals(self, filter: Optional[apb.ApprovalFilter] = None,
                              **by: Any) -> AsyncIterator[apb.WatchApprovalsResponse]:
        stream = self.approvals.WatchApprovals(
            apb.WatchApprovalsRequest(filter=filter or b.approval_filter(**by)),
            metadata=self.metadata())
        try:
            async for change in stream:
                yield change
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            stream.cancel()

    async def decide(self, request_id: str, decision: b.DecisionLike, *, reason: str = "",
                     args: JSON = None, result: JSON = None,
                     expected_digest: str = "") -> apb.ResolveResponse:
        resp: apb.ResolveResponse = await self._call(self.approvals.Resolve, b.decide_request(
            request_id, decision, reason, args, result, expected_digest))
        return resp

    async def approve(self, request_id: str, reason: str = "", *,
                      expected_digest: str = "") -> apb.ResolveResponse:
        return await self.decide(request_id, "approve", reason=reason,
                                 expected_digest=expected_digest)

    async def reject(self, request_id: str, reason: str = "") -> apb.ResolveResponse:
        return await self.decide(request_id, "reject", reason=reason)

    async def bulk_decide(self, request_ids: Iterable[str], decision: b.DecisionLike, *,
                          reason: str = "", expected_digests: Optional[Mapping[str, str]] = None,
                          limit: int = 0) -> apb.BulkResolveResponse:
        resp: apb.BulkResolveResponse = await self._call(
            self.approvals.BulkResolve,
            b.bulk_decide_request(request_ids, decision, reason, expected_digests, limit))
        return resp

    async def claim(self, request_id: str, ttl_ms: int = 0) -> apb.Approval:
        resp: apb.ClaimResponse = await self._call(
            self.approvals.Claim, apb.ClaimRequest(request_id=request_id, ttl_ms=ttl_ms))
        return resp.approval

    async def release_claim(self, request_id: str) -> apb.Approval:
        resp: apb.ClaimResponse = await self._call(
            self.approvals.Claim, apb.ClaimRequest(request_id=request_id, release=True))
        return resp.approval

    async def reassign(self, request_id: str, to: str) -> apb.Approval:
        resp: apb.ReassignResponse = await self._call(
            self.approvals.Reassign, apb.ReassignRequest(request_id=request_id, to=to))
        return resp.approval

    async def comment(self, request_id: str, text: str) -> apb.Approval:
        resp: apb.CommentResponse = await self._call(
            self.approvals.Comment, apb.CommentRequest(request_id=request_id, text=text))
        return resp.approval

    async def delegate(self, to: str, *, from_: str = "", scope: str = "") -> apb.Delegation:
        req = apb.DelegateRequest(to=to, scope=scope)
        setattr(req, "from", from_)
        resp: apb.DelegateResponse = await self._call(self.approvals.Delegate, req)
        return resp.delegation

    async def revoke_delegation(self, delegation_id: str) -> None:
        await self._call(self.approvals.RevokeDelegation,
                         apb.RevokeDelegationRequest(id=delegation_id))

    async def list_delegations(self, principal: str = "") -> list[apb.Delegation]:
        resp: apb.ListDelegationsResponse = await self._call(
            self.approvals.ListDelegations, apb.ListDelegationsRequest(principal=principal))
        return list(resp.delegations)

    async def audit_log(self, *, request_id: str = "", run_id: str = "",
                        page_size: int = 100) -> AsyncIterator[apb.AuditEntry]:
        token = ""
        while True:
            page: apb.GetAuditLogResponse = await self._call(
                self.approvals.GetAuditLog, apb.GetAuditLogRequest(
                    request_id=request_id, run_id=run_id, page_size=page_size,
                    page_token=token))
            for entry in page.entries:
                yield entry
            token = page.next_page_token
            if not token:
                return
