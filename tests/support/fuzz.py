"""Schemathesis against a running server: the configuration both the test
(tests/integration/test_fuzz_api.py) and the long run (scripts/fuzz.sh) use.

The server requires API keys (``SERVER_ENV``: every ``/v1`` route and ``/metrics`` want one,
as in production); schemathesis sends a valid key (``FUZZ_API_KEY``, made with
``rag-stream keys create``) on every request. ``auth_problems`` then sends every operation
without a key and with wrong ones: each must get a 401, never a 5xx or an answer.

Checks: ``not_a_server_error`` (no 5xx, whatever the input), ``status_code_conformance``
(every status answered is one the operation documents: rag_stream/api/openapi.py),
``content_type_conformance`` (and in a media type it documents),
``response_schema_conformance`` (each response, every SSE frame of a stream included, matches
its schema) and ``ignored_auth`` (an operation that answered the key also refuses the same
request without it and with a made-up one).

Known ids (a KB, a document, a chunk, finished streams, a conversation, a finished job, the
models) are offered for part of the path, query and body parameters that name one, so the
fuzzer also reaches past the 404s; deletes get spares of their own, so the seeded KB outlives
the run. A KB named "0" too: the coverage phase, which takes no dictionaries, names that one.
Jobs and chat completions, which have rules of their own past the schema, draw from the lists
more often and get twice the examples.
Integers, strings and moments also come, now and then, from short lists of values that broke
this API before (64-bit edges, NUL characters, the first and last days of the calendar).

For scripts/fuzz.sh, ``python -m tests.support.fuzz``: ``env`` prints the server's settings as
shell exports, ``seed URL`` creates the known resources and prints their ids (JSON),
``config IDS.json MAX_EXAMPLES SEED`` prints the configuration, ``auth URL IDS.json`` probes
every operation without a valid key, ``summary REPORT.json [EVENTS.ndjson]`` prints a run's
figures (with the NDJSON events: test cases and requests per phase). ``seed``
and ``auth`` read the key from ``FUZZ_API_KEY``, and so does schemathesis.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

# The server under test: keys required (as the production profile has it), so /metrics is
# behind the key too (security.metrics' default; its OpenAPI entry declares the key, so
# `ignored_auth` holds it to that), and jobs small enough that one made by the fuzzer ends in
# a fraction of a second on the stub engine.
SERVER_ENV = {
    "RAG_STREAM_SECURITY__REQUIRE_KEYS": "true",
    "RAG_STREAM_JOBS__MAX_SECTIONS": "3",
    "RAG_STREAM_JOBS__DEFAULT_SECTION_TOKENS": "16",
    "RAG_STREAM_JOBS__MAX_SECTION_TOKENS": "32",
    "RAG_STREAM_JOBS__OUTLINE_TOKENS": "32",
}
TENANT = "fuzz"
# The coverage phase takes no dictionaries: its positive cases name the simplest string, "0",
# wherever a body wants a KB name (POST /v1/jobs, /v1/answers...). A KB of that name, made by
# the seeding, lets them get past the 404 to the checks and the work behind them.
COVERAGE_KB = "0"
PUBLIC = {"GET /healthz", "GET /readyz"}  # the only operations without the key
KEY_VARIABLE = "FUZZ_API_KEY"

# Values at the edges of what the engine, SQL and Redis hold (as strings: TOML integers stop at
# 64 bits). Schemathesis sends those a schema allows as valid input, the others as invalid.
WIDE_INTEGERS = [-1, 0, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1]
# PostgreSQL refuses NUL in text; the others are near misses of ids and numbers.
ODD_STRINGS = ["\x00", "a\x00b", "\ufffd", " ", "0" * 40 + "1", "-0", "1_0", "\u202e"]
# Moments at the ends of the calendar, some with no UTC time (year 0, year 10000).
MOMENTS = [
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00+01:00",
    "0001-01-05T00:00:00",
    "9999-12-31T23:59:59.999999Z",
    "9999-12-31T23:59:59-01:00",
    "1970-01-01T00:00:00Z",
]


def create_key(env: Mapping[str, str], tenant: str = TENANT) -> str:
    """A key from the real CLI, on the database ``env`` names."""
    out = subprocess.run(
        [sys.executable, "-m", "rag_stream", "keys", "create", "--tenant", tenant],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return out.stdout.strip().splitlines()[-1]


def _client(base_url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=300)


def _finished_jobs(client: httpx.Client, kb: str, count: int) -> list[dict[str, Any]]:
    body = {"kb": kb, "title": "Seed", "outline": ["Herons", "Water"], "section_tokens": 16}
    jobs = [client.post("/v1/jobs", json=body).raise_for_status().json() for _ in range(count)]
    deadline = time.monotonic() + 120
    for i, job in enumerate(jobs):
        while job["status"] in ("queued", "running"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"seed job still {job['status']}: {job}")
            time.sleep(0.1)
            job = client.get(f"/v1/jobs/{job['id']}").raise_for_status().json()
        assert job["status"] == "completed", job
        jobs[i] = job
    return jobs


def known_ids(base_url: str, key: str) -> dict[str, list[str]]:
    """Create one of each resource; their ids seed the fuzzer's dictionaries. And spares of
    what can be deleted (KBs, documents, jobs), offered to the deletes only."""
    name = f"fuzz-{uuid.uuid4().hex[:8]}"
    with _client(base_url, key) as client:

        def post(path: str, **body: Any) -> dict[str, Any]:
            return client.post(path, json=body).raise_for_status().json()  # type: ignore[no-any-return]

        kb = post("/v1/kbs", name=name)
        coverage_kb = client.post("/v1/kbs", json={"name": COVERAGE_KB})
        if coverage_kb.status_code != 409:  # there already on a database seeded before
            coverage_kb.raise_for_status()
        docs = [
            post(f"/v1/kbs/{name}/documents", title="Seed", text=f"# Seed\n\nThe heron waits {n}.")
            for n in range(4)
        ]
        detail = (
            client.get(f"/v1/kbs/{name}/documents/{docs[0]['id']}", params={"include_chunks": True})
            .raise_for_status()
            .json()
        )
        generated = post("/v1/generate", prompt="seed", max_tokens=8, stream=False)
        answered = post("/v1/answers", kb=name, question="Where?", max_tokens=8, stream=False)
        jobs = _finished_jobs(client, name, 3)
        models = client.get("/v1/models").raise_for_status().json()["data"]
        spare_kbs = [post("/v1/kbs", name=f"{name}-spare-{n}")["name"] for n in range(2)]
    ids = {
        "kbs": [kb["name"], kb["id"]],
        "docs": [docs[0]["id"]],
        "chunks": [c["id"] for c in detail["chunks"]],
        "streams": [generated["stream_id"], answered["stream_id"], jobs[0]["stream_id"]],
        "conversations": [answered["conversation_id"]],
        "jobs": [jobs[0]["id"]],
        "models": [m["id"] for m in models],
    }
    # and a near miss of each, with a NUL character (PostgreSQL refuses it in a query)
    ids = {name: [*values, values[0] + "\x00"] for name, values in ids.items()}
    ids["spare_kbs"] = spare_kbs
    ids["spare_docs"] = [d["id"] for d in docs[1:]]
    ids["spare_jobs"] = [j["id"] for j in jobs[1:]]
    return ids


def config(ids: dict[str, list[str]], max_examples: int, seed: int) -> str:
    """schemathesis.toml: seed, limits, the key, the checks, and the known ids."""
    dictionaries = "".join(
        f"[dictionaries.{name}]\nvalues = {json.dumps(values)}\n" for name, values in ids.items()
    )
    return f"""\
seed = {seed}
workers = 1
request-timeout = 60
max-stream-events = 50

[generation]
max-examples = {max_examples}
database = "none"

[auth.openapi.HTTPBearer]
bearer = "${{{KEY_VARIABLE}}}"

[checks]
enabled = false
not_a_server_error.enabled = true
status_code_conformance.enabled = true
content_type_conformance.enabled = true
response_schema_conformance.enabled = true
ignored_auth.enabled = true

{dictionaries}
[dictionaries.wide_integers]
values = {json.dumps([str(n) for n in WIDE_INTEGERS])}
[dictionaries.odd_strings]
values = {json.dumps(ODD_STRINGS)}
[dictionaries.moments]
values = {json.dumps(MOMENTS)}
[dictionaries.cursors]
values = {json.dumps(ids["conversations"] + ids["jobs"])}
[dictionaries.headings]
values = ["Herons", "Shallow water", "Nests"]
[dictionaries.small]
values = [1, 2, 3]
[dictionaries.section_tokens]
values = [16, 32]
[dictionaries.user]
values = ["user"]
[dictionaries.question]
values = ["Where do herons wait?", "Nests?"]
[dictionaries.one]
values = [1]

[generation.dictionaries]
integer = {{ dictionary = "wide_integers", probability = 0.2 }}
string = {{ dictionary = "odd_strings", probability = 0.1 }}

# A job and a chat completion must also satisfy rules the schema does not state (a known KB or
# model; an outline or a number of sections, at most jobs.max_sections; top_k within
# jobs.max_top_k; n = 1; the last message the user's, and no user message without text...):
# most of what the fuzzer draws for them is refused whole, so their values come from the lists
# more often, and they get twice the examples.
# (Operation blocks do not merge their parameters: the first that matches decides, so these two
# come before the general one and repeat what they need of it.)
[[operations]]
include-name = "POST /v1/jobs"
[operations.generation]
max-examples = {max_examples * 2}
[operations.parameters]
"body.kb" = {{ dictionary = "kbs", probability = 0.9 }}
"body.outline[*]" = {{ dictionary = "headings", probability = 0.9 }}
"body.sections" = {{ dictionary = "small", probability = 0.8 }}
"body.section_tokens" = {{ dictionary = "section_tokens", probability = 0.8 }}
"body.top_k" = {{ dictionary = "small", probability = 0.8 }}

[[operations]]
include-name = "POST /v1/chat/completions"
[operations.generation]
max-examples = {max_examples * 2}
[operations.parameters]
"body.model" = {{ dictionary = "models", probability = 0.9 }}
"body.messages[*].role" = {{ dictionary = "user", probability = 0.9 }}
"body.messages[*].content" = {{ dictionary = "question", probability = 0.8 }}
"body.n" = {{ dictionary = "one", probability = 0.9 }}
"body.top_k" = {{ dictionary = "small", probability = 0.5 }}

[[operations]]
include-method = ["GET", "POST"]
[operations.parameters]
"path.kb" = {{ dictionary = "kbs", probability = 0.7 }}
"body.kb" = {{ dictionary = "kbs", probability = 0.5 }}
"path.doc" = {{ dictionary = "docs", probability = 0.7 }}
"path.chunk_id" = {{ dictionary = "chunks", probability = 0.7 }}
"path.stream_id" = {{ dictionary = "streams", probability = 0.5 }}
"path.conversation_id" = {{ dictionary = "conversations", probability = 0.5 }}
"body.conversation_id" = {{ dictionary = "conversations", probability = 0.3 }}
"path.job_id" = {{ dictionary = "jobs", probability = 0.5 }}
"path.model_id" = {{ dictionary = "models", probability = 0.5 }}
"body.model" = {{ dictionary = "models", probability = 0.7 }}
"query.before" = {{ dictionary = "cursors", probability = 0.3 }}
"query.from" = {{ dictionary = "moments", probability = 0.3 }}
"query.to" = {{ dictionary = "moments", probability = 0.3 }}

# Deletes get spares (and no ids seen in responses, where the fuzzing phase would find the
# seeded ones), so the seeded resources outlive the run.
[[operations]]
include-name = "DELETE /v1/kbs/{{kb}}"
[operations.parameters]
"path.kb" = {{ dictionary = "spare_kbs", probability = 0.3 }}
[operations.phases.fuzzing]
extra-data-sources = {{ responses = false }}

[[operations]]
include-name = "DELETE /v1/kbs/{{kb}}/documents/{{doc}}"
[operations.parameters]
"path.kb" = {{ dictionary = "kbs", probability = 0.7 }}
"path.doc" = {{ dictionary = "spare_docs", probability = 0.5 }}
[operations.phases.fuzzing]
extra-data-sources = {{ responses = false }}

[[operations]]
include-name = "DELETE /v1/jobs/{{job_id}}"
[operations.parameters]
"path.job_id" = {{ dictionary = "spare_jobs", probability = 0.3 }}
[operations.phases.fuzzing]
extra-data-sources = {{ responses = false }}
"""


# Authorization headers that must all get a 401: none, a made-up key, the right key id with a
# wrong secret, the key under another scheme, an empty Bearer, the key with a byte more, and
# bytes that are not ASCII (HTTP allows them; Starlette reads them as Latin-1).
def _bad_credentials(key: str) -> dict[str, bytes | None]:
    key_id = key.split("_", 2)[1]
    return {
        "no key": None,
        "made-up key": b"Bearer rsk_0123456789abcdef_" + b"x" * 43,
        "wrong secret": f"Bearer rsk_{key_id}_".encode() + b"x" * 43,
        "Basic scheme": f"Basic {key}".encode(),
        "empty Bearer": b"Bearer",
        "key plus a byte": f"Bearer {key}x".encode(),
        "not ASCII": f"Bearer rsk_{key_id}_".encode() + b"\xff\xfe" * 20,
    }


def _path(template: str, ids: dict[str, list[str]]) -> str:
    for param, group in (
        ("kb", "kbs"),
        ("doc", "docs"),
        ("chunk_id", "chunks"),
        ("stream_id", "streams"),
        ("conversation_id", "conversations"),
        ("job_id", "jobs"),
        ("model_id", "models"),
    ):
        template = template.replace("{" + param + "}", ids[group][0])
    return template


def auth_problems(base_url: str, key: str, ids: dict[str, list[str]]) -> tuple[int, list[str]]:
    """Every operation of /openapi.json but ``PUBLIC`` declares the key; each is sent without a
    valid one, on the seeded ids (a request the key would allow): (requests sent, problems)."""
    problems: list[str] = []
    sent = 0
    with httpx.Client(base_url=base_url, timeout=60) as client:
        schema = client.get("/openapi.json").raise_for_status().json()
        for template, operations in schema["paths"].items():
            for method, operation in operations.items():
                label = f"{method.upper()} {template}"
                if not operation.get("security"):
                    if label not in PUBLIC:
                        problems.append(f"{label} declares no key")
                    continue
                body: dict[str, Any] | None = {} if method in ("post", "put", "patch") else None
                for what, header in _bad_credentials(key).items():
                    headers = {b"Authorization": header} if header is not None else {}
                    r = client.request(method, _path(template, ids), json=body, headers=headers)
                    sent += 1
                    error = r.json().get("error", {}) if r.content else {}
                    if (
                        r.status_code != 401
                        or error.get("code") != "invalid_api_key"
                        or r.headers.get("www-authenticate") != "Bearer"
                    ):
                        problems.append(f"{label} with {what}: {r.status_code} {r.text[:200]}")
    return sent, problems


def run(
    base_url: str, workdir: Path, key: str, *, max_examples: int, seed: int
) -> tuple[dict[str, Any], str, dict[str, list[str]]]:
    """Seed the server, run the CLI; return its JSON report, its console output (which has
    a curl command reproducing each failure) and the seeded ids."""
    ids = known_ids(base_url, key)
    (workdir / "schemathesis.toml").write_text(config(ids, max_examples=max_examples, seed=seed))
    report = workdir / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            "schemathesis.toml",
            "run",
            f"{base_url}/openapi.json",
            "--no-color",
            "--report",
            "json",
            "--report-json-path",
            str(report),
        ],
        cwd=workdir,  # its cache folder lands here, not in the repository
        env={**os.environ, KEY_VARIABLE: key},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    return json.loads(report.read_text()), done.stdout + done.stderr, ids


def phase_counts(events: Path) -> dict[str, tuple[int, int]]:
    """Test cases and recorded calls per phase, from the CLI's NDJSON event report
    (``ScenarioFinished`` events: a recorder with the cases and interactions of a scenario).
    A call is a test case's own request: the extra requests of checks (``ignored_auth`` sends
    each accepted case again without the key) are not recorded."""
    counts: dict[str, list[int]] = {}

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            recorder = node.get("recorder")
            if isinstance(node.get("phase"), str) and isinstance(recorder, dict):
                phase = counts.setdefault(node["phase"], [0, 0])
                phase[0] += len(recorder.get("cases") or ())
                phase[1] += len(recorder.get("interactions") or ())
                return
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    with events.open() as lines:
        for line in lines:
            if '"recorder"' in line:
                visit(json.loads(line))
    return {name: (cases, requests) for name, (cases, requests) in counts.items()}


def summary(report: dict[str, Any]) -> str:
    cases = report["test_cases"]
    failures = Counter(f.get("title") or f.get("code") or "?" for f in report["failures"])
    phases = ", ".join(f"{name} {p['status']}" for name, p in report["phases"].items())
    lines = [
        f"schemathesis {report['schemathesis_version']}, seed {report['seed']}, "
        f"{report['running_time']:.0f} s",
        f"operations tested: {report['operations']['tested']}/{report['operations']['total']}",
        f"phases: {phases}",
        f"test cases: {cases['generated']} generated, {cases['with_failures']} with failures, "
        f"{cases['unique_failures']} unique failures, {cases['errored']} errored",
        f"errors: {len(report['errors'])}",
    ]
    lines += [f"  {n} x {title}" for title, n in failures.most_common()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    key = os.environ.get(KEY_VARIABLE, "")
    match argv:
        case ["env"]:
            print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in SERVER_ENV.items()))
        case ["seed", url] if key:
            print(json.dumps(known_ids(url, key)))
        case ["config", ids, max_examples, seed]:
            ids_ = json.loads(Path(ids).read_text())
            print(config(ids_, max_examples=int(max_examples), seed=int(seed)))
        case ["auth", url, ids] if key:
            sent, problems = auth_problems(url, key, json.loads(Path(ids).read_text()))
            print(f"auth: {sent} requests without a valid key, {len(problems)} not a 401")
            print("\n".join(problems))
            return 1 if problems else 0
        case ["summary", report, *events]:
            print(summary(json.loads(Path(report).read_text())))
            for path in events:
                try:
                    per_phase = phase_counts(Path(path))
                except (OSError, ValueError) as exc:
                    print(f"per phase: unavailable ({exc!r})")
                    continue
                for name, (cases, requests) in per_phase.items():
                    print(f"  {name}: {cases} test cases, {requests} recorded calls")
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
