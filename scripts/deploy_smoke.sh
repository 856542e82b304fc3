#!/usr/bin/env bash
# The production topology of deploy/compose.yaml, brought up with podman-compose and checked
# through nginx only (docs/deploy.md, "The compose smoke test"):
#   - /v1 refuses a request without a key; a key made with the CLI in an API container works;
#   - /v1/answers and a `kb:docs` chat completion send their sources before the first token;
#   - an API container killed (kill -9) mid-stream: the client resumes through nginx with
#     Last-Event-ID, the other container takes the stream over, and the text is the
#     uninterrupted one;
#   - a vLLM replica stopped mid-stream: the stream finishes on the other, the same text;
#   - an API container restarted on the same PostgreSQL, with that replica still stopped: it
#     starts on the other, a conversation is still there, and a follow-up on it is answered,
#     with the other API container stopped; the replica started again rejoins;
#   - `down` leaves no container, volume or network of the project.
# Prints each step's time and writes them to $SMOKE_DIR/report.txt.
#
# Needs the images (scripts/images.sh) and the prepared models (.data/models, `make install`).
# Settings (environment): SMOKE_DIR (.data/deploy-smoke: logs and report), PROXY_PORT (18080),
# MODELS_DIR (.data/models), PROJECT (rag-smoke), KEEP=1 leaves the stack up at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
PROJECT=${PROJECT:-rag-smoke}
DIR=${SMOKE_DIR:-$ROOT/.data/deploy-smoke}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/deploy/containers.conf}
export MODELS_DIR=${MODELS_DIR:-$ROOT/.data/models}
export PROXY_PORT=${PROXY_PORT:-18080}
SERVICES=localhost/rag-stream-services:bookworm  # stand-ins for the public images
export NGINX_IMAGE=${NGINX_IMAGE:-$SERVICES} REDIS_IMAGE=${REDIS_IMAGE:-$SERVICES}
export POSTGRES_IMAGE=${POSTGRES_IMAGE:-$SERVICES}
export PUBLIC_URL=http://127.0.0.1:$PROXY_PORT
URL=http://127.0.0.1:$PROXY_PORT
# what a fresh clone lacks, said before anything starts
need() { echo "smoke: $*" >&2; exit 1; }
[ -x "$PY" ] || need "no $PY: run \`make install\` first"
[ -f "$MODELS_DIR/SmolLM2-135M-Instruct/.prepared" ] \
  || need "no prepared models in $MODELS_DIR: run \`make install\` (or set MODELS_DIR)"
command -v podman-compose >/dev/null || need "no podman-compose: run scripts/images.sh first"
podman image exists "${API_IMAGE:-localhost/rag-stream-api:0.1.0}" \
  || need "no image ${API_IMAGE:-localhost/rag-stream-api:0.1.0}: run scripts/images.sh first"
mkdir -p "$DIR"
LOG=$DIR/compose.log
REPORT=$DIR/report.txt
: > "$LOG"
: > "$REPORT"
started=$(date +%s.%N)
last=$started

elapsed() { "$PY" -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):.1f}')" "$@"; }
step() {  # step MESSAGE: the time since the previous step, and since the start
  local now; now=$(date +%s.%N)
  printf 'smoke: %-62s %7s s  (at %6s s)\n' "$*" "$(elapsed "$now" "$last")" \
    "$(elapsed "$now" "$started")" | tee -a "$REPORT"
  last=$now
}
compose() { podman-compose -p "$PROJECT" -f deploy/compose.yaml "$@" >> "$LOG" 2>&1; }
container() { echo "${PROJECT}_$1_1"; }

down() {
  compose down -t 1 -v || true
  # podman-compose 1.0.3 leaves the project's network behind
  for net in $(podman network ls -q --filter "label=io.podman.compose.project=$PROJECT"); do
    podman network rm "$net" >> "$LOG" 2>&1 || true
  done
}
finish() {
  local code=$?
  if [ "$code" != 0 ]; then
    echo "smoke: FAILED (exit $code); container logs in $DIR" >&2
    for c in $(podman ps -a -q --filter "label=io.podman.compose.project=$PROJECT"); do
      podman logs "$c" > "$DIR/$(podman inspect -f '{{.Name}}' "$c").log" 2>&1 || true
    done
  fi
  if [ "${KEEP:-0}" != 1 ]; then down; fi
}
trap finish EXIT

wait_for() {  # wait_for WHAT SECONDS COMMAND...: poll once a second
  local what=$1 limit=$2; shift 2
  for _ in $(seq 1 "$limit"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "smoke: $what: not within $limit s" >&2
  return 1
}
healthy() { podman exec "$(container "$1")" python3 -c \
  "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/$2', timeout=2)"; }
logged() { podman logs "$(container "$1")" 2>&1 | grep -q "$2"; }

if podman ps -a -q --filter "label=io.podman.compose.project=$PROJECT" | grep -q .; then
  echo "smoke: a previous $PROJECT stack is still there: taking it down" >&2
  down
fi

# --- up, in the order this machine needs -------------------------------------------------------
compose up -d postgres redis vllm-1 vllm-2
step "up: postgres, redis, 2 vLLM replicas created"
replicas_up() { healthy vllm-1 health && healthy vllm-2 health; }
wait_for "vLLM replicas" 600 replicas_up
step "both vLLM replicas serve SmolLM2 (/health)"
# api-1 first: it ingests the sample KB; api-2 then copies it from PostgreSQL into its own
# vector store (no Qdrant server here: deploy/compose.yaml)
compose up -d api-1
wait_for "api-1's sample KB" 600 logged api-1 "sample kb 'docs'"
step "api-1 up, sample KB ingested"
compose up -d api-2 proxy
wait_for "api-2's sample KB" 600 logged api-2 "sample kb 'docs'"
wait_for "nginx" 60 curl -fs "$URL/readyz"
step "api-2 up (sample KB rebuilt from PostgreSQL), nginx up"

key=$(podman exec "$(container api-1)" rag-stream keys create --tenant local --name smoke | tail -n 1)
step "key created with the CLI in api-1"

# --- the checks, through nginx ------------------------------------------------------------------
PROJECT=$PROJECT URL=$URL KEY=$key "$PY" - <<'PYTHON' | tee -a "$REPORT"
"""The client side of the smoke test: everything through nginx; podman only to find and
kill the process or replica serving a stream."""

import json
import os
import subprocess
import time

import httpx

URL, KEY, PROJECT = os.environ["URL"], os.environ["KEY"], os.environ["PROJECT"]
AUTH = {"Authorization": f"Bearer {KEY}"}
QUESTION = {"kb": "docs", "question": "How do I resume a stream after a dropped connection?",
            "max_tokens": 160, "temperature": 0}
T0 = time.monotonic()


def say(what: str, **figures: float) -> None:
    extra = "  ".join(f"{k}={v:.2f}" for k, v in figures.items())
    print(f"smoke: {what:<62} {extra}", flush=True)


def container(service: str) -> str:
    return f"{PROJECT}_{service}_1"


def podman(*args: str) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"smoke: podman {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def logs(service: str) -> str:
    """A container's output and error output, as one text."""
    return subprocess.run(["podman", "logs", container(service)], check=True, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT).stdout


def events(response: httpx.Response):
    """(id, type, data) of each SSE event, keep-alive comments skipped."""
    event_id, kind, data = None, None, []
    for line in response.iter_lines():
        if not line:
            if data:
                yield event_id, kind, json.loads("\n".join(data))
            event_id, kind, data = None, None, []
        elif line.startswith("id:"):
            event_id = int(line[3:].strip())
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


class Run:
    """What a client saw of one stream: its events, from the first request and any resumes."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.text = ""
        self.last_id: int | None = None
        self.stream_id = ""
        self.conversation_id: str | None = None
        self.first_token_s: float | None = None
        self.done: dict | None = None
        self.broken = ""  # how the first connection ended, when it broke

    def take(self, event_id, kind, data, began: float) -> None:
        self.last_id = event_id if event_id is not None else self.last_id
        self.kinds.append(kind)
        if kind == "stream":
            self.stream_id = data["stream_id"]
            self.conversation_id = data.get("conversation_id")
        elif kind == "token":
            self.first_token_s = self.first_token_s or time.monotonic() - began
            self.text += data["text"]
        elif kind == "done":
            self.done = data
        elif kind == "error":
            raise SystemExit(f"smoke: error event: {data}")


def ask(client: httpx.Client, body: dict, stop_after: int | None = None, on_tokens=None) -> Run:
    """POST /v1/answers and read it; with ``stop_after``, call ``on_tokens(run)`` once that
    many tokens came, then read on until the connection ends (it may break)."""
    run, began = Run(), time.monotonic()
    try:
        with client.stream("POST", f"{URL}/v1/answers", json=body, headers=AUTH) as r:
            assert r.status_code == 200, (r.status_code, r.read())
            for event in events(r):
                run.take(*event, began)
                if stop_after is not None and run.kinds.count("token") == stop_after:
                    on_tokens(run)
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        run.broken = type(exc).__name__
    return run


def resume(client: httpx.Client, run: Run, deadline_s: float = 240) -> int:
    """Follow the stream from its last event id through nginx until it ends; the number of
    reconnections it took."""
    attempts, began = 0, time.monotonic()
    while run.done is None:
        assert time.monotonic() - began < deadline_s, "the stream did not finish"
        attempts += 1
        headers = {**AUTH, "Last-Event-ID": str(run.last_id)}
        try:
            with client.stream("GET", f"{URL}/v1/streams/{run.stream_id}/events",
                               headers=headers) as r:
                if r.status_code != 200:
                    time.sleep(0.5)
                    continue
                for event in events(r):
                    run.take(*event, began)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError):
            time.sleep(0.5)
    return attempts


def sources_first(kinds: list[str]) -> bool:
    first_token = kinds.index("token")
    return kinds[0] == "stream" and "citation" in kinds[:first_token]


with httpx.Client(timeout=httpx.Timeout(30, read=120)) as client:
    r = client.post(f"{URL}/v1/answers", json=QUESTION)
    assert r.status_code == 401, r.status_code
    say("no key: 401")

    reference = ask(client, QUESTION)
    assert sources_first(reference.kinds), reference.kinds[:8]
    assert reference.done and reference.kinds[-1] == "done"
    say("/v1/answers: stream, citations, then tokens, done",
        first_token_s=reference.first_token_s, tokens=reference.kinds.count("token"),
        citations=reference.kinds.count("citation"))

    began, chunks, first_content = time.monotonic(), [], None
    chat = {"model": "kb:docs", "stream": True, "max_tokens": 60, "temperature": 0,
            "messages": [{"role": "user", "content": QUESTION["question"]}]}
    with client.stream("POST", f"{URL}/v1/chat/completions", json=chat, headers=AUTH) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunk = json.loads(line[5:])
                chunks.append(chunk)
                delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
                if delta.get("content") and first_content is None:
                    first_content = time.monotonic() - began
    # the role chunk, then one with the sources (search_results, citations), then content
    sources_at = next(i for i, c in enumerate(chunks) if c.get("search_results"))
    content_at = next(i for i, c in enumerate(chunks) if c.get("choices")
                      and c["choices"][0]["delta"].get("content"))
    assert sources_at < content_at, (sources_at, content_at)
    say("kb:docs chat completion: sources before the first content",
        first_content_s=first_content, sources=len(chunks[sources_at]["search_results"]))

    # An API container killed mid-stream: resume through nginx on the other.
    killed: dict[str, str] = {}

    def kill_owner(run: Run) -> None:
        owner = podman("exec", container("redis"), "redis-cli", "GET",
                       f"rs:s:{run.stream_id}:lease").strip()
        service = owner.split(":")[0]
        pid = podman("inspect", "-f", "{{.State.Pid}}", container(service)).strip()
        subprocess.run(["kill", "-9", pid], check=True)
        killed.update(service=service, at=str(time.monotonic()))

    run = ask(client, QUESTION, stop_after=20, on_tokens=kill_owner)
    cut_at = run.kinds.count("token")
    attempts = resume(client, run)
    resumed_s = time.monotonic() - float(killed["at"])
    assert run.text == reference.text, (run.text, reference.text)
    say(f"kill -9 {killed['service']} mid-stream: resumed via nginx, same text",
        tokens_before_kill=cut_at, reconnects=attempts, kill_to_done_s=resumed_s)

    # A vLLM replica stopped mid-stream: the stream finishes on the other.
    def completions(service: str) -> int:
        return logs(service).count("POST /v1/completions")

    stopped: dict[str, str] = {}

    def stop_replica(run: Run) -> None:
        after = {s: completions(s) for s in ("vllm-1", "vllm-2")}
        serving = max(after, key=lambda s: after[s] - before[s])
        assert after[serving] > before[serving], "no replica got the request"
        subprocess.run(["podman", "stop", "-t", "0", container(serving)], check=True,
                       capture_output=True)
        stopped.update(service=serving, at=str(time.monotonic()))

    before = {s: completions(s) for s in ("vllm-1", "vllm-2")}
    run = ask(client, QUESTION, stop_after=20, on_tokens=stop_replica)
    if run.done is None:
        resume(client, run)
    assert run.text == reference.text, (run.text, reference.text)
    say(f"{stopped['service']} stopped mid-stream: finished on the other, same text",
        stop_to_done_s=time.monotonic() - float(stopped["at"]),
        cached_tokens=run.done["usage"]["cached_tokens"])

    # A conversation; its API container restarted on the same PostgreSQL while that replica is
    # still down (an API process starts on the replicas that answer); the other API container
    # stopped: the conversation is there, and a follow-up on it is answered.
    down_replica = stopped["service"]
    first = ask(client, {**QUESTION, "max_tokens": 40})
    assert first.done and first.conversation_id

    def serving_runs() -> int:  # each start logs the sample KB once it serves
        return logs("api-1").count("sample kb 'docs'")

    def address(service: str) -> str:
        return podman("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                      container(service)).strip()

    runs, old_ip = serving_runs(), address("api-1")
    # stop, then start: `podman restart` raced the restart policy here once (exit 125)
    podman("stop", "-t", "10", container("api-1"))
    podman("start", container("api-1"))
    began = time.monotonic()
    while serving_runs() == runs:
        assert time.monotonic() - began < 600, "api-1 did not come back"
        time.sleep(1)
    back_s = time.monotonic() - began
    down_at_start = f"engine replica http://{down_replica}:8000 is down at start"
    assert down_at_start in logs("api-1"), "api-1 did not start with the replica down"
    say(f"api-1 restarted with {down_replica} down: serves on the other",
        restart_to_serving_s=back_s)
    # nginx resolved api-1 when it loaded its configuration; podman gives a restarted
    # container a new address (a crashed one it restarts keeps its own): reload nginx
    new_ip = address("api-1")
    if new_ip != old_ip:
        podman("exec", container("proxy"), "nginx", "-s", "reload")
        say(f"api-1 came back on {new_ip} (was {old_ip}): nginx reloaded")
    podman("stop", "-t", "1", container("api-2"))
    r = client.get(f"{URL}/v1/conversations/{first.conversation_id}", headers=AUTH)
    assert r.status_code == 200, (r.status_code, r.text)
    before_turns = len(r.json()["messages"])
    second = ask(client, {**QUESTION, "question": "And what does Last-Event-ID do?",
                          "max_tokens": 40, "conversation_id": first.conversation_id})
    assert second.done and second.conversation_id == first.conversation_id
    after = client.get(f"{URL}/v1/conversations/{first.conversation_id}", headers=AUTH).json()
    assert len(after["messages"]) == before_turns + 2, after["messages"]
    say("api-1 restarted (same PostgreSQL), api-2 stopped: conversation kept",
        messages=len(after["messages"]))

    # The replica back: api-1's health checks see it and route to it again.
    podman("start", container(down_replica))
    began = time.monotonic()
    while f"engine replica http://{down_replica}:8000 is back" not in logs("api-1"):
        assert time.monotonic() - began < 600, f"api-1 never saw {down_replica} back"
        time.sleep(1)
    say(f"{down_replica} started again: api-1 routes to it again",
        start_to_rejoin_s=time.monotonic() - began)
PYTHON
step "checks through nginx passed"

if [ "${KEEP:-0}" = 1 ]; then
  echo "smoke: KEEP=1: the stack stays up ($URL); take it down with:"
  echo "  CONTAINERS_CONF=$CONTAINERS_CONF podman-compose -p $PROJECT -f deploy/compose.yaml down -t 1 -v"
  exit 0
fi
trap - EXIT
down
step "down"
left=$(podman ps -a -q --filter "label=io.podman.compose.project=$PROJECT" | wc -l)
vols=$(podman volume ls -q --filter "label=io.podman.compose.project=$PROJECT" | wc -l)
nets=$(podman network ls -q --filter "label=io.podman.compose.project=$PROJECT" | wc -l)
echo "smoke: left behind: $left containers, $vols volumes, $nets networks" | tee -a "$REPORT"
[ "$left$vols$nets" = 000 ]
step "smoke test passed"
