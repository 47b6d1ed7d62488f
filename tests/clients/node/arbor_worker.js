// A task worker for arbor.runner.v1.WorkerService, with the stubs loaded from proto/ at run time.
// See example_worker.js; for logs, a Worker emits ready, task, completed, threw, failed,
// released, lost, reconnect and stopped. On SIGTERM it drains: it stops taking tasks, lets the
// running ones finish within graceMs, and hands the rest back with ReleaseTask (another worker
// takes them at once, with the same attempt number).

'use strict';

const path = require('path');
const { EventEmitter } = require('events');
const { setTimeout: delay } = require('timers/promises');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

// What a handler throws: a business error fails the node at once with {code, message}, for the
// tree to route on; a RetryableError (or any other error) fails the attempt, to be tried again;
// a FatalError fails the node.
class BusinessError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}
class RetryableError extends Error {
  constructor(message, backoffMs) { super(message); this.backoffMs = backoffMs; }
}
class FatalError extends Error {}
for (const E of [BusinessError, RetryableError, FatalError]) E.prototype.name = E.name;

const { status } = grpc;
const TRANSIENT = new Set([status.UNAVAILABLE, status.RESOURCE_EXHAUSTED]);
// The lease is no longer ours: nothing sent about the task can change it any more.
const LOST = new Set([status.ABORTED, status.NOT_FOUND]);
const EVENT = { CompleteTask: 'completed', ThrowError: 'threw', FailTask: 'failed',
  ReleaseTask: 'released' };

const mapObject = (o, f) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, f(v)]));

// google.protobuf.Value as proto-loader decodes it (its built-in struct.proto is camelCase).
function fromValue(v) {
  switch (v && v.kind) {
    case 'numberValue': case 'stringValue': case 'boolValue': return v[v.kind];
    case 'listValue': return v.listValue.values.map(fromValue);
    case 'structValue': return mapObject(v.structValue.fields, fromValue);
    default: return null;
  }
}

function jsonToValue(x) {
  if (typeof x === 'number') return { numberValue: x };
  if (typeof x === 'string') return { stringValue: x };
  if (typeof x === 'boolean') return { boolValue: x };
  if (Array.isArray(x)) return { listValue: { values: x.map(jsonToValue) } };
  if (x) return { structValue: { fields: mapObject(x, jsonToValue) } };
  return { nullValue: 'NULL_VALUE' };
}
// Whatever JSON.stringify makes of x (toJSON, undefined fields dropped), as a Value.
const toValue = (x) => jsonToValue(JSON.parse(JSON.stringify(x) ?? 'null'));

const globRe = (glob) => new RegExp(`^${glob.replace(/[.+^${}()|[\]\\]/g, '\\$&')
  .replaceAll('*', '.*').replaceAll('?', '.')}$`, 's');

class Worker extends EventEmitter {
  constructor({ target, workerId, token, maxInFlight = 4, leaseMs = 10000, graceMs = 10000,
    proto = path.resolve(__dirname, '../../../proto'), log = console.warn }) {
    super();
    Object.assign(this, { workerId, maxInFlight, leaseMs, graceMs, log });
    const definition = protoLoader.loadSync('arbor/runner/v1/worker_service.proto', {
      includeDirs: [proto], keepCase: true, longs: Number, enums: String, defaults: true,
      oneofs: true,
    });
    const { WorkerService } = grpc.loadPackageDefinition(definition).arbor.runner.v1;
    // Keepalive notices a dead connection under a stream that may stay idle for hours.
    this.client = new WorkerService(target, grpc.credentials.createInsecure(),
      { 'grpc.keepalive_time_ms': 20000, 'grpc.keepalive_timeout_ms': 10000 });
    this.md = new grpc.Metadata();
    if (token) this.md.set('authorization', `Bearer ${token}`);
    this.handlers = [];
    this.inFlight = new Map(); // a handler's promise -> what hands its task back
    this.stopping = new AbortController();
  }

  task(glob, handler) { this.handlers.push({ glob, re: globRe(glob), handler }); return this; }

  call(method, request, retries = 0, waitMs = 100) {
    return new Promise((resolve, reject) => this.client[method](request, this.md.clone(),
      { deadline: Date.now() + 10000 }, (err, resp) => (err ? reject(err) : resolve(resp))))
      .catch(async (err) => {
        if (!retries || !TRANSIENT.has(err.code)) throw err;
        await delay(waitMs);
        return this.call(method, request, retries - 1, waitMs * 2);
      });
  }

  async run() {
    if (!this.handlers.length) throw new Error('register a handler with worker.task() first');
    const onSignal = () => { this.stop(); };
    process.on('SIGTERM', onSignal).on('SIGINT', onSignal);
    let failures = 0;
    while (!this.stopping.signal.aborted) {
      const started = Date.now();
      const end = await this.session(() => { failures = 0; });
      if (this.stopping.signal.aborted) break;
      // A stream that was up for a while starts the backoff again from the bottom.
      failures = Date.now() - started > 5000 ? 1 : failures + 1;
      const base = Math.min(2000, 100 * 2 ** (failures - 1));
      const delayMs = Math.round(base / 2 + (Math.random() * base) / 2);
      this.emit('reconnect', { attempt: failures, delayMs, status: end });
      await delay(delayMs, undefined, { signal: this.stopping.signal }).catch(() => {});
    }
    await this.stop();
    process.off('SIGTERM', onSignal).off('SIGINT', onSignal);
  }

  // One StreamTasks call; resolves with the status that ended it (null for OK).
  session(onTask) {
    return new Promise((resolve) => {
      const request = { worker_id: this.workerId, task_types: this.handlers.map((h) => h.glob),
        max_in_flight: this.maxInFlight, lease_ms: this.leaseMs };
      const call = this.client.StreamTasks(request, this.md.clone());
      const cancel = () => call.cancel();
      this.stopping.signal.addEventListener('abort', cancel);
      if (!this.streamed) { this.streamed = true; this.emit('ready'); }
      call.on('data', ({ task }) => { onTask(); this.execute(task); });
      call.on('error', () => {}); // the status says it all
      call.on('status', (s) => {
        this.stopping.signal.removeEventListener('abort', cancel);
        resolve(s.code === status.OK ? null : s);
      });
    });
  }

  execute(act) {
    const lease = { task_id: act.task_id, lease_token: act.lease_token };
    const abort = new AbortController();
    let details = act.details || undefined; // resent with each heartbeat: a retry keeps it
    let settled = null; // once reported, handed back, or the lease is lost: nothing more to send
    const task = {
      taskId: act.task_id, taskType: act.task_type, args: fromValue(act.args),
      idempotencyKey: act.idempotency_key, attempt: act.attempt, maxAttempts: act.max_attempts,
      details: fromValue(act.details), runId: act.run_id, threadId: act.thread_id,
      nodeLocator: act.node_locator, signal: abort.signal,
      get cancelled() { return abort.signal.aborted; },
      heartbeat: async (d) => {
        if (d !== undefined) details = toValue(d);
        const resp = await this.call('Heartbeat', { ...lease, details }).catch((err) => {
          if (LOST.has(err.code) && !settled) {
            settled = Promise.resolve();
            abort.abort(err);
            this.emit('lost', task, err);
          }
          throw err;
        });
        if (resp.cancel_requested) abort.abort(new Error('cancellation requested'));
        return resp;
      },
    };
    let beating = null;
    const beat = setInterval(() => {
      beating ||= task.heartbeat().catch(() => {}).finally(() => { beating = null; });
    }, Math.max(50, (act.lease_ms || this.leaseMs) / 3));
    const settle = (method, request) => {
      clearInterval(beat);
      settled ||= this.report(task, method, { ...lease, ...request });
      return settled;
    };
    // Once a shutdown's grace period is over (or before a task started): hand it back now,
    // without spending an attempt, not at lease expiry.
    const abandon = () => {
      if (settled) return settled;
      // Settled first, so what the handler still returns is not reported.
      const released = settle('ReleaseTask', { reason: `worker ${this.workerId} shutting down` });
      abort.abort(new Error('worker shutting down'));
      return released;
    };
    const handler = this.handlers.find((h) => h.re.test(act.task_type));
    const done = (async () => {
      if (this.stopping.signal.aborted) return abandon();
      this.emit('task', task);
      try {
        if (!handler) throw new FatalError(`no handler for task type ${act.task_type}`);
        return settle('CompleteTask', { output: toValue(await handler.handler(task)) });
      } catch (err) {
        if (err instanceof BusinessError) {
          return settle('ThrowError', { code: String(err.code), message: err.message });
        }
        return settle('FailTask', { error: String(err?.message ?? err),
          retryable: !(err instanceof FatalError),
          backoff_ms: err instanceof RetryableError ? err.backoffMs : undefined });
      }
    })().finally(() => { clearInterval(beat); this.inFlight.delete(done); });
    this.inFlight.set(done, abandon);
  }

  async report(task, method, request) {
    try {
      // Worth a few tries while the lease lasts; after it, the task comes back anyway.
      const resp = await this.call(method, request, 5);
      if (resp.accepted === false) this.log(`${method} ${task.taskId} ignored: ${resp.reason}`);
      this.emit(EVENT[method], task, resp, request);
    } catch (err) {
      if (LOST.has(err.code)) this.emit('lost', task, err);
      else this.log(`${method} ${task.taskId} failed: ${err.code} ${err.details || err.message}`);
    }
  }

  // Stops taking tasks, lets the running ones finish for up to graceMs, then releases the rest.
  stop(graceMs = this.graceMs) {
    this.stopped ||= (async () => {
      this.stopping.abort();
      const grace = delay(graceMs, undefined, { ref: false }); // keeps no process alive
      await Promise.race([Promise.allSettled(this.inFlight.keys()), grace]);
      await Promise.allSettled([...this.inFlight.values()].map((abandon) => abandon()));
      this.client.close();
      this.emit('stopped');
    })();
    return this.stopped;
  }
}

module.exports = { Worker, BusinessError, RetryableError, FatalError, fromValue, toValue };
