"""The Arbor benchmark cycle in LangGraph: node -> interrupt() -> node, with the SQLite
checkpointer and durability="sync", N cycles at concurrency K (threads sharing one checkpointer).

Prints one JSON object with the figures; arbor-bench reads it. LangGraph runs in-process: no
network, no second service, no authentication.
"""

import json
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt


class State(TypedDict, total=False):
    plan: dict
    receipt: dict
    done: bool


def build(conn: sqlite3.Connection, ledger: sqlite3.Connection):
    ledger_lock = threading.Lock()
    ledger.execute("CREATE TABLE IF NOT EXISTS ledger (key TEXT PRIMARY KEY, entry TEXT)")

    def plan(state: State) -> State:
        return {"plan": {"service": "billing", "replicas": 3}}

    def gate(state: State) -> State:
        decision: Any = interrupt({"title": "Deploy?", "context": state["plan"]})
        if decision != "approve":
            raise RuntimeError("rejected")
        return {}

    def deploy(state: State) -> State:
        # The same idempotency-keyed side effect as Arbor's ledger.append.
        key = f"{state_thread.get()}:deploy"
        with ledger_lock:
            ledger.execute(
                "INSERT OR IGNORE INTO ledger (key, entry) VALUES (?, ?)",
                (key, json.dumps(state["plan"])),
            )
            ledger.commit()
        return {"receipt": {"key": key, "entry": state["plan"]}}

    def done(state: State) -> State:
        return {"done": True}

    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("gate", gate)
    g.add_node("deploy", deploy)
    g.add_node("done", done)
    g.add_edge(START, "plan")
    g.add_edge("plan", "gate")
    g.add_edge("gate", "deploy")
    g.add_edge("deploy", "done")
    g.add_edge("done", END)
    return g.compile(checkpointer=SqliteSaver(conn))


class _Thread(threading.local):
    def get(self) -> str:
        return getattr(self, "value", "")


state_thread = _Thread()


def cycle(graph) -> tuple[float, float]:
    thread_id = str(uuid.uuid4())
    state_thread.value = thread_id
    config = {"configurable": {"thread_id": thread_id}}
    t0 = time.perf_counter()
    first = graph.invoke({}, config, durability="sync")
    if "__interrupt__" not in first:
        raise RuntimeError("the gate did not interrupt")
    t1 = time.perf_counter()
    last = graph.invoke(Command(resume="approve"), config, durability="sync")
    t2 = time.perf_counter()
    if not last.get("done"):
        raise RuntimeError("the run did not finish")
    return t2 - t0, t2 - t1


def pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = round((len(sorted_values) - 1) * q)
    return sorted_values[min(i, len(sorted_values) - 1)] * 1e3


def main() -> None:
    cycles = int(sys.argv[1])
    concurrency = int(sys.argv[2])
    with tempfile.TemporaryDirectory() as d:
        conn = sqlite3.connect(f"{d}/checkpoints.db", check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        ledger = sqlite3.connect(f"{d}/ledger.db", check_same_thread=False)
        ledger.execute("PRAGMA synchronous=FULL")
        graph = build(conn, ledger)
        cycle(graph)  # warm up imports and the schema
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            results = list(pool.map(lambda _: cycle(graph), range(cycles)))
        elapsed = time.perf_counter() - start
        ledger_rows = ledger.execute("SELECT COUNT(*) FROM ledger").fetchone()[0]
        db_bytes = sum(
            p.stat().st_size for p in __import__("pathlib").Path(d).iterdir() if p.is_file()
        )
    total = sorted(r[0] for r in results)
    resume = sorted(r[1] for r in results)
    print(
        json.dumps(
            {
                "cycles": cycles,
                "concurrency": concurrency,
                "elapsed_s": elapsed,
                "cycles_per_s": cycles / elapsed,
                "total_p50_ms": pct(total, 0.50),
                "total_p95_ms": pct(total, 0.95),
                "total_p99_ms": pct(total, 0.99),
                "resume_p50_ms": pct(resume, 0.50),
                "resume_p99_ms": pct(resume, 0.99),
                "ledger_records": ledger_rows - 1,
                "bytes_per_run": db_bytes / (cycles + 1),
            }
        )
    )


if __name__ == "__main__":
    main()
