#!/usr/bin/env bash
# Receiver-only ingest at 64 connections (wrk, pre-signed distinct bodies) on a fresh durable
# embedded cluster: accepted/s, latency percentiles, server CPU per notification.
# Usage: scripts/bench.d/receiver-peak.sh BIN_DIR LABEL (BIN_DIR holds release siwa-events and
# siwa-bench; alternate two of them back to back to compare builds).
set -euo pipefail
BIN=$1; label=$2
work=$(mktemp -d /tmp/ab-run.XXXXXX); chmod 755 "$work"
port=$((30000 + RANDOM % 10000))
"$BIN/siwa-events" keys generate --dir "$work/keys" >/dev/null
"$BIN/siwa-bench" sign --keys "$work/keys" --aud com.example.bench --count 90000 --output "$work/bodies.txt" >/dev/null 2>&1
"$BIN/siwa-bench" sign --keys "$work/keys" --aud com.example.bench --count 5000 --output "$work/warm.txt" >/dev/null 2>&1
SIWA_ROLE=receiver SIWA_APPLE_BUNDLE_IDS=com.example.bench SIWA_APPLE_JWKS_URL="file://$work/keys/jwks.json" \
  SIWA_DATA_DIR="$work/data" SIWA_PORT=$port SIWA_ADMIN_PORT=$((port + 1)) SIWA_LOG_LEVEL=warning \
  "$BIN/siwa-events" serve >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 240); do curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && break; sleep 0.5; done
cd "$(dirname "$0")/../.."
BODIES="$work/warm.txt" THREADS=2 wrk -t2 -c32 -d2s -s scripts/bench.d/post-bodies.lua "http://127.0.0.1:$port" >/dev/null
cpu0=$(awk '{print $14+$15}' /proc/$server/stat)
out=$(BODIES="$work/bodies.txt" THREADS=2 wrk -t2 -c64 -d10s --latency -s scripts/bench.d/post-bodies.lua "http://127.0.0.1:$port")
cpu1=$(awk '{print $14+$15}' /proc/$server/stat)
rate=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
total=$(echo "$out" | awk '/requests in/ {print $1}')
p50=$(echo "$out" | awk '$1=="50%" {print $2}'); p99=$(echo "$out" | awk '$1=="99%" {print $2}')
non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
echo "$label: accepted/s=$rate p50=$p50 p99=$p99 requests=$total non2xx=${non2xx:-0} server_cpu_us_per_req=$(( (cpu1 - cpu0) * 10000 / total ))"
kill -TERM $server; wait $server || true
rm -rf "$work"
