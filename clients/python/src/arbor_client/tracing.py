"""W3C trace context from the caller's current OpenTelemetry span, as gRPC metadata.

With `opentelemetry-api` installed (`pip install "arbor-client[otel]"`), every call the client
makes carries `traceparent` (and `tracestate`) of the span current at the call, through the
globally configured propagator; without it, nothing is added and nothing is imported again.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

_inject: Optional[Callable[..., Any]] = None
_tried = False


def _injector() -> Optional[Callable[..., Any]]:
    global _inject, _tried
    if not _tried:
        _tried = True
        try:
            from opentelemetry.propagate import inject

            _inject = inject
        except ImportError:  # tracing is optional
            _inject = None
    return _inject


def trace_metadata() -> list[tuple[str, str]]:
    """The propagation headers of the current span (empty without OpenTelemetry or a span)."""
    inject = _injector()
    if inject is None:
        return []
    carrier: dict[str, str] = {}
    inject(carrier)
    return [(k.lower(), v) for k, v in carrier.items()]
