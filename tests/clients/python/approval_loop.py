#!/usr/bin/env python3
"""The whole Arbor approval loop from Python, with the arbor_client package:

    register_tree -> submit_run -> wait for the approval (list_approvals)
    -> approve (decide) -> follow the run's events to RUN_SUCCEEDED

    python approval_loop.py --runner HOST:PORT --approval HOST:PORT [--traceparent TP]

Prints what it sees, one line per step, and exits non-zero on any failure.
"""

import argparse
import json
import sys
import time
import uuid

from arbor_client import Client, approval_pb, events_pb, runner_pb, struct_to_py, types_pb
from arbor_client.errors import ArborError

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


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runner", default="127.0.0.1:50051")
    p.add_argument("--approval", default="127.0.0.1:50052")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds for the whole loop")
    p.add_argument("--traceparent", default="", help="W3C traceparent to send with SubmitRun")
    args = p.parse_args()
    deadline = time.monotonic() + args.timeout
    arbor = Client(args.runner, args.approval, timeout=args.timeout)
    try:
        tree = arbor.register_tree(dict(TREE, id=f"py-deploy-{uuid.uuid4().hex[:8]}"))
        print(f"registered tree {tree.id} v{tree.version} "
              f"({tree.node_count} nodes, digest {tree.digest[:12]})", flush=True)

        metadata = arbor.metadata()
        if args.traceparent:  # a caller without OpenTelemetry passing a context along by hand
            metadata += (("traceparent", args.traceparent),)
        sub = arbor.runner.SubmitRun(
            runner_pb.SubmitRunRequest(tree_id=tree.id, tree_version=tree.version),
            metadata=metadata, timeout=args.timeout)
        run_id = sub.run.run_id
        print(f"submitted run {run_id} status={types_pb.RunStatus.Name(sub.run.status)}",
              flush=True)

        approval = None
        while approval is None:
            if time.monotonic() > deadline:
                fail(f"the loop took longer than {args.timeout}s")
            approval = next(iter(arbor.list_approvals(run_id=run_id, states=["pending"])), None)
            if approval is None:
                time.sleep(0.05)
        req = approval.request
        print(f"approval pending {approval.request_id}: {req.title!r} "
              f"node={req.node_name} context={json.dumps(struct_to_py(req.context))}", flush=True)

        resolved = arbor.decide(approval.request_id, "approve", reason="approved from Python")
        print(f"approved: state={approval_pb.ApprovalState.Name(resolved.approval.state)} "
              f"decision_id={resolved.approval.decision.decision_id}", flush=True)

        for e in arbor.follow(run_id=run_id, after_seq=0, until_run_ends=True):
            kind = events_pb.EventKind.Name(e.kind).removeprefix("EVENT_KIND_")
            print(f"event seq={e.seq} {kind} traceparent={e.traceparent}", flush=True)
            if e.kind in (events_pb.EVENT_KIND_RUN_FAILED, events_pb.EVENT_KIND_RUN_CANCELLED,
                    events_pb.EVENT_KIND_RUN_SUPERSEDED):
                fail(f"run ended with {kind}: {e.run_finished.error}")

        run = arbor.get_run(run_id)
        if run.status != types_pb.RUN_STATUS_SUCCEEDED:
            fail(f"run status is {types_pb.RunStatus.Name(run.status)}")
        blackboard = struct_to_py(run.blackboard)
        if "receipt" not in blackboard:
            fail(f"the gated tool did not run: {blackboard}")
        print(f"run {run_id} SUCCEEDED receipt={json.dumps(blackboard['receipt'])}", flush=True)
    except ArborError as e:
        fail(str(e))


if __name__ == "__main__":
    main()
