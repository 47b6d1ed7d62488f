// Approve and reject from the item page; the submitter sees their run's item but cannot decide
// it, and the page says why.
import { expect, test } from '@playwright/test';
import { accessible, finished, signIn, submit, suspended } from './helpers';

test('approve: the tool runs with the arguments shown', async ({ browser }) => {
  const runId = submit('pay', { amount: 60, payee: 'approve-co', memo: 'ok to pay' });
  const rid = await suspended(runId);
  const { context, page } = await signIn(browser, 'alice');
  await page.goto(`/items/${rid}`);
  await accessible(page, 'item');
  const args = page.getByRole('table', { name: 'Arguments' });
  await expect(args.getByRole('row', { name: /payee/ })).toContainText('approve-co');
  await expect(args.getByRole('row', { name: /amount/ })).toContainText('60');
  await expect(page.locator('code.digest')).toHaveText(/^sha256:[0-9a-f]{64}$/);
  await expect(page.getByRole('region', { name: 'The run' })).toBeVisible();

  await page.getByRole('button', { name: 'Approve' }).click();
  await expect(page.locator('#item-live')).toContainText('approve by alice');
  await expect(page.getByRole('button', { name: 'Approve' })).toHaveCount(0);
  await accessible(page, 'item (decided)');
  const run = await finished(runId);
  expect(run.status.toUpperCase()).toBe('SUCCEEDED');
  await context.close();
});

test('reject with a reason: the tool never runs', async ({ browser }) => {
  const runId = submit('pay', { amount: 61, payee: 'reject-co', memo: 'not this one' });
  const rid = await suspended(runId);
  const { context, page } = await signIn(browser, 'alice');
  await page.goto(`/items/${rid}`);
  await page.getByLabel('Reason').fill('wrong payee');
  await page.getByRole('button', { name: 'Reject' }).click();
  await expect(page.locator('#item-live')).toContainText('reject by alice');
  const run = await finished(runId);
  expect(run.blackboard['receipt']).toBeUndefined();
  await context.close();
});

test('the submitter sees the item but cannot decide it, and is told why', async ({ browser }) => {
  const runId = submit('pay', { amount: 62, payee: 'own-co', memo: 'my own' }, 'bob');
  const rid = await suspended(runId, 'bob');
  const { context, page } = await signIn(browser, 'bob');
  await page.goto(`/items/${rid}`);
  await expect(page.getByRole('heading', { level: 1 })).toBeVisible();
  await expect(page.getByRole('region', { name: 'Why it is yours' })).toContainText(/you submitted this run/i);
  await expect(page.getByRole('button', { name: 'Approve' })).toHaveCount(0);
  await expect(page.getByRole('button', { name: 'Reject' })).toHaveCount(0);
  await accessible(page, 'item (cannot decide)');
  // Nor does it count as bob's to decide.
  await page.goto('/queue?q=mine');
  await expect(page.getByRole('region', { name: `Run ${runId}` })).toHaveCount(0);
  await context.close();
});

test("the run's tree: the node done, the node it waits at, the nodes to come", async ({ browser }) => {
  const runId = submit('gate', {});
  const rid = await suspended(runId);
  const { context, page } = await signIn(browser, 'alice');
  await page.goto(`/items/${rid}`);
  await expect(page.getByRole('heading', { level: 1 })).toHaveText('Deploy billing with 3 replicas?');
  await expect(page.getByRole('table', { name: 'Context' })).toContainText('billing');
  const tree = page.getByRole('list', { name: 'Tree' });
  const node = (name: string) => tree.getByRole('listitem').filter({ has: page.locator('.node-name', { hasText: new RegExp(`^${name}$`) }) });
  await expect(node('plan')).toContainText('success');
  await expect(node('approve-deploy')).toHaveAttribute('aria-current', 'step');
  await expect(node('approve-deploy')).toContainText('waiting');
  await expect(node('rollout')).toContainText('idle');
  await expect(node('announce')).toContainText('idle');
  await expect(tree.locator('[aria-current="step"]')).toHaveCount(1);

  await page.getByRole('button', { name: 'Approve' }).click();
  expect((await finished(runId)).status.toUpperCase()).toBe('SUCCEEDED');
  await context.close();
});
