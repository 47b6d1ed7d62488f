"""Runs, approvals, user input and external results with the sync client, against the real
services; errors arrive typed, with their field violations."""

from __future__ import annotations

import pytest

from arbor_client import Client, approval_pb, events_pb, struct_to_py, types_pb
from arbor_client.errors import (FailedPrecondition, InvalidArgument, NotFound,
                                 Unauthenticated)
from conftest import env, gate_tree, unique


def pending_approval(approver: Client, run_id: str) -> approval_pb.Approval:
    for change in approver.watch_approvals(run_id=run_id, states=["pending"]):
        if change.approval.request_id:
            return change.approval
    raise AssertionError("the watch ended without the run's approval")


def test_a_gated_run_is_approved_with_its_digest_and_followed_to_success(
        submitter: Client, approver: Client) -> None:
    tree = submitter.register_tree(gate_tree(unique("py-gate")))
    thread = unique("py-thread")
    key = unique("dedupe")
    first = submitter.submit_run(tree.id, input={"ticket": 7}, thread_id=thread, dedupe_key=key)
    assert not first.deduplicated and first.run.thread_id == thread
    run_id = first.run.run_id

    approval = pending_approval(approver, run_id)
    assert approval.request.title == "Ship billing?"
    assert struct_to_py(approval.request.context) == {"plan": {"service": "billing"}}
    with pytest.raises(FailedPrecondition):
        approver.approve(approval.request_id, expected_digest="sha256:" + "0" * 64)
    approver.decide(approval.request_id, "approve", reason="from pytest",
                    expected_digest=approval.args_digest)

    kinds = [e.kind for e in submitter.follow(run_id=run_id, after_seq=0, until_run_ends=True)]
    assert kinds[0] == events_pb.EVENT_KIND_RUN_QUEUED
    assert events_pb.EVENT_KIND_APPROVAL_RESOLVED in kinds
    assert kinds[-1] == events_pb.EVENT_KIND_RUN_SUCCEEDED
    run = submitter.get_run(run_id)
    assert run.status == types_pb.RUN_STATUS_SUCCEEDED
    assert "receipt" in struct_to_py(run.blackboard)
    assert [r.run_id for r in submitter.list_runs(thread_id=thread)] == [run_id]
    decided = approver.get_approval(approval.request_id)
    assert decided.decision.reason == "from pytest"
    assert decided.decision.kind == types_pb.DECISION_KIND_APPROVE


def test_a_rejection_with_a_comment_fails_the_run(submitter: Client, approver: Client) -> None:
    tree = submitter.register_tree(gate_tree(unique("py-reject")))
    run_id = submitter.submit_run(tree.id).run.run_id
    approval = pending_approval(approver, run_id)
    commented = approver.comment(approval.request_id, "not on a Friday")
    assert [c.text for c in commented.comments] == ["not on a Friday"]
    approver.reject(approval.request_id, "Friday")
    last = list(submitter.follow(run_id=run_id, after_seq=0, until_run_ends=True))[-1]
    assert last.kind == events_pb.EVENT_KIND_RUN_FAILED


def test_user_input_and_an_external_result_are_answered(submitter: Client) -> None:
    tree = submitter.register_tree({
        "id": unique("py-answers"), "version": 1,
        "root": {"type": "sequence", "name": "main", "children": [
            {"type": "user_input", "name": "size", "input_kind": "select",
             "prompt": "Which size?", "options": ["small", "large"], "output": "size"},
            {"type": "external", "name": "backup", "execution_kind": "backup",
             "task": {"db": "main"}, "output": "backup"},
        ]},
    })
    run_id = submitter.submit_run(tree.id).run.run_id
    suspensions = submitter.follow(run_id=run_id, after_seq=0,
                                   kinds=["execution_suspended", "run_failed"])
    ask = next(suspensions)
    assert ask.execution_suspended.category == types_pb.SUSPENSION_CATEGORY_REQUIRE_USER_INPUT
    with pytest.raises(InvalidArgument) as bad:
        submitter.answer_input(run_id, ask.execution_suspended.request_id, "huge")
    assert bad.value.field_violations, "the refusal names the bad field"
    submitter.answer_input(run_id, ask.execution_suspended.request_id, "large")
    ext = next(suspensions)
    assert ext.execution_suspended.category == types_pb.SUSPENSION_CATEGORY_REQUIRE_EXTERNAL_EXECUTION
    submitter.complete_external(run_id, ext.execution_suspended.request_id, {"snapshot": "s-1"})
    suspensions.close()
    last = list(submitter.follow(run_id=run_id, after_seq=0, until_run_ends=True))[-1]
    assert last.kind == events_pb.EVENT_KIND_RUN_SUCCEEDED
    board = struct_to_py(submitter.get_run(run_id).blackboard)
    assert board["size"] == "large" and board["backup"] == {"snapshot": "s-1"}


def test_errors_are_typed_with_their_code_and_details(submitter: Client) -> None:
    with pytest.raises(InvalidArgument) as bad:
        submitter.register_tree({"id": "", "version": 1, "root": {"type": "nope"}})
    assert bad.value.field_violations, bad.value
    assert all(v.field and v.description for v in bad.value.field_violations)
    with pytest.raises(NotFound):
        submitter.get_run("no-such-run")
    with pytest.raises(ValueError, match="unknown restore_policy"):
        submitter.submit_run("x", restore="sometimes")
    with Client(env("ARBOR_RUNNER"), None) as anonymous:
        with pytest.raises(Unauthenticated) as denied:
            anonymous.get_run("no-such-run")
    assert denied.value.code.name == "UNAUTHENTICATED"


def test_edit_and_respond_decide_a_tool_call(submitter: Client, approver: Client) -> None:
    tree = submitter.register_tree({
        "id": unique("py-refund"), "version": 1,
        "root": {"type": "tool", "name": "refund", "tool": "ledger.append", "policy": "ask",
                 "allow_edit": True, "allow_respond": True,
                 "args": {"entry": {"refund": {"$ref": "refund"}}}, "output": "refund_result"},
    })
    edited = submitter.submit_run(tree.id, input={"refund": 50}).run.run_id
    responded = submitter.submit_run(tree.id, input={"refund": 70}).run.run_id
    approver.decide(pending_approval(approver, edited).request_id, "edit",
                    args={"entry": {"refund": 20}}, reason="capped")
    approver.decide(pending_approval(approver, responded).request_id, "respond",
                    result={"refunded": "by hand"})
    boards = {}
    for run_id in (edited, responded):
        last = list(submitter.follow(run_id=run_id, after_seq=0, until_run_ends=True))[-1]
        assert last.kind == events_pb.EVENT_KIND_RUN_SUCCEEDED
        boards[run_id] = struct_to_py(submitter.get_run(run_id).blackboard)
    assert boards[edited]["refund_result"]["entry"] == {"refund": 20}
    assert boards[responded]["refund_result"] == {"refunded": "by hand"}
