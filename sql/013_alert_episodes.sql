-- Alert episodes: an app's revocation spike is one row (type NULL) whose `series` names each series
-- that crossed, so one burst pages once. Rows written before keep their `type` as their only series
-- and still resolve once; the one-firing index is unchanged.
ALTER TABLE alerts ADD COLUMN series text[] NOT NULL DEFAULT '{}';
UPDATE alerts SET series = ARRAY[type] WHERE type IS NOT NULL;
COMMENT ON COLUMN alerts.series IS 'the series that crossed during the episode (consent-revoked, account-delete, revocations); empty for operational kinds';
COMMENT ON COLUMN alerts.type IS 'alerts stored before 013 (one row per series): the series; NULL for episodes and operational kinds';
