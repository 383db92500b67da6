-- The effect claim takes available jobs in event order, the gate's own order, not in run order.
--
-- Until now it walked the ready jobs in run order (run_at, id) and probed the gate for each: only a
-- user's earliest unfinished job passes. When users have several jobs queued out of event order (a
-- burst or a replay enqueued at one instant, Apple delivering a user's events out of order), most
-- jobs at the front of the run order are not their user's earliest: every claim probed them all
-- again, and the front grew as the drain went on. Measured on 100,000 jobs, 10 per user in random
-- order (`BENCH_DRAIN_ORDER=shuffled scripts/bench drain`): the drain ran at 1,077 jobs/s, with
-- 1,580 µs of PostgreSQL CPU per job; one claim a tenth of the way in probed 21,864 jobs to find
-- 200 (151 ms).
--
-- In event order (event_time, id: the gate's own order) the first job met of each user is its
-- earliest available one, so nearly every probe passes: that claim took 2 ms; the drain ran at
-- 5,485-6,759 jobs/s.
-- What is left to step over is the front other workers hold (gate probe passes, lock skipped), as
-- before. Nothing else changes: the same gate, then the same lock, under the limit.
--
-- Retryable jobs wait out their backoff (run_at in the future), so they keep a run-order index of
-- their own and are claimed first, gate before lock, as before. Available jobs are always due
-- (enqueued, rescued and retried-now with run_at = now()).
--
-- Ingest adds one entry to these (jobs_effects_next), as it did to jobs_effects_ready; completion
-- adds none.
CREATE INDEX jobs_effects_next ON jobs (event_time, id) WHERE lane = 'effects' AND state = 'available';
CREATE INDEX jobs_effects_retry ON jobs (run_at, id) WHERE lane = 'effects' AND state = 'retryable';
DROP INDEX jobs_effects_ready;

-- Same result as before (sql/009): up to `batch` jobs, each its user's earliest unfinished one,
-- locked, with the events they apply. One statement, so one snapshot: the retries taken and the
-- gate of the available jobs see the same jobs (in two statements, a user's job enqueued between
-- them with an earlier event_time could join its retry in the same batch). Bitmap scans and sorts
-- are priced out too: a bitmap scan and a sort of every available job must never look cheaper
-- than walking the index in order.
CREATE OR REPLACE FUNCTION siwa_claim_effects(batch integer)
RETURNS TABLE (job_id bigint, attempt integer, notification_id bigint, jti text, aud text, sub text, type text, raw_type text,
               event_time_ms bigint, email text, is_private_email boolean)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off SET enable_sort = off
ROWS 200
AS $$
BEGIN
    RETURN QUERY
    WITH retries AS (
        -- Retries that are due, in run order.
        SELECT j.id, j.notification_id, j.attempt FROM jobs j
        WHERE j.lane = 'effects' AND j.state = 'retryable' AND j.run_at <= now()
          AND NOT EXISTS (
              SELECT 1 FROM jobs e
              WHERE e.aud = j.aud AND e.sub = j.sub AND e.lane = 'effects'
                AND e.state IN ('available', 'retryable', 'running')
                AND (e.event_time, e.id) < (j.event_time, j.id))
        ORDER BY j.run_at, j.id
        LIMIT batch
        FOR UPDATE OF j SKIP LOCKED
    ), fresh AS (
        -- Then available jobs, in event order.
        SELECT j.id, j.notification_id, j.attempt FROM jobs j
        WHERE j.lane = 'effects' AND j.state = 'available'
          AND NOT EXISTS (
              SELECT 1 FROM jobs e
              WHERE e.aud = j.aud AND e.sub = j.sub AND e.lane = 'effects'
                AND e.state IN ('available', 'retryable', 'running')
                AND (e.event_time, e.id) < (j.event_time, j.id))
        ORDER BY j.event_time, j.id
        LIMIT batch - (SELECT count(*) FROM retries)
        FOR UPDATE OF j SKIP LOCKED
    ), candidates AS (
        SELECT * FROM retries UNION ALL SELECT * FROM fresh
    )
    SELECT c.id, c.attempt + 1, n.id, n.jti, n.aud, n.sub, n.type, n.raw_type,
        (extract(epoch FROM n.event_time) * 1000)::bigint, n.email, n.is_private_email
    FROM candidates c JOIN notifications n ON n.id = c.notification_id;
END
$$;
