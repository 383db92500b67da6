-- The effect lane's per-user gate, defined once: a job may run only when no earlier (event_time, id)
-- effect job of its user is unfinished (available, retryable or running). Until now the condition
-- was written out in siwa_claim_effects (twice, sql/010) and again in the store's re-lock of one job
-- of a failed batch. Both now call this function.
--
-- A set-returning SQL function with one SELECT, no SET clause, not STRICT: PostgreSQL inlines it
-- where it is called in FROM, so the claim's plan is the one it had (one probe of jobs_user_order
-- per candidate), not a function call per job.
CREATE FUNCTION siwa_effect_jobs_ahead(aud text, sub text, event_time timestamptz, id bigint)
RETURNS SETOF bigint
LANGUAGE sql STABLE
AS $$
    SELECT e.id FROM jobs e
    WHERE e.aud = $1 AND e.sub = $2 AND e.lane = 'effects'
      AND e.state IN ('available', 'retryable', 'running')
      AND (e.event_time, e.id) < ($3, $4)
$$;

-- As sql/010, with the gate above, and the time that decides which retries are due passed in
-- (tests drive retries with it; the store passes now()).
CREATE FUNCTION siwa_claim_effects(batch integer, due_at timestamptz)
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
        WHERE j.lane = 'effects' AND j.state = 'retryable' AND j.run_at <= due_at
          AND NOT EXISTS (SELECT FROM siwa_effect_jobs_ahead(j.aud, j.sub, j.event_time, j.id))
        ORDER BY j.run_at, j.id
        LIMIT batch
        FOR UPDATE OF j SKIP LOCKED
    ), fresh AS (
        -- Then available jobs, in event order.
        SELECT j.id, j.notification_id, j.attempt FROM jobs j
        WHERE j.lane = 'effects' AND j.state = 'available'
          AND NOT EXISTS (SELECT FROM siwa_effect_jobs_ahead(j.aud, j.sub, j.event_time, j.id))
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

-- The one-argument claim of sql/010, for a binary of the previous release still running beside this
-- one during an upgrade: the same claim, due now.
CREATE OR REPLACE FUNCTION siwa_claim_effects(batch integer)
RETURNS TABLE (job_id bigint, attempt integer, notification_id bigint, jti text, aud text, sub text, type text, raw_type text,
               event_time_ms bigint, email text, is_private_email boolean)
LANGUAGE sql
ROWS 200
AS $$
    SELECT * FROM siwa_claim_effects(batch, now())
$$;
