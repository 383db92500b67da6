-- A notification's status follows its effect job: the queue's statements change `jobs` only, and
-- these statement-level triggers carry each new state to `notifications` (available: pending,
-- retryable: retrying, completed: applied, discarded: discarded). A claim (running) leaves the
-- status as it was, so a retried notification reads `retrying` while it runs. Rows whose status
-- already matches are not written, so an ingest batch (its notifications are pending) writes none.
CREATE FUNCTION siwa_notifications_follow_jobs() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    UPDATE public.notifications n SET status = f.status
    FROM (
        SELECT j.notification_id,
            (CASE j.state WHEN 'available' THEN 'pending' WHEN 'retryable' THEN 'retrying'
                          WHEN 'completed' THEN 'applied' WHEN 'discarded' THEN 'discarded' END)::public.notification_status AS status
        FROM changed_jobs j
        WHERE j.lane = 'effects' AND j.state <> 'running'
    ) f
    WHERE n.id = f.notification_id AND n.status IS DISTINCT FROM f.status;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_inserted_notifications_follow AFTER INSERT ON public.jobs
    REFERENCING NEW TABLE AS changed_jobs FOR EACH STATEMENT EXECUTE FUNCTION siwa_notifications_follow_jobs();
CREATE TRIGGER jobs_updated_notifications_follow AFTER UPDATE ON public.jobs
    REFERENCING NEW TABLE AS changed_jobs FOR EACH STATEMENT EXECUTE FUNCTION siwa_notifications_follow_jobs();
