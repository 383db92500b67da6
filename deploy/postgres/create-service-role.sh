#!/bin/sh
# Creates the role siwa-events connects as and the database it owns: no superuser, no CREATEDB or
# CREATEROLE, and PUBLIC keeps no privilege on the database (no CONNECT, no TEMPORARY): a role
# that `siwa-events db grant-backend` prepares gets CONNECT of its own and nothing to shadow with.
#
# In deploy/compose.yaml the postgres image runs it once, when its volume is new
# (/docker-entrypoint-initdb.d), as the bootstrap superuser (POSTGRES_USER), which is used for this
# only. Elsewhere run it once as a superuser with psql's usual PG* variables set.
#
# SIWA_DB_PASSWORD_FILE  the service role's password (default /run/secrets/siwa-db-password)
# SIWA_DB_ROLE           the role (default siwa)
# SIWA_DB_NAME           the database (default siwa)
set -eu
password_file=${SIWA_DB_PASSWORD_FILE:-/run/secrets/siwa-db-password}
[ -s "$password_file" ] || { echo "create-service-role.sh: $password_file is missing or empty" >&2; exit 1; }
# The password never goes on a command line (any user sees those in `ps`): psql reads the file
# itself, into a variable (the backquoted `cat` is given the file's name, not its contents; one
# trailing newline is dropped), and `:'password'` quotes it as a literal.
psql -X -q -v ON_ERROR_STOP=1 --dbname "${PGDATABASE:-postgres}" \
  -v role="${SIWA_DB_ROLE:-siwa}" -v database="${SIWA_DB_NAME:-siwa}" -v password_file="$password_file" <<'SQL'
\set password `cat -- :'password_file'`
CREATE ROLE :"role" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD :'password';
CREATE DATABASE :"database" OWNER :"role";
REVOKE ALL ON DATABASE :"database" FROM PUBLIC;
SQL
