"""JSON values to and from google.protobuf.Value / Struct, and names to enum numbers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from google.protobuf import json_format, struct_pb2

#: Any JSON value: what tools take and return, what a blackboard holds.
JSON = Any


def to_py(value: Optional[struct_pb2.Value]) -> JSON:
    """google.protobuf.Value -> plain JSON value. Value only has doubles: 3.0 comes back as 3."""
    if value is None:
        return None

    def whole(v: JSON) -> JSON:
        if isinstance(v, dict):
            return {k: whole(x) for k, x in v.items()}
        if isinstance(v, list):
            return [whole(x) for x in v]
        if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
            return int(v)
        return v

    return whole(json_format.MessageToDict(value))


def struct_to_py(value: Optional[struct_pb2.Struct]) -> dict[str, JSON]:
    """google.protobuf.Struct -> dict (a run's blackboard, an approval's context)."""
    if value is None:
        return {}
    out = to_py(struct_pb2.Value(struct_value=value))
    return out if isinstance(out, dict) else {}


def to_value(obj: JSON) -> struct_pb2.Value:
    """Any JSON value -> google.protobuf.Value."""
    return json_format.ParseDict(obj, struct_pb2.Value())


def to_struct(obj: Optional[Mapping[str, JSON]]) -> Optional[struct_pb2.Struct]:
    """A JSON object -> google.protobuf.Struct (None stays None)."""
    if obj is None:
        return None
    return json_format.ParseDict(dict(obj), struct_pb2.Struct())


def enum_number(enum: Any, prefix: str, value: int | str) -> Any:
    """An enum value given as its number, its full name or its short name ("approve" for
    DECISION_KIND_APPROVE); an unknown name is a ValueError naming the ones there are. (Typed
    Any: each enum's generated stub has a ValueType of its own.)"""
    if isinstance(value, int):
        return value
    name = value.upper()
    if not name.startswith(prefix):
        name = prefix + name
    try:
        return int(enum.Value(name))
    except ValueError:
        known = [n.removeprefix(prefix).lower() for n in enum.keys() if not n.endswith("UNSPECIFIED")]
        raise ValueError(f"unknown {prefix.rstrip('_').lower()} {value!r}; one of {known}") from None
