// Sign-in and sign-out; nothing without a session (pages redirect to sign-in, fragments and the
// event stream answer 401); a POST without the CSRF token is refused and changes nothing.
import { expect, test } from '@playwright/test';
import { accessible, getRun, runGroup, signIn, submit, suspended } from './helpers';

test('sign in with a token, and sign out', async ({ browser }) => {
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto('/queue');
  await expect(page).toHaveURL(/\/sign-in$/);
  await accessible(page, 'sign-in');

  await page.getByLabel('Token').fill('not-a-token');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await expect(page.getByRole('alert')).toBeVisible();
  await expect(page.getByRole('button', { name: 'Sign out' })).toHaveCount(0);

  await context.close();
  const { context: alice, page: signedIn } = await signIn(browser, 'alice');
  // The session is a cookie the page's scripts cannot read; the token is in no URL.
  const cookies = await alice.cookies();
  expect(cookies.length).toBeGreaterThan(0);
  for (const c of cookies) {
    expect(c.httpOnly, `cookie ${c.name} is HttpOnly`).toBe(true);
    expect(c.sameSite).toBe('Strict');
  }
  expect(await signedIn.evaluate(() => document.cookie)).toBe('');
  expect(signedIn.url()).not.toContain(process.env.TOKEN_ALICE!);

  await signedIn.getByRole('button', { name: 'Sign out' }).click();
  await expect(signedIn).toHaveURL(/\/sign-in$/);
  await signedIn.goto('/queue');
  await expect(signedIn).toHaveURL(/\/sign-in$/);
  await alice.close();
});

test('no page, fragment or stream without a session', async ({ playwright }) => {
  const anon = await playwright.request.newContext({ baseURL: process.env.INBOX_URL, maxRedirects: 0 });
  for (const page of ['/queue', '/queue?q=decided', '/items/anything', '/items/anything/edit', '/questions/r/q']) {
    const res = await anon.get(page);
    expect(res.status(), `GET ${page}`).toBeGreaterThanOrEqual(300);
    expect(res.status(), `GET ${page}`).toBeLessThan(400);
    expect(res.headers()['location'], `GET ${page}`).toMatch(/\/sign-in$/);
  }
  for (const fragment of ['/events', '/fragments/queue', '/fragments/counts', '/items/anything/live']) {
    const res = await anon.get(fragment);
    expect(res.status(), `GET ${fragment}`).toBe(401);
  }
  const post = await anon.post('/bulk', { form: { decision: 'approve', id: 'x' } });
  expect([401, 403, 303]).toContain(post.status());
  await anon.dispose();
});

test('a POST without the CSRF token is refused and changes nothing', async ({ browser }) => {
  const runId = submit('pay', { amount: 40, payee: 'csrf-co', memo: 'csrf' });
  const rid = await suspended(runId);
  const { context, page } = await signIn(browser, 'alice');
  await page.goto(`/items/${rid}`);
  const digest = await page.locator('form#decide input[name=digest]').inputValue();

  // The session cookie goes along (same site), the token does not: 403.
  for (const form of [
    { decision: 'approve', digest },
    { decision: 'approve', digest, csrf: 'forged' },
  ]) {
    const res = await context.request.post(`/items/${rid}/decide`, { form, maxRedirects: 0 });
    expect(res.status(), JSON.stringify(form)).toBe(403);
  }
  const res = await context.request.post('/sign-out', { form: {}, maxRedirects: 0 });
  expect(res.status()).toBe(403);

  // Nothing changed: the item is still pending and alice still signed in.
  await page.reload();
  await expect(page.locator('#item-live .state')).toHaveText('pending');
  await expect(page.getByRole('button', { name: 'Approve' })).toBeVisible();
  expect(getRun(runId).status.toUpperCase()).toBe('SUSPENDED');
  await page.goto('/queue?q=pending');
  await expect(runGroup(page, runId)).toBeVisible();
  await context.close();
});
