// The queue is live: a request appears in alice's queue without a reload within a second of its
// run suspending, and leaves it as fast when someone decides it through the gRPC API.
import { expect, test } from '@playwright/test';
import { LIVE, accessible, approvalCli, runGroup, signIn, submit, suspended } from './helpers';

test('a new request appears live, and a decision through the API takes it away', async ({ browser }) => {
  const { context, page } = await signIn(browser, 'alice');
  await page.goto('/queue?q=mine');
  await expect(page.getByRole('heading', { name: 'For me' })).toBeVisible();
  await accessible(page, 'queue: for me');
  // A marker a reload would wipe out.
  await page.evaluate(() => { (window as unknown as { stayed: boolean }).stayed = true; });

  const runId = submit('pay', { amount: 25, payee: 'live-co', memo: 'appears live' });
  const rid = await suspended(runId);
  const group = runGroup(page, runId);
  await expect(group).toBeVisible(LIVE);
  await expect(group.getByRole('link', { name: /ledger\.append/ })).toHaveAttribute('href', `/items/${rid}`);

  approvalCli(['approve', rid, '--reason', 'decided through the API'], 'bob');
  await expect(group).toHaveCount(0, LIVE);
  expect(await page.evaluate(() => (window as unknown as { stayed?: boolean }).stayed)).toBe(true);

  for (const q of ['pending', 'overdue', 'decided']) {
    await page.goto(`/queue?q=${q}`);
    await accessible(page, `queue: ${q}`);
  }
  await expect(runGroup(page, runId)).toBeVisible();
  await context.close();
});
