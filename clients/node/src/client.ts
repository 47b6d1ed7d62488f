// The client: runs (register, submit, get, list, cancel, follow), approvals (list, watch, decide,
// claim, comment, delegate…), user input and external results. Every method returns a promise
// (or an async iterator) and rejects with an `ArborError`.

import type { CallOptions, ClientReadableStream, ClientUnaryCall, Metadata,
  ServiceError } from '@grpc/grpc-js';
import { randomUUID } from 'node:crypto';

import {
  ApprovalFilter, ApprovalServiceClient, ApprovalState, ResolveRequest as DecideRequest,
  type Approval, type AuditEntry, type BulkResolveResponse, type Delegation,
  type ResolveResponse as DecideResponse, type WatchApprovalsResponse,
} from './gen/arbor/approval/v1/approval_service';
import { EventKind, type Event } from './gen/arbor/runner/v1/events';
import {
  ListRunsRequest, ResolveRequest, RunnerServiceClient, StreamEventsRequest, SubmitRunRequest,
  type ResolveResponse, type SubmitRunResponse,
} from './gen/arbor/runner/v1/runner_service';
import {
  DecisionKind, ResolveAction, RestorePolicy, RunStatus, type Run, type Tree,
} from './gen/arbor/runner/v1/types';
import { BACKOFF_CAP_MS, type ConnectOptions, callMetadata, channelOptions, credentials,
  sleep } from './connection';
import { toArborError } from './errors';

type Unary<Req, Res> = (req: Req, md: Metadata, opts: Partial<CallOptions>,
  cb: (err: ServiceError | null, res: Res) => void) => ClientUnaryCall;

/** An enum value given as its number or its name, short ("approve") or full. */
export type EnumLike = number | string;

export function enumNumber(e: Record<string, string | number>, prefix: string,
  value: EnumLike): number {
  if (typeof value === 'number') return value;
  let name = value.toUpperCase();
  if (!name.startsWith(prefix)) name = prefix + name;
  const n = e[name];
  if (typeof n !== 'number' || n < 0) {
    const known = Object.keys(e).filter((k) => k.startsWith(prefix) && !k.endsWith('UNSPECIFIED'))
      .map((k) => k.slice(prefix.length).toLowerCase());
    throw new RangeError(`unknown ${prefix.slice(0, -1).toLowerCase()} '${value}'; one of ${known.join(', ')}`);
  }
  return n;
}

/** Events after which a run has nothing more to say. */
export const RUN_END_KINDS: ReadonlySet<EventKind> = new Set([EventKind.EVENT_KIND_RUN_SUCCEEDED,
  EventKind.EVENT_KIND_RUN_FAILED, EventKind.EVENT_KIND_RUN_CANCELLED,
  EventKind.EVENT_KIND_RUN_SUPERSEDED]);

export interface SubmitOptions {
  version?: number;
  input?: Record<string, unknown>;
  threadId?: string;
  dedupeKey?: string;
  runId?: string;
  /** "never", "if_exists", "required". */
  restore?: EnumLike;
  priority?: number;
  maxAttempts?: number;
}

export interface FollowOptions {
  runId?: string;
  threadId?: string;
  /** Event kinds by name ("execution_suspended") or number; none: all. */
  kinds?: EnumLike[];
  /** A durable subscriber: events are acked as the loop goes, and a new process with the same
   * id goes on from its acked cursor. */
  subscriberId?: string;
  /** Start after this seq (default: the subscriber's cursor, else the beginning). */
  afterSeq?: number;
  /** End after the run's last event (succeeded, failed, cancelled, superseded). */
  untilRunEnds?: boolean;
  /** Stops the iteration. */
  signal?: AbortSignal;
  /** Called before each reconnect (the stream broke). */
  onReconnect?: (err: Error, delayMs: number) => void;
}

export type ApprovalFilterLike = Partial<Omit<ApprovalFilter, 'states'>> & { states?: EnumLike[] };

export interface DecideOptions {
  reason?: string;
  /** EDIT: the new arguments. */
  args?: unknown;
  /** RESPOND: the stand-in result. */
  result?: unknown;
  /** The `argsDigest` the decider looked at: changed arguments are FAILED_PRECONDITION. */
  expectedDigest?: string;
}

export interface AnswerOptions {
  /** Idempotency key: a repeat with the same id changes nothing (default: a new one). */
  decisionId?: string;
  reason?: string;
}

export class ArborClient {
  readonly runner?: RunnerServiceClient;
  readonly approvals?: ApprovalServiceClient;
  private readonly token?: string;
  private readonly timeoutMs: number;

  /** `runner` and `approval` are host:port (either may be left out). */
  constructor(addresses: { runner?: string; approval?: string }, opts: ConnectOptions = {}) {
    this.token = opts.token;
    this.timeoutMs = opts.timeoutMs ?? 30000;
    const creds = credentials(opts.tls);
    if (addresses.runner) {
      this.runner = new RunnerServiceClient(addresses.runner, creds, channelOptions(opts.tls));
    }
    if (addresses.approval) {
      this.approvals = new ApprovalServiceClient(addresses.approval, creds,
        channelOptions(opts.tls));
    }
  }

  close(): void {
    this.runner?.close();
    this.approvals?.close();
  }

  private r(): RunnerServiceClient {
    if (!this.runner) throw new Error('this client was made without a runner address');
    return this.runner;
  }

  private a(): ApprovalServiceClient {
    if (!this.approvals) throw new Error('this client was made without an approval address');
    return this.approvals;
  }

  private call<Req, Res>(client: object, method: Unary<Req, Res>, req: Req): Promise<Res> {
    return new Promise((resolve, reject) => {
      method.call(client, req, callMetadata(this.token),
        { deadline: Date.now() + this.timeoutMs },
        (err, res) => (err ? reject(toArborError(err)) : resolve(res)));
    });
  }

  // -- trees and runs -------------------------------------------------------------------------

  /** Registers a tree version (its JSON document, or the object it parses to). */
  async registerTree(document: string | object): Promise<Tree> {
    const doc = typeof document === 'string' ? document : JSON.stringify(document);
    const res = await this.call(this.r(), this.r().registerTree, { document: doc, format: 0 });
    return res.tree!;
  }

  /** Starts a run of a tree (version 0: the latest); a live `dedupeKey` returns the first run. */
  submitRun(treeId: string, o: SubmitOptions = {}): Promise<SubmitRunResponse> {
    return this.call(this.r(), this.r().submitRun, SubmitRunRequest.fromPartial({
      treeId, treeVersion: o.version ?? 0, input: o.input, threadId: o.threadId ?? '',
      dedupeKey: o.dedupeKey ?? '', runId: o.runId ?? '', priority: o.priority ?? 0,
      maxAttempts: o.maxAttempts ?? 0,
      restorePolicy: enumNumber(RestorePolicy, 'RESTORE_POLICY_', o.restore ?? 0),
    }));
  }

  async getRun(runId: string): Promise<Run> {
    return (await this.call(this.r(), this.r().getRun, { runId })).run!;
  }

  /** Every matching run, page after page. */
  async *listRuns(f: { threadId?: string; treeId?: string; statuses?: EnumLike[];
    pageSize?: number } = {}): AsyncGenerator<Run> {
    let pageToken = '';
    do {
      const page = await this.call(this.r(), this.r().listRuns, ListRunsRequest.fromPartial({
        threadId: f.threadId ?? '', treeId: f.treeId ?? '', pageSize: f.pageSize ?? 100,
        pageToken, statuses: (f.statuses ?? []).map((s) => enumNumber(RunStatus, 'RUN_STATUS_', s)),
      }));
      yield* page.runs;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  async cancelRun(runId: string, reason = ''): Promise<Run> {
    return (await this.call(this.r(), this.r().cancelRun, { runId, reason })).run!;
  }

  /**
   * The events of a run, a thread or everything, live: the backlog, then each new event. When
   * the stream breaks (the runner restarts, the network drops) it reconnects with backoff and
   * resumes after the last event it yielded: every event comes once, in order. With a
   * `subscriberId`, each event is acked once the loop body that got it is done.
   */
  async *follow(o: FollowOptions = {}): AsyncGenerator<Event> {
    const filter = { runId: o.runId ?? '', threadId: o.threadId ?? '',
      kinds: (o.kinds ?? []).map((k) => enumNumber(EventKind, 'EVENT_KIND_', k)) };
    let last = o.afterSeq;
    let backoff = 100;
    while (!o.signal?.aborted) {
      const call: ClientReadableStream<{ event?: Event }> = this.r().streamEvents(
        StreamEventsRequest.fromPartial({ subscriberId: o.subscriberId ?? '', afterSeq: last,
          filter, follow: true }), callMetadata(this.token));
      const cancel = () => call.cancel();
      o.signal?.addEventListener('abort', cancel);
      try {
        for await (const item of call) {
          const e = item.event!;
          if (last !== undefined && e.seq <= last) continue; // replayed: an ack got lost
          backoff = 100;
          yield e;
          last = e.seq;
          if (o.subscriberId) await this.ack(o.subscriberId, e.seq);
          if (o.untilRunEnds && RUN_END_KINDS.has(e.kind)) return;
        }
      } catch (err) {
        const error = toArborError(err);
        if (o.signal?.aborted) return;
        if (!error.transient) throw error;
        o.onReconnect?.(error, backoff);
      } finally {
        o.signal?.removeEventListener('abort', cancel);
        call.cancel();
      }
      await sleep(backoff, o.signal);
      backoff = Math.min(backoff * 2, BACKOFF_CAP_MS);
    }
  }

  private async ack(subscriberId: string, seq: number): Promise<void> {
    try {
      await this.call(this.r(), this.r().ack, { subscriberId, seq });
    } catch (err) {
      // The stream resumes after `seq` anyway; a later ack covers this one.
      if (!toArborError(err).transient) throw err;
    }
  }

  // -- user input and external results --------------------------------------------------------

  private answer(runId: string, requestId: string, result: unknown, cancel: boolean,
    o: AnswerOptions): Promise<ResolveResponse> {
    return this.call(this.r(), this.r().resolve, ResolveRequest.fromPartial({
      runId, requestId, decisionId: o.decisionId || `${requestId}:${randomUUID()}`,
      reason: o.reason ?? '', result,
      action: cancel ? ResolveAction.RESOLVE_ACTION_CANCEL : ResolveAction.RESOLVE_ACTION_RESUME,
    }));
  }

  /** Answers a `user_input` suspension with `value`. */
  answerInput(runId: string, requestId: string, value: unknown,
    o: AnswerOptions = {}): Promise<ResolveResponse> {
    return this.answer(runId, requestId, { value }, false, o);
  }

  /** Reports the result of an `external` suspension (`failed`: it did not succeed). */
  completeExternal(runId: string, requestId: string, result: unknown,
    o: AnswerOptions & { failed?: boolean } = {}): Promise<ResolveResponse> {
    return this.answer(runId, requestId,
      { status: o.failed ? 'failed' : 'succeeded', result: result ?? null }, false, o);
  }

  /** Cancels a user input or external suspension (the node fails). */
  cancelSuspension(runId: string, requestId: string,
    o: AnswerOptions = {}): Promise<ResolveResponse> {
    return this.answer(runId, requestId, undefined, true, o);
  }

  // -- approvals ------------------------------------------------------------------------------

  private filter(f: ApprovalFilterLike): ApprovalFilter {
    return ApprovalFilter.fromPartial({ ...f,
      states: (f.states ?? []).map((s) => enumNumber(ApprovalState, 'APPROVAL_STATE_', s)) });
  }

  /** Every matching approval, page after page (`{states: ['pending'], runId}`…). */
  async *listApprovals(f: ApprovalFilterLike = {}, pageSize = 100): AsyncGenerator<Approval> {
    let pageToken = '';
    do {
      const page = await this.call(this.a(), this.a().listApprovals,
        { filter: this.filter(f), pageSize, pageToken });
      yield* page.approvals;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  async getApproval(requestId: string): Promise<Approval> {
    return (await this.call(this.a(), this.a().getApproval, { requestId })).approval!;
  }

  /** The matching approvals now (SNAPSHOT… SNAPSHOT_END), then every change. */
  async *watchApprovals(f: ApprovalFilterLike = {},
    signal?: AbortSignal): AsyncGenerator<WatchApprovalsResponse> {
    const call = this.a().watchApprovals({ filter: this.filter(f) }, callMetadata(this.token));
    const cancel = () => call.cancel();
    signal?.addEventListener('abort', cancel);
    try {
      for await (const change of call) yield change as WatchApprovalsResponse;
    } catch (err) {
      if (!signal?.aborted) throw toArborError(err);
    } finally {
      signal?.removeEventListener('abort', cancel);
      call.cancel();
    }
  }

  /** Decides (or, under a quorum, votes on) an approval: "approve", "reject", "edit" (with
   * `args`) or "respond" (with `result`). */
  decide(requestId: string, decision: EnumLike, o: DecideOptions = {}): Promise<DecideResponse> {
    return this.call(this.a(), this.a().resolve, DecideRequest.fromPartial({
      requestId, reason: o.reason ?? '', args: o.args, result: o.result,
      expectedDigest: o.expectedDigest ?? '',
      decision: enumNumber(DecisionKind, 'DECISION_KIND_', decision),
    }));
  }

  approve(requestId: string, o: DecideOptions = {}): Promise<DecideResponse> {
    return this.decide(requestId, 'approve', o);
  }

  reject(requestId: string, reason = ''): Promise<DecideResponse> {
    return this.decide(requestId, 'reject', { reason });
  }

  bulkDecide(requestIds: string[], decision: EnumLike,
    o: { reason?: string; expectedDigests?: Record<string, string>; limit?: number } = {},
  ): Promise<BulkResolveResponse> {
    return this.call(this.a(), this.a().bulkResolve, {
      requestIds, reason: o.reason ?? '', limit: o.limit ?? 0, args: undefined,
      result: undefined, expectedDigests: o.expectedDigests ?? {},
      decision: enumNumber(DecisionKind, 'DECISION_KIND_', decision),
    });
  }

  /** Claims an approval for the caller (ttlMs 0: until released). */
  async claim(requestId: string, ttlMs = 0): Promise<Approval> {
    return (await this.call(this.a(), this.a().claim,
      { requestId, ttlMs, release: false })).approval!;
  }

  async releaseClaim(requestId: string): Promise<Approval> {
    return (await this.call(this.a(), this.a().claim,
      { requestId, ttlMs: 0, release: true })).approval!;
  }

  async reassign(requestId: string, to: string): Promise<Approval> {
    return (await this.call(this.a(), this.a().reassign, { requestId, to })).approval!;
  }

  async comment(requestId: string, text: string): Promise<Approval> {
    return (await this.call(this.a(), this.a().comment, { requestId, text })).approval!;
  }

  /** Lets `to` decide in the caller's (or, for an operator, `from`'s) place. */
  async delegate(to: string, o: { from?: string; scope?: string; starts?: Date;
    ends?: Date } = {}): Promise<Delegation> {
    return (await this.call(this.a(), this.a().delegate, { to, from: o.from ?? '',
      scope: o.scope ?? '', starts: o.starts, ends: o.ends })).delegation!;
  }

  async revokeDelegation(id: string): Promise<void> {
    await this.call(this.a(), this.a().revokeDelegation, { id });
  }

  async listDelegations(principal = ''): Promise<Delegation[]> {
    return (await this.call(this.a(), this.a().listDelegations, { principal })).delegations;
  }

  async *auditLog(f: { requestId?: string; runId?: string } = {}): AsyncGenerator<AuditEntry> {
    let pageToken = '';
    do {
      const page = await this.call(this.a(), this.a().getAuditLog, { requestId: f.requestId ?? '',
        runId: f.runId ?? '', pageSize: 100, pageToken });
      yield* page.entries;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }
}
