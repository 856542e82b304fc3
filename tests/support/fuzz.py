"""Schemathesis against a running server: the configuration both the test
(tests/integration/test_fuzz_api.py) and the long run (scripts/fuzz.sh) use.

Checks: ``not_a_server_error`` (no 5xx, whatever the input) and ``response_schema_conformance``
(each documented response, SSE events included, matches its schema). Status-code conformance is
left out: the OpenAPI documents only 2xx and 422, while 404, 409, 413 and 415 are correct
answers here.

Known ids (a KB, a document, finished streams, a conversation) are offered for part of the path
and body parameters that name one, so the fuzzer also reaches past the 404s; deletes never get
them, so the seeded KB outlives the run. Integers and strings also come, now and then, from two
short lists of values that broke this API before (64-bit edges, NUL characters).

``python -m tests.support.fuzz config URL MAX_EXAMPLES SEED`` seeds the server and prints the
configuration; ``python -m tests.support.fuzz summary REPORT.json`` prints a run's figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

# Values at the edges of what the engine, SQL and Redis hold (as strings: TOML integers stop at
# 64 bits). Schemathesis sends those a schema allows as valid input, the others as invalid.
WIDE_INTEGERS = [-1, 0, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1]
# PostgreSQL refuses NUL in text; the others are near misses of ids and numbers.
ODD_STRINGS = ["\x00", "a\x00b", "\ufffd", " ", "0" * 40 + "1", "-0", "1_0", "\u202e"]


def known_ids(base_url: str) -> dict[str, list[str]]:
    """Create one of each resource; their ids seed the fuzzer's dictionaries."""
    name = f"fuzz-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=base_url, timeout=300) as client:
        kb = client.post("/v1/kbs", json={"name": name}).raise_for_status().json()
        doc = (
            client.post(
                f"/v1/kbs/{name}/documents",
                json={"title": "Seed", "text": "# Seed\n\nThe heron waits in shallow water."},
            )
            .raise_for_status()
            .json()
        )
        generated = (
            client.post("/v1/generate", json={"prompt": "seed", "max_tokens": 8, "stream": False})
            .raise_for_status()
            .json()
        )
        answered = (
            client.post(
                "/v1/answers",
                json={"kb": name, "question": "Where?", "max_tokens": 8, "stream": False},
            )
            .raise_for_status()
            .json()
        )
    ids = {
        "kbs": [kb["name"], kb["id"]],
        "docs": [doc["id"]],
        "streams": [generated["stream_id"], answered["stream_id"]],
        "conversations": [answered["conversation_id"]],
    }
    # and a near miss of each, with a NUL character (PostgreSQL refuses it in a query)
    return {name: [*values, values[0] + "\x00"] for name, values in ids.items()}


def config(ids: dict[str, list[str]], max_examples: int, seed: int) -> str:
    """schemathesis.toml: seed, limits, the two checks, and the known ids."""
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

[checks]
enabled = false
not_a_server_error.enabled = true
response_schema_conformance.enabled = true

{dictionaries}
[dictionaries.wide_integers]
values = {json.dumps([str(n) for n in WIDE_INTEGERS])}
[dictionaries.odd_strings]
values = {json.dumps(ODD_STRINGS)}

[generation.dictionaries]
integer = {{ dictionary = "wide_integers", probability = 0.2 }}
string = {{ dictionary = "odd_strings", probability = 0.1 }}

[[operations]]
include-method = ["GET", "POST"]
[operations.parameters]
"path.kb" = {{ dictionary = "kbs", probability = 0.7 }}
"body.kb" = {{ dictionary = "kbs", probability = 0.5 }}
"path.doc" = {{ dictionary = "docs", probability = 0.7 }}
"path.stream_id" = {{ dictionary = "streams", probability = 0.5 }}
"path.conversation_id" = {{ dictionary = "conversations", probability = 0.5 }}
"body.conversation_id" = {{ dictionary = "conversations", probability = 0.3 }}
"""


def run(
    base_url: str, workdir: Path, *, max_examples: int, seed: int
) -> tuple[dict[str, Any], str]:
    """Seed the server, run the CLI; return its JSON report and its console output (which has
    a curl command reproducing each failure)."""
    (workdir / "schemathesis.toml").write_text(
        config(known_ids(base_url), max_examples=max_examples, seed=seed)
    )
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
        capture_output=True,
        text=True,
        timeout=3600,
    )
    return json.loads(report.read_text()), done.stdout + done.stderr


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
    if argv[:1] == ["config"] and len(argv) == 4:
        print(config(known_ids(argv[1]), max_examples=int(argv[2]), seed=int(argv[3])))
        return 0
    if argv[:1] == ["summary"] and len(argv) == 2:
        print(summary(json.loads(Path(argv[1]).read_text())))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
