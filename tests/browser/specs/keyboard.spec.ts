// The whole approve flow with the keyboard alone: sign in, filter the queue, move to the item
// with j, open it with Enter, approve with a — no mouse, no typed URL.
import { expect, test } from '@playwright/test';
import { accessible, finished, submit, suspended, token } from './helpers';

test('the approve flow with the keyboard alone', async ({ browser }) => {
  const runId = submit('keys', { amount: 80, payee: 'keys-co' });
  const rid = await suspended(runId);
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto('/sign-in');
  // The token field has the focus; Enter submits.
  await page.keyboard.type(token('alice'));
  await page.keyboard.press('Enter');
  await expect(page.getByText('Signed in as alice')).toBeVisible();

  // Tab to the Tree filter, type the tree, Enter.
  const treeFilter = page.getByLabel('Tree');
  for (let i = 0; i < 30 && !(await treeFilter.evaluate((el) => el === document.activeElement)); i++) {
    await page.keyboard.press('Tab');
  }
  await expect(treeFilter).toBeFocused();
  await page.keyboard.type('inbox-keys');
  await page.keyboard.press('Enter');
  await expect(page).toHaveURL(/tree=inbox-keys/);
  await page.keyboard.press('?');
  const help = page.getByRole('dialog', { name: 'Keyboard shortcuts' });
  await expect(help).toBeVisible();
  await accessible(page, 'keyboard help');
  await page.keyboard.press('Escape');
  await expect(help).toBeHidden();

  await page.keyboard.press('j');
  const link = page.getByRole('link', { name: /ledger\.append/ }).first();
  await expect(link).toBeFocused();
  await expect(link).toHaveAttribute('href', `/items/${rid}`);
  await page.keyboard.press('Enter');
  await expect(page).toHaveURL(new RegExp(`/items/${rid}$`));
  await page.keyboard.press('a');
  await expect(page.locator('#item-live')).toContainText('approve by alice');
  expect((await finished(runId)).status.toUpperCase()).toBe('SUCCEEDED');
  await context.close();
});
