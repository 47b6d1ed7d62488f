// Bulk approve of a filtered set: only the items the filter shows, each outcome listed.
import { expect, test } from '@playwright/test';
import { accessible, finished, getRun, runGroup, signIn, submit, suspended } from './helpers';

test('bulk approve of a filtered set', async ({ browser }) => {
  const runs = [1, 2, 3].map((i) => submit('bulk', { amount: 70 + i, payee: `bulk-co-${i}` }));
  const outside = submit('pay', { amount: 79, payee: 'not-in-the-filter', memo: 'stays' });
  for (const r of [...runs, outside]) await suspended(r);

  const { context, page } = await signIn(browser, 'alice');
  await page.goto('/queue?q=mine&tree=inbox-bulk');
  for (const r of runs) await expect(runGroup(page, r)).toBeVisible();
  await expect(runGroup(page, outside)).toHaveCount(0);
  for (const r of runs) await runGroup(page, r).getByRole('checkbox').check();
  await page.getByRole('button', { name: 'Approve selected' }).click();

  const outcomes = page.getByRole('table', { name: 'Outcome of each item' });
  await expect(outcomes).toBeVisible();
  await expect(outcomes.locator('tbody tr')).toHaveCount(3);
  await expect(outcomes.locator('td.error')).toHaveCount(0);
  await accessible(page, 'bulk outcome');
  for (const r of runs) expect((await finished(r)).status.toUpperCase()).toBe('SUCCEEDED');
  expect(getRun(outside).status.toUpperCase()).toBe('SUSPENDED');
  await context.close();
});
