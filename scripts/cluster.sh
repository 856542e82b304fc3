#!/usr/bin/env bash
# The topology of docs/deploy.md as plain processes on one machine: 2 vLLM OpenAI servers
# (with the rag-stream KV connector, so a replica that takes over loads the KV blocks another
# saved), 2 rag-stream API processes, this machine's PostgreSQL and Redis. No Qdrant server
# exists here, so each API process has its own embedded vector store (ingest into both, or use
# RAG_STREAM_QDRANT_URL when you have a server).
#
#   scripts/cluster.sh start            # prints the URLs; logs and pids in $CLUSTER_DIR
#   scripts/cluster.sh start-api PORT   # one more API process on the running engines
#   scripts/cluster.sh stop
#
# Settings (environment): CLUSTER_DIR (.data/cluster), MODEL, VLLM_PORTS ("8101 8102"),
# API_PORTS ("8001 8002"), REDIS_URL, DATABASE (a PostgreSQL database, created if missing),
# KV_CONNECTOR (1; 0 runs the servers without it). Any RAG_STREAM_* variable set here reaches
# every process, e.g. RAG_STREAM_STREAMING__KEY_PREFIX and RAG_STREAM_KV__KEY_PREFIX to keep
# the cluster's Redis keys apart from another service's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIR=${CLUSTER_DIR:-.data/cluster}
MODELS_DIR=${MODELS_DIR:-$PWD/.data/models}
MODEL=${MODEL:-$MODELS_DIR/SmolLM2-135M-Instruct}
NAME=$(basename "$MODEL")
export RAG_STREAM_REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
DATABASE=${DATABASE:-rag_cluster}
KV_CONNECTOR=${KV_CONNECTOR:-1}
read -r -a VLLM_PORTS <<< "${VLLM_PORTS:-8101 8102}"
read -r -a API_PORTS <<< "${API_PORTS:-8001 8002}"

start() {
  mkdir -p "$DIR"
  psql -h 127.0.0.1 -U postgres -d postgres -tc "SELECT 1 FROM pg_database WHERE datname='$DATABASE'" \
    | grep -q 1 || psql -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE $DATABASE" >/dev/null
  local kv=()
  if [ "$KV_CONNECTOR" = 1 ]; then
    kv=(--kv-transfer-config "$("$PY" -c 'from rag_stream.kv.config import transfer_config_json
from rag_stream.settings import load_settings
print(transfer_config_json(load_settings()))')")
  fi
  local urls=()
  for port in "${VLLM_PORTS[@]}"; do
    # One process per replica runs the model on one thread (rag-stream's engine.cpu_executor
    # "uni"): vLLM's CPU default binds every replica's threads to the same first core, and its
    # engine core spins, waiting on its worker (docs/benchmarks.md, "The CPU engine's executor").
    VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=1 \
    setsid "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name "$NAME" \
      --distributed-executor-backend uni \
      --dtype float32 --enforce-eager --seed 0 --max-model-len 4096 \
      --kv-cache-memory-bytes $((512 << 20)) --gpu-memory-utilization 0.3 \
      --scheduling-policy priority --enable-prompt-tokens-details "${kv[@]}" --port "$port" \
      > "$DIR/vllm-$port.log" 2>&1 &
    echo $! > "$DIR/vllm-$port.pid"
    urls+=("http://127.0.0.1:$port")
  done
  for port in "${VLLM_PORTS[@]}"; do wait_http "http://127.0.0.1:$port/health" "vLLM :$port" "$DIR/vllm-$port.pid"; done
  (IFS=,; echo "${urls[*]}") > "$DIR/engine_urls"
  for port in "${API_PORTS[@]}"; do launch_api "$port"; done
  for port in "${API_PORTS[@]}"; do wait_http "http://127.0.0.1:$port/readyz" "API :$port" "$DIR/api-$port.pid"; done
  echo "engines: $(cat "$DIR/engine_urls")"
  for port in "${API_PORTS[@]}"; do echo "api: http://127.0.0.1:$port"; done
}

launch_api() {  # launch_api PORT: an API process on the engines in $DIR/engine_urls
  RAG_STREAM_PORT=$1 RAG_STREAM_DATA_DIR="$DIR/api-$1" RAG_STREAM_MODEL="$MODEL" \
    RAG_STREAM_MODELS_DIR="$MODELS_DIR" RAG_STREAM_ENGINE_URLS="$(cat "$DIR/engine_urls")" \
    RAG_STREAM_DATABASE_URL="postgresql+asyncpg://postgres@127.0.0.1:5432/$DATABASE" \
    setsid "$PY" -m rag_stream serve > "$DIR/api-$1.log" 2>&1 &
  echo $! > "$DIR/api-$1.pid"
}

start_api() {
  [ -e "$DIR/engine_urls" ] || { echo "cluster: not started (no $DIR/engine_urls)" >&2; exit 1; }
  launch_api "$1"
  wait_http "http://127.0.0.1:$1/readyz" "API :$1" "$DIR/api-$1.pid"
  echo "api: http://127.0.0.1:$1"
}

wait_http() {  # wait_http URL NAME [PIDFILE]
  for _ in $(seq 1 600); do
    if [ -n "${3:-}" ] && ! kill -0 "$(cat "$3")" 2>/dev/null; then
      echo "cluster: $2 exited (see $DIR)" >&2
      return 1
    fi
    if curl -fs "$1" >/dev/null 2>&1; then echo "cluster: $2 is up"; return 0; fi
    sleep 1
  done
  echo "cluster: $2 did not come up (see $DIR)" >&2
  return 1
}

stop() {
  for pidfile in "$DIR"/*.pid; do
    [ -e "$pidfile" ] || continue
    kill -TERM -- "-$(cat "$pidfile")" 2>/dev/null || true
  done
  for pidfile in "$DIR"/*.pid; do  # then wait for each, and kill what lingers
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

case "${1:-}" in
  start) start ;;
  start-api) start_api "${2:?usage: $0 start-api PORT}" ;;
  stop) stop ;;
  *) echo "usage: $0 start|start-api PORT|stop" >&2; exit 2 ;;
esac
