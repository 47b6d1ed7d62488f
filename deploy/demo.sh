#!/usr/bin/env bash
# Starts runner-svc and approval-svc on embedded sled data (./data), registers the demo tree,
# submits a run that waits for approval, and tells you how to approve it. Ctrl-C stops both.
# With ARBOR_STORE=postgres://… in the environment (see deploy/postgres-local.sh) both services
# keep their state in that PostgreSQL database instead.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --quiet -p arbor-runner-svc -p arbor-approval-svc --bins
bin=target/release
mkdir -p data
runner_port=${ARBOR_DEMO_RUNNER_PORT:-50051}
approval_port=${ARBOR_DEMO_APPROVAL_PORT:-50052}
web_port=${ARBOR_DEMO_WEB_PORT:-8080}
export ARBOR_RUNNER_ADDR=http://127.0.0.1:$runner_port ARBOR_ADDR=http://127.0.0.1:$approval_port

"$bin/runner-svc" serve --data-dir data/runner --listen 127.0.0.1:$runner_port >data/runner.log 2>&1 &
runner=$!
"$bin/approval-svc" serve --data-dir data/approval --listen 127.0.0.1:$approval_port \
  --runner "$ARBOR_RUNNER_ADDR" --web-listen 127.0.0.1:$web_port >data/approval.log 2>&1 &
approval=$!
trap 'kill -TERM $runner $approval 2>/dev/null; wait $runner $approval 2>/dev/null; echo "stopped."' EXIT
trap 'exit 130' INT TERM

for _ in $(seq 1 100); do
  for pid in $runner $approval; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "a service failed to start (ports $runner_port/$approval_port busy?):" >&2
      tail -n 3 data/runner.log data/approval.log >&2
      exit 1
    fi
  done
  if "$bin/runner-svc" runs >/dev/null 2>&1 && "$bin/approval-svc" pending >/dev/null 2>&1; then break; fi
  sleep 0.1
done

"$bin/runner-svc" submit deploy/demo/deploy-service.json
for _ in $(seq 1 50); do
  id=$("$bin/approval-svc" pending 2>/dev/null | awk 'NR>1 && $1 != "" {print $1; exit}')
  [ -n "${id:-}" ] && break
  sleep 0.1
done

cat <<EOT

Both services are running (logs in data/*.log). A deploy is waiting for your approval:

$("$bin/approval-svc" pending)

The web inbox: http://127.0.0.1:$web_port/
  (authentication is off in the demo: sign in with any text as the token)

Or, in another terminal:
  $bin/approval-svc approve ${id:-<ID>}                 # or: reject ${id:-<ID>} --reason "not now"
  $bin/runner-svc runs                                  # the run now waits for release notes
  $bin/runner-svc resolve <RUN_ID> <REQUEST_ID> --text "Billing v2"
  $bin/runner-svc events                                # the whole story, in order

Press Ctrl-C to stop both services (data stays in ./data).
EOT
wait
