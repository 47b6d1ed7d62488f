// What every spec shares: who is who (tokens from the cargo test that started the services),
// the services' own CLIs for what happens outside the browser (submitting runs, deciding through
// the gRPC API), signing a person in in a context of their own, and the axe-core check.
import { execFileSync } from 'node:child_process';
import * as path from 'node:path';
import AxeBuilder from '@axe-core/playwright';
import { Browser, BrowserContext, Page, expect } from '@playwright/test';

export type Person = 'alice' | 'bob' | 'carol' | 'sam';

function env(name: string): string {
  const v = process.env[name];
  if (!v) {
    throw new Error(`${name} is not set: run the browser suite through \`cargo test -p arbor-tests --test e2e inbox\``);
  }
  return v;
}

/** Each person's bearer token. alice, bob and carol approve (all three in group `payments`);
 * sam submits. bob also submits (`bob` is a submitter and an approver). */
export function token(who: Person): string {
  return env(`TOKEN_${who.toUpperCase()}`);
}

const TREES = path.join(__dirname, '..', 'trees');

function cli(bin: string, args: string[], who: Person, addr: [string, string]): string {
  try {
    return execFileSync(env(bin), args, {
      env: { ...process.env, [addr[0]]: addr[1], ARBOR_TOKEN: token(who) },
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
  } catch (e: unknown) {
    const err = e as { stderr?: string; stdout?: string; message: string };
    throw new Error(`${path.basename(env(bin))} ${args.join(' ')} as ${who} failed: ${err.stderr ?? ''}${err.stdout ?? ''}${err.message}`);
  }
}

/** runner-svc's CLI as `who`. */
export function runnerCli(args: string[], who: Person): string {
  return cli('RUNNER_BIN', args, who, ['ARBOR_RUNNER_ADDR', env('RUNNER_URL')]);
}

/** approval-svc's CLI (the gRPC API) as `who`. */
export function approvalCli(args: string[], who: Person): string {
  return cli('APPROVAL_BIN', args, who, ['ARBOR_ADDR', env('APPROVAL_URL')]);
}

/** Registers `tests/browser/trees/{tree}.json` and submits a run of it; the run's id. */
export function submit(tree: string, input: object, who: Person = 'sam'): string {
  const out = runnerCli(['submit', path.join(TREES, `${tree}.json`), '--input', JSON.stringify(input)], who);
  const m = /run (\S+) submitted/.exec(out);
  if (!m) throw new Error(`no run id in: ${out}`);
  return m[1];
}

export interface RunJson {
  run_id: string;
  status: string;
  blackboard: Record<string, unknown>;
  waiting_on: { request_id: string; node: string; category: string; payload: Record<string, unknown> }[];
}

export function getRun(runId: string, who: Person = 'sam'): RunJson {
  return JSON.parse(runnerCli(['get', runId], who)) as RunJson;
}

/** The run once the runner has it suspended: its first waiting request id. */
export async function suspended(runId: string, who: Person = 'sam'): Promise<string> {
  let rid = '';
  await expect
    .poll(() => {
      const run = getRun(runId, who);
      rid = run.status.toUpperCase() === 'SUSPENDED' && run.waiting_on.length > 0 ? run.waiting_on[0].request_id : '';
      return rid;
    }, { message: `run ${runId} to suspend`, timeout: 20_000, intervals: [50, 100, 200] })
    .not.toBe('');
  return rid;
}

export async function finished(runId: string, who: Person = 'sam'): Promise<RunJson> {
  let run: RunJson | undefined;
  await expect
    .poll(() => {
      run = getRun(runId, who);
      return run.status.toUpperCase();
    }, { message: `run ${runId} to end`, timeout: 20_000, intervals: [100, 200, 500] })
    .toMatch(/SUCCEEDED|FAILED|CANCELLED/);
  return run!;
}

/** A context of `who`'s own (its cookies are theirs alone), signed in with their token. */
export async function signIn(
  browser: Browser,
  who: Person,
  opts: { javaScriptEnabled?: boolean; baseURL?: string } = {},
): Promise<{ context: BrowserContext; page: Page }> {
  const context = await browser.newContext({
    javaScriptEnabled: opts.javaScriptEnabled ?? true,
    ...(opts.baseURL ? { baseURL: opts.baseURL } : {}),
  });
  const page = await context.newPage();
  await page.goto('/sign-in');
  await page.getByLabel('Token').fill(token(who));
  await page.getByRole('button', { name: 'Sign in' }).click();
  await expect(page.getByText(`Signed in as ${who}`)).toBeVisible();
  return { context, page };
}

/** The queue's group of rows for one run. */
export function runGroup(page: Page, runId: string) {
  return page.getByRole('region', { name: `Run ${runId}` });
}

/** No serious or critical accessibility violation on the page as it is now. */
export async function accessible(page: Page, view: string): Promise<void> {
  const results = await new AxeBuilder({ page }).analyze();
  const bad = results.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  expect(
    bad.map((v) => `${v.impact} ${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join('; ')})`),
    `axe-core on ${view}`,
  ).toEqual([]);
}

/** "Within a second": the deadline an expectation about a live update must meet. */
export const LIVE = { timeout: 1_000 };
