-- The effects: accounts and sessions that workers change, the effect lane of the job queue with
-- leases, and an attempt log that outlives job pruning.

CREATE TYPE email_forwarding AS ENUM ('enabled', 'disabled');

-- One row per Sign in with Apple user of an app. The *_event_time columns are the event_time of
-- the last applied event of each kind: they decide order, whatever order deliveries arrive in.
CREATE TABLE accounts (
    aud                  text NOT NULL,
    sub                  text NOT NULL,
    email                text,
    is_private_email     boolean,
    email_forwarding     email_forwarding,
    email_event_time     timestamptz,
    address_event_time   timestamptz,
    consent_revoked_at   timestamptz,
    deleted_at           timestamptz,
    consent_event_time   timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (aud, sub)
);

-- The app's sessions of Sign in with Apple users. Backends create and check them (README).
CREATE TABLE sessions (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    aud             text NOT NULL,
    sub             text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz,
    revoked_at      timestamptz,
    revoked_reason  text CHECK (revoked_reason IN ('consent-revoked', 'account-delete', 'logout', 'erased')),
    revoked_by      text,
    -- event_time of the revoking event: the earliest revoking event is the one recorded.
    revoked_event_time timestamptz,
    CONSTRAINT sessions_revocation_complete CHECK ((revoked_at IS NULL) = (revoked_reason IS NULL))
);

CREATE INDEX sessions_user_active ON sessions (aud, sub, created_at) WHERE revoked_at IS NULL;
CREATE INDEX sessions_user ON sessions (aud, sub);

-- The queue: effect jobs carry their user and event time (per-user order), and a lease.
ALTER TABLE jobs
    ADD COLUMN lane text NOT NULL DEFAULT 'effects' CHECK (lane IN ('effects', 'callbacks')),
    ADD COLUMN aud text,
    ADD COLUMN sub text,
    ADD COLUMN event_time timestamptz,
    ADD COLUMN locked_by text,
    ADD COLUMN lease_expires_at timestamptz,
    ADD CONSTRAINT jobs_running_has_lease CHECK ((state = 'running') = (lease_expires_at IS NOT NULL AND locked_by IS NOT NULL));

UPDATE jobs SET aud = n.aud, sub = n.sub, event_time = n.event_time
FROM notifications n WHERE n.id = jobs.notification_id;

DROP INDEX jobs_ready;
-- Shaped like the claim: ready effect jobs in run order…
CREATE INDEX jobs_effects_ready ON jobs (run_at, id) WHERE lane = 'effects' AND state IN ('available', 'retryable');
-- …gated on the user's earlier unfinished jobs (one effect job per user in flight, oldest first).
CREATE INDEX jobs_user_open ON jobs (aud, sub, event_time, id) WHERE state IN ('available', 'retryable', 'running');
-- The rescuer's scan for leases that ran out.
CREATE INDEX jobs_running_lease ON jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE state IN ('completed', 'discarded');

-- Every attempt at a job, kept after the job itself is pruned.
CREATE TABLE job_attempts (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id           bigint NOT NULL,
    notification_id  bigint NOT NULL REFERENCES notifications (id) ON DELETE CASCADE,
    attempt          integer NOT NULL,
    worker           text NOT NULL,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL DEFAULT now(),
    outcome          text NOT NULL CHECK (outcome IN ('applied', 'retrying', 'discarded', 'lease_expired')),
    error            text,
    effect           jsonb
);

CREATE INDEX job_attempts_notification ON job_attempts (notification_id, id);

-- When the user's address was erased from this notification (account deleted).
ALTER TABLE notifications ADD COLUMN erased_at timestamptz;

-- Erasure finds a user's kept tokens among rejections by sub.
ALTER TABLE rejections ADD COLUMN sub text;
CREATE INDEX rejections_user ON rejections (sub) WHERE sub IS NOT NULL;
