// Channels (address, token, TLS) and per-call metadata, shared by the client and the worker.

import { ChannelCredentials, Metadata, type ChannelOptions } from '@grpc/grpc-js';

import { injectTraceContext } from './tracing';

/** TLS for a connection: the CA that signed the server (none: the system's roots), and a
 * client certificate and key for mutual TLS, PEM. */
export interface TlsOptions {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
  /** Override the name checked against the server's certificate. */
  serverName?: string;
}

export interface ConnectOptions {
  /** Sent as `authorization: Bearer …`. */
  token?: string;
  /** `true`: TLS with the system's roots; an object: as given; absent: plaintext. */
  tls?: boolean | TlsOptions;
  /** Deadline of every unary call, ms (default 30 s). */
  timeoutMs?: number;
}

export const BACKOFF_CAP_MS = 2000;

// grpc's own reconnect backoff grows to minutes; keepalive notices a dead connection under a
// stream that may stay idle for hours.
const CHANNEL_OPTIONS: ChannelOptions = {
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': BACKOFF_CAP_MS,
  'grpc.keepalive_time_ms': 20000,
  'grpc.keepalive_timeout_ms': 10000,
  'grpc.max_receive_message_length': 64 << 20,
};

export function credentials(tls: ConnectOptions['tls']): ChannelCredentials {
  if (!tls) return ChannelCredentials.createInsecure();
  const t = tls === true ? {} : tls;
  return ChannelCredentials.createSsl(t.ca ?? null, t.key ?? null, t.cert ?? null);
}

export function channelOptions(tls: ConnectOptions['tls']): ChannelOptions {
  const name = typeof tls === 'object' ? tls.serverName : undefined;
  return name ? { ...CHANNEL_OPTIONS, 'grpc.ssl_target_name_override': name } : CHANNEL_OPTIONS;
}

/** What every call carries: the token and the caller's trace context. */
export function callMetadata(token: string | undefined): Metadata {
  const md = new Metadata();
  if (token) md.set('authorization', `Bearer ${token}`);
  return injectTraceContext(md);
}

export const sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() { clearTimeout(t); signal?.removeEventListener('abort', done); resolve(); }
    signal?.addEventListener('abort', done);
  });
