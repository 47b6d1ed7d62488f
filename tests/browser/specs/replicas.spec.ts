// Two approval replicas on one PostgreSQL database, each serving the inbox (run by
// tests/tests/e2e/inbox/replicas.rs): bob decides in the inbox of replica 2, and the item leaves
// alice's queue on replica 1 within a second.
import { expect, test } from '@playwright/test';
import { LIVE, finished, runGroup, signIn, submit, suspended } from './helpers';

test('@replicas a decision on another replica leaves the queue live', async ({ browser }) => {
  const other = process.env.INBOX_URL_2;
  if (!other) throw new Error('INBOX_URL_2 is not set: this spec runs against two replicas');
  const alice = await signIn(browser, 'alice');
  await alice.page.goto('/queue?q=mine');
  const runId = submit('pay', { amount: 90, payee: 'replica-co', memo: 'on two replicas' });
  const rid = await suspended(runId);
  const group = runGroup(alice.page, runId);
  await expect(group).toBeVisible();

  const bob = await signIn(browser, 'bob', { baseURL: other });
  await bob.page.goto(`/items/${rid}`);
  await bob.page.getByRole('button', { name: 'Approve' }).click();
  await expect(bob.page.locator('#item-live')).toContainText('approve by bob');
  await expect(group).toHaveCount(0, LIVE);
  expect((await finished(runId)).status.toUpperCase()).toBe('SUCCEEDED');
  await alice.context.close();
  await bob.context.close();
});
