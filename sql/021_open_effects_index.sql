-- The effect claim's per-user gate (siwa_effect_jobs_ahead: an earlier unfinished effect job of the
-- same user?) reads open jobs only, so it gets an index of open effect jobs in place of
-- jobs_user_order, which held every job of every lane and took a new entry at each job's insert and
-- at its completion. sql/003 chose the full index because a partial one, planned from statistics of
-- an empty queue, was scanned whole per candidate. Since sql/014 the gate is a per-candidate subplan
-- whose search keys are the candidate's aud and sub, which no statistics make dearer than a full
-- scan; QueueTests plans the claim on never-analyzed tables.
CREATE INDEX jobs_effects_open ON jobs (aud, sub, event_time, id)
    WHERE lane = 'effects' AND state IN ('available', 'retryable', 'running');
-- One user's Apple revocations (`apple revocations --sub`, an app transfer's re-key); the other lanes'
-- jobs are found through their notification.
CREATE INDEX jobs_apple_revocations_user ON jobs (aud, sub) WHERE lane = 'apple_revocations';
DROP INDEX jobs_user_order;
