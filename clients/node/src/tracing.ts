// W3C trace context from the caller's active OpenTelemetry span, as gRPC metadata.
//
// With `@opentelemetry/api` installed (an optional peer dependency), every call carries
// `traceparent` (and `tracestate`) of the span active at the call, through the globally
// registered propagator; without it, nothing is added.

import type { Metadata } from '@grpc/grpc-js';

type OtelApi = typeof import('@opentelemetry/api');

let api: OtelApi | null | undefined;

function otel(): OtelApi | null {
  if (api === undefined) {
    try {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      api = require('@opentelemetry/api') as OtelApi;
    } catch {
      api = null; // tracing is optional
    }
  }
  return api;
}

/** Adds the active span's propagation headers to `md` (nothing without OpenTelemetry). */
export function injectTraceContext(md: Metadata): Metadata {
  const o = otel();
  if (!o) return md;
  const carrier: Record<string, string> = {};
  o.propagation.inject(o.context.active(), carrier);
  for (const [k, v] of Object.entries(carrier)) md.set(k.toLowerCase(), v);
  return md;
}
