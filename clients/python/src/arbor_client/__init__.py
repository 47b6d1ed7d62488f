"""Arbor from Python: submit and follow runs, decide approvals, answer user input and external
results (`Client`, or `arbor_client.aio.AsyncClient` for asyncio), and serve tools as a task
worker (`Worker`). Failed calls raise `arbor_client.errors.ArborError` subclasses.

The generated message and enum modules are re-exported as `runner_pb`, `events_pb`, `types_pb`,
`worker_pb` and `approval_pb` for the fields the methods return.
"""

from ._base import RUN_END_KINDS, SUSPENSION_KINDS, Tls
from ._convert import JSON, struct_to_py, to_py, to_struct, to_value
from ._gen.arbor.approval.v1 import approval_service_pb2 as approval_pb
from ._gen.arbor.runner.v1 import events_pb2 as events_pb
from ._gen.arbor.runner.v1 import runner_service_pb2 as runner_pb
from ._gen.arbor.runner.v1 import types_pb2 as types_pb
from ._gen.arbor.runner.v1 import worker_service_pb2 as worker_pb
from .client import Client
from .errors import ArborError, FieldViolation
from .worker import BusinessError, FatalError, RetryableError, Task, Worker

__all__ = [
    "JSON", "RUN_END_KINDS", "SUSPENSION_KINDS", "ArborError", "BusinessError", "Client",
    "FatalError", "FieldViolation", "RetryableError", "Task", "Tls", "Worker", "approval_pb",
    "events_pb", "runner_pb", "struct_to_py", "to_py", "to_struct", "to_value", "types_pb",
    "worker_pb",
]
