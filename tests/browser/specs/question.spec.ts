// A user-input question names who may answer (carol): she answers through the form generated
// from its JSON Schema (a wrong answer shown at the field first); alice, not named, cannot.
import { expect, test } from '@playwright/test';
import { accessible, finished, getRun, signIn, submit, suspended } from './helpers';

const PROMPT = 'Release notes for billing v2?';

test('a question answered through its generated form, and refused to those it does not name', async ({ browser }) => {
  const runId = submit('ask', {});
  const rid = await suspended(runId);
  const url = `/questions/${runId}/${rid}`;

  const alice = await signIn(browser, 'alice');
  await alice.page.goto('/queue?q=mine');
  await expect(alice.page.getByRole('region', { name: 'Questions and external results' })).toBeVisible();
  await expect(alice.page.getByRole('link', { name: PROMPT })).toHaveCount(0);
  await alice.page.goto(url);
  await expect(alice.page.getByRole('button', { name: 'Answer' })).toHaveCount(0);
  await expect(alice.page.locator('main')).toContainText(/may not/);
  await accessible(alice.page, 'question refused');

  const carol = await signIn(browser, 'carol');
  await carol.page.goto('/queue?q=mine');
  const questions = carol.page.getByRole('region', { name: 'Questions and external results' });
  await questions.getByRole('link', { name: PROMPT }).click();
  await expect(carol.page).toHaveURL(new RegExp(`${url}$`));
  await expect(carol.page.getByRole('heading', { level: 1 })).toContainText(PROMPT);
  await expect(carol.page.locator('main')).toContainText('carol');
  await accessible(carol.page, 'question');

  const answer = carol.page.getByRole('textbox').first();
  await answer.fill('tiny');
  await carol.page.getByRole('button', { name: 'Answer' }).click();
  await expect(carol.page.getByRole('alert')).toBeVisible();
  await expect(carol.page.locator('.field-error')).toBeVisible();
  await accessible(carol.page, 'question with an error');
  expect(getRun(runId).status.toUpperCase()).toBe('SUSPENDED');

  await carol.page.getByRole('textbox').first().fill('Billing v2: faster invoices');
  await carol.page.getByRole('button', { name: 'Answer' }).click();
  const run = await finished(runId);
  expect(run.status.toUpperCase()).toBe('SUCCEEDED');
  expect(run.blackboard['notes']).toBe('Billing v2: faster invoices');
  await alice.context.close();
  await carol.context.close();
});
