#!/usr/bin/env bash
# The topology of docs/deploy.md as plain processes on one machine: 2 vLLM OpenAI servers,
# 2 rag-stream API processes, this machine's PostgreSQL and Redis. No Qdrant server exists
# here, so each API process has its own embedded vector store (ingest into both, or use
# RAG_STREAM_QDRANT_URL when you have a server).
#
#   scripts/cluster.sh start   # prints the URLs; logs and pids in $CLUSTER_DIR (.data/cluster)
#   scripts/cluster.sh stop
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIR=${CLUSTER_DIR:-.data/cluster}
MODELS_DIR=${MODELS_DIR:-$PWD/.data/models}
MODEL=${MODEL:-$MODELS_DIR/SmolLM2-135M-Instruct}
NAME=$(basename "$MODEL")
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
DATABASE=${DATABASE:-rag_cluster}
VLLM_PORTS=(${VLLM_PORTS:-8101 8102})
API_PORTS=(${API_PORTS:-8001 8002})

start() {
  mkdir -p "$DIR"
  psql -h 127.0.0.1 -U postgres -d postgres -tc "SELECT 1 FROM pg_database WHERE datname='$DATABASE'" \
    | grep -q 1 || psql -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE $DATABASE" >/dev/null
  urls=()
  for port in "${VLLM_PORTS[@]}"; do
    setsid "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name "$NAME" \
      --dtype float32 --enforce-eager --seed 0 --max-model-len 4096 \
      --kv-cache-memory-bytes $((512 << 20)) --gpu-memory-utilization 0.3 \
      --scheduling-policy priority --enable-prompt-tokens-details --port "$port" \
      > "$DIR/vllm-$port.log" 2>&1 &
    echo $! > "$DIR/vllm-$port.pid"
    urls+=("http://127.0.0.1:$port")
  done
  for port in "${VLLM_PORTS[@]}"; do wait_http "http://127.0.0.1:$port/health" "vLLM :$port" "$DIR/vllm-$port.pid"; done
  engine_urls=$(IFS=,; echo "${urls[*]}")
  for port in "${API_PORTS[@]}"; do
    RAG_STREAM_PORT=$port RAG_STREAM_DATA_DIR="$DIR/api-$port" RAG_STREAM_MODEL="$MODEL" \
      RAG_STREAM_MODELS_DIR="$MODELS_DIR" \
      RAG_STREAM_ENGINE_URLS="$engine_urls" RAG_STREAM_REDIS_URL="$REDIS_URL" \
      RAG_STREAM_DATABASE_URL="postgresql+asyncpg://postgres@127.0.0.1:5432/$DATABASE" \
      setsid "$PY" -m rag_stream serve > "$DIR/api-$port.log" 2>&1 &
    echo $! > "$DIR/api-$port.pid"
  done
  for port in "${API_PORTS[@]}"; do wait_http "http://127.0.0.1:$port/readyz" "API :$port" "$DIR/api-$port.pid"; done
  echo "engines: $engine_urls"
  for port in "${API_PORTS[@]}"; do echo "api: http://127.0.0.1:$port"; done
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
    rm -f "$pidfile"
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
