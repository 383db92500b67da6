#!/usr/bin/env python3
"""Verifies a siwa-events callback's Standard Webhooks signature (Python 3 standard library only).

Copy `verify` into your endpoint. Run as a script, it checks one request:
    verify_callback.py --secret whsec_… --id msg_12 --timestamp 1763712000 --signature 'v1,…' < body.json
and prints the verified event (exit 0), or why it is refused (exit 1).
"""
import argparse
import base64
import hashlib
import hmac
import json
import sys
import time


class InvalidCallback(Exception):
    pass


def verify(secrets, webhook_id, timestamp, signature_header, body, tolerance=300, now=None):
    """Returns the callback's JSON body once its signature checks out; raises InvalidCallback.

    secrets: the SIWA_CALLBACK_SECRET value (one or more space-separated whsec_… secrets).
    body: the request body as received, bytes, before any JSON parsing.
    """
    try:
        sent_at = int(timestamp)
    except ValueError:
        raise InvalidCallback("webhook-timestamp is not a number")
    if abs((now or time.time()) - sent_at) > tolerance:
        raise InvalidCallback("webhook-timestamp is too far from now (a replay?)")
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    expected = []
    for secret in secrets.split():
        key = base64.b64decode(secret.removeprefix("whsec_"))
        expected.append(base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode())
    for candidate in signature_header.split():
        version, _, value = candidate.partition(",")
        if version == "v1" and any(hmac.compare_digest(value, e) for e in expected):
            return json.loads(body)
    raise InvalidCallback("no signature matches: wrong secret, or the body was changed")


def main():
    parser = argparse.ArgumentParser(description="Verify one siwa-events callback; the body on stdin.")
    parser.add_argument("--secret", required=True, help="SIWA_CALLBACK_SECRET")
    parser.add_argument("--id", required=True, help="the webhook-id header")
    parser.add_argument("--timestamp", required=True, help="the webhook-timestamp header")
    parser.add_argument("--signature", required=True, help="the webhook-signature header")
    args = parser.parse_args()
    try:
        event = verify(args.secret, args.id, args.timestamp, args.signature, sys.stdin.buffer.read())
    except InvalidCallback as error:
        print(f"refused: {error}", file=sys.stderr)
        sys.exit(1)
    # Deduplicate on args.id (the same on every retry), then apply by event["type"].
    print(json.dumps({"webhook_id": args.id, **event}, sort_keys=True))


if __name__ == "__main__":
    main()
