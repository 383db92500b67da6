"""What the contract test teaches schemathesis that the document cannot express.

Loaded with SCHEMATHESIS_HOOKS=schemathesis_hooks (PYTHONPATH=Tests/contract) by HistoryAPITests.
- A `cursor` is opaque: only the `next_cursor` a list handed out is valid, so generated ones are
  left out (paging is tested by the list tests with real cursors).
- `aud` of POST /v1/sessions must be one of the server's configured bundle IDs (its settings, not
  the document): generated bodies use the test server's; its `expires_at` must be in the future
  (relative to now, which a schema cannot say): a past one is moved a year ahead.
"""
import datetime

import schemathesis

BUNDLE_ID = "com.example.app"


@schemathesis.hook
def map_query(ctx, query):
    if query and "cursor" in query:
        query = {key: value for key, value in query.items() if key != "cursor"}
    return query


@schemathesis.hook
def map_body(ctx, body):
    if isinstance(body, dict) and isinstance(body.get("aud"), str):
        body = dict(body, aud=BUNDLE_ID)
    if isinstance(body, dict) and isinstance(body.get("expires_at"), str):
        try:
            expires = datetime.datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00"))
        except ValueError:
            return body  # not a date-time: a negative case, left as generated
        now = datetime.datetime.now(datetime.timezone.utc)
        if expires.tzinfo is not None and expires <= now:
            body = dict(body, expires_at=(now + datetime.timedelta(days=365)).isoformat().replace("+00:00", "Z"))
    return body
