#!/usr/bin/env bash
# Verifies a siwa-events callback's Standard Webhooks signature with openssl.
# Usage: verify_callback.sh SECRET WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE BODY_FILE
# Exit 0 and "verified" when one v1 signature matches; exit 1 otherwise.
set -euo pipefail
secret=$1 id=$2 timestamp=$3 signatures=$4 body=$5
now=$(date +%s)
if [ $((now - timestamp)) -gt 300 ] || [ $((timestamp - now)) -gt 300 ]; then
  echo "refused: webhook-timestamp is too far from now (a replay?)" >&2; exit 1
fi
for one in $secret; do
  key=$(printf '%s' "${one#whsec_}" | base64 -d | od -An -v -tx1 | tr -d ' \n')
  expected=$({ printf '%s.%s.' "$id" "$timestamp"; cat "$body"; } \
    | openssl dgst -sha256 -mac HMAC -macopt "hexkey:$key" -binary | base64 -w0)
  for candidate in $signatures; do
    if [ "$candidate" = "v1,$expected" ]; then echo verified; exit 0; fi
  done
done
echo "refused: no signature matches: wrong secret, or the body was changed" >&2
exit 1
