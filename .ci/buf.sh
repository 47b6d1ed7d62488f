#!/usr/bin/env bash
# Runs the buf CLI (from the npm package @bufbuild/buf, installed into target/ on first use) on
# proto/. Usage: .ci/buf.sh lint | breaking
set -euo pipefail
cd "$(dirname "$0")/.."
tools=target/ci-tools
if [ ! -x "$tools/node_modules/.bin/buf" ]; then
  mkdir -p "$tools"
  npm install --silent --no-audit --no-fund --prefix "$tools" @bufbuild/buf@1 >/dev/null
fi
buf="$PWD/$tools/node_modules/.bin/buf"
case "${1:-lint}" in
  lint) (cd proto && "$buf" lint) ;;
  *) echo "unknown buf command: $1" >&2; exit 2 ;;
esac
echo "buf ${1:-lint}: ok"
