#!/usr/bin/env bash
# Starts a local PostgreSQL for Arbor in ./data/postgres (port 5433, user and database `arbor`,
# trust authentication on 127.0.0.1 only) from Debian's `postgresql` package, and prints the URL
# to give both services. Run it again to start the same cluster after a reboot; stop it with
#   pg_ctl -D data/postgres stop      (prefixed with `runuser -u nobody --` when run as root)
# For development only: a real deployment points ARBOR_STORE at a managed PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(command -v initdb >/dev/null 2>&1 && dirname "$(readlink -f "$(command -v initdb)")" ||
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  echo "PostgreSQL's server programs are missing: apt-get install -y postgresql" >&2
  exit 1
fi
port=${ARBOR_PG_PORT:-5433}
dir=$PWD/data/postgres
as=()
if [ "$(id -u)" = 0 ]; then
  # The server refuses to run as root.
  as=(runuser -u nobody --)
fi
mkdir -p data
if [ ! -s "$dir/PG_VERSION" ]; then
  mkdir -p "$dir"
  [ ${#as[@]} -eq 0 ] || chown nobody "$dir"
  chmod 700 "$dir"
  "${as[@]}" "$bin/initdb" -D "$dir" --auth=trust --username=arbor -E UTF8 >/dev/null
fi
if "${as[@]}" "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
  echo "already running"
else
  "${as[@]}" "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir" start >/dev/null
fi
"$bin/psql" -h 127.0.0.1 -p "$port" -U arbor -d postgres -tAc \
  "SELECT 1 FROM pg_database WHERE datname = 'arbor'" | grep -q 1 ||
  "$bin/createdb" -h 127.0.0.1 -p "$port" -U arbor arbor
echo "PostgreSQL is up. Start both services on it with:"
echo "  ARBOR_STORE=postgres://arbor@127.0.0.1:$port/arbor bash deploy/demo.sh"
echo "or, on this host, through its Unix socket (less CPU than TCP):"
echo "  ARBOR_STORE=postgres://arbor@${dir//\//%2F}:$port/arbor bash deploy/demo.sh"
