#!/usr/bin/env bash
# What an authorization code exchange adds to POST /v1/sessions: the same server, one request at a
# time, sessions for aud+sub beside sessions completed with a code exchanged at the local stand-in
# for Apple's /auth/token (real HTTP, client secret minted, id_token verified, token encrypted and
# kept), on a fresh durable embedded cluster.
# Usage: scripts/bench.d/session-exchange.sh BIN_DIR [REQUESTS] (BIN_DIR holds siwa-events and
# siwa-bench: .build/release, or .build/debug for a quick look).
set -euo pipefail
BIN=$1; requests=${2:-1000}
work=$(mktemp -d /tmp/exchange-bench.XXXXXX); chmod 755 "$work"
port=$((30000 + RANDOM % 10000)); standin_port=$((port + 2))
server=; standin=
cleanup() { [ -n "$server" ] && kill -TERM "$server" 2>/dev/null; [ -n "$standin" ] && kill -TERM "$standin" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
"$BIN/siwa-events" keys generate --dir "$work/keys" >/dev/null
"$BIN/siwa-events" standin serve --keys "$work/keys" --port "$standin_port" --team-id TEAMID1234 --key-id KEYID12345 \
  --client-ids com.example.bench >"$work/standin.log" 2>&1 &
standin=$!
for _ in $(seq 1 120); do [ -f "$work/keys/AuthKey_KEYID12345.p8" ] && curl -s -o /dev/null "http://127.0.0.1:$standin_port/" && break; sleep 0.5; done
SIWA_ROLE=receiver SIWA_APPLE_BUNDLE_IDS=com.example.bench SIWA_APPLE_JWKS_URL="file://$work/keys/jwks.json" \
  SIWA_APPLE_TEAM_ID=TEAMID1234 SIWA_APPLE_KEY_ID=KEYID12345 SIWA_APPLE_PRIVATE_KEY_FILE="$work/keys/AuthKey_KEYID12345.p8" \
  SIWA_APPLE_AUTH_URL="http://127.0.0.1:$standin_port" SIWA_APPLE_TOKEN_KEYS="$(openssl rand -base64 32)" \
  SIWA_DATA_DIR="$work/data" SIWA_PORT=$port SIWA_ADMIN_PORT=$((port + 1)) SIWA_LOG_LEVEL=warning \
  "$BIN/siwa-events" serve >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 240); do curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && break; sleep 0.5; done
curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null || { cat "$work/server.log" >&2; exit 1; }
token=$(SIWA_DATA_DIR="$work/data" "$BIN/siwa-events" tokens create --name bench-sessions --scope sessions:write 2>/dev/null)
"$BIN/siwa-bench" sessions --url "http://127.0.0.1:$((port + 1))" --token "$token" --standin "http://127.0.0.1:$standin_port" \
  --aud com.example.bench --requests "$requests"
