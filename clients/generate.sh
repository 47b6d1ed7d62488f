#!/usr/bin/env bash
# Regenerates the stubs of both client packages from proto/arbor/.
#   bash clients/generate.sh          write them into the packages
#   bash clients/generate.sh DIR      write them into DIR/python and DIR/node instead (the
#                                     freshness test compares those with the committed ones)
# Python: grpcio-tools (it bundles protoc) with mypy-protobuf for typed .pyi stubs, from the pinned
# clients/python/requirements-dev.txt in a virtualenv under target/. Node: ts-proto, from the
# Node package's own devDependencies (npm ci in clients/node), run by the same protoc.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
py_out=$root/clients/python/src/arbor_client/_gen
node_out=$root/clients/node/src/gen
if [ $# -gt 0 ]; then
  mkdir -p "$1"
  out=$(cd "$1" && pwd)
  py_out=$out/python
  node_out=$out/node
fi

venv=$target/py-client
reqs=$root/clients/python/requirements-dev.txt
if ! cmp -s "$reqs" "$venv/.arbor-installed" 2>/dev/null; then
  ${PYTHON:-python3} -m venv --clear "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$reqs"
  cp "$reqs" "$venv/.arbor-installed"
fi
if ! cmp -s "$root/clients/node/package-lock.json" \
    "$root/clients/node/node_modules/.arbor-installed" 2>/dev/null; then
  (cd "$root/clients/node" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  cp "$root/clients/node/package-lock.json" "$root/clients/node/node_modules/.arbor-installed"
fi

cd "$root/proto"
mapfile -t protos < <(find arbor -name '*.proto' | LC_ALL=C sort)

# Python: generated into arbor_client/_gen, their `arbor.` imports made package-relative.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PATH=$venv/bin:$PATH "$venv/bin/python" -m grpc_tools.protoc -I . \
  --python_out="$tmp" --mypy_out=quiet:"$tmp" \
  --grpc_python_out="$tmp" --mypy_grpc_out=quiet:"$tmp" "${protos[@]}"
# Services only: a proto without one gets no (empty) grpc module.
for f in "$tmp"/arbor/*/v1/*_pb2_grpc.py; do
  grep -q "class .*Stub" "$f" || rm -f "$f" "${f}i"
done
find "$tmp" -type f -name '*.py*' -exec sed -i -E \
  's/^from arbor\.([a-z0-9_.]+) import/from arbor_client._gen.arbor.\1 import/' {} +
for d in "$tmp" "$tmp"/arbor "$tmp"/arbor/* "$tmp"/arbor/*/v1; do
  echo '"""Generated from proto/ by clients/generate.sh; do not edit."""' >"$d/__init__.py"
done
rm -rf "$py_out"
mkdir -p "$(dirname "$py_out")"
cp -r "$tmp" "$py_out"

# Node: ts-proto, clients for @grpc/grpc-js.
ts=$(mktemp -d)
"$venv/bin/python" -m grpc_tools.protoc -I . \
  --plugin=protoc-gen-ts_proto="$root/clients/node/node_modules/.bin/protoc-gen-ts_proto" \
  --ts_proto_out="$ts" \
  --ts_proto_opt=outputServices=grpc-js,esModuleInterop=true,forceLong=number,env=node,useOptionals=messages \
  "${protos[@]}"
rm -rf "$node_out"
mkdir -p "$(dirname "$node_out")"
cp -r "$ts" "$node_out"
rm -rf "$ts"
echo "stubs generated: $py_out $node_out"
