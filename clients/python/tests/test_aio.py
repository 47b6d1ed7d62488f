"""The asyncio client runs the same approval loop."""

from __future__ import annotations

import asyncio

from arbor_client import events_pb, types_pb
from arbor_client.aio import AsyncClient
from conftest import env, gate_tree, unique


def test_the_approval_loop_with_the_asyncio_client() -> None:
    async def loop() -> list[int]:
        async with AsyncClient(env("ARBOR_RUNNER"), None,
                               token=env("ARBOR_SUBMITTER_TOKEN")) as submitter, \
                AsyncClient(env("ARBOR_RUNNER"), env("ARBOR_APPROVAL"),
                            token=env("ARBOR_APPROVER_TOKEN")) as approver:
            tree = await submitter.register_tree(gate_tree(unique("py-aio")))
            run_id = (await submitter.submit_run(tree.id)).run.run_id
            async for change in approver.watch_approvals(run_id=run_id, states=["pending"]):
                if change.approval.request_id:
                    claimed = await approver.claim(change.approval.request_id, ttl_ms=60_000)
                    assert claimed.claim.principal == "alice"
                    await approver.decide(change.approval.request_id, "approve")
                    break
            kinds = [int(e.kind) async for e in
                     submitter.follow(run_id=run_id, after_seq=0, until_run_ends=True)]
            assert (await submitter.get_run(run_id)).status == types_pb.RUN_STATUS_SUCCEEDED
            return kinds

    kinds = asyncio.run(loop())
    assert kinds[-1] == events_pb.EVENT_KIND_RUN_SUCCEEDED
