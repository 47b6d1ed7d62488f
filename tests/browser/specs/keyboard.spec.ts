// The whole approve flow with the keyboard alone: sign in, move to the item with j, open it with
// Enter, approve with a — no mouse.
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

  await page.goto('/queue?q=mine&tree=inbox-keys');
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
