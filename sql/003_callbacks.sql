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
-- (per-user order), oldest first. A function so that its plan cannot depend on statistics: with
-- sequential and bitmap scans off, the gate is always a per-candidate probe of jobs_user_open.
-- Planned from stale statistics (a backlog inserted before the next ANALYZE looks like an empty
-- table), the same query became a nested loop over every open job per candidate: claims ran for
-- minutes on a 100,000-job backlog. Not inlined (it has SET clauses): planned per call.
CREATE FUNCTION siwa_effect_heads(max_jobs bigint) RETURNS SETOF bigint
LANGUAGE sql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
    SELECT j.id FROM jobs j
    WHERE j.lane = 'effects' AND j.state IN ('available', 'retryable') AND j.run_at <= now()
      AND NOT EXISTS (
          SELECT 1 FROM jobs e
          WHERE e.aud = j.aud AND e.sub = j.sub AND e.lane = 'effects'
            AND e.state IN ('available', 'retryable', 'running')
            AND (e.event_time, e.id) < (j.event_time, j.id))
    ORDER BY j.run_at, j.id
    LIMIT max_jobs
$$;
