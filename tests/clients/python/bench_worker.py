#!/usr/bin/env python3
"""The task worker of arbor-bench: the arbor_client package's Worker as an application would use
it, answering every task with a constant, and printing when each activation arrived and when its
CompleteTask returned (time.perf_counter_ns, the monotonic clock), and when the handler returned in between
(what the Worker's hand-off to its handler thread took), one flushed line per task:

    python bench_worker.py --runner HOST:PORT --token T --types bench.echo

    ready
    done run=<run_id> recv=<ns> handled=<ns> ack=<ns> accepted=<true|false>
    stopped
"""

import argparse
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runner", required=True)
    p.add_argument("--worker-id", default="bench-python")
    p.add_argument("--types", required=True, help="comma-separated task type globs")
    p.add_argument("--max-in-flight", type=int, default=1)
    p.add_argument("--token", help="bearer token for runner-svc")
    args = p.parse_args()
    import arbor_client as aw

    def say(line):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    class BenchWorker(aw.Worker):
        ready = False

        def on_connect(self):
            if not self.ready:
                self.ready = True
                say("ready")

        # The first hook after the Worker decoded an activation, before its hand-off to a
        # handler thread.
        def _dispatch(self, task):
            task.received_ns = time.perf_counter_ns()
            super()._dispatch(task)

        def on_done(self, task, outcome, request, reply):
            ack = time.perf_counter_ns()
            accepted = outcome == "completed" and reply.accepted
            say(f"done run={task.run_id} recv={task.received_ns} handled={task.handled_ns} "
                f"ack={ack} accepted={str(accepted).lower()}")

    def handle(task):
        task.handled_ns = time.perf_counter_ns()
        return {"ok": True}

    worker = BenchWorker(args.runner, args.worker_id, token=args.token,
                         max_in_flight=args.max_in_flight)
    for glob in filter(None, (g.strip() for g in args.types.split(","))):
        worker.task(glob)(handle)
    worker.run()
    say("stopped")


if __name__ == "__main__":
    main()
