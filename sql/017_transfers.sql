-- App transfers between developer teams (issue 30): Apple gives every user a new `sub` in the
-- recipient team; both teams exchange identifiers through /auth/usermigrationinfo within 60 days.

-- One transfer of an app (its client ID and bundle ID) to or from another team. `transferred_at`
-- starts Apple's 60-day window.
CREATE TABLE transfers (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    direction       text NOT NULL CHECK (direction IN ('outgoing', 'incoming')),
    client_id       text NOT NULL,
    aud             text NOT NULL,
    team_id         text NOT NULL CHECK (team_id ~ '^[A-Z0-9]{10}$'),
    transferred_at  timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL,
    UNIQUE (direction, client_id, team_id)
);
COMMENT ON COLUMN transfers.team_id IS 'outgoing: the recipient team (target); incoming: the sending team';

-- Sending side: each known user's transfer identifier for the target team, or the error that
-- stopped it (kept, retried on request). Never exported with `sub`.
CREATE TABLE transfer_subs (
    transfer_id   bigint NOT NULL REFERENCES transfers (id) ON DELETE CASCADE,
    sub           text NOT NULL,
    transfer_sub  text CHECK (length(transfer_sub) BETWEEN 1 AND 512),
    error         text,
    attempts      integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (transfer_id, sub),
    CONSTRAINT transfer_subs_one_outcome CHECK (transfer_sub IS NULL OR error IS NULL)
);
CREATE INDEX transfer_subs_pending ON transfer_subs (transfer_id, sub) WHERE transfer_sub IS NULL AND error IS NULL;

-- Calls to /auth/usermigrationinfo, and the client_credentials token for them, are recorded too.
ALTER TABLE apple_auth_calls DROP CONSTRAINT apple_auth_calls_endpoint_check;
ALTER TABLE apple_auth_calls ADD CONSTRAINT apple_auth_calls_endpoint_check
    CHECK (endpoint IN ('/auth/token', '/auth/revoke', '/auth/usermigrationinfo'));
ALTER TABLE apple_auth_calls DROP CONSTRAINT apple_auth_calls_grant_type_check;
ALTER TABLE apple_auth_calls ADD CONSTRAINT apple_auth_calls_grant_type_check
    CHECK (grant_type IN ('authorization_code', 'refresh_token', 'client_credentials'));
ALTER TABLE apple_auth_calls DROP CONSTRAINT apple_auth_calls_shape;
ALTER TABLE apple_auth_calls ADD CONSTRAINT apple_auth_calls_shape CHECK (
    CASE endpoint WHEN '/auth/token' THEN grant_type IS NOT NULL AND token_type_hint IS NULL
                  WHEN '/auth/revoke' THEN grant_type IS NULL AND token_type_hint IS NOT NULL
                  ELSE grant_type IS NULL AND token_type_hint IS NULL END);

-- Receiving side: each transfer_sub to exchange at Apple, and what it became: the user's sub in
-- this team (and, when this database holds the sender's users too, the account it re-keyed).
CREATE TABLE transfer_imports (
    transfer_id   bigint NOT NULL REFERENCES transfers (id) ON DELETE CASCADE,
    transfer_sub  text NOT NULL CHECK (length(transfer_sub) BETWEEN 1 AND 512),
    new_sub       text,
    old_sub       text,
    error         text,
    attempts      integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (transfer_id, transfer_sub),
    CONSTRAINT transfer_imports_one_outcome CHECK (new_sub IS NULL OR error IS NULL)
);
CREATE INDEX transfer_imports_pending ON transfer_imports (transfer_id, transfer_sub) WHERE new_sub IS NULL AND error IS NULL;
CREATE INDEX transfer_subs_by_value ON transfer_subs (transfer_sub) WHERE transfer_sub IS NOT NULL;

-- A user re-keyed by a transfer: their sub before it, kept as history.
CREATE TABLE account_sub_changes (
    aud          text NOT NULL,
    old_sub      text NOT NULL,
    new_sub      text NOT NULL,
    transfer_id  bigint REFERENCES transfers (id) ON DELETE SET NULL,
    changed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (aud, old_sub)
);
CREATE INDEX account_sub_changes_new ON account_sub_changes (aud, new_sub);
