#!/usr/bin/env python3
"""A durable follower of a run's events with the arbor_client package, for the end-to-end test
that kills runner-svc under it:

    python follow.py --runner HOST:PORT --subscriber ID --run RUN_ID

Prints `event seq=N kind=KIND` for each event the iterator yields (it acks each as it goes and
resumes after a disconnect), `reconnect` when the stream broke, and `done` after the run's last
event.
"""

import argparse

from arbor_client import Client, events_pb


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runner", required=True)
    p.add_argument("--subscriber", required=True)
    p.add_argument("--run", required=True)
    args = p.parse_args()
    with Client(args.runner, None, timeout=10) as arbor:
        for e in arbor.follow(run_id=args.run, subscriber_id=args.subscriber, after_seq=0,
                              until_run_ends=True,
                              on_reconnect=lambda err, _: print(f"reconnect {err.code.name}",
                                                                flush=True)):
            kind = events_pb.EventKind.Name(e.kind).removeprefix("EVENT_KIND_")
            print(f"event seq={e.seq} kind={kind}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
