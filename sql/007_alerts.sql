-- Alerts: revocation spikes and operational trouble, one row per episode, delivered to sinks
-- through the job queue's own `alerts` lane.

CREATE TABLE alert_silences (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('revocation_spike', 'jobs_discarded', 'queue_lag', 'bad_signatures', 'test')),
    aud         text,                  -- NULL: every app
    until       timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text NOT NULL,
    reason      text
);
CREATE INDEX alert_silences_until ON alert_silences (until);

CREATE TABLE alerts (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind            text NOT NULL CHECK (kind IN ('revocation_spike', 'jobs_discarded', 'queue_lag', 'bad_signatures', 'test')),
    aud             text,
    type            text,              -- consent-revoked, account-delete, or revocations (both)
    state           text NOT NULL CHECK (state IN ('firing', 'resolved')),
    started_at      timestamptz NOT NULL,
    resolved_at     timestamptz,
    window_seconds  integer NOT NULL CHECK (window_seconds > 0),
    value           bigint NOT NULL,   -- the latest evaluation
    peak            bigint NOT NULL,   -- the largest of the episode, with what it was compared to:
    baseline        double precision,  -- NULL: no baseline (a new app, or a plain threshold)
    threshold       double precision NOT NULL,
    normal_since    timestamptz,       -- back to normal since (firing only; resolves after SIWA_SPIKE_RESOLVE_AFTER)
    silenced_by     bigint REFERENCES alert_silences (id),
    CONSTRAINT alerts_resolved_complete CHECK ((state = 'resolved') = (resolved_at IS NOT NULL))
);
-- One open episode per series: a second detector (a lease handed over mid-evaluation) cannot
-- open a duplicate.
CREATE UNIQUE INDEX alerts_one_firing ON alerts (kind, coalesce(aud, ''), coalesce(type, '')) WHERE state = 'firing';
CREATE INDEX alerts_started ON alerts (started_at DESC, id DESC);

-- Which process evaluates alerts: one holder at a time, renewed while it lives, taken over when
-- it expires (processes come and go; no connection is held for it).
CREATE TABLE leases (
    name        text PRIMARY KEY,
    holder      text NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- Sink deliveries are jobs in lane `alerts`: payload is the exact body, target names the sink
-- (`slack`, or `webhook:<first 16 hex of the URL's SHA-256>`: no secret URL in the database),
-- kind is alert_firing / alert_resolved / alert_test.
ALTER TABLE jobs ALTER COLUMN notification_id DROP NOT NULL;
ALTER TABLE jobs ADD COLUMN alert_id bigint REFERENCES alerts (id) ON DELETE CASCADE;
ALTER TABLE jobs ADD COLUMN target text;
ALTER TABLE jobs DROP CONSTRAINT jobs_lane_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_lane_check CHECK (lane IN ('effects', 'callbacks', 'alerts'));
ALTER TABLE jobs DROP CONSTRAINT jobs_callback_has_payload;
ALTER TABLE jobs ADD CONSTRAINT jobs_payload_by_lane CHECK ((lane IN ('callbacks', 'alerts')) = (payload IS NOT NULL));
ALTER TABLE jobs ADD CONSTRAINT jobs_subject_by_lane CHECK (
    CASE WHEN lane = 'alerts' THEN notification_id IS NULL AND alert_id IS NOT NULL AND target IS NOT NULL
         ELSE notification_id IS NOT NULL AND alert_id IS NULL END);
-- One message per alert, state and sink, however often an evaluation is retried.
CREATE UNIQUE INDEX jobs_alert_message ON jobs (alert_id, kind, target) WHERE lane = 'alerts';
CREATE INDEX jobs_alerts_ready ON jobs (run_at, id) WHERE lane = 'alerts' AND state IN ('available', 'retryable');
-- jobs_discarded alerts count recent discards.
CREATE INDEX jobs_discarded ON jobs (finished_at) WHERE state = 'discarded';

ALTER TABLE job_attempts ALTER COLUMN notification_id DROP NOT NULL;
ALTER TABLE job_attempts ADD COLUMN alert_id bigint REFERENCES alerts (id) ON DELETE CASCADE;
ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_lane_check;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_lane_check CHECK (lane IN ('effects', 'callbacks', 'alerts'));
