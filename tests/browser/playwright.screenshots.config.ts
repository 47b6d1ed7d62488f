// Not a test suite: regenerates the inbox screenshots the docs show (docs/img/inbox-*.png), run
// by tests/browser/screenshots.sh against services the cargo harness starts.
import { defineConfig } from '@playwright/test';
import base from './playwright.config';

export default defineConfig({
  ...base,
  testDir: './screenshots',
  use: { ...base.use, viewport: { width: 1280, height: 800 }, screenshot: 'off', trace: 'off' },
});
