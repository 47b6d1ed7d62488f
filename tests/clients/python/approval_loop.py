#!/usr/bin/env python3
"""The whole Arbor approval loop from Python, with nothing but stubs generated from proto/.

    RegisterTree -> SubmitRun -> wait for the approval (ApprovalService.ListApprovals)
    -> approve (ApprovalService.Resolve) -> follow RunnerService.StreamEvents to RUN_SUCCEEDED

Generate the stubs first (tests/tests/e2e/polyglot.rs does this into target/py-gen):

    python -m grpc_tools.protoc -I proto --python_out=OUT --grpc_python_out=OUT \
        arbor/runner/v1/*.proto arbor/approval/v1/*.proto

then run:  python approval_loop.py --stubs OUT --runner HOST:PORT --approval HOST:PORT

Prints what it sees, one line per step, and exits non-zero on any failure.
"""

import argparse
import json
import os
import sys
import time
import uuid

TREE = {
    "id": "py-deploy",
    "version": 1,
    "root": {
        "type": "sequence",
        "name": "main",
        "children": [
            {"type": "set", "name": "plan", "key": "plan",
             "value": {"service": "billing", "replicas": 3}},
            {"type": "approval", "name": "gate", "phase": "before", "on_reject": "failure",
             "title": "Ship billing from Python?", "context": ["plan"],
             "child": {"type": "tool", "name": "ship", "tool": "ledger.append",
                       "args": {"entry": {"$ref": "plan"}}, "output": "receipt"}},
            {"type": "set", "name": "done", "key": "done", "value": True},
        ],
    },
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stubs", required=True, help="directory holding the generated arbor/ package")
    p.add_argument("--runner", default="127.0.0.1:50051")
    p.add_argument("--approval", default="127.0.0.1:50052")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds for the whole loop")
    p.add_argument("--traceparent", default="", help="W3C traceparent to send with SubmitRun")
    return p.parse_args()


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def main():
    args = parse_args()
    sys.path.insert(0, os.path.abspath(args.stubs))
    import grpc
    from arbor.approval.v1 import approval_service_pb2 as apb
    from arbor.approval.v1 import approval_service_pb2_grpc as apb_grpc
    from arbor.runner.v1 import events_pb2 as epb
    from arbor.runner.v1 import runner_service_pb2 as rpb
    from arbor.runner.v1 import runner_service_pb2_grpc as rpb_grpc
    from arbor.runner.v1 import types_pb2 as tpb

    deadline = time.monotonic() + args.timeout

    def left():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            fail(f"the loop took longer than {args.timeout}s")
        return remaining

    runner = rpb_grpc.RunnerServiceStub(grpc.insecure_channel(args.runner))
    approvals = apb_grpc.ApprovalServiceStub(grpc.insecure_channel(args.approval))

    try:
        tree_doc = dict(TREE, id=f"py-deploy-{uuid.uuid4().hex[:8]}")
        reg = runner.RegisterTree(rpb.RegisterTreeRequest(document=json.dumps(tree_doc)),
                                  timeout=left())
        print(f"registered tree {reg.tree.id} v{reg.tree.version} "
              f"({reg.tree.node_count} nodes, digest {reg.tree.digest[:12]})", flush=True)

        metadata = [("traceparent", args.traceparent)] if args.traceparent else None
        sub = runner.SubmitRun(rpb.SubmitRunRequest(tree_id=reg.tree.id,
                                                    tree_version=reg.tree.version),
                               timeout=left(), metadata=metadata)
        run_id = sub.run.run_id
        print(f"submitted run {run_id} status={tpb.RunStatus.Name(sub.run.status)}", flush=True)

        approval = None
        while approval is None:
            page = approvals.ListApprovals(
                apb.ListApprovalsRequest(filter=apb.ApprovalFilter(
                    run_id=run_id, states=[apb.APPROVAL_STATE_PENDING])),
                timeout=left())
            if page.approvals:
                approval = page.approvals[0]
            else:
                time.sleep(0.05)
        req = approval.request
        print(f"approval pending {approval.request_id}: {req.title!r} "
              f"node={req.node_name} context={json.dumps(dict_of(req.context))}", flush=True)

        resolved = approvals.Resolve(
            apb.ResolveRequest(request_id=approval.request_id,
                               decision=tpb.DECISION_KIND_APPROVE,
                               reason="approved from Python"),
            timeout=left())
        print(f"approved: state={apb.ApprovalState.Name(resolved.approval.state)} "
              f"decision_id={resolved.approval.decision.decision_id}", flush=True)

        stream = runner.StreamEvents(
            rpb.StreamEventsRequest(after_seq=0, follow=True,
                                    filter=epb.EventFilter(run_id=run_id)),
            timeout=left())
        for item in stream:
            e = item.event
            kind = epb.EventKind.Name(e.kind).removeprefix("EVENT_KIND_")
            print(f"event seq={e.seq} {kind} traceparent={e.traceparent}", flush=True)
            if e.kind == epb.EVENT_KIND_RUN_SUCCEEDED:
                stream.cancel()
                break
            if e.kind in (epb.EVENT_KIND_RUN_FAILED, epb.EVENT_KIND_RUN_CANCELLED,
                          epb.EVENT_KIND_RUN_SUPERSEDED):
                fail(f"run ended with {kind}: {e.run_finished.error}")
        else:
            fail("the event stream ended before RUN_SUCCEEDED")

        run = runner.GetRun(rpb.GetRunRequest(run_id=run_id), timeout=left()).run
        if run.status != tpb.RUN_STATUS_SUCCEEDED:
            fail(f"run status is {tpb.RunStatus.Name(run.status)}")
        blackboard = dict_of(run.blackboard)
        if "receipt" not in blackboard:
            fail(f"the gated tool did not run: {blackboard}")
        print(f"run {run_id} SUCCEEDED receipt={json.dumps(blackboard['receipt'])}", flush=True)
    except grpc.RpcError as e:
        fail(f"{e.code().name}: {e.details()}")


def dict_of(struct):
    from google.protobuf.json_format import MessageToDict
    return MessageToDict(struct)


if __name__ == "__main__":
    main()
