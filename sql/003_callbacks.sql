-- Callbacks: after an effect commits, an HTTP POST to the backend (Standard Webhooks signing),
-- retried with backoff in the queue's own `callbacks` lane, so that a failing endpoint never holds
-- back an effect.

-- The body a callback job sends, as exact text: every attempt signs the same bytes. It carries no
-- email address (type, aud, sub, jti, event_time, effect, revoked_sessions), so erasure has nothing
-- to remove from it.
ALTER TABLE jobs ADD COLUMN payload text;
-- The HTTP status of the last delivery attempt (NULL: no answer — refused, timed out).
ALTER TABLE jobs ADD COLUMN last_status integer;
ALTER TABLE jobs ADD CONSTRAINT jobs_callback_has_payload CHECK ((lane = 'callbacks') = (payload IS NOT NULL));

CREATE INDEX jobs_callbacks_ready ON jobs (run_at, id) WHERE lane = 'callbacks' AND state IN ('available', 'retryable');
CREATE INDEX jobs_callbacks_created ON jobs (created_at, id) WHERE lane = 'callbacks';

-- The per-user gate of the effect claim (is there an earlier unfinished effect job of this
-- user?) probes this index once per candidate. It is deliberately not partial: as a partial index
-- over open jobs, planned from statistics taken before a backlog arrived (a burst, a bulk replay,
-- workers starting on a queue that filled while they were down), the open set looked empty and
-- the planner scanned all of it for every candidate instead of probing by user — minutes per claim
-- on 100,000 jobs. Over all jobs, a full scan can never look cheaper than the probe. A user has a
-- handful of jobs, so the probe stays a few index tuples; state and lane ride along (INCLUDE).
DROP INDEX jobs_user_open;
CREATE INDEX jobs_user_order ON jobs (aud, sub, event_time, id) INCLUDE (lane, state);

-- The attempt log records deliveries too.
ALTER TABLE job_attempts ADD COLUMN lane text NOT NULL DEFAULT 'effects' CHECK (lane IN ('effects', 'callbacks'));
ALTER TABLE job_attempts ADD COLUMN http_status integer;
ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_outcome_check;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_outcome_check
    CHECK (outcome IN ('applied', 'delivered', 'retrying', 'discarded', 'lease_expired'));

-- The queue table churns (every job is inserted, updated two or three times, then deleted): vacuum
-- and analyze it after 1 % changes instead of PostgreSQL's 20 % / 10 %, so dead rows and stale
-- statistics do not pile up under a backlog.
ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.01);
