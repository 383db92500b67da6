-- The effect lane's claim as a function, so that each connection plans it once — planning it
-- cost PostgreSQL ~0.6 ms per claim, a quarter of its CPU at 1,000 notifications/s (batches of a
-- few jobs) — and plans it by key whatever the statistics say. A plan cached from an empty queue
-- or tables never analyzed (a fresh install, a quiet night) must not scan or hash the jobs table
-- once a backlog arrives: with sequential scans, hash and merge joins priced out here, the only
-- plans left walk jobs_effects_ready in run order, probe the per-user gate (jobs_user_order) per
-- candidate, and lock under the limit (rows other workers hold are skipped, not counted).
--
-- Up to `batch` ready effect jobs, each its user's earliest unfinished one (no earlier
-- (event_time, id) effect job of the user is available, retryable or running: a job another
-- worker holds is locked, not finished, so its user's later jobs wait), locked with SKIP LOCKED,
-- with the events they apply. The caller sets the transaction's own settings (EffectStore).
CREATE FUNCTION siwa_claim_effects(batch integer)
RETURNS TABLE (job_id bigint, attempt integer, notification_id bigint, jti text, aud text, sub text, type text, raw_type text,
               event_time_ms bigint, email text, is_private_email boolean)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
ROWS 200
AS $$
BEGIN
    RETURN QUERY
    WITH candidates AS (
        SELECT j.id, j.notification_id, j.attempt FROM jobs j
        WHERE j.lane = 'effects' AND j.state IN ('available', 'retryable') AND j.run_at <= now()
          AND NOT EXISTS (
              SELECT 1 FROM jobs e
              WHERE e.aud = j.aud AND e.sub = j.sub AND e.lane = 'effects'
                AND e.state IN ('available', 'retryable', 'running')
                AND (e.event_time, e.id) < (j.event_time, j.id))
        ORDER BY j.run_at, j.id
        LIMIT batch
        FOR UPDATE OF j SKIP LOCKED
    )
    SELECT c.id, c.attempt + 1, n.id, n.jti, n.aud, n.sub, n.type, n.raw_type,
        (extract(epoch FROM n.event_time) * 1000)::bigint, n.email, n.is_private_email
    FROM candidates c JOIN notifications n ON n.id = c.notification_id;
END
$$;
