// A gate with a deadline: its countdown runs in the page, and when it passes the item leaves
// the queue and shows in *decided*, rejected (the gate's on_timeout).
import { expect, test } from '@playwright/test';
import { finished, runGroup, signIn, submit, suspended } from './helpers';

test('a deadline counts down, then the item is decided as rejected', async ({ browser }) => {
  const runId = submit('deadline', {});
  const rid = await suspended(runId);
  const { context, page } = await signIn(browser, 'alice');
  await page.goto(`/items/${rid}`);
  const countdown = page.locator('#item-live time.countdown');
  await expect(countdown).toBeVisible();
  await expect(countdown).toHaveAttribute('datetime', /\d{4}-\d\d-\d\dT/);
  await expect(page.locator('#item-live')).toContainText(/reject/i);
  const first = await countdown.textContent();
  await expect(countdown).not.toHaveText(first ?? '', { timeout: 3_000 });

  await page.goto('/queue?q=mine');
  const group = runGroup(page, runId);
  await expect(group.locator('time.countdown')).toBeVisible();
  // The deadline (6 s from the request) passes: gone from "for me" without a reload.
  await expect(group).toHaveCount(0, { timeout: 15_000 });
  await page.goto('/queue?q=decided');
  await expect(runGroup(page, runId)).toBeVisible();
  await expect(runGroup(page, runId).locator('.outcome')).toContainText('rejected');
  await runGroup(page, runId).getByRole('link', { name: 'Expires unless decided' }).click();
  await expect(page).toHaveURL(new RegExp(`/items/${rid}$`));
  await expect(page.locator('#item-live')).toContainText(/reject by/i);
  const run = await finished(runId);
  expect(run.status.toUpperCase()).toBe('FAILED');
  await context.close();
});
