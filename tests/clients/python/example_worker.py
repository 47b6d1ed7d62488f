#!/usr/bin/env python3
"""A tool in Python: serves the task type `py.summarise` to the trees of runner-svc.

    python example_worker.py --stubs OUT --runner 127.0.0.1:50051
"""

import argparse
import os
import sys

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--runner", default="127.0.0.1:50051")
p.add_argument("--stubs", required=True, help="directory holding the generated arbor/ package")
args = p.parse_args()
sys.path.insert(0, os.path.abspath(args.stubs))

from arbor_worker import BusinessError, Worker  # noqa: E402 (it needs the stubs)

worker = Worker(args.runner, "py-summariser")


@worker.task("py.summarise")
def summarise(task):
    text = task.args.get("text")
    if not isinstance(text, str):
        raise BusinessError("E_NO_TEXT", "args.text must be a string")
    words = text.split()
    return {"summary": " ".join(words[:12]) + (" ..." if len(words) > 12 else "")}


worker.run()
