// A task worker for arbor.runner.v1.WorkerService: serves tools (remote `tool` nodes and
// `external` nodes) from Node. A Worker emits ready, task, completed, threw, failed, released,
// lost, reconnect and stopped. On SIGTERM it drains: it stops taking tasks, lets the running ones
// finish within graceMs, and hands the rest back with ReleaseTask (another worker takes them at
// once, with the same attempt number).

import { EventEmitter } from 'node:events';
import { status, type ServiceError, type StatusObject } from '@grpc/grpc-js';

import {
  type TaskActivation, WorkerServiceClient,
} from './gen/arbor/runner/v1/worker_service';
import { type ConnectOptions, callMetadata, channelOptions, credentials,
  sleep } from './connection';
import { toArborError } from './errors';

/** Fails the node at once with {code, message} in its `error_output` (ThrowError). */
export class BusinessError extends Error {
  constructor(readonly code: string, message: string) { super(message); this.name = 'BusinessError'; }
}
/** Worth another attempt, after `backoffMs` or else the node's own backoff. */
export class RetryableError extends Error {
  constructor(message: string, readonly backoffMs?: number) {
    super(message);
    this.name = 'RetryableError';
  }
}
/** A technical failure that another attempt would not fix. */
export class FatalError extends Error {
  constructor(message: string) { super(message); this.name = 'FatalError'; }
}

/** One leased task, as a handler sees it. */
export interface Task {
  taskId: string;
  taskType: string;
  args: any;
  /** Apply side effects at most once per key: the same on every attempt of a call. */
  idempotencyKey: string;
  attempt: number;
  maxAttempts: number;
  /** What an earlier attempt's last heartbeat stored (undefined: none). */
  details: any;
  runId: string;
  threadId: string;
  nodeLocator: string;
  /** Aborts when the run cancels the task, the lease is lost, or the worker hands it back. */
  signal: AbortSignal;
  readonly cancelled: boolean;
  /** Extends the lease now, storing `details` for a later attempt. */
  heartbeat(details?: unknown): Promise<{ cancelRequested: boolean }>;
}

export type Handler = (task: Task) => unknown;

export interface WorkerOptions extends ConnectOptions {
  /** runner-svc's host:port. */
  target: string;
  workerId: string;
  maxInFlight?: number;
  leaseMs?: number;
  /** On stop(), how long running tasks may finish before they are handed back. */
  graceMs?: number;
  log?: (line: string) => void;
}

const TRANSIENT = new Set<number>([status.UNAVAILABLE, status.RESOURCE_EXHAUSTED]);
// The lease is no longer ours: nothing sent about the task can change it any more.
const LOST = new Set<number>([status.ABORTED, status.NOT_FOUND]);
const EVENT = { completeTask: 'completed', throwError: 'threw', failTask: 'failed',
  releaseTask: 'released' } as const;
type Report = keyof typeof EVENT;

const globRe = (glob: string) => new RegExp(`^${glob.replace(/[.+^${}()|[\]\\]/g, '\\$&')
  .replaceAll('*', '.*').replaceAll('?', '.')}$`, 's');

export class Worker extends EventEmitter {
  readonly workerId: string;
  readonly maxInFlight: number;
  readonly leaseMs: number;
  readonly graceMs: number;
  readonly client: WorkerServiceClient;
  private readonly token?: string;
  private readonly log: (line: string) => void;
  private readonly handlers: { glob: string; re: RegExp; handler: Handler }[] = [];
  private readonly inFlight = new Map<Promise<unknown>, () => Promise<unknown>>();
  private readonly stopping = new AbortController();
  private streamed = false;
  private stopped?: Promise<void>;

  constructor(o: WorkerOptions) {
    super();
    this.workerId = o.workerId;
    this.maxInFlight = o.maxInFlight ?? 4;
    this.leaseMs = o.leaseMs ?? 10000;
    this.graceMs = o.graceMs ?? 10000;
    this.token = o.token;
    this.log = o.log ?? ((line) => console.warn(line));
    this.client = new WorkerServiceClient(o.target, credentials(o.tls), channelOptions(o.tls));
  }

  /** Serves the task types matching `glob` (the first match wins). */
  task(glob: string, handler: Handler): this {
    this.handlers.push({ glob, re: globRe(glob), handler });
    return this;
  }

  private call<Res>(method: string, request: object, retries = 0, waitMs = 100): Promise<Res> {
    const fn = (this.client as unknown as Record<string, Function>)[method];
    return new Promise<Res>((resolve, reject) => fn.call(this.client, request,
      callMetadata(this.token), { deadline: Date.now() + 10000 },
      (err: ServiceError | null, res: Res) => (err ? reject(err) : resolve(res))))
      .catch(async (err: ServiceError) => {
        if (!retries || !TRANSIENT.has(err.code)) throw err;
        await sleep(waitMs);
        return this.call<Res>(method, request, retries - 1, waitMs * 2);
      });
  }

  /** Serves tasks until stop() or SIGTERM/SIGINT; resolves once drained. */
  async run(): Promise<void> {
    if (!this.handlers.length) throw new Error('register a handler with worker.task() first');
    const onSignal = () => { void this.stop(); };
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
      if (end && [status.UNAUTHENTICATED, status.PERMISSION_DENIED, status.INVALID_ARGUMENT]
        .includes(end.code)) {
        await this.stop();
        process.off('SIGTERM', onSignal).off('SIGINT', onSignal);
        throw toArborError(end);
      }
      this.emit('reconnect', { attempt: failures, delayMs, status: end });
      await sleep(delayMs, this.stopping.signal);
    }
    await this.stop();
    process.off('SIGTERM', onSignal).off('SIGINT', onSignal);
  }

  // One StreamTasks call; resolves with the status that ended it (null for OK).
  private session(onTask: () => void): Promise<StatusObject | null> {
    return new Promise((resolve) => {
      const request = { workerId: this.workerId, taskTypes: this.handlers.map((h) => h.glob),
        maxInFlight: this.maxInFlight, leaseMs: this.leaseMs };
      const call = this.client.streamTasks(request, callMetadata(this.token));
      const cancel = () => call.cancel();
      this.stopping.signal.addEventListener('abort', cancel);
      if (!this.streamed) { this.streamed = true; this.emit('ready'); }
      call.on('data', ({ task }: { task?: TaskActivation }) => {
        onTask();
        if (task) this.execute(task);
      });
      call.on('error', () => {}); // the status says it all
      call.on('status', (s: StatusObject) => {
        this.stopping.signal.removeEventListener('abort', cancel);
        resolve(s.code === status.OK ? null : s);
      });
    });
  }

  private execute(act: TaskActivation): void {
    const lease = { taskId: act.taskId, leaseToken: act.leaseToken };
    const abort = new AbortController();
    let details: unknown = act.details; // resent with each heartbeat: a retry keeps it
    let settled: Promise<unknown> | null = null; // once reported, handed back or lost
    const task: Task = {
      taskId: act.taskId, taskType: act.taskType, args: act.args ?? null,
      idempotencyKey: act.idempotencyKey, attempt: act.attempt, maxAttempts: act.maxAttempts,
      details: act.details, runId: act.runId, threadId: act.threadId,
      nodeLocator: act.nodeLocator, signal: abort.signal,
      get cancelled() { return abort.signal.aborted; },
      heartbeat: async (d?: unknown) => {
        if (d !== undefined) details = JSON.parse(JSON.stringify(d) ?? 'null');
        const resp = await this.call<{ cancelRequested: boolean }>('heartbeat',
          { ...lease, details }).catch((err: ServiceError) => {
          if (LOST.has(err.code) && !settled) {
            settled = Promise.resolve();
            abort.abort(err);
            this.emit('lost', task, err);
          }
          throw err;
        });
        if (resp.cancelRequested) abort.abort(new Error('cancellation requested'));
        return resp;
      },
    };
    let beating: Promise<unknown> | null = null;
    const beat = setInterval(() => {
      beating ||= task.heartbeat().catch(() => {}).finally(() => { beating = null; });
    }, Math.max(50, (act.leaseMs || this.leaseMs) / 3));
    const settle = (method: Report, request: object) => {
      clearInterval(beat);
      settled ||= this.report(task, method, { ...lease, ...request });
      return settled;
    };
    // Once a shutdown's grace is over (or before a task started): hand it back now, without
    // spending an attempt, not at lease expiry.
    const abandon = () => {
      if (settled) return settled;
      // Settled first, so what the handler still returns is not reported.
      const released = settle('releaseTask', { reason: `worker ${this.workerId} shutting down` });
      abort.abort(new Error('worker shutting down'));
      return released;
    };
    const handler = this.handlers.find((h) => h.re.test(act.taskType));
    const done: Promise<unknown> = (async () => {
      if (this.stopping.signal.aborted) return abandon();
      this.emit('task', task);
      try {
        if (!handler) throw new FatalError(`no handler for task type ${act.taskType}`);
        const output = await handler.handler(task);
        return settle('completeTask', { output: JSON.parse(JSON.stringify(output) ?? 'null') });
      } catch (err) {
        if (err instanceof BusinessError) {
          return settle('throwError', { code: String(err.code), message: err.message });
        }
        const e = err as Error;
        return settle('failTask', { error: String(e?.message ?? err),
          retryable: !(err instanceof FatalError),
          backoffMs: err instanceof RetryableError ? err.backoffMs : undefined });
      }
    })().finally(() => { clearInterval(beat); this.inFlight.delete(done); });
    this.inFlight.set(done, abandon);
  }

  private async report(task: Task, method: Report, request: object): Promise<void> {
    try {
      // Worth a few tries while the lease lasts; after it, the task comes back anyway.
      const resp = await this.call<{ accepted?: boolean; reason?: string }>(method, request, 5);
      if (resp.accepted === false) this.log(`${method} ${task.taskId} ignored: ${resp.reason}`);
      this.emit(EVENT[method], task, resp, request);
    } catch (err) {
      const e = err as ServiceError;
      if (LOST.has(e.code)) this.emit('lost', task, err);
      else this.log(`${method} ${task.taskId} failed: ${e.code} ${e.details || e.message}`);
    }
  }

  /** Stops taking tasks, lets the running ones finish for up to graceMs, then releases the
   * rest. */
  stop(graceMs = this.graceMs): Promise<void> {
    this.stopped ||= (async () => {
      this.stopping.abort();
      let timer: NodeJS.Timeout | undefined;
      const grace = new Promise((r) => { timer = setTimeout(r, graceMs); timer.unref(); });
      await Promise.race([Promise.allSettled(this.inFlight.keys()), grace]);
      clearTimeout(timer);
      await Promise.allSettled([...this.inFlight.values()].map((abandon) => abandon()));
      this.client.close();
      this.emit('stopped');
    })();
    return this.stopped;
  }
}
