#!/bin/sh
# A stand-in for the official postgres image, from Debian's postgresql-15 (scripts/compose_smoke.sh, when no
# registry answers): UTF-8 as the official image, the same variables (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB) and data folder.
set -eu
bin=/usr/lib/postgresql/15/bin
data=/var/lib/postgresql/data
mkdir -p "$data" /run/postgresql
chown -R postgres:postgres "$data" /run/postgresql
if [ ! -s "$data/PG_VERSION" ]; then
  printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
  chown postgres /tmp/pwfile
  su postgres -s /bin/sh -c "$bin/initdb -D $data -E UTF8 --locale=C.UTF-8 -U $POSTGRES_USER --pwfile=/tmp/pwfile -A scram-sha-256 >/dev/null"
  rm /tmp/pwfile
  echo "host all all all scram-sha-256" >> "$data/pg_hba.conf"
  su postgres -s /bin/sh -c "$bin/pg_ctl -D $data -o '-c listen_addresses=' -w start >/dev/null"
  su postgres -s /bin/sh -c \
    "PGPASSWORD='$POSTGRES_PASSWORD' $bin/psql -h /run/postgresql -U $POSTGRES_USER -d postgres -qc 'CREATE DATABASE \"$POSTGRES_DB\"'"
  su postgres -s /bin/sh -c "$bin/pg_ctl -D $data -m fast -w stop >/dev/null"
fi
exec su postgres -s /bin/sh -c "exec $bin/postgres -D $data -c listen_addresses='*'"
