"""Serve Arbor tasks (remote tools, `external` nodes) from Python:

    from arbor_client import Worker

    worker = Worker("127.0.0.1:50051", "py-worker-1")

    @worker.task("py.*")
    def handle(task):
        return {"length": len(task.args["text"])}

    worker.run()  # until SIGTERM/SIGINT or worker.stop()

Handlers run on a pool of `max_in_flight` threads; each task is heartbeated from the moment it
arrives. On SIGTERM (or stop()) the worker drains: it stops taking tasks, gives the running ones
a grace to finish, and hands the rest back with ReleaseTask, so another worker takes them at once
with the same attempt number (no attempt is spent).
"""

from __future__ import annotations

import fnmatch
import logging
import queue
import signal
import threading
import time
from typing import Any, Callable, Optional

import grpc

from . import _base as b
from ._convert import JSON, to_py, to_value
from ._gen.arbor.runner.v1 import worker_service_pb2 as wpb
from ._gen.arbor.runner.v1 import worker_service_pb2_grpc as wpb_grpc

log = logging.getLogger("arbor_client.worker")

# Stream errors that reconnecting will not fix.
FATAL_CODES = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
               grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED}
# Heartbeat answers meaning the lease is gone for good.
LOST_CODES = {grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND}


class BusinessError(Exception):
    """Fails the node at once with {code, message} in its `error_output` (ThrowError)."""

    def __init__(self, code: str, message: str = ""):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class RetryableError(Exception):
    """Worth another attempt, after `backoff_ms` or else the node's own backoff."""

    def __init__(self, message: str, backoff_ms: Optional[int] = None):
        super().__init__(message)
        self.backoff_ms = backoff_ms


class FatalError(Exception):
    """A technical failure that another attempt would not fix."""


class Task:
    """One leased task. `cancelled` is set when the run no longer wants it, the lease is lost, or
    the worker released it while shutting down. `details` are what an earlier attempt's last
    heartbeat stored (None if none); they stay as they came, whatever this attempt heartbeats."""

    def __init__(self, act: wpb.TaskActivation, worker: "Worker"):
        self.task_id, self.task_type = act.task_id, act.task_type
        self.args: JSON = to_py(act.args)
        self.idempotency_key, self.attempt, self.max_attempts = (
            act.idempotency_key, act.attempt, act.max_attempts)
        self.details: JSON = to_py(act.details) if act.HasField("details") else None
        self.run_id, self.thread_id, self.node_locator = act.run_id, act.thread_id, act.node_locator
        self.cancelled = threading.Event()
        self.lease_lost, self.heartbeats = False, 0
        self._worker = worker
        self.lease_token = act.lease_token
        self._interval_s = (act.lease_ms or worker.lease_ms) / 3000
        self._settled, self._done = False, threading.Event()
        # Resent with each heartbeat: details given to a heartbeat that did not get through
        # still reach the server with the next one, for a later attempt.
        self._details: JSON = self.details

    def heartbeat(self, details: JSON = None) -> bool:
        """Extends the lease now, storing `details` (any JSON value) for a later attempt, or
        keeping the last ones given when None; False once cancelled."""
        return self._worker._heartbeat(self, details)


Handler = Callable[[Task], JSON]


class Worker:
    """Takes tasks of the types its handlers serve from runner-svc's WorkerService."""

    def __init__(self, target: str, worker_id: str, token: Optional[str] = None,
                 max_in_flight: int = 4, lease_ms: int = 10000, grace_s: float = 10.0,
                 tls: b.TlsLike = None):
        self.worker_id, self.max_in_flight, self.lease_ms = worker_id, max_in_flight, lease_ms
        self._stub = wpb_grpc.WorkerServiceStub(b.sync_channel(target, tls))
        self._token = token
        self._handlers: list[tuple[str, Handler]] = []  # the first match wins
        self._jobs: queue.Queue[tuple[Task, Handler]] = queue.Queue()
        self._inflight: dict[str, Task] = {}  # lease token -> task
        self._lock = threading.Condition(threading.RLock())  # RLock: stop() runs in signal handlers
        self._stream: Optional[Any] = None
        self._stopping, self._grace_s = threading.Event(), grace_s

    @property
    def _md(self) -> b.Metadata:
        return b.call_metadata(self._token)

    def task(self, glob: str) -> Callable[[Handler], Handler]:
        """Decorator: `fn(task) -> JSON value` serves the task types matching `glob`."""
        def register(fn: Handler) -> Handler:
            self._handlers.append((glob, fn))
            return fn
        return register

    def on_connect(self) -> None:
        """Hook: called right after each StreamTasks call is issued."""

    def on_done(self, task: Task, outcome: str, request: Any, reply: Any) -> None:
        """Hook: the server answered a task's last call; outcome: completed, failed, threw or
        released (handed back at shutdown)."""

    def stop(self, grace_s: Optional[float] = None) -> None:
        """Stops taking tasks; run() gives in-flight ones `grace_s` (default: the worker's
        grace) to finish, releases the rest, then returns."""
        if grace_s is not None:
            self._grace_s = grace_s
        self._stopping.set()
        with self._lock:
            if self._stream is not None:
                self._stream.cancel()

    def run(self) -> None:
        """Serves tasks until stop(), or SIGTERM/SIGINT when called on the main thread."""
        restore: list[tuple[signal.Signals, Any]] = []
        if threading.current_thread() is threading.main_thread():
            restore = [(s, signal.signal(s, lambda *_: self.stop()))
                       for s in (signal.SIGTERM, signal.SIGINT)]
        for i in range(self.max_in_flight):
            threading.Thread(target=self._work, name=f"arbor-task-{i}", daemon=True).start()
        try:
            self._serve()
        finally:
            self._drain()
            for sig, previous in restore:
                signal.signal(sig, signal.SIG_DFL if previous is None else previous)

    def _serve(self) -> None:
        request = wpb.StreamTasksRequest(
            worker_id=self.worker_id, task_types=[glob for glob, _ in self._handlers],
            max_in_flight=self.max_in_flight, lease_ms=self.lease_ms)
        backoff = 0.1
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                with self._lock:
                    stream = self._stream = self._stub.StreamTasks(request, metadata=self._md)
                if self._stopping.is_set():  # stop() may have cancelled the previous stream
                    stream.cancel()
                self.on_connect()
                for reply in stream:
                    self._dispatch(Task(reply.task, self))
                log.info("the server ended the task stream")
            except grpc.RpcError as e:
                if self._stopping.is_set():
                    break
                if e.code() in FATAL_CODES:
                    raise
                log.info("task stream broke: %s: %s", e.code().name, e.details())
            if time.monotonic() - started > b.BACKOFF_CAP_S:
                backoff = 0.1
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, b.BACKOFF_CAP_S)

    def _dispatch(self, task: Task) -> None:
        with self._lock:
            self._inflight[task.lease_token] = task
        fn = next((f for glob, f in self._handlers if fnmatch.fnmatchcase(task.task_type, glob)),
                  None)
        if fn is None:
            return self._fail(task, f"no handler for task type {task.task_type!r}")
        # The handler first (starting a thread costs time); heartbeats start at once after it,
        # as the task may wait in the queue while the pool is busy.
        self._jobs.put((task, fn))
        threading.Thread(target=self._keep_alive, args=(task,), daemon=True).start()

    def _work(self) -> None:
        while True:
            task, fn = self._jobs.get()
            if task._settled:  # released at shutdown while it was queued
                continue
            if self._stopping.is_set():  # not started: another worker can run it now
                self._release(task)
                continue
            try:
                output = to_value(fn(task))
            except BusinessError as e:
                self._settle(task, "threw", self._stub.ThrowError, wpb.ThrowErrorRequest(
                    task_id=task.task_id, lease_token=task.lease_token, code=str(e.code), message=str(e.message)))
            except FatalError as e:
                self._fail(task, str(e), retryable=False)
            except RetryableError as e:
                self._fail(task, str(e), backoff_ms=e.backoff_ms)
            except Exception as e:
                log.warning("task %s (%s) raised", task.task_id, task.task_type, exc_info=True)
                self._fail(task, f"{type(e).__name__}: {e}")
            else:
                self._settle(task, "completed", self._stub.CompleteTask,
                             wpb.CompleteTaskRequest(task_id=task.task_id, lease_token=task.lease_token, output=output))

    def _fail(self, task: Task, error: str, retryable: bool = True,
              backoff_ms: Optional[int] = None) -> None:
        self._settle(task, "failed", self._stub.FailTask, wpb.FailTaskRequest(
            task_id=task.task_id, lease_token=task.lease_token, error=error, retryable=retryable, backoff_ms=backoff_ms))

    def _release(self, task: Task) -> None:
        """Hands a task that will not be finished back (shutdown): another worker takes it at
        once, with the same attempt number."""
        if not self._claim(task):
            return
        task.cancelled.set()  # the handler stops; a result it still returns is not sent
        self._send(task, "released", self._stub.ReleaseTask, wpb.ReleaseTaskRequest(
            task_id=task.task_id, lease_token=task.lease_token, reason=f"worker {self.worker_id} shutting down"))

    def _claim(self, task: Task) -> bool:
        """Whether the caller sends the task's last call: only the first to ask does."""
        with self._lock:
            if task._settled:
                return False
            task._settled = True
            return True

    def _settle(self, task: Task, outcome: str, rpc: Callable[..., Any], request: Any) -> None:
        if self._claim(task):
            self._send(task, outcome, rpc, request)

    def _send(self, task: Task, outcome: str, rpc: Callable[..., Any], request: Any) -> None:
        try:
            if task.lease_lost:
                log.info("dropping the result of task %s: lease lost", task.task_id)
                return
            reply = rpc(request, metadata=self._md, timeout=10)
            if not getattr(reply, "accepted", True):
                log.info("task %s %s, not accepted: %s", task.task_id, outcome, reply.reason)
            self.on_done(task, outcome, request, reply)
        except grpc.RpcError as e:
            log.warning("task %s %s, refused: %s: %s", task.task_id, outcome, e.code().name,
                        e.details())
        except Exception:
            log.exception("on_done of task %s", task.task_id)
        finally:
            task._done.set()
            with self._lock:
                self._inflight.pop(task.lease_token, None)
                self._lock.notify_all()

    def _keep_alive(self, task: Task) -> None:
        while not task._done.wait(task._interval_s) and not task.lease_lost:
            self._heartbeat(task)

    def _heartbeat(self, task: Task, details: JSON = None) -> bool:
        request = wpb.HeartbeatRequest(task_id=task.task_id, lease_token=task.lease_token)
        if details is not None:
            task._details = details
        if task._details is not None:
            request.details.CopyFrom(to_value(task._details))
        try:
            reply = self._stub.Heartbeat(request, metadata=self._md, timeout=task._interval_s)
            task.heartbeats += 1
            if reply.cancel_requested:
                task.cancelled.set()
        except grpc.RpcError as e:
            log.info("heartbeat of task %s: %s: %s", task.task_id, e.code().name, e.details())
            # After the task's last call a stale token is expected, not a lost lease.
            if e.code() in LOST_CODES and not task._done.is_set():
                task.lease_lost = True
                task.cancelled.set()
        return not task.cancelled.is_set()

    def _drain(self) -> None:
        deadline = time.monotonic() + self._grace_s
        with self._lock:
            while self._inflight and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)
            late = list(self._inflight.values())
        for task in late:
            self._release(task)
