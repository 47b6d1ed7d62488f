// Calls made inside an OpenTelemetry span carry that span's W3C trace context (`traceparent`),
// seen by a small RunnerService in the test; calls outside any span carry none.

import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { test } from 'node:test';

import { context, propagation, trace, TraceFlags } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { Server, ServerCredentials, type ServerUnaryCall } from '@grpc/grpc-js';

import { ArborClient } from '../src';
import { RunnerServiceService, SubmitRunResponse } from '../src/gen/arbor/runner/v1/runner_service';

test('a call inside a span carries its trace id', async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const seen: Record<string, string>[] = [];
  const server = new Server();
  server.addService(RunnerServiceService, {
    submitRun: (call: ServerUnaryCall<unknown, unknown>, cb: (e: null, r: object) => void) => {
      const md = call.metadata.getMap();
      seen.push(Object.fromEntries(Object.entries(md).map(([k, v]) => [k, String(v)])));
      cb(null, SubmitRunResponse.fromPartial({ run: { runId: 'r-1' } }));
    },
  } as never);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0',
    ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  const client = new ArborClient({ runner: `127.0.0.1:${port}` });
  try {
    await client.submitRun('t'); // no span: nothing to propagate
    const span = { traceId: randomBytes(16).toString('hex'), spanId: randomBytes(8).toString('hex'),
      traceFlags: TraceFlags.SAMPLED };
    await context.with(trace.setSpanContext(context.active(), span), () => client.submitRun('t'));
    const [outside, inside] = seen;
    assert.equal(outside.traceparent, undefined);
    assert.equal(inside.traceparent, `00-${span.traceId}-${span.spanId}-01`);
  } finally {
    client.close();
    server.forceShutdown();
  }
});
