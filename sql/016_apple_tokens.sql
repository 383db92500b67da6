-- Custody of Apple's tokens (issue 29): the refresh token each sign-in's code exchange returns,
-- encrypted; the lane that revokes them at Apple's /auth/revoke; and a record of every call made
-- to Apple's auth endpoints, since /auth/revoke answers 200 to anything.

-- The newest refresh token per user and client ID (a later sign-in replaces it: revoking the
-- older one would end the user's authorization). `token` is ciphertext, AES-GCM bound to aud/sub
-- (`v1.<key id>.<base64url>`); `key_id` names its key, so re-encryption finds the rest.
CREATE TABLE apple_tokens (
    aud           text NOT NULL,
    sub           text NOT NULL,
    client_id     text NOT NULL,
    token         text NOT NULL CHECK (token ~ '^v1\.[0-9a-f]{8}\.[A-Za-z0-9_-]+$' AND length(token) <= 8192),
    key_id        text GENERATED ALWAYS AS (split_part(token, '.', 2)) STORED,
    fingerprint   text NOT NULL CHECK (fingerprint ~ '^[0-9a-f]{12}$'),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    validated_at  timestamptz,
    PRIMARY KEY (aud, sub, client_id),
    FOREIGN KEY (aud, sub) REFERENCES accounts (aud, sub) ON DELETE CASCADE
);
CREATE INDEX apple_tokens_key ON apple_tokens (key_id);
-- Optional daily validation picks the tokens due first: last validated (or kept) longest ago.
CREATE INDEX apple_tokens_due ON apple_tokens ((coalesce(validated_at, created_at)));

-- Lane `apple_revocations`: one job per token to revoke. aud/sub name the user, target the client
-- ID, kind the token type; payload is the ciphertext, moved here from apple_tokens in the
-- transaction that erases the account, and cleared when Apple has taken the revocation.
ALTER TABLE jobs DROP CONSTRAINT jobs_lane_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_lane_check CHECK (lane IN ('effects', 'callbacks', 'alerts', 'apple_revocations'));
ALTER TABLE jobs DROP CONSTRAINT jobs_payload_by_lane;
ALTER TABLE jobs ADD CONSTRAINT jobs_payload_by_lane CHECK (
    CASE lane WHEN 'effects' THEN payload IS NULL
              WHEN 'apple_revocations' THEN (payload IS NULL) = (state = 'completed')
              ELSE payload IS NOT NULL END);
ALTER TABLE jobs DROP CONSTRAINT jobs_subject_by_lane;
ALTER TABLE jobs ADD CONSTRAINT jobs_subject_by_lane CHECK (
    CASE lane WHEN 'alerts' THEN notification_id IS NULL AND alert_id IS NOT NULL AND target IS NOT NULL
              WHEN 'apple_revocations' THEN alert_id IS NULL AND aud IS NOT NULL AND sub IS NOT NULL AND target IS NOT NULL
                  AND kind IN ('refresh_token', 'access_token')
              ELSE notification_id IS NOT NULL AND alert_id IS NULL END);
CREATE INDEX jobs_apple_revocations_ready ON jobs (run_at, id) WHERE lane = 'apple_revocations' AND state IN ('available', 'retryable');
CREATE INDEX jobs_apple_revocations_created ON jobs (created_at, id) WHERE lane = 'apple_revocations';

ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_lane_check;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_lane_check CHECK (lane IN ('effects', 'callbacks', 'alerts', 'apple_revocations'));

-- Every call to /auth/token and /auth/revoke: what was sent (never the token: a fingerprint, the
-- first 12 hex digits of its SHA-256) and what Apple answered (status nil: no answer).
CREATE TABLE apple_auth_calls (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                 timestamptz NOT NULL DEFAULT now(),
    endpoint           text NOT NULL CHECK (endpoint IN ('/auth/token', '/auth/revoke')),
    client_id          text NOT NULL,
    grant_type         text CHECK (grant_type IN ('authorization_code', 'refresh_token')),
    token_type_hint    text CHECK (token_type_hint IN ('refresh_token', 'access_token')),
    token_fingerprint  text NOT NULL CHECK (token_fingerprint ~ '^[0-9a-f]{12}$'),
    status             integer,
    error              text,
    aud                text,
    sub                text,
    job_id             bigint REFERENCES jobs (id) ON DELETE SET NULL,
    CONSTRAINT apple_auth_calls_shape CHECK (
        CASE endpoint WHEN '/auth/token' THEN grant_type IS NOT NULL AND token_type_hint IS NULL
                      ELSE grant_type IS NULL AND token_type_hint IS NOT NULL END)
);
CREATE INDEX apple_auth_calls_user ON apple_auth_calls (aud, sub, at DESC);
CREATE INDEX apple_auth_calls_at ON apple_auth_calls (at);
CREATE INDEX apple_auth_calls_job ON apple_auth_calls (job_id) WHERE job_id IS NOT NULL;

-- Alert apple_credentials: Apple refused our client secret (invalid_client) in the window.
ALTER TABLE alert_silences DROP CONSTRAINT alert_silences_kind_check;
ALTER TABLE alert_silences ADD CONSTRAINT alert_silences_kind_check
    CHECK (kind IN ('revocation_spike', 'jobs_discarded', 'queue_lag', 'bad_signatures', 'apple_credentials', 'test'));
ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check;
ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check
    CHECK (kind IN ('revocation_spike', 'jobs_discarded', 'queue_lag', 'bad_signatures', 'apple_credentials', 'test'));

ALTER TABLE audit_log DROP CONSTRAINT audit_log_action_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_action_check
    CHECK (action IN ('token.create', 'token.revoke', 'account.erase', 'apple_tokens.reencrypt'));
