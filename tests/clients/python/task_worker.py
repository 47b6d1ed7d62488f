#!/usr/bin/env python3
"""The task worker of the end-to-end tests: the arbor_client package's Worker with canned
behaviours.

    python task_worker.py --runner HOST:PORT --worker-id ID --types 'py.*,x.upper'

The part of a task type after its last '.' picks the behaviour: upper, effect, slow, raise,
flaky, resume (`steps` steps of `step_ms`, each heartbeated as details {"done": n}, going on
from the details an earlier attempt left); anything else echoes its args. On SIGTERM it drains
within --grace-ms. Prints one line per event, flushed:

    ready
    task id=<task_id> type=<type> attempt=<n> key=<idempotency_key> args=<compact json>
    completed id=<id> accepted=<true|false>
    cancelled id=<id>
    progress id=<id> done=<n>
    released id=<id> accepted=<true|false> attempt=<n>
    failed id=<id>
    threw id=<id> code=<code>
    stopped
"""

import argparse
import fcntl
import json
import logging
import sys
import threading
import time

_out = threading.Lock()


def say(line):
    with _out:  # handlers run on several threads; keep lines whole
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runner", default="127.0.0.1:50051")
    p.add_argument("--worker-id", required=True)
    p.add_argument("--types", required=True, help="comma-separated task type globs")
    p.add_argument("--max-in-flight", type=int, default=4)
    p.add_argument("--lease-ms", type=int, default=10000)
    p.add_argument("--effects", help="file of idempotency keys that `effect` tasks applied")
    p.add_argument("--token", help="bearer token for runner-svc")
    p.add_argument("--grace-ms", type=int, default=10000,
                   help="on SIGTERM, how long running tasks may finish before they are released")
    return p.parse_args()


def main():
    args = parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"task_worker[{args.worker_id}] %(levelname)s %(message)s")
    import arbor_client as aw

    def upper(task):
        return {"text": task.args["text"].upper(), "worker": args.worker_id}

    def effect(task):
        if not args.effects:
            raise aw.FatalError("effect tasks need --effects")
        time.sleep(task.args.get("ms", 0) / 1000)
        key = task.idempotency_key
        with open(args.effects, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # other workers append to the same file
            f.seek(0)
            if key not in f.read().splitlines():
                f.write(key + "\n")
        return {"key": key, "worker": args.worker_id, "attempt": task.attempt}

    def slow(task):
        ms = task.args["ms"]
        end = time.monotonic() + ms / 1000
        while time.monotonic() < end:
            if task.cancelled.is_set():
                say(f"cancelled id={task.task_id}")
                return {"cancelled": True}
            time.sleep(0.02)
        return {"slept_ms": ms, "heartbeats": task.heartbeats}

    def fail_business(task):
        raise aw.BusinessError(task.args.get("code", "E_BUSINESS"),
                               task.args.get("message", "business error"))

    def flaky(task):
        if task.attempt < task.args.get("succeed_on", 2):
            raise aw.RetryableError(f"flaky attempt {task.attempt}", backoff_ms=50)
        return {"attempt": task.attempt}

    def resume(task):
        start = (task.details or {}).get("done", 0)
        for done in range(start + 1, task.args["steps"] + 1):
            time.sleep(task.args.get("step_ms", 50) / 1000)
            if not task.heartbeat({"done": done}):
                say(f"cancelled id={task.task_id}")
                return {"cancelled": True}
            say(f"progress id={task.task_id} done={done}")
        # `details` are still the earlier attempt's, whatever this one heartbeated.
        return {"resumed_from": start, "previous": task.details, "attempt": task.attempt,
                "worker": args.worker_id}

    behaviours = {"upper": upper, "effect": effect, "slow": slow, "raise": fail_business,
                  "flaky": flaky, "resume": resume}

    def handle(task):
        say(f"task id={task.task_id} type={task.task_type} attempt={task.attempt} "
            f"key={task.idempotency_key} "
            f"args={json.dumps(task.args, separators=(',', ':'), sort_keys=True)}")
        return behaviours.get(task.task_type.rsplit(".", 1)[-1], lambda t: t.args)(task)

    class TestWorker(aw.Worker):
        ready = False

        def on_connect(self):
            if not self.ready:
                self.ready = True
                say("ready")

        def on_done(self, task, outcome, request, reply):
            if outcome == "completed":
                say(f"completed id={task.task_id} accepted={str(reply.accepted).lower()}")
            elif outcome == "released":
                say(f"released id={task.task_id} accepted={str(reply.accepted).lower()} "
                    f"attempt={reply.attempt}")
            elif outcome == "threw":
                say(f"threw id={task.task_id} code={request.code}")
            else:
                say(f"failed id={task.task_id}")

    worker = TestWorker(args.runner, args.worker_id, token=args.token,
                        max_in_flight=args.max_in_flight, lease_ms=args.lease_ms,
                        grace_s=args.grace_ms / 1000)
    for glob in filter(None, (g.strip() for g in args.types.split(","))):
        worker.task(glob)(handle)
    worker.run()
    say("stopped")


if __name__ == "__main__":
    main()
