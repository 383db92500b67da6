-- Lane `apple_validations`: the daily validation of a kept Apple refresh token runs on the queue,
-- as every other call to Apple does (one claim, retry and discard). aud/sub name the user, target
-- the client ID, the payload the fingerprint of the token that was due (never the token). At most one open job
-- per token: the scheduler's enqueue adds none while one waits or runs.
CREATE INDEX jobs_apple_validations_ready ON jobs (run_at, id) WHERE lane = 'apple_validations' AND state IN ('available', 'retryable');
CREATE UNIQUE INDEX jobs_apple_validations_open ON jobs (aud, sub, target)
    WHERE lane = 'apple_validations' AND state IN ('available', 'retryable', 'running');
