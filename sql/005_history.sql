-- Event history queries (GET /v1/notifications and friends): keyset pages newest first, by user or
-- by time.

-- A user's notifications, newest first, with id as the tie-breaker of the keyset. By sub first:
-- Apple's sub is team-scoped, backends look users up by it (aud, when given, filters the few rows).
-- Time-range pages use notifications_received (received_at DESC, id DESC) from 001.
--
-- Deliberately not here (measured, see BENCHMARKS.md): an index on event_time and one on
-- (received_at, type) for stats cost ~10 % of durable ingest at 64 connections (5,035 → 4,521/s),
-- and per-minute counts kept by a trigger made concurrent batches wait on the same counter row
-- (ingest fell to 523/s with 503s). Stats need a rollup that stays off the ingest path.
DROP INDEX notifications_user;
CREATE INDEX notifications_user ON notifications (sub, received_at DESC, id DESC);
