#!/usr/bin/env bash
# Runs the buf CLI (from the npm package @bufbuild/buf, installed into target/ on first use) on
# proto/. Usage: .ci/buf.sh lint | breaking
#   lint      buf lint, with proto/buf.yaml
#   breaking  buf breaking against the previous commit (HEAD~1, the main line before this
#             change). Needs that commit in the clone: in a shallow or single-commit clone it
#             says so loudly and skips; fetch more history (git fetch --deepen=1) to check.
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
  breaking)
    if ! git rev-parse --verify --quiet 'HEAD~1^{commit}' >/dev/null; then
      echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
      echo "!! buf breaking SKIPPED: HEAD~1 is not in this clone (shallow or single commit)." >&2
      echo "!! Proto changes were NOT checked for breaking changes. Fetch history to check:" >&2
      echo "!!   git fetch --deepen=1 && bash .ci/buf.sh breaking" >&2
      echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
      exit 0
    fi
    "$buf" breaking proto --against '.git#ref=HEAD~1,subdir=proto'
    ;;
  *) echo "unknown buf command: $1" >&2; exit 2 ;;
esac
echo "buf ${1:-lint}: ok"
