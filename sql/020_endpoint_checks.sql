-- The background endpoint check (SIWA_PUBLIC_URL): the latest result per URL, written by the one
-- process holding the `endpoint_check` lease and read by every process (/health on the admin
-- listener, metrics, the endpoint_unhealthy alert).
CREATE TABLE endpoint_checks (
    url                     text PRIMARY KEY,
    checked_at              timestamptz NOT NULL,
    failing                 text CHECK (failing IN ('url', 'dns', 'tls', 'route')),
    certificate_expires_at  timestamptz,
    findings                jsonb NOT NULL CHECK (jsonb_typeof(findings) = 'array')
);
COMMENT ON COLUMN endpoint_checks.failing IS 'the first check that failed; NULL: none did';
COMMENT ON COLUMN endpoint_checks.findings IS 'each check''s finding in order: [{"check", "level" (ok, warn, fail), "detail"}]';
