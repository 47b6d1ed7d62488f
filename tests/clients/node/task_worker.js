#!/usr/bin/env node
// The task worker of the end-to-end tests, built on the arbor-client package's Worker (run with
// NODE_PATH pointing at a node_modules holding it).
//
//   node task_worker.js --runner 127.0.0.1:50051 --worker-id w1 --types 'node.*,x.upper'
//                       [--max-in-flight 4] [--lease-ms 10000] [--effects FILE] [--token T]
//                       [--grace-ms 10000]
//
// What a task does depends on its type's last segment (`node.upper` and `x.upper` alike):
// upper, greet, effect (at most once per idempotency key, into --effects), slow (until
// cancelled), raise (a business error), flaky (retryable failures until attempt succeed_on),
// resume (`steps` steps of `step_ms`, each heartbeated as details {done: n}, going on from the
// details an earlier attempt left); any other type returns its args. On SIGTERM it drains
// within --grace-ms.
//
// Output, one line per event: `ready`, `task id=ID type=TYPE attempt=N key=KEY args=JSON`,
// `completed id=ID accepted=BOOL`, `cancelled id=ID`, `progress id=ID done=N`,
// `released id=ID accepted=BOOL attempt=N`, `failed id=ID`, `threw id=ID code=CODE`, `stopped`. Diagnostics (reconnects, lost leases) go to stderr. Exit 0 after SIGTERM/SIGINT,
// 1 on bad arguments.

'use strict';

const fs = require('fs');
const { setTimeout: delay } = require('timers/promises');
const { Worker, BusinessError, RetryableError, FatalError } = require('arbor-client');

function parseArgs(argv) {
  const count = (flag, value) => {
    if (!/^\d+$/.test(value)) throw new Error(`${flag} must be a whole number, not ${value}`);
    return Number(value);
  };
  const opts = { runner: '127.0.0.1:50051', workerId: '', types: [], maxInFlight: 4, leaseMs: 10000,
    effects: '', token: process.env.ARBOR_TOKEN || '', graceMs: 10000 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    switch (flag) {
      case '--runner': opts.runner = value; break;
      case '--worker-id': opts.workerId = value; break;
      case '--types': opts.types = value.split(',').filter(Boolean); break;
      case '--max-in-flight': opts.maxInFlight = count(flag, value); break;
      case '--lease-ms': opts.leaseMs = count(flag, value); break;
      case '--effects': opts.effects = value; break;
      case '--token': opts.token = value; break;
      case '--grace-ms': opts.graceMs = count(flag, value); break;
      default: throw new Error(`unknown argument ${flag}`);
    }
  }
  if (!opts.workerId) throw new Error('--worker-id is required');
  if (!opts.types.length) throw new Error('--types is required (globs over task types)');
  return opts;
}

const log = (line) => process.stdout.write(`${line}\n`);
const sleep = (ms, signal) => delay(ms, undefined, { signal }).catch(() => {});

function behaviours(opts) {
  const worker = opts.workerId;
  return {
    upper: (task, args) => ({ text: args.text.toUpperCase(), worker }),
    greet: (task, args) => ({ greeting: `Hello, ${args.name}`, worker }),
    effect: async ({ idempotencyKey: key, attempt }, args) => {
      if (!opts.effects) throw new FatalError('effect tasks need --effects FILE');
      await sleep(args.ms || 0);
      const seen = fs.existsSync(opts.effects) ? fs.readFileSync(opts.effects, 'utf8') : '';
      if (!seen.split('\n').includes(key)) fs.appendFileSync(opts.effects, `${key}\n`);
      return { key, worker, attempt };
    },
    slow: async ({ taskId, signal }, args) => {
      await sleep(args.ms, signal);
      if (!signal.aborted) return { slept_ms: args.ms };
      log(`cancelled id=${taskId}`);
      return { cancelled: true };
    },
    raise: (task, args) => {
      throw new BusinessError(args.code || 'E_BUSINESS', args.message || 'business error');
    },
    resume: async (task, args) => {
      const start = task.details?.done ?? 0;
      for (let done = start + 1; done <= args.steps; done += 1) {
        await sleep(args.step_ms ?? 50, task.signal);
        // A heartbeat refused once the task was handed back is the same as a cancellation.
        if (!task.cancelled) await task.heartbeat({ done }).catch(() => {});
        if (task.cancelled) {
          log(`cancelled id=${task.taskId}`);
          return { cancelled: true };
        }
        log(`progress id=${task.taskId} done=${done}`);
      }
      return { resumed_from: start, previous: task.details, attempt: task.attempt, worker };
    },
    flaky: ({ attempt }, args) => {
      if (attempt < (args.succeed_on || 2)) {
        throw new RetryableError(`flaky: attempt ${attempt} fails`, 50);
      }
      return { attempt };
    },
  };
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const byKind = behaviours(opts);
  const worker = new Worker({ target: opts.runner, workerId: opts.workerId, token: opts.token,
    maxInFlight: opts.maxInFlight, leaseMs: opts.leaseMs, graceMs: opts.graceMs });
  const handle = async (task) => {
    const kind = byKind[task.taskType.slice(task.taskType.lastIndexOf('.') + 1)];
    return kind ? kind(task, task.args ?? {}) : task.args;
  };
  for (const glob of opts.types) worker.task(glob, handle);
  const warn = (line) => process.stderr.write(`${line}\n`);
  worker
    .on('ready', () => log('ready'))
    .on('task', (t) => log(`task id=${t.taskId} type=${t.taskType} attempt=${t.attempt} `
      + `key=${t.idempotencyKey} args=${JSON.stringify(t.args)}`))
    .on('completed', (t, resp) => log(`completed id=${t.taskId} accepted=${resp.accepted}`))
    .on('failed', (t) => log(`failed id=${t.taskId}`))
    .on('released', (t, resp) => log(`released id=${t.taskId} accepted=${resp.accepted} `
      + `attempt=${resp.attempt}`))
    .on('threw', (t, resp, req) => log(`threw id=${t.taskId} code=${req.code}`))
    .on('lost', (t, err) => warn(`lost id=${t.taskId}: ${err.details || err.message}`))
    .on('reconnect', ({ attempt, delayMs, status }) => warn(`reconnect attempt=${attempt} `
      + `in=${delayMs}ms after=${status ? `${status.code}: ${status.details}` : 'stream ended'}`));
  await worker.run();
  log('stopped');
  process.exit(0);
}

main().catch((err) => {
  process.stderr.write(`error: ${err.message}\n`);
  process.exit(1);
});
