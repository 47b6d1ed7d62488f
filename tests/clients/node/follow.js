#!/usr/bin/env node
// A durable follower of a run's events with the arbor-client package (run with NODE_PATH
// pointing at a node_modules holding it), for the end-to-end test that kills runner-svc under it:
//
//   node follow.js --runner HOST:PORT --subscriber ID --run RUN_ID
//
// Prints `event seq=N kind=KIND` for each event the iterator yields (it acks each as it goes and
// resumes after a disconnect), `reconnect CODE` when the stream broke, and `done` after the run's
// last event.

'use strict';

const { ArborClient, EventKind } = require('arbor-client');

async function main() {
  const opts = {};
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) opts[argv[i].replace(/^--/, '')] = argv[i + 1];
  const arbor = new ArborClient({ runner: opts.runner }, { timeoutMs: 10000 });
  const say = (line) => process.stdout.write(`${line}\n`);
  for await (const e of arbor.follow({ runId: opts.run, subscriberId: opts.subscriber,
    afterSeq: 0, untilRunEnds: true, onReconnect: (err) => say(`reconnect ${err.codeName}`) })) {
    say(`event seq=${e.seq} kind=${EventKind[e.kind].replace(/^EVENT_KIND_/, '')}`);
  }
  arbor.close();
  say('done');
}

main().catch((err) => {
  process.stdout.write(`error: ${err.message}\n`);
  process.exit(1);
});
