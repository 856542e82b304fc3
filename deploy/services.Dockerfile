# Stand-ins for the public nginx, redis and postgres images on a host that reaches no container
# registry (scripts/images.sh builds it on the debootstrap base): Debian's packages behind the
# same interface as those images, as deploy/compose.yaml uses it (the commands `nginx -g
# 'daemon off;'`, `redis-server ...` and `postgres`; POSTGRES_USER, POSTGRES_DB,
# POSTGRES_HOST_AUTH_METHOD=trust, data in /var/lib/postgresql/data, /etc/nginx/conf.d/*.conf).
# Elsewhere compose.yaml takes the public images.
# BASE: scripts/images.sh passes a debootstrap root file system that already has the packages.
ARG BASE=docker.io/library/debian:bookworm-slim
FROM ${BASE}
RUN if ! command -v nginx >/dev/null || ! command -v redis-server >/dev/null \
      || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then \
      mkdir -p /etc/postgresql-common/createcluster.d \
      && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/no-main.conf \
      && apt-get update \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
           nginx-light redis-server postgresql \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && rm -rf /etc/nginx/sites-enabled/default /var/lib/postgresql/*/main /etc/postgresql/*/main \
 && ln -sf /dev/stdout /var/log/nginx/access.log && ln -sf /dev/stderr /var/log/nginx/error.log \
 && mkdir -p /data /var/lib/postgresql/data /var/run/postgresql \
 && chown postgres:postgres /var/lib/postgresql/data /var/run/postgresql
COPY services-entrypoint.sh /usr/local/bin/services-entrypoint
ENV PGDATA=/var/lib/postgresql/data
WORKDIR /data
ENTRYPOINT ["/usr/local/bin/services-entrypoint"]
