-- What a role granted by `db grant-backend` can make the database do, closed from two sides:
-- the SECURITY DEFINER session trigger names everything by schema with pg_temp last in its
-- search_path (a caller's temporary objects never run as the owner), and a revocation is final
-- (SE003) unless the service re-attributes it to an earlier revoking event.

CREATE OR REPLACE FUNCTION public.siwa_session_allowed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    account public.accounts%ROWTYPE;
BEGIN
    INSERT INTO public.accounts (aud, sub) VALUES (NEW.aud, NEW.sub) ON CONFLICT (aud, sub) DO NOTHING;
    SELECT * INTO account FROM public.accounts a
    WHERE a.aud OPERATOR(pg_catalog.=) NEW.aud AND a.sub OPERATOR(pg_catalog.=) NEW.sub FOR UPDATE;
    IF account.deleted_at IS NOT NULL THEN
        RAISE EXCEPTION 'Apple reported this Apple ID deleted at %; no session can be created for it',
            pg_catalog.to_char(account.deleted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            USING ERRCODE = 'SE001';
    END IF;
    IF account.consent_revoked_at IS NOT NULL
       AND account.consent_revoked_at OPERATOR(pg_catalog.>=)
           coalesce(account.consent_given_at, '-infinity'::pg_catalog.timestamptz) THEN
        IF NEW.identity_issued_at IS NULL OR NEW.identity_issued_at OPERATOR(pg_catalog.<=) account.consent_revoked_at THEN
            RAISE EXCEPTION 'the user revoked consent at %; a session needs an identity token issued after that (the user signs in with Apple again)',
                pg_catalog.to_char(account.consent_revoked_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                USING ERRCODE = 'SE002';
        END IF;
        UPDATE public.accounts a SET consent_given_at = NEW.identity_issued_at, updated_at = pg_catalog.now()
        WHERE a.aud OPERATOR(pg_catalog.=) NEW.aud AND a.sub OPERATOR(pg_catalog.=) NEW.sub;
    END IF;
    RETURN NEW;
END $$;

-- Runs as the caller (no SECURITY DEFINER): it only compares the old and new row.
CREATE FUNCTION public.siwa_session_revocation_final() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NEW.revoked_at IS DISTINCT FROM OLD.revoked_at
       OR (NEW.revoked_reason IS DISTINCT FROM OLD.revoked_reason
           AND NOT coalesce(NEW.revoked_event_time OPERATOR(pg_catalog.<) OLD.revoked_event_time, false)) THEN
        RAISE EXCEPTION 'session % was revoked at % (%); a revocation is final: sign the user in again for a new session',
            OLD.id, pg_catalog.to_char(OLD.revoked_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), OLD.revoked_reason
            USING ERRCODE = 'SE003';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER sessions_revocation_final BEFORE UPDATE ON public.sessions
    FOR EACH ROW WHEN (OLD.revoked_at IS NOT NULL) EXECUTE FUNCTION public.siwa_session_revocation_final();
