// Untrusted text — a gate's title, a tool's arguments, a blackboard value — is shown as text:
// `<script>` and `"><img onerror>` never run and never become elements.
import { expect, test } from '@playwright/test';
import { signIn, submit, suspended } from './helpers';

const TITLE = `<script>window.__pwned = 'title'</script>"><img src=x onerror="window.__pwned='title-img'">`;
const MEMO = `<script>window.__pwned = 'memo'</script>"><img src=x onerror="window.__pwned='memo-img'">`;

test('a hostile title and arguments are rendered as text', async ({ browser }) => {
  const gateRun = submit('hostile', { memo: MEMO });
  const gate = await suspended(gateRun);
  const payRun = submit('pay', { amount: 5, payee: `"><img src=x onerror="window.__pwned='payee'">`, memo: MEMO });
  const pay = await suspended(payRun);

  const { context, page } = await signIn(browser, 'alice');
  const dialogs: string[] = [];
  page.on('dialog', (d) => { dialogs.push(d.message()); void d.dismiss(); });
  await page.goto('/queue?q=mine');
  await expect(page.getByRole('link', { name: TITLE })).toBeVisible();

  await page.goto(`/items/${gate}`);
  await expect(page.getByRole('heading', { level: 1 })).toHaveText(TITLE);
  await expect(page.getByRole('table', { name: 'Context' })).toContainText(MEMO);

  await page.goto(`/items/${pay}`);
  const args = page.getByRole('table', { name: 'Arguments' });
  await expect(args).toContainText(MEMO);
  await expect(args).toContainText(`"><img src=x onerror=`);

  for (const at of ['/queue?q=mine', `/items/${gate}`, `/items/${pay}`]) {
    await page.goto(at);
    expect(await page.evaluate(() => (window as unknown as { __pwned?: string }).__pwned), at).toBeUndefined();
    await expect(page.locator('img[src="x"]'), at).toHaveCount(0);
    await expect(page.locator('main script'), at).toHaveCount(0);
  }
  expect(dialogs).toEqual([]);
  await context.close();
});
