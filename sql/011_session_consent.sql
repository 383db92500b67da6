-- Who may open a session, decided in the database itself, so the API and a backend that shares the
-- database (`db grant-backend`) hold the same rules:
-- - never for an Apple ID that Apple reported deleted (SQLSTATE SE001);
-- - after a consent revocation, only with an identity token issued after it (the person signed in
--   again), which records consent given again on the account (SQLSTATE SE002 otherwise).

-- The `iat` of the identity token a session was opened with (NULL: opened with aud and sub alone).
ALTER TABLE sessions ADD COLUMN identity_issued_at timestamptz;
-- The `iat` of the latest identity token issued after a consent revocation.
ALTER TABLE accounts ADD COLUMN consent_given_at timestamptz;

-- Runs as its owner (the backend role may read accounts, not lock or change them). The account row
-- is created if missing and locked, so an effect applied at the same moment either comes first
-- (and is seen here) or waits for this transaction (and revokes this session with the others).
CREATE FUNCTION siwa_session_allowed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    account accounts%ROWTYPE;
BEGIN
    INSERT INTO accounts (aud, sub) VALUES (NEW.aud, NEW.sub) ON CONFLICT (aud, sub) DO NOTHING;
    SELECT * INTO account FROM accounts WHERE aud = NEW.aud AND sub = NEW.sub FOR UPDATE;
    IF account.deleted_at IS NOT NULL THEN
        RAISE EXCEPTION 'Apple reported this Apple ID deleted at %; no session can be created for it',
            to_char(account.deleted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            USING ERRCODE = 'SE001';
    END IF;
    IF account.consent_revoked_at IS NOT NULL AND account.consent_revoked_at >= coalesce(account.consent_given_at, '-infinity') THEN
        IF NEW.identity_issued_at IS NULL OR NEW.identity_issued_at <= account.consent_revoked_at THEN
            RAISE EXCEPTION 'the user revoked consent at %; a session needs an identity token issued after that (the user signs in with Apple again)',
                to_char(account.consent_revoked_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                USING ERRCODE = 'SE002';
        END IF;
        UPDATE accounts SET consent_given_at = NEW.identity_issued_at, updated_at = now()
        WHERE aud = NEW.aud AND sub = NEW.sub;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER sessions_allowed BEFORE INSERT ON sessions FOR EACH ROW EXECUTE FUNCTION siwa_session_allowed();
