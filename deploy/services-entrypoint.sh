#!/bin/sh
# What the public postgres image's entrypoint does, the part deploy/compose.yaml uses: a first
# start makes the cluster (POSTGRES_USER, trust) and POSTGRES_DB; then postgres runs as its
# user, listening on every address. Any other command (nginx, redis-server) runs as given.
set -eu
if [ "${1:-}" = postgres ]; then
  shift
  bin=$(echo /usr/lib/postgresql/*/bin)
  user=${POSTGRES_USER:-postgres}
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    chown postgres:postgres "$PGDATA"
    runuser -u postgres -- "$bin/initdb" -D "$PGDATA" -U "$user" --auth=trust >/dev/null
    echo "host all all all ${POSTGRES_HOST_AUTH_METHOD:-trust}" >> "$PGDATA/pg_hba.conf"
    if [ -n "${POSTGRES_DB:-}" ] && [ "$POSTGRES_DB" != postgres ]; then
      echo "CREATE DATABASE \"$POSTGRES_DB\"" \
        | runuser -u postgres -- "$bin/postgres" --single -D "$PGDATA" postgres >/dev/null
    fi
    echo "services-entrypoint: initialised $PGDATA (user $user, database ${POSTGRES_DB:-postgres})"
  fi
  exec runuser -u postgres -- "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
