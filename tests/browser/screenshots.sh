#!/usr/bin/env bash
# Regenerates the inbox screenshots in docs/img/ (inbox-queue.png, inbox-item.png): starts both
# services with the inbox on, as the browser tests do, and takes them with the same Chromium.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo test -p arbor-tests --test e2e inbox::screenshots -- --ignored --exact inbox::screenshots::regenerate_the_docs_screenshots
ls -l docs/img/inbox-*.png
