-- Whole tokens kept for another app's bundle ID (wrong_audience, Apple-signed) are deleted after
-- SIWA_OTHER_APP_TOKEN_RETENTION; this finds the oldest of them without scanning every rejection.
CREATE INDEX rejections_kept_token_time ON rejections (received_at) WHERE token IS NOT NULL;
