// The services under test come from the environment (the repository's end-to-end test starts
// both binaries with authentication on and sets these): ARBOR_RUNNER, ARBOR_APPROVAL
// (host:port), ARBOR_SUBMITTER_TOKEN, ARBOR_APPROVER_TOKEN, ARBOR_WORKER_TOKEN.

import { randomUUID } from 'node:crypto';

import { ArborClient } from '../src';

export function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: these tests run against real services`);
  return value;
}

export const unique = (prefix: string) => `${prefix}-${randomUUID().slice(0, 10)}`;

export const submitter = () => new ArborClient({ runner: env('ARBOR_RUNNER') },
  { token: env('ARBOR_SUBMITTER_TOKEN') });

export const approver = () => new ArborClient(
  { runner: env('ARBOR_RUNNER'), approval: env('ARBOR_APPROVAL') },
  { token: env('ARBOR_APPROVER_TOKEN') });

/** An approval gate in front of a ledger append (a built-in tool). */
export const gateTree = (id: string) => ({
  id, version: 1,
  root: { type: 'sequence', name: 'main', children: [
    { type: 'set', name: 'plan', key: 'plan', value: { service: 'billing' } },
    { type: 'approval', name: 'gate', phase: 'before', on_reject: 'failure',
      title: 'Ship billing?', context: ['plan'],
      child: { type: 'tool', name: 'ship', tool: 'ledger.append',
        args: { entry: { $ref: 'plan' } }, output: 'receipt' } },
  ] },
});
