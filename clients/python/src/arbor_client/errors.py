"""Typed exceptions for failed calls, carrying the gRPC code and the rich error details.

Every method of the clients raises an `ArborError` subclass chosen by the status code
(`InvalidArgument`, `NotFound`, `FailedPrecondition`…). When the service sent
`google.rpc.Status` details (the `grpc-status-details-bin` trailer), they are decoded:
`details` holds every detail message, and `field_violations` the `google.rpc.BadRequest`
violations an INVALID_ARGUMENT names (which field, what is wrong with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import grpc

_DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class FieldViolation:
    """One bad field of a request: its path and what is wrong with it."""

    field: str
    description: str


class ArborError(Exception):
    """A call the service answered with an error (or could not be made)."""

    #: The gRPC status code.
    code: grpc.StatusCode
    #: The status message.
    message: str
    #: Decoded google.rpc detail messages (BadRequest, ErrorInfo, …), in the order sent.
    details: list[Any]
    #: The BadRequest field violations among `details`.
    field_violations: list[FieldViolation]

    def __init__(self, code: grpc.StatusCode, message: str, details: Optional[list[Any]] = None):
        super().__init__(f"{code.name}: {message}")
        self.code, self.message = code, message
        self.details = list(details or [])
        self.field_violations = [
            FieldViolation(v.field, v.description)
            for d in self.details
            if type(d).__name__ == "BadRequest"
            for v in d.field_violations
        ]

    @property
    def transient(self) -> bool:
        """Whether the same call may succeed when retried (the service was away or busy)."""
        return self.code in TRANSIENT


class InvalidArgument(ArborError):
    """The request is wrong; `field_violations` says where. Nothing was changed."""


class NotFound(ArborError):
    """No such run, tree, approval, task or lease."""


class AlreadyExists(ArborError):
    """Already there, and different (a tree version registered with another document)."""


class FailedPrecondition(ArborError):
    """Not in a state that allows it (a decision kind not allowed, a stale digest…)."""


class Aborted(ArborError):
    """Lost a race or a lease; read again and decide again."""


class PermissionDenied(ArborError):
    """The token's principal may not do this."""


class Unauthenticated(ArborError):
    """No token, or one the service does not know."""


class Unavailable(ArborError):
    """The service is away (restarting, unreachable); worth retrying."""


class DeadlineExceeded(ArborError):
    """The call's timeout passed first."""


class ResourceExhausted(ArborError):
    """Over a limit (size, rate, queue); worth retrying later when it is a rate."""


TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED,
}

_BY_CODE: dict[grpc.StatusCode, type[ArborError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
}


def _decode_details(raw: bytes) -> list[Any]:
    from google.protobuf import symbol_database
    from google.rpc import error_details_pb2, status_pb2  # noqa: F401 (registers the types)

    status = status_pb2.Status.FromString(raw)
    out: list[Any] = []
    db = symbol_database.Default()
    for any_detail in status.details:
        name = any_detail.TypeName()
        try:
            cls = db.GetSymbol(name)
        except KeyError:  # a detail type this client does not know: kept packed
            out.append(any_detail)
            continue
        msg = cls()
        any_detail.Unpack(msg)
        out.append(msg)
    return out


def from_status(code: grpc.StatusCode, message: str, trailing: Any) -> ArborError:
    """The typed error for a status and its trailing metadata."""
    details: list[Any] = []
    for key, value in trailing or ():
        if key == _DETAILS_KEY and isinstance(value, bytes):
            try:
                details = _decode_details(value)
            except Exception:  # undecodable details must not hide the error itself
                details = []
    return _BY_CODE.get(code, ArborError)(code, message, details)


def from_rpc_error(err: grpc.RpcError) -> ArborError:
    """The typed error for a failed sync or asyncio call."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    return from_status(code or grpc.StatusCode.UNKNOWN, message or "", trailing)
