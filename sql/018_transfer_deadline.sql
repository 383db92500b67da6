-- Alert transfer_deadline: an app transfer's 60-day window runs out with users not yet migrated.
ALTER TABLE alert_silences DROP CONSTRAINT alert_silences_kind_check;
ALTER TABLE alert_silences ADD CONSTRAINT alert_silences_kind_check
    CHECK (kind IN ('revocation_spike', 'jobs_discarded', 'queue_lag', 'bad_signatures', 'apple_credentials', 'transfer_deadline', 'test'));
ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check;
ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check
    CHECK (kind IN ('revocation_spike', 'jobs_discarded', 'queue_lag', 'bad_signatures', 'apple_credentials', 'transfer_deadline', 'test'));
COMMENT ON COLUMN alerts.type IS 'alerts stored before 013 (one row per series): the series; transfer_deadline: the other team (to/from TEAMID); else NULL';
