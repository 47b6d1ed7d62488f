// The screenshots in the docs: alice's queue with a few requests and a question, and an item
// with a quorum in progress.
import * as path from 'node:path';
import { expect, test } from '@playwright/test';
import { runGroup, signIn, submit, suspended } from '../specs/helpers';

const IMG = path.join(__dirname, '..', '..', '..', 'docs', 'img');

test('inbox screenshots for the docs', async ({ browser }) => {
  const quorum = submit('pay', { amount: 2400, payee: 'quorum-co', memo: 'Q3 hosting invoice' });
  const runs = [
    quorum,
    submit('gate', {}),
    submit('deadline', {}),
    submit('pay', { amount: 120, payee: 'stationery-co', memo: 'office supplies' }),
  ];
  const rids = [];
  for (const r of runs) rids.push(await suspended(r));

  const bob = await signIn(browser, 'bob');
  await bob.page.goto(`/items/${rids[0]}`);
  await bob.page.getByRole('button', { name: 'Approve' }).click();
  await bob.context.close();

  const { context, page } = await signIn(browser, 'alice');
  await page.goto('/queue?q=mine');
  for (const r of runs) await expect(runGroup(page, r)).toBeVisible();
  await page.screenshot({ path: path.join(IMG, 'inbox-queue.png'), fullPage: true });
  await page.goto(`/items/${rids[0]}`);
  await expect(page.locator('#item-live .progress')).toContainText('1 of 2');
  await page.screenshot({ path: path.join(IMG, 'inbox-item.png'), fullPage: true });
  await context.close();
});
