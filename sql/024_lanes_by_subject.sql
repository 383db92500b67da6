-- A lane is declared in code (`Lane`): the schema no longer lists lane names. The built-in lanes
-- keep their exact rules; any other lane's jobs must have one of the known subjects (a
-- notification; an alert's message to a sink; a user and a target) and a payload until they
-- complete (a secret payload is cleared then), so adding a lane rewrites no constraint. The
-- name's format is `Lane`'s to check: a regular expression here cost 1.4 µs a row (BENCHMARKS.md).
ALTER TABLE jobs DROP CONSTRAINT jobs_lane_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_lane_check CHECK (octet_length(lane) BETWEEN 1 AND 40);
ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_lane_check;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_lane_check CHECK (octet_length(lane) BETWEEN 1 AND 40);

ALTER TABLE jobs DROP CONSTRAINT jobs_payload_by_lane;
ALTER TABLE jobs ADD CONSTRAINT jobs_payload_by_lane CHECK (
    CASE lane WHEN 'effects' THEN payload IS NULL
              WHEN 'apple_revocations' THEN (payload IS NULL) = (state = 'completed')
              WHEN 'callbacks' THEN payload IS NOT NULL
              WHEN 'alerts' THEN payload IS NOT NULL
              ELSE payload IS NOT NULL OR state = 'completed' END);

ALTER TABLE jobs DROP CONSTRAINT jobs_subject_by_lane;
ALTER TABLE jobs ADD CONSTRAINT jobs_subject_by_lane CHECK (
    CASE lane WHEN 'alerts' THEN notification_id IS NULL AND alert_id IS NOT NULL AND target IS NOT NULL
              WHEN 'apple_revocations' THEN alert_id IS NULL AND aud IS NOT NULL AND sub IS NOT NULL AND target IS NOT NULL
                  AND kind IN ('refresh_token', 'access_token')
              WHEN 'effects' THEN notification_id IS NOT NULL AND alert_id IS NULL
              WHEN 'callbacks' THEN notification_id IS NOT NULL AND alert_id IS NULL
              ELSE (notification_id IS NOT NULL AND alert_id IS NULL)
                OR (notification_id IS NULL AND alert_id IS NOT NULL AND target IS NOT NULL)
                OR (notification_id IS NULL AND alert_id IS NULL AND aud IS NOT NULL AND sub IS NOT NULL AND target IS NOT NULL) END);
