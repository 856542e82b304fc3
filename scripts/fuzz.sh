#!/usr/bin/env bash
# The long fuzzing run (docs/reliability.md, "Fuzzing the HTTP API"): schemathesis on every
# operation of /openapi.json, positive and negative inputs then stateful sequences, with a
# valid API key, against a server this script starts and stops with keys required; then every
# operation without a valid key (401 each). The configuration (server settings, checks, known
# ids) is the one tests/integration/test_fuzz_api.py uses, from tests/support/fuzz.py.
#
#   scripts/fuzz.sh                             # stub engine, SQLite, 300 examples, seed 1
#   FUZZ_EXAMPLES=300 FUZZ_SEED=7 scripts/fuzz.sh
#   FUZZ_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/scratch scripts/fuzz.sh
#   FUZZ_ENGINE=vllm scripts/fuzz.sh            # real vLLM on the tiny random-weight model
#
# FUZZ_EXAMPLES is per operation and per phase: 300 makes about 12,000 test cases. The database
# must be one you can throw away (the fuzzer creates and deletes KBs). Needs Redis
# (FUZZ_REDIS_URL, default redis://127.0.0.1:6379/0); its keys get a prefix of their own.
# Prints a summary, keeps the report and the server log when something failed, and exits
# non-zero then.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-$PWD/.venv/bin/python}
EXAMPLES=${FUZZ_EXAMPLES:-300}
SEED=${FUZZ_SEED:-1}
ENGINE=${FUZZ_ENGINE:-stub}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rag-stream-fuzz.XXXXXX")
PORT=$("$PY" -c 'from tests.support.server import free_port; print(free_port())')
URL="http://127.0.0.1:$PORT"
server=""

finish() {
  status=$?
  if [ -n "$server" ]; then
    kill -TERM -- "-$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  if [ "$status" -eq 0 ]; then rm -rf "$WORK"; else echo "fuzz: report and server log kept in $WORK"; fi
  exit "$status"
}
trap finish EXIT

export RAG_STREAM_PROFILE=test
export RAG_STREAM_DATA_DIR="$WORK/data"
export RAG_STREAM_MODELS_DIR=${RAG_STREAM_MODELS_DIR:-$PWD/.data/models}
export RAG_STREAM_PORT=$PORT
export RAG_STREAM_REDIS_URL=${FUZZ_REDIS_URL:-redis://127.0.0.1:6379/0}
export RAG_STREAM_STREAMING__KEY_PREFIX="rs-fuzz-$$"
[ -n "${FUZZ_DATABASE_URL:-}" ] && export RAG_STREAM_DATABASE_URL=$FUZZ_DATABASE_URL
eval "$("$PY" -m tests.support.fuzz env)"  # keys required, small jobs
# the key schemathesis sends (the CLI migrates the database first)
FUZZ_API_KEY=$("$PY" -m rag_stream keys create --tenant fuzz | tail -1)
export FUZZ_API_KEY

case "$ENGINE" in
  stub)
    # the service on the stub engine, unpaced: streams end in milliseconds
    command=("$PY" -m tests.support.stub_server)
    export STUB_TOKEN_DELAY_S=0
    ;;
  vllm)
    RAG_STREAM_MODEL=$("$PY" -c '
import sys
from pathlib import Path
from rag_stream.prepare import make_tiny_model
models = Path(sys.argv[1])
print(make_tiny_model(models / "tiny-llama-test", models / "SmolLM2-135M-Instruct"))
' "$RAG_STREAM_MODELS_DIR")
    export RAG_STREAM_MODEL
    command=("$PY" -m rag_stream serve)
    ;;
  *) echo "fuzz: FUZZ_ENGINE is stub or vllm, not $ENGINE" >&2; exit 2 ;;
esac

echo "fuzz: starting the server ($ENGINE engine) on $URL"
setsid "${command[@]}" >"$WORK/server.log" 2>&1 &
server=$!
for _ in $(seq 600); do
  curl -fs "$URL/readyz" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { tail -20 "$WORK/server.log"; exit 1; }
  sleep 0.5
done
curl -fs "$URL/readyz" >/dev/null || { echo "fuzz: server not ready" >&2; exit 1; }

"$PY" -m tests.support.fuzz seed "$URL" >"$WORK/ids.json"
"$PY" -m tests.support.fuzz config "$WORK/ids.json" "$EXAMPLES" "$SEED" >"$WORK/schemathesis.toml"
echo "fuzz: schemathesis, $EXAMPLES examples per operation and phase, seed $SEED"
result=0
(cd "$WORK" && "$PY" -m schemathesis.cli --config-file schemathesis.toml run "$URL/openapi.json" \
  --no-color --report json,ndjson --report-json-path "$WORK/report.json" \
  --report-ndjson-path "$WORK/events.ndjson") >"$WORK/output.txt" 2>&1 || result=$?

# the failures with a curl command reproducing each, then the figures
if [ ! -f "$WORK/report.json" ]; then tail -30 "$WORK/output.txt"; exit 1; fi
sed -n '/= FAILURES =/,/= WARNINGS =\|= SUMMARY =/p' "$WORK/output.txt"
"$PY" -m tests.support.fuzz summary "$WORK/report.json" "$WORK/events.ndjson"
"$PY" -m tests.support.fuzz auth "$URL" "$WORK/ids.json" || result=1
grep -c -E 'Traceback|unhandled error' "$WORK/server.log" | sed 's/^/server log tracebacks: /' || true
exit "$result"
