-- Suppressions: "do not mail this address", kept from Apple's notifications (issue 44).
-- `suppressions` holds each app's address as the rules left it (a last-writer-wins register on
-- the event time); `suppression_changes` is the feed: one row per change, its id the cursor.
-- Writers take one transaction-level advisory lock (`SuppressionStore.feedLock`) before they
-- read or write either table, so ids are taken in commit order and a reader paging by id never
-- skips one committed late.
CREATE TABLE suppressions (
    aud text NOT NULL,
    address text NOT NULL CHECK (octet_length(address) BETWEEN 3 AND 320),
    sub text NOT NULL,
    suppressed boolean NOT NULL,
    reason text NOT NULL CHECK (octet_length(reason) BETWEEN 1 AND 40),
    event_time timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (aud, address)
);
CREATE INDEX suppressions_by_user ON suppressions (aud, sub);

CREATE TABLE suppression_changes (
    id bigserial PRIMARY KEY,
    aud text NOT NULL,
    address text NOT NULL,
    sub text NOT NULL,
    action text NOT NULL CHECK (action IN ('suppress', 'lift')),
    reason text NOT NULL CHECK (octet_length(reason) BETWEEN 1 AND 40),
    event_time timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX suppression_changes_by_app ON suppression_changes (aud, id);
CREATE INDEX suppression_changes_by_user ON suppression_changes (aud, sub, id);

-- One lane per mail provider (`Lane.suppressions`): aud/sub name the user, target the address,
-- kind the action, payload the reason. Jobs of one address run one at a time in id order (the
-- claim's gate reads this index of open jobs by target).
CREATE INDEX jobs_open_by_target ON jobs (lane, aud, target, id)
    WHERE target IS NOT NULL AND state IN ('available', 'retryable', 'running');
CREATE INDEX jobs_suppressions_postmark_ready ON jobs (run_at, id) WHERE lane = 'suppressions_postmark' AND state IN ('available', 'retryable');
CREATE INDEX jobs_suppressions_sendgrid_ready ON jobs (run_at, id) WHERE lane = 'suppressions_sendgrid' AND state IN ('available', 'retryable');
CREATE INDEX jobs_suppressions_mailgun_ready ON jobs (run_at, id) WHERE lane = 'suppressions_mailgun' AND state IN ('available', 'retryable');
CREATE INDEX jobs_suppressions_resend_ready ON jobs (run_at, id) WHERE lane = 'suppressions_resend' AND state IN ('available', 'retryable');
CREATE INDEX jobs_suppressions_ses_ready ON jobs (run_at, id) WHERE lane = 'suppressions_ses' AND state IN ('available', 'retryable');

-- A backfill (`suppressions sync --target`): where it stands, so a killed run resumes there.
CREATE TABLE suppression_syncs (
    target text PRIMARY KEY,
    after_aud text NOT NULL DEFAULT '',
    after_address text NOT NULL DEFAULT '',
    queued bigint NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);

-- A token may read the feed (scope `suppressions:read`).
ALTER TABLE api_tokens DROP CONSTRAINT api_tokens_scopes_check;
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_scopes_check CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['sessions:write', 'sessions:read',
    'accounts:read', 'accounts:erase', 'notifications:read', 'alerts:read', 'suppressions:read', 'admin']);

-- Each provider's last success, read by the dashboard and `suppressions list` without a scan.
CREATE INDEX jobs_suppressions_postmark_done ON jobs (finished_at) WHERE lane = 'suppressions_postmark' AND state = 'completed';
CREATE INDEX jobs_suppressions_sendgrid_done ON jobs (finished_at) WHERE lane = 'suppressions_sendgrid' AND state = 'completed';
CREATE INDEX jobs_suppressions_mailgun_done ON jobs (finished_at) WHERE lane = 'suppressions_mailgun' AND state = 'completed';
CREATE INDEX jobs_suppressions_resend_done ON jobs (finished_at) WHERE lane = 'suppressions_resend' AND state = 'completed';
CREATE INDEX jobs_suppressions_ses_done ON jobs (finished_at) WHERE lane = 'suppressions_ses' AND state = 'completed';

-- When a delivery job began failing (its first failed attempt; cleared when it succeeds): how
-- long a provider has kept failing, for `suppression_target_failing`, without reading attempts.
ALTER TABLE jobs ADD COLUMN failing_since timestamptz;
