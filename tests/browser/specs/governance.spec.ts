// Two of three (alice, bob, carol in `payments`) must approve a payment to quorum-co or edit-co:
// progress updates live in every open page; an edit is checked against the tool's schema with
// the error next to the field; a valid edit makes earlier approvals stale; an approval posted
// against the replaced digest is refused, showing what changed.
import { expect, test } from '@playwright/test';
import { LIVE, accessible, finished, signIn, submit, suspended } from './helpers';

test('2-of-3 quorum progress updates live in both browsers', async ({ browser }) => {
  const runId = submit('pay', { amount: 2000, payee: 'quorum-co', memo: 'two of three' });
  const rid = await suspended(runId);
  const alice = await signIn(browser, 'alice');
  const bob = await signIn(browser, 'bob');
  for (const p of [alice.page, bob.page]) {
    await p.goto(`/items/${rid}`);
    await expect(p.locator('#item-live .progress')).toContainText('0 of 2');
  }

  await alice.page.getByRole('button', { name: 'Approve' }).click();
  for (const p of [alice.page, bob.page]) {
    await expect(p.locator('#item-live .progress')).toContainText('1 of 2', LIVE);
    await expect(p.getByRole('table', { name: 'Votes' })).toContainText('alice', LIVE);
  }

  await bob.page.getByRole('button', { name: 'Approve' }).click();
  for (const p of [alice.page, bob.page]) {
    await expect(p.locator('#item-live .state')).not.toHaveText('pending', LIVE);
  }
  expect((await finished(runId)).status.toUpperCase()).toBe('SUCCEEDED');
  await alice.context.close();
  await bob.context.close();
});

test('an edit: schema error at the field, then stale votes, and a stale approval refused', async ({ browser }) => {
  const runId = submit('pay', { amount: 1500, payee: 'edit-co', memo: 'edit me' });
  const rid = await suspended(runId);
  // alice's page as it was before the edit (a plain form, no script to refresh it).
  const aliceOld = await signIn(browser, 'alice', { javaScriptEnabled: false });
  await aliceOld.page.goto(`/items/${rid}`);
  const oldDigest = await aliceOld.page.locator('code.digest').textContent();

  const bob = await signIn(browser, 'bob');
  await bob.page.goto(`/items/${rid}`);
  await bob.page.getByRole('button', { name: 'Approve' }).click();
  await expect(bob.page.locator('#item-live .progress')).toContainText('1 of 2');

  const carol = await signIn(browser, 'carol');
  await carol.page.goto(`/items/${rid}`);
  await carol.page.getByRole('link', { name: 'Edit arguments' }).click();
  await expect(carol.page).toHaveURL(new RegExp(`/items/${rid}/edit$`));
  await accessible(carol.page, 'edit');

  // Not a number: refused, the error next to the amount field, nothing decided.
  const amount = carol.page.getByLabel(/^amount/);
  await amount.fill('lots');
  await carol.page.getByRole('button', { name: 'Propose edit' }).click();
  await expect(carol.page.getByRole('alert')).toBeVisible();
  await expect(amount).toHaveAttribute('aria-invalid', 'true');
  const errorId = await amount.getAttribute('aria-describedby');
  const fieldError = carol.page.locator(`#${errorId}`);
  await expect(fieldError).toBeVisible();
  await expect(fieldError).not.toBeEmpty();
  await accessible(carol.page, 'edit with an error');

  await carol.page.getByLabel(/^amount/).fill('1200');
  await carol.page.getByRole('button', { name: 'Propose edit' }).click();
  await expect(carol.page).toHaveURL(new RegExp(`/items/${rid}(\\?done=edit)?$`));
  await expect(carol.page.getByRole('table', { name: 'Arguments as edited' })).toContainText('1200');
  const newDigest = await carol.page.locator('code.digest').textContent();
  expect(newDigest).not.toBe(oldDigest);
  // bob approved the old digest: shown as stale, live in bob's page too.
  for (const p of [carol.page, bob.page]) {
    const bobsVote = p.getByRole('table', { name: 'Votes' }).getByRole('row', { name: /bob/ });
    await expect(bobsVote).toContainText('stale');
  }

  // alice approves what her page showed: refused, with the change shown.
  await aliceOld.page.getByRole('button', { name: 'Approve' }).click();
  const alert = aliceOld.page.getByRole('alert');
  await expect(alert).toBeVisible();
  const changed = alert.getByRole('table', { name: 'What changed' });
  await expect(changed.getByRole('row', { name: /amount/ })).toContainText('1500');
  await expect(changed.getByRole('row', { name: /amount/ })).toContainText('1200');
  // Her vote was not counted.
  await expect(carol.page.getByRole('table', { name: 'Votes' }).getByRole('row', { name: /alice/ })).toHaveCount(0);

  for (const s of [aliceOld, bob, carol]) await s.context.close();
});
