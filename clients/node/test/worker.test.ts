// A tool served by the package's Worker: its output reaches the run, a business error fails the
// node with its code, and stop() resolves cleanly.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BusinessError, EventKind, Worker } from '../src';
import { env, submitter, unique } from './helpers';

test('a node tool serves a run and stops cleanly', async () => {
  const taskType = unique('node.count');
  const worker = new Worker({ target: env('ARBOR_RUNNER'), workerId: unique('node-test'),
    token: env('ARBOR_WORKER_TOKEN'), graceMs: 1000 });
  const keys: string[] = [];
  worker.task(taskType, async ({ args, idempotencyKey }) => {
    keys.push(idempotencyKey);
    if (typeof args.text !== 'string') throw new BusinessError('E_NO_TEXT', 'args.text is required');
    return { words: args.text.split(' ').length };
  });
  const running = worker.run();
  const s = submitter();
  try {
    const tree = await s.registerTree({ id: unique('node-tool'), version: 1, task_types: [taskType],
      root: { type: 'sequence', name: 'main', children: [
        { type: 'tool', name: 'count', tool: taskType, args: { text: 'one two three' },
          output: 'counted' },
        { type: 'tool', name: 'missing', tool: taskType, args: {}, output: 'never',
          error_output: 'problem' },
      ] } });
    const runId = (await s.submitRun(tree.id)).run!.runId;
    let last;
    for await (const e of s.follow({ runId, afterSeq: 0, untilRunEnds: true })) last = e;
    assert.equal(last!.kind, EventKind.EVENT_KIND_RUN_FAILED);
    const board = (await s.getRun(runId)).blackboard!;
    assert.deepEqual(board.counted, { words: 3 });
    assert.equal(board.problem.code, 'E_NO_TEXT');
    assert.equal(keys.length, 2);
  } finally {
    s.close();
    await worker.stop();
    await running;
  }
});
