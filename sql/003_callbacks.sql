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

-- The per-user gate of the effect claim looks only at effect jobs: a backlog of callbacks for a
-- user (a dead endpoint) must not slow that user's effects down.
DROP INDEX jobs_user_open;
CREATE INDEX jobs_user_open ON jobs (aud, sub, event_time, id)
    WHERE lane = 'effects' AND state IN ('available', 'retryable', 'running');

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

-- The effect claim's first step: ready effect jobs that are their user's earliest unfinished one
-- (per-user order), oldest first. Its plan depends on the statistics of jobs, and a backlog that
-- arrives faster than autovacuum analyzes (a burst, a bulk replay, workers started on a queue that
-- filled while they were down) looks like an empty table: the gate then became a nested loop over
-- every open job per candidate — minutes per claim on 100,000 jobs. So the function analyzes jobs
-- first when more than 1,000 rows and 10 % of it changed since the last analyze (one worker at a
-- time; the others go on with the statistics they have), and its query is planned after that.
CREATE FUNCTION siwa_effect_heads(max_jobs bigint) RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    changed bigint := pg_stat_get_mod_since_analyze('jobs'::regclass);
BEGIN
    IF changed > 1000 AND changed * 10 > pg_stat_get_live_tuples('jobs'::regclass)
       AND pg_try_advisory_xact_lock(hashtext('siwa_effect_heads analyze')) THEN
        ANALYZE jobs;
    END IF;
    -- EXECUTE: planned for this call's limit and the current statistics (a cached generic plan,
    -- made for an unknown limit, scanned every open job).
    RETURN QUERY EXECUTE
        'SELECT j.id FROM jobs j
         WHERE j.lane = ''effects'' AND j.state IN (''available'', ''retryable'') AND j.run_at <= now()
           AND NOT EXISTS (
               SELECT 1 FROM jobs e
               WHERE e.aud = j.aud AND e.sub = j.sub AND e.lane = ''effects''
                 AND e.state IN (''available'', ''retryable'', ''running'')
                 AND (e.event_time, e.id) < (j.event_time, j.id))
         ORDER BY j.run_at, j.id
         LIMIT ' || max_jobs::int;
END
$$;
