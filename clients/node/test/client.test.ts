// Runs, approvals, user input and external results against the real services; errors arrive
// typed, with their field violations.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ArborClient, ArborError, DecisionKind, EventKind, RunStatus,
  SuspensionCategory } from '../src';
import { approver, env, gateTree, submitter, unique } from './helpers';

async function pendingApproval(a: ArborClient, runId: string) {
  for await (const change of a.watchApprovals({ runId, states: ['pending'] })) {
    if (change.approval?.requestId) return change.approval;
  }
  throw new Error('the watch ended without the run\'s approval');
}

async function kindsUntilEnd(c: ArborClient, runId: string): Promise<EventKind[]> {
  const kinds: EventKind[] = [];
  for await (const e of c.follow({ runId, afterSeq: 0, untilRunEnds: true })) kinds.push(e.kind);
  return kinds;
}

test('a gated run is approved with its digest and followed to success', async () => {
  const s = submitter();
  const a = approver();
  try {
    const tree = await s.registerTree(gateTree(unique('node-gate')));
    const threadId = unique('node-thread');
    const dedupeKey = unique('dedupe');
    const first = await s.submitRun(tree.id, { input: { ticket: 7 }, threadId, dedupeKey });
    assert.ok(!first.deduplicated);
    assert.equal(first.run!.threadId, threadId);
    const runId = first.run!.runId;

    const approval = await pendingApproval(a, runId);
    assert.equal(approval.request!.title, 'Ship billing?');
    assert.deepEqual(approval.request!.context, { plan: { service: 'billing' } });
    await assert.rejects(a.approve(approval.requestId, { expectedDigest: `sha256:${'0'.repeat(64)}` }),
      (e: ArborError) => e.codeName === 'FAILED_PRECONDITION');
    await a.decide(approval.requestId, 'approve', { reason: 'from node --test',
      expectedDigest: approval.argsDigest });

    const kinds = await kindsUntilEnd(s, runId);
    assert.equal(kinds[0], EventKind.EVENT_KIND_RUN_QUEUED);
    assert.ok(kinds.includes(EventKind.EVENT_KIND_APPROVAL_RESOLVED));
    assert.equal(kinds.at(-1), EventKind.EVENT_KIND_RUN_SUCCEEDED);
    const run = await s.getRun(runId);
    assert.equal(run.status, RunStatus.RUN_STATUS_SUCCEEDED);
    assert.ok('receipt' in (run.blackboard ?? {}));
    const runs = [];
    for await (const r of s.listRuns({ threadId })) runs.push(r.runId);
    assert.deepEqual(runs, [runId]);
    const decided = await a.getApproval(approval.requestId);
    assert.equal(decided.decision!.reason, 'from node --test');
    assert.equal(decided.decision!.kind, DecisionKind.DECISION_KIND_APPROVE);
  } finally {
    s.close();
    a.close();
  }
});

test('user input and an external result are answered', async () => {
  const s = submitter();
  try {
    const tree = await s.registerTree({ id: unique('node-answers'), version: 1,
      root: { type: 'sequence', name: 'main', children: [
        { type: 'user_input', name: 'size', input_kind: 'select', prompt: 'Which size?',
          options: ['small', 'large'], output: 'size' },
        { type: 'external', name: 'backup', execution_kind: 'backup', task: { db: 'main' },
          output: 'backup' },
      ] } });
    const runId = (await s.submitRun(tree.id)).run!.runId;
    const suspensions = s.follow({ runId, afterSeq: 0, kinds: ['execution_suspended'] });
    const ask = (await suspensions.next()).value!.executionSuspended!;
    assert.equal(ask.category, SuspensionCategory.SUSPENSION_CATEGORY_REQUIRE_USER_INPUT);
    await assert.rejects(s.answerInput(runId, ask.requestId, 'huge'),
      (e: ArborError) => e.codeName === 'INVALID_ARGUMENT' && e.fieldViolations.length > 0);
    await s.answerInput(runId, ask.requestId, 'large');
    const ext = (await suspensions.next()).value!.executionSuspended!;
    assert.equal(ext.category, SuspensionCategory.SUSPENSION_CATEGORY_REQUIRE_EXTERNAL_EXECUTION);
    await s.completeExternal(runId, ext.requestId, { snapshot: 's-1' });
    await suspensions.return(undefined);
    assert.equal((await kindsUntilEnd(s, runId)).at(-1), EventKind.EVENT_KIND_RUN_SUCCEEDED);
    const board = (await s.getRun(runId)).blackboard!;
    assert.equal(board.size, 'large');
    assert.deepEqual(board.backup, { snapshot: 's-1' });
  } finally {
    s.close();
  }
});

test('errors are typed with their code and details', async () => {
  const s = submitter();
  const anonymous = new ArborClient({ runner: env('ARBOR_RUNNER') });
  try {
    await assert.rejects(s.registerTree({ id: '', version: 1, root: { type: 'nope' } }),
      (e: ArborError) => e instanceof ArborError && e.codeName === 'INVALID_ARGUMENT'
        && e.fieldViolations.length > 0
        && e.fieldViolations.every((v) => v.field !== '' && v.description !== ''));
    await assert.rejects(s.getRun('no-such-run'), (e: ArborError) => e.codeName === 'NOT_FOUND');
    assert.throws(() => s.submitRun('x', { restore: 'sometimes' }), /unknown restore_policy/);
    await assert.rejects(anonymous.getRun('no-such-run'),
      (e: ArborError) => e.codeName === 'UNAUTHENTICATED');
  } finally {
    s.close();
    anonymous.close();
  }
});

test('edit and respond decide a tool call', async () => {
  const s = submitter();
  const a = approver();
  try {
    const tree = await s.registerTree({ id: unique('node-refund'), version: 1,
      root: { type: 'tool', name: 'refund', tool: 'ledger.append', policy: 'ask',
        allow_edit: true, allow_respond: true,
        args: { entry: { refund: { $ref: 'refund' } } }, output: 'refund_result' } });
    const edited = (await s.submitRun(tree.id, { input: { refund: 50 } })).run!.runId;
    const responded = (await s.submitRun(tree.id, { input: { refund: 70 } })).run!.runId;
    await a.decide((await pendingApproval(a, edited)).requestId, 'edit',
      { args: { entry: { refund: 20 } }, reason: 'capped' });
    await a.decide((await pendingApproval(a, responded)).requestId, 'respond',
      { result: { refunded: 'by hand' } });
    for (const runId of [edited, responded]) {
      assert.equal((await kindsUntilEnd(s, runId)).at(-1), EventKind.EVENT_KIND_RUN_SUCCEEDED);
    }
    assert.deepEqual((await s.getRun(edited)).blackboard!.refund_result.entry, { refund: 20 });
    assert.deepEqual((await s.getRun(responded)).blackboard!.refund_result,
      { refunded: 'by hand' });
  } finally {
    s.close();
    a.close();
  }
});
