-- Counts per minute, aud and type for GET /v1/stats/notifications, and per second for the spike
-- detector's window, without scanning notifications and without slowing ingest.
--
-- Statement-level triggers append one delta row per (second, aud, type) of each INSERT or DELETE
-- statement on notifications (a commit batch of 60 notifications in the same second adds one row).
-- Ingest only ever appends: concurrent batches never wait on a shared counter row (counters
-- updated in place by the triggers cut durable ingest at 64 connections from 5,035 to 523/s, see
-- BENCHMARKS.md). The workers' maintenance folds the deltas into notification_counts (per minute,
-- kept as long as the notifications) and notification_counts_recent (per second, kept a day)
-- every few seconds; readers add the deltas not folded yet, so a count is exact the moment its notification commits. The triggers
-- see every writer (the receiver, bulk loads, retention pruning, psql), so counts equal
-- count(*) over notifications at any committed point.

CREATE TABLE notification_counts (
    minute  timestamptz NOT NULL,
    aud     text NOT NULL,
    type    text NOT NULL,           -- canonical type; 'unreadable' for an unreadable event
    count   bigint NOT NULL,
    PRIMARY KEY (minute, aud, type)
);

-- Per second, for the spike detector's window (SIWA_SPIKE_WINDOW at most a few hours).
CREATE TABLE notification_counts_recent (
    second  timestamptz NOT NULL,
    aud     text NOT NULL,
    type    text NOT NULL,
    count   bigint NOT NULL,
    PRIMARY KEY (second, aud, type)
);

-- Append-only, no index: read whole by the fold (a few thousand rows at most between folds) and
-- by readers.
CREATE TABLE notification_count_deltas (
    second  timestamptz NOT NULL,
    aud     text NOT NULL,
    type    text NOT NULL,
    delta   bigint NOT NULL
);
ALTER TABLE notification_count_deltas SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);

CREATE FUNCTION notification_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO notification_count_deltas (second, aud, type, delta)
    SELECT date_trunc('second', received_at), aud, coalesce(type, 'unreadable'), count(*)
    FROM inserted GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

CREATE FUNCTION notification_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO notification_count_deltas (second, aud, type, delta)
    SELECT date_trunc('second', received_at), aud, coalesce(type, 'unreadable'), -count(*)
    FROM deleted GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

-- No insert or delete may slip between the backfill and the triggers (CREATE TRIGGER takes this
-- lock too; taking it first makes the backfill see exactly the rows the triggers will not).
LOCK TABLE notifications IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER notifications_count_inserted AFTER INSERT ON notifications
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION notification_count_inserted();
CREATE TRIGGER notifications_count_deleted AFTER DELETE ON notifications
    REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION notification_count_deleted();

INSERT INTO notification_counts (minute, aud, type, count)
SELECT date_trunc('minute', received_at, 'UTC'), aud, coalesce(type, 'unreadable'), count(*)
FROM notifications GROUP BY 1, 2, 3;
INSERT INTO notification_counts_recent (second, aud, type, count)
SELECT date_trunc('second', received_at), aud, coalesce(type, 'unreadable'), count(*)
FROM notifications WHERE received_at > now() - interval '1 day' GROUP BY 1, 2, 3;

-- When each app's first notification arrived: the spike detector's "does this app have history?"
-- (kept by the fold; a new app has no baseline yet).
CREATE TABLE app_first_seen (
    aud         text PRIMARY KEY,
    first_seen  timestamptz NOT NULL
);
INSERT INTO app_first_seen (aud, first_seen) SELECT aud, min(minute) FROM notification_counts GROUP BY aud;
