-- The backend API: bearer tokens (stored as hashes only), an audit log, and the account facts that
-- identity tokens and privacy requests add.

CREATE TABLE api_tokens (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name          text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$'),
    -- SHA-256 of the token. Tokens are 256 random bits, so a fast hash is enough: nothing to
    -- guess, and one indexed lookup per request.
    token_hash    bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    scopes        text[] NOT NULL CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['sessions:write', 'sessions:read',
                      'accounts:read', 'accounts:erase', 'notifications:read', 'alerts:read', 'admin']),
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz,
    last_used_at  timestamptz,
    revoked_at    timestamptz
);

-- A name identifies one live token (`tokens revoke <name>`); a revoked name can be reused.
CREATE UNIQUE INDEX api_tokens_live_name ON api_tokens (name) WHERE revoked_at IS NULL;

-- Who did what: token creation and revocation, privacy erasures. Never an email address.
CREATE TABLE audit_log (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text NOT NULL,
    action   text NOT NULL CHECK (action IN ('token.create', 'token.revoke', 'account.erase')),
    target   text NOT NULL,
    details  jsonb NOT NULL DEFAULT '{}'
);

CREATE INDEX audit_log_at ON audit_log (at DESC, id DESC);

-- From identity tokens: Apple's real-user signal (0 unsupported, 1 unknown, 2 likely real).
ALTER TABLE accounts ADD COLUMN real_user_status smallint;
-- A privacy request erased the address at this time (events from before it never store it again).
ALTER TABLE accounts ADD COLUMN erased_at timestamptz;

-- An account's sessions, newest first (GET /v1/accounts/{aud}/{sub}/sessions).
DROP INDEX sessions_user;
CREATE INDEX sessions_user ON sessions (aud, sub, created_at DESC, id DESC);
