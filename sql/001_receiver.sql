-- The receiver: every genuine notification, the job that will apply its effect, rejected
-- deliveries kept for diagnosis, and the persisted Apple key set.

CREATE TYPE notification_status AS ENUM ('pending', 'applied', 'skipped', 'retrying', 'discarded');

CREATE TABLE notifications (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The idempotency key: Apple's jti, or the SHA-256 of the payload segment when it has none.
    jti              text NOT NULL,
    jti_derived      boolean NOT NULL DEFAULT false,
    aud              text NOT NULL,
    -- The decoded event. NULL only for an unreadable event (status skipped, unreadable_event).
    sub              text,
    type             text,             -- canonical: account-delete for both spellings; raw for unknown types
    raw_type         text,             -- as Apple spelled it
    event_time       timestamptz,      -- normalised from seconds or milliseconds; iat when missing
    email            text,
    is_private_email boolean,
    status           notification_status NOT NULL,
    skip_reason      text CHECK (skip_reason IN ('unreadable_event', 'unknown_type')),
    skip_detail      text,
    -- Verification facts and the token as received.
    kid              text NOT NULL,
    issued_at        timestamptz NOT NULL,
    expires_at       timestamptz,
    raw_jws          text NOT NULL,
    header           jsonb NOT NULL,
    claims           jsonb NOT NULL,
    received_at      timestamptz NOT NULL DEFAULT now(),
    remote_addr      text,
    deliveries       integer NOT NULL DEFAULT 1 CHECK (deliveries >= 1),
    last_delivery_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT notifications_jti_key UNIQUE (jti),
    CONSTRAINT notifications_skipped_has_reason CHECK ((status = 'skipped') = (skip_reason IS NOT NULL))
);

-- The same event under another jti is a duplicate too. NULLs are distinct, so unreadable events
-- (no sub/type) only deduplicate by jti.
CREATE UNIQUE INDEX notifications_event_key ON notifications (aud, sub, type, event_time);
CREATE INDEX notifications_received ON notifications (received_at DESC, id DESC);
CREATE INDEX notifications_user ON notifications (aud, sub, received_at DESC);

CREATE TYPE job_state AS ENUM ('available', 'running', 'retryable', 'completed', 'discarded');

-- One job per notification with an effect to apply; enqueued in the transaction that records it.
CREATE TABLE jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    notification_id  bigint NOT NULL REFERENCES notifications (id) ON DELETE CASCADE,
    kind             text NOT NULL DEFAULT 'apply_effect',
    state            job_state NOT NULL DEFAULT 'available',
    attempt          integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     integer NOT NULL DEFAULT 25 CHECK (max_attempts > 0),
    run_at           timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    attempted_at     timestamptz,
    finished_at      timestamptz,
    last_error       text,
    CONSTRAINT jobs_finished_check CHECK ((state IN ('completed', 'discarded')) = (finished_at IS NOT NULL))
);

-- Shaped like the claim query: ready jobs in run order.
CREATE INDEX jobs_ready ON jobs (run_at, id) WHERE state IN ('available', 'retryable');
CREATE UNIQUE INDEX jobs_notification_kind ON jobs (notification_id, kind);

-- Rejected deliveries, for "why didn't it arrive?". Written in batches and sampled per reason per
-- minute so that forged traffic cannot use up commit capacity or disk; what sampling drops is
-- still counted in rejection_counts.
CREATE TABLE rejections (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    received_at      timestamptz NOT NULL,
    remote_addr      text,
    reason           text NOT NULL,
    message          text NOT NULL,
    body_size        integer NOT NULL CHECK (body_size >= 0),
    body_prefix      bytea NOT NULL,
    kid              text,
    aud              text,
    jti              text,
    -- Only for tokens whose signature was valid (wrong_audience): the whole token and the key that
    -- verified it, so `rejections replay` can record it once the configuration is fixed.
    token            text,
    key_jwk          jsonb,
    replayed_at      timestamptz,
    replay_outcome   text,
    CONSTRAINT rejections_token_needs_key CHECK ((token IS NULL) = (key_jwk IS NULL))
);

CREATE INDEX rejections_reason_time ON rejections (reason, received_at DESC);
CREATE INDEX rejections_time ON rejections (received_at DESC);
-- A genuine token rejected again (Apple retries) is kept once.
CREATE UNIQUE INDEX rejections_token_jti ON rejections (jti) WHERE token IS NOT NULL;

CREATE TABLE rejection_counts (
    minute           timestamptz NOT NULL,
    reason           text NOT NULL,
    recorded         bigint NOT NULL DEFAULT 0,
    sampled_out      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, reason)
);

-- The last good Apple key set per source URL: a restart works while Apple is unreachable, and a
-- set fetched from another URL (local test keys) is never used after the URL changes.
CREATE TABLE jwks_cache (
    source_url       text PRIMARY KEY,
    document         text NOT NULL,
    fetched_at       timestamptz NOT NULL
);
