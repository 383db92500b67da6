-- The key-set cache and the endpoint checks are keyed by their URL without its userinfo, so a
-- credential in SIWA_APPLE_JWKS_URL or SIWA_PUBLIC_URL is never stored. Rows stored with one go:
-- both are caches, refilled by the next fetch or check.
DELETE FROM jwks_cache WHERE source_url ~ '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@[:space:]]*@';
DELETE FROM endpoint_checks WHERE url ~ '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@[:space:]]*@';
