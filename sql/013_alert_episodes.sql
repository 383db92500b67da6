-- Alert episodes: one consent-revoked burst crosses both its type's series and `revocations`
-- (both types), and paged once per series. Since 013 an app's revocation spike is one alert row,
-- one episode, with `type` NULL and `series` naming each series that crossed; a series crossing
-- while it is open is told to the sinks as an `alert_updated_<n>` message (n: how many series
-- the episode names after it).
--
-- Rows written before (one per series) keep their `type` and get it as their only series; one
-- still open resolves on its own, once, as before. The one-firing index is unchanged: an episode
-- is the (kind, aud, '') of that index, an old row its (kind, aud, type).
ALTER TABLE alerts ADD COLUMN series text[] NOT NULL DEFAULT '{}';
UPDATE alerts SET series = ARRAY[type] WHERE type IS NOT NULL;
COMMENT ON COLUMN alerts.series IS 'the series that crossed during the episode (consent-revoked, account-delete, revocations); empty for operational kinds';
COMMENT ON COLUMN alerts.type IS 'alerts stored before 013 (one row per series): the series; NULL for episodes and operational kinds';
