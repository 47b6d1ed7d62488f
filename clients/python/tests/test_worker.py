"""A tool served by the package's Worker: its output reaches the run, a business error fails the
node with its code, and stop() returns cleanly."""

from __future__ import annotations

import threading

from arbor_client import BusinessError, Client, Task, Worker, events_pb, struct_to_py
from conftest import env, unique


def test_a_python_tool_serves_a_run_and_stops_cleanly(submitter: Client) -> None:
    task_type = unique("py.count")
    worker = Worker(env("ARBOR_RUNNER"), unique("pytest-worker"),
                    token=env("ARBOR_WORKER_TOKEN"), grace_s=1.0)
    seen: list[Task] = []

    @worker.task(task_type)
    def count(task: Task) -> object:
        seen.append(task)
        if task.args.get("text") is None:
            raise BusinessError("E_NO_TEXT", "args.text is required")
        return {"words": len(task.args["text"].split())}

    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        tree = submitter.register_tree({
            "id": unique("py-tool"), "version": 1, "task_types": [task_type],
            "root": {"type": "sequence", "name": "main", "children": [
                {"type": "tool", "name": "count", "tool": task_type,
                 "args": {"text": "one two three"}, "output": "counted"},
                {"type": "tool", "name": "missing", "tool": task_type, "args": {},
                 "output": "never", "error_output": "problem"},
            ]},
        })
        run_id = submitter.submit_run(tree.id).run.run_id
        last = list(submitter.follow(run_id=run_id, after_seq=0, until_run_ends=True))[-1]
        run = submitter.get_run(run_id)
        board = struct_to_py(run.blackboard)
        assert board["counted"] == {"words": 3}, board
        assert board["problem"]["code"] == "E_NO_TEXT", board
        assert last.kind == events_pb.EVENT_KIND_RUN_FAILED, last
        assert [t.idempotency_key != "" for t in seen] == [True, True]
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert not thread.is_alive(), "run() returns after stop()"
