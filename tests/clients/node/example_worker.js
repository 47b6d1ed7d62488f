#!/usr/bin/env node
// A tool in Node: serves `node.greet` to runner-svc until SIGTERM/SIGINT.
//
//   node example_worker.js --runner 127.0.0.1:50051    (ARBOR_TOKEN: the bearer token, if any)

'use strict';

const { Worker } = require('./arbor_worker');

const at = process.argv.indexOf('--runner');
const worker = new Worker({
  target: at > 0 ? process.argv[at + 1] : '127.0.0.1:50051',
  workerId: `greeter-${process.pid}`,
  token: process.env.ARBOR_TOKEN,
});

worker.task('node.greet', async ({ args }) => ({ greeting: `Hello, ${args.name}` }));

worker.run().catch((err) => {
  console.error(err.message);
  process.exit(1);
});
