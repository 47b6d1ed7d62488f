"""The services under test come from the environment (the repository's end-to-end test starts
both binaries with authentication on and sets these):

    ARBOR_RUNNER, ARBOR_APPROVAL            host:port of runner-svc and approval-svc
    ARBOR_SUBMITTER_TOKEN                   registers trees, submits runs, answers input
    ARBOR_APPROVER_TOKEN                    decides approvals
    ARBOR_WORKER_TOKEN                      serves tasks
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from arbor_client import Client


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: these tests run against real services (see conftest.py)")
    return value


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def gate_tree(tree_id: str) -> dict[str, Any]:
    """An approval gate in front of a ledger append (a built-in tool)."""
    return {
        "id": tree_id, "version": 1,
        "root": {"type": "sequence", "name": "main", "children": [
            {"type": "set", "name": "plan", "key": "plan", "value": {"service": "billing"}},
            {"type": "approval", "name": "gate", "phase": "before", "on_reject": "failure",
             "title": "Ship billing?", "context": ["plan"],
             "child": {"type": "tool", "name": "ship", "tool": "ledger.append",
                       "args": {"entry": {"$ref": "plan"}}, "output": "receipt"}},
        ]},
    }


@pytest.fixture
def submitter() -> Iterator[Client]:
    with Client(env("ARBOR_RUNNER"), None, token=env("ARBOR_SUBMITTER_TOKEN")) as c:
        yield c


@pytest.fixture
def approver() -> Iterator[Client]:
    with Client(env("ARBOR_RUNNER"), env("ARBOR_APPROVAL"),
                token=env("ARBOR_APPROVER_TOKEN")) as c:
        yield c
