"""What the contract test teaches schemathesis that the document cannot express.

Loaded with SCHEMATHESIS_HOOKS=schemathesis_hooks (PYTHONPATH=Tests/contract) by HistoryAPITests.
Applied to every generated request (all phases), and only to values that are valid by the
document, so a request meant to break the schema still does:
- A `cursor` is opaque: only the `next_cursor` a list handed out is valid, so generated ones are
  left out (paging is tested by the list tests with real cursors).
- `aud` of POST /v1/sessions must be one of the server's configured bundle IDs, and `client_id`
  one of its client IDs (its settings, not the document): generated bodies use the test server's.
- `expires_at` must lie ahead of now, which a schema cannot say: a past one moves a year ahead.
(An `authorization_code` needs no more: the server's Apple credentials point at the stand-in,
which refuses made-up codes with invalid_grant, a 401.)
"""
import datetime

import schemathesis

BUNDLE_ID = "com.example.app"


def _valid_text(value):
    return isinstance(value, str) and 1 <= len(value) <= 255 and "\x00" not in value


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    if isinstance(case.query, dict) and "cursor" in case.query:
        del case.query["cursor"]
    body = case.body
    if not isinstance(body, dict):
        return
    if "aud" in body and _valid_text(body["aud"]):
        body["aud"] = BUNDLE_ID
    if "client_id" in body and _valid_text(body["client_id"]):
        body["client_id"] = BUNDLE_ID
    expires = body.get("expires_at")
    if isinstance(expires, str):
        try:
            when = datetime.datetime.fromisoformat(expires.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            return  # not a date-time: a request meant to be refused
        now = datetime.datetime.now(datetime.timezone.utc)
        if when.tzinfo is not None and when <= now:
            body["expires_at"] = (now + datetime.timedelta(days=365)).isoformat().replace("+00:00", "Z")
