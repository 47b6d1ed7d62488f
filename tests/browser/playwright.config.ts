// The inbox's browser tests: Debian's Chromium (never a downloaded browser), one worker (the
// suite shares one service pair, started by the cargo test in tests/tests/e2e/inbox), and
// screenshots and traces of failures under target/browser/.
import { defineConfig } from '@playwright/test';
import * as path from 'node:path';

const out = process.env.ARBOR_BROWSER_OUT ?? path.join(__dirname, '..', '..', 'target', 'browser');

export default defineConfig({
  testDir: './specs',
  outputDir: path.join(out, 'results'),
  fullyParallel: false,
  workers: 1,
  retries: 0,
  forbidOnly: true,
  timeout: 60_000,
  expect: { timeout: 10_000 },
  reporter: [['list']],
  use: {
    baseURL: process.env.INBOX_URL,
    browserName: 'chromium',
    headless: true,
    screenshot: 'only-on-failure',
    trace: 'retain-on-failure',
    launchOptions: {
      executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    },
  },
});
