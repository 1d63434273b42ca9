#!/usr/bin/env bash
# Installs (npm ci, pinned by package-lock.json) and starts the Cosmos DB
# protocol server for the tests, with a fresh self-signed certificate for
# 127.0.0.1, and the fault-injecting proxy in front of it on PORT+1
# (faultproxy.js). Prints the environment the tests read. Fails loudly.
# Usage: ci/cosmos/start.sh DIR [PORT]
#   (DIR receives cert, key, pid, log, proxy.pid, proxy.log)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="$1"; port="${2:-8081}"
mkdir -p "$dir"
command -v node >/dev/null || { echo "node is needed for the Cosmos tests" >&2; exit 1; }
if [ ! -d "$here/node_modules/@vercel/cosmosdb-server" ]; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error) >&2
fi
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
  -subj "/CN=127.0.0.1" -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
  -addext "basicConstraints=critical,CA:FALSE" \
  -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null
rm -f "$dir/pid"
node "$here/launch.js" "$port" "$dir/cert.pem" "$dir/key.pem" "$dir/pid" > "$dir/log" 2>&1 &
for _ in $(seq 1 50); do [ -s "$dir/pid" ] && break; sleep 0.1; done
[ -s "$dir/pid" ] || { echo "the Cosmos test server did not start:" >&2; cat "$dir/log" >&2; exit 1; }
proxy_port=$((port + 1))
rm -f "$dir/proxy.pid"
node "$here/faultproxy.js" "$proxy_port" "$port" "$dir/cert.pem" "$dir/key.pem" "$dir/proxy.pid" > "$dir/proxy.log" 2>&1 &
for _ in $(seq 1 50); do [ -s "$dir/proxy.pid" ] && break; sleep 0.1; done
[ -s "$dir/proxy.pid" ] || { echo "the Cosmos fault proxy did not start:" >&2; cat "$dir/proxy.log" >&2; exit 1; }
echo "STEADFAST_TEST_COSMOS=cosmos://127.0.0.1:$port"
echo "STEADFAST_TEST_COSMOS_PROXY=cosmos://127.0.0.1:$proxy_port"
echo "STEADFAST_TEST_COSMOS_CA=$dir/cert.pem"
