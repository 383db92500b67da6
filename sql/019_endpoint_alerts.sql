-- Alerts quiet_app (an app's notifications stopped arriving) and endpoint_unhealthy (the public
-- endpoint registered with Apple fails the doctor's checks, or its certificate expires soon).
ALTER TABLE alert_silences DROP CONSTRAINT alert_silences_kind_check;
ALTER TABLE alert_silences ADD CONSTRAINT alert_silences_kind_check
    CHECK (kind IN ('revocation_spike', 'jobs_discarded', 'queue_lag', 'bad_signatures', 'apple_credentials', 'transfer_deadline',
                    'quiet_app', 'endpoint_unhealthy', 'test'));
ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check;
ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check
    CHECK (kind IN ('revocation_spike', 'jobs_discarded', 'queue_lag', 'bad_signatures', 'apple_credentials', 'transfer_deadline',
                    'quiet_app', 'endpoint_unhealthy', 'test'));

-- quiet_app reads when each app was last heard from: kept by the counts' fold, next to first_seen.
ALTER TABLE app_first_seen ADD COLUMN last_seen timestamptz;
UPDATE app_first_seen f SET last_seen = (SELECT max(minute) FROM notification_counts c WHERE c.aud = f.aud AND c.count > 0);
COMMENT ON COLUMN app_first_seen.last_seen IS 'the latest accepted notification folded (readers add the deltas not folded yet)';
