// Arbor from Node: submit and follow runs, decide approvals, answer user input and external
// results (`ArborClient`), and serve tools as a task worker (`Worker`). Failed calls reject with
// an `ArborError`. The generated messages and enums are re-exported for the fields the methods
// return.

export { ArborClient, RUN_END_KINDS, enumNumber } from './client';
export type { ApprovalFilterLike, AnswerOptions, DecideOptions, EnumLike, FollowOptions,
  SubmitOptions } from './client';
export type { ConnectOptions, TlsOptions } from './connection';
export { ArborError, toArborError } from './errors';
export type { ErrorDetail, FieldViolation } from './errors';
export { injectTraceContext } from './tracing';
export { BusinessError, FatalError, RetryableError, Worker } from './worker';
export type { Handler, Task, WorkerOptions } from './worker';
export * as approval from './gen/arbor/approval/v1/approval_service';
export * as events from './gen/arbor/runner/v1/events';
export * as runner from './gen/arbor/runner/v1/runner_service';
export * as types from './gen/arbor/runner/v1/types';
export * as workers from './gen/arbor/runner/v1/worker_service';
export { EventKind } from './gen/arbor/runner/v1/events';
export { ApprovalState } from './gen/arbor/approval/v1/approval_service';
export { DecisionKind, RunStatus, SuspensionCategory } from './gen/arbor/runner/v1/types';
