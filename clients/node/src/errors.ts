// Typed errors for failed calls, carrying the gRPC code and the rich error details.
//
// Every method rejects with an `ArborError` whose `code` is the gRPC status code (`codeName` its
// name). When the service sent `google.rpc.Status` details (the `grpc-status-details-bin`
// trailer), `details` lists them ({typeUrl, value}) and `fieldViolations` holds the
// `google.rpc.BadRequest` violations an INVALID_ARGUMENT names (which field, what is wrong).

import { BinaryReader } from '@bufbuild/protobuf/wire';
import { Metadata, status, type ServiceError } from '@grpc/grpc-js';

export interface FieldViolation {
  field: string;
  description: string;
}

export interface ErrorDetail {
  typeUrl: string;
  value: Uint8Array;
}

const TRANSIENT = new Set<number>([status.UNAVAILABLE, status.DEADLINE_EXCEEDED,
  status.RESOURCE_EXHAUSTED, status.UNKNOWN, status.CANCELLED]);

export class ArborError extends Error {
  readonly codeName: string;
  readonly fieldViolations: FieldViolation[];

  constructor(readonly code: status, message: string, readonly details: ErrorDetail[] = []) {
    super(`${status[code] ?? code}: ${message}`);
    this.name = 'ArborError';
    this.codeName = status[code] ?? String(code);
    this.fieldViolations = details
      .filter((d) => d.typeUrl.endsWith('/google.rpc.BadRequest'))
      .flatMap((d) => decodeBadRequest(d.value));
  }

  /** Whether the same call may succeed when retried (the service was away or busy). */
  get transient(): boolean {
    return TRANSIENT.has(this.code);
  }
}

function decodeStatusDetails(raw: Uint8Array): ErrorDetail[] {
  // google.rpc.Status { int32 code = 1; string message = 2; repeated Any details = 3; }
  const out: ErrorDetail[] = [];
  const r = new BinaryReader(raw);
  while (r.pos < r.len) {
    const [field, wire] = r.tag();
    if (field !== 3) { r.skip(wire); continue; }
    const any = new BinaryReader(r.bytes());
    const detail: ErrorDetail = { typeUrl: '', value: new Uint8Array() };
    while (any.pos < any.len) {
      const [f, w] = any.tag();
      if (f === 1) detail.typeUrl = any.string();
      else if (f === 2) detail.value = any.bytes();
      else any.skip(w);
    }
    out.push(detail);
  }
  return out;
}

function decodeBadRequest(raw: Uint8Array): FieldViolation[] {
  // google.rpc.BadRequest { repeated FieldViolation field_violations = 1; }
  const out: FieldViolation[] = [];
  const r = new BinaryReader(raw);
  while (r.pos < r.len) {
    const [field, wire] = r.tag();
    if (field !== 1) { r.skip(wire); continue; }
    const v = new BinaryReader(r.bytes());
    const violation: FieldViolation = { field: '', description: '' };
    while (v.pos < v.len) {
      const [f, w] = v.tag();
      if (f === 1) violation.field = v.string();
      else if (f === 2) violation.description = v.string();
      else v.skip(w);
    }
    out.push(violation);
  }
  return out;
}

/** The typed error for what a grpc-js call failed with. */
export function toArborError(err: unknown): ArborError {
  if (err instanceof ArborError) return err;
  const e = err as Partial<ServiceError>;
  let details: ErrorDetail[] = [];
  const raw = e.metadata instanceof Metadata ? e.metadata.get('grpc-status-details-bin') : [];
  if (raw.length && raw[0] instanceof Buffer) {
    try {
      details = decodeStatusDetails(raw[0]);
    } catch {
      details = []; // undecodable details must not hide the error itself
    }
  }
  return new ArborError(e.code ?? status.UNKNOWN, e.details ?? String(e.message ?? err), details);
}
