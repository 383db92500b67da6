-- Event history queries (GET /v1/notifications and friends): keyset pages newest first, by user or
-- by time field, and counts per time bucket.

-- A user's notifications, newest first, with id as the tie-breaker of the keyset. By sub first:
-- Apple's sub is team-scoped, backends look users up by it (aud, when given, filters the few rows).
DROP INDEX notifications_user;
CREATE INDEX notifications_user ON notifications (sub, received_at DESC, id DESC);
-- time_field=event_time pages.
CREATE INDEX notifications_event_time ON notifications (event_time DESC, id DESC) WHERE event_time IS NOT NULL;
-- Stats per bucket and type read this index only (no table access).
CREATE INDEX notifications_received_type ON notifications (received_at, type);
