-- Event history queries (GET /v1/notifications and friends): keyset pages newest first, by user or
-- by time field, and counts per time bucket.

-- A user's notifications, newest first, with id as the tie-breaker of the keyset. By sub first:
-- Apple's sub is team-scoped, backends look users up by it (aud, when given, filters the few rows).
DROP INDEX notifications_user;
CREATE INDEX notifications_user ON notifications (sub, received_at DESC, id DESC);
-- time_field=event_time pages.
CREATE INDEX notifications_event_time ON notifications (event_time DESC, id DESC) WHERE event_time IS NOT NULL;
-- Stats per bucket and type read per-minute counts, kept by statement-level triggers on every
-- insert and delete (whoever writes: the receiver's group commit, bulk loads, retention pruning).
-- Counting 7 days of a million rows on demand took 400-800 ms; this reads at most 10,080 minutes
-- per app and type. Concurrent receivers add to the same minute's row: each waits for the other's
-- commit on that row, which group commit makes one short wait per batch.
CREATE TABLE notification_counts (
    minute  timestamptz NOT NULL,
    aud     text NOT NULL,
    type    text NOT NULL,
    count   bigint NOT NULL,
    PRIMARY KEY (minute, aud, type)
);

CREATE FUNCTION notification_counts_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO notification_counts (minute, aud, type, count)
    SELECT date_trunc('minute', received_at, 'UTC'), aud, coalesce(type, 'unreadable'), count(*)
    FROM inserted GROUP BY 1, 2, 3
    ON CONFLICT (minute, aud, type) DO UPDATE SET count = notification_counts.count + excluded.count;
    RETURN NULL;
END $$;

CREATE FUNCTION notification_counts_remove() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE notification_counts c SET count = c.count - d.n
    FROM (SELECT date_trunc('minute', received_at, 'UTC') AS minute, aud, coalesce(type, 'unreadable') AS type, count(*) AS n
          FROM deleted GROUP BY 1, 2, 3) d
    WHERE c.minute = d.minute AND c.aud = d.aud AND c.type = d.type;
    DELETE FROM notification_counts WHERE count <= 0;
    RETURN NULL;
END $$;

CREATE TRIGGER notifications_counted AFTER INSERT ON notifications
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION notification_counts_add();
CREATE TRIGGER notifications_uncounted AFTER DELETE ON notifications
    REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION notification_counts_remove();

INSERT INTO notification_counts (minute, aud, type, count)
SELECT date_trunc('minute', received_at, 'UTC'), aud, coalesce(type, 'unreadable'), count(*) FROM notifications GROUP BY 1, 2, 3;
