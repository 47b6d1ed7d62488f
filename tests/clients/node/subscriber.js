#!/usr/bin/env node
// A durable Arbor event subscriber in Node.js, with the stubs loaded from proto/ at run time.
//
// It follows RunnerService.StreamEvents as the named subscriber SUBSCRIBER: the first stream
// starts after --after (or at the subscriber's acked cursor on the runner), every event is
// processed once and then acked, and when the stream breaks (runner restart, network) it
// reconnects with exponential backoff and resumes from its acked cursor. Events the runner
// replays because an ack was lost are recognised by seq and skipped, so nothing is processed
// twice and, since seqs are gap-free, a gap would be visible.
//
//   node subscriber.js --runner 127.0.0.1:50051 --subscriber audit [--run RUN_ID]
//                      [--after SEQ] [--until RUN_SUCCEEDED] [--timeout-ms 60000]
//
// Output, one line per step: `event seq=N kind=KIND run=RUN`, `duplicate seq=N skipped`,
// `acked seq=N`, `reconnect attempt=K in=MSms after=CODE: MESSAGE`, `done`.
// Exit 0 after processing the --until event; 1 on timeout or a permanent error.

'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

function parseArgs(argv) {
  const opts = {
    runner: '127.0.0.1:50051',
    subscriber: '',
    run: '',
    after: null,
    until: '',
    timeoutMs: 60000,
    proto: path.resolve(__dirname, '../../../proto'),
  };
  for (let i = 0; i < argv.length; i += 1) {
    const flag = argv[i];
    const value = argv[i + 1];
    switch (flag) {
      case '--runner': opts.runner = value; i += 1; break;
      case '--subscriber': opts.subscriber = value; i += 1; break;
      case '--run': opts.run = value; i += 1; break;
      case '--after': opts.after = Number(value); i += 1; break;
      case '--until': opts.until = value; i += 1; break;
      case '--timeout-ms': opts.timeoutMs = Number(value); i += 1; break;
      case '--proto': opts.proto = value; i += 1; break;
      default:
        throw new Error(`unknown argument ${flag}`);
    }
  }
  if (!opts.subscriber) throw new Error('--subscriber is required (a durable subscriber id)');
  return opts;
}

function loadRunner(protoRoot) {
  const definition = protoLoader.loadSync('arbor/runner/v1/runner_service.proto', {
    includeDirs: [protoRoot],
    keepCase: true,
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).arbor.runner.v1.RunnerService;
}

// Codes after which retrying cannot help: the request itself is wrong or was refused.
const PERMANENT = new Set([
  grpc.status.INVALID_ARGUMENT,
  grpc.status.OUT_OF_RANGE,
  grpc.status.PERMISSION_DENIED,
  grpc.status.UNAUTHENTICATED,
  grpc.status.UNIMPLEMENTED,
]);

function log(line) {
  process.stdout.write(`${line}\n`);
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const RunnerService = loadRunner(opts.proto);
  const client = new RunnerService(opts.runner, grpc.credentials.createInsecure());
  const kindName = (k) => String(k).replace(/^EVENT_KIND_/, '');

  let processed = opts.after === null ? 0 : opts.after; // last seq handled (processed + acked)
  let firstStream = true;
  let attempt = 0;
  let finished = false;

  const deadline = Date.now() + opts.timeoutMs;
  const timer = setTimeout(() => {
    log(`timeout after ${opts.timeoutMs}ms; last processed seq=${processed}`);
    process.exit(1);
  }, opts.timeoutMs);

  const ack = (seq) => new Promise((resolve, reject) => {
    client.Ack({ subscriber_id: opts.subscriber, seq }, { deadline: Date.now() + 10000 },
      (err, resp) => (err ? reject(err) : resolve(resp)));
  });

  // One stream session; resolves with the error (or null) that ended it.
  const session = () => new Promise((resolve) => {
    const request = {
      subscriber_id: opts.subscriber,
      follow: true,
      filter: { run_id: opts.run, thread_id: '', kinds: [] },
    };
    // The first stream starts where asked; every reconnect resumes from the acked cursor.
    if (firstStream && opts.after !== null) request.after_seq = opts.after;
    firstStream = false;
    const call = client.StreamEvents(request);
    let chain = Promise.resolve();
    let ended = false;
    const end = (err) => {
      if (ended) return;
      ended = true;
      // Let the events already received finish before deciding what comes next.
      chain.then(() => resolve(err), () => resolve(err));
    };
    call.on('data', (item) => {
      chain = chain.then(async () => {
        if (finished) return;
        const e = item.event;
        if (e.seq <= processed) {
          log(`duplicate seq=${e.seq} skipped`);
          return;
        }
        attempt = 0;
        log(`event seq=${e.seq} kind=${kindName(e.kind)} run=${e.run_id}`);
        processed = e.seq;
        await ack(e.seq);
        log(`acked seq=${e.seq}`);
        if (opts.until && kindName(e.kind) === opts.until) {
          finished = true;
          call.cancel();
        }
      }).catch((err) => {
        // An ack that failed is retried by the replay after the reconnect (and then skipped
        // as a duplicate, its processing already done): end this session.
        log(`ack failed: ${err.code} ${err.details || err.message}`);
        call.cancel();
      });
    });
    call.on('error', (err) => end(err));
    call.on('end', () => end(null));
  });

  while (!finished) {
    const err = await session();
    if (finished) break;
    if (err && PERMANENT.has(err.code)) {
      log(`permanent error ${err.code}: ${err.details}`);
      process.exit(1);
    }
    attempt += 1;
    const base = Math.min(2000, 100 * 2 ** (attempt - 1));
    const wait = Math.round(base / 2 + Math.random() * (base / 2));
    const why = err ? `${err.code}: ${err.details}` : 'stream ended';
    log(`reconnect attempt=${attempt} in=${wait}ms after=${why}`);
    if (Date.now() + wait > deadline) break;
    await new Promise((r) => setTimeout(r, wait));
  }
  clearTimeout(timer);
  client.close();
  if (!finished) {
    log(`gave up; last processed seq=${processed}`);
    process.exit(1);
  }
  log('done');
}

main().catch((err) => {
  log(`error: ${err.message}`);
  process.exit(1);
});
