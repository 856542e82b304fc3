"""Run the chat clients people already use against a real rag-stream and record what each one
gets: the evidence behind the compatibility table of docs/clients.md.

Clients (each in the process and venv a user would have it in):

- ``curl -N`` on ``/v1/chat/completions``;
- the ``openai`` Python SDK (the project venv's);
- LangChain's ``ChatOpenAI`` (``langchain-openai``): ``.stream()``, ``.invoke()``, and a small
  subclass that keeps rag-stream's extra fields (the workaround);
- LlamaIndex's ``OpenAILike`` (``llama-index-llms-openai-like``): ``stream_chat``; its Stop also
  followed by ``gc.collect()`` or by rag-stream's cancel route (the workarounds);
- AI SDK Core ``streamText`` with ``@ai-sdk/openai``'s ``openai.chat(model)`` under Node
  (``scripts/clients/stream_text.mjs``), and with ``@ai-sdk/perplexity`` (which reads
  Perplexity's ``citations``);
- rag-stream's own ``rag_stream.client`` (``ask`` on ``/v1/answers``).

LangChain and LlamaIndex live in their own venv, ``.data/clients-venv`` (made and filled here
when it lacks the pinned versions, about 30 s); the Node packages are installed from
``scripts/clients/package-lock.json`` into ``.data/clients-node`` (``npm ci``, seconds).

For each client, three runs against the real engine (the default profile's ``kb:docs``, greedy):

- ``answer``: does the app see the sources before the first text, through which object or
  field; does it get the cited sources linked to the ``[n]`` markers (annotations); is its text
  the server's;
- ``stop``: the client's own way to stop (close, break, abort, Ctrl-C, cancel) after a few
  tokens of a long answer; passes when ``GET /v1/streams/{id}`` says ``done``/``cancelled``
  within grace + 1 s (grace: ``streaming.chat_abandon_after_s``). The client process stays alive
  meanwhile, so a connection it leaves open stays open;
- ``drop``: the client talks through a TCP proxy that cuts the connection after a few tokens.
  Does the client resume by itself? If not, what does it do, and does the rest come back by
  hand (``GET /v1/streams/{id}/events``, with ``Last-Event-ID`` when the client knows the last
  event id, else from the start, skipping the text it has) within the grace, to the server's
  text?

Output: a line per run, then the table as Markdown (``.data/clients-report.md``) and everything
observed as JSON (``.data/clients-report.json``). Exit status 0 when every run ran (a "no" in the
table is a result, not a failure).

    .venv/bin/python scripts/check_clients.py                   # starts rag-stream itself
    .venv/bin/python scripts/check_clients.py --url http://127.0.0.1:8000 --grace 3
    .venv/bin/python scripts/check_clients.py --only openai,ai-sdk
    .venv/bin/python scripts/check_clients.py --render     # the table again from the JSON

The same file is also each Python client's probe (``check_clients.py probe CLIENT SCENARIO``,
run by the venv that has the client): it prints what the client shows the app, one JSON object a
line, ``{t, what, ...}``; the Node program prints the same notes.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".data"
CLIENTS_VENV = DATA / "clients-venv"
NODE_SOURCE = ROOT / "scripts" / "clients"
NODE_WORK = DATA / "clients-node"
NODE_FILES = ("package.json", "package-lock.json", "stream_text.mjs")
# What the clients venv holds; raise the pins by hand, then rerun.
CLIENT_PINS = {"langchain-openai": "1.8.1", "llama-index-llms-openai-like": "0.8.1"}
VERSIONS_SHOWN = (
    "langchain-openai",
    "langchain-core",
    "llama-index-llms-openai-like",
    "llama-index-llms-openai",
    "llama-index-core",
    "openai",
)
MARKER = re.compile(r"\[(\d+)\]")
SOURCE_KEYS = ("search_results", "citations")


def note(what: str, **fields: Any) -> None:
    """One observation of a probe, for the checker reading its stdout."""
    print(json.dumps({"t": time.time(), "what": what, **fields}, default=str), flush=True)


def error_note(exc: BaseException, text: str, **fields: Any) -> None:
    kind = type(exc)
    note(
        "error",
        type=f"{kind.__module__}.{kind.__qualname__}",
        message=str(exc)[:300],
        text=text,
        **fields,
    )


# =============================================================================================
# Probes: one client each, run in the venv that has it. Only the standard library at import.


@dataclass
class ProbeArgs:
    client: str
    scenario: str  # answer, stop or drop
    url: str
    model: str
    question: str
    max_tokens: int
    stop_after: int  # text deltas before the client stops (stop)
    linger: float  # seconds to stay alive after stopping

    @property
    def stopping(self) -> bool:
        return self.scenario == "stop"

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.question}]


class TextSeen:
    """The answer text as the app received it, one note per delta."""

    def __init__(self) -> None:
        self.text = ""
        self.deltas = 0

    def add(self, delta: str) -> None:
        if delta:
            self.text += delta
            self.deltas += 1
            note("text", chars=len(delta))

    def stop_now(self, args: ProbeArgs) -> bool:
        return args.stopping and self.deltas == args.stop_after


def linger(args: ProbeArgs) -> None:
    """Stay alive after stopping, holding whatever the client left open; then say the process
    is ending (its exit closes every connection)."""
    time.sleep(args.linger)
    note("exiting")


def sources_in(mapping: Any) -> str | None:
    """The first of rag-stream's source fields a mapping holds, if any."""
    if isinstance(mapping, dict):
        return next((key for key in SOURCE_KEYS if mapping.get(key)), None)
    return None


def probe_curl(args: ProbeArgs) -> None:
    body = {
        "model": args.model,
        "stream": True,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "messages": args.messages(),
    }
    command = ["curl", "-sS", "-N", "-i", f"{args.url}/v1/chat/completions"]
    command += ["-H", "content-type: application/json", "-d", json.dumps(body)]
    seen = TextSeen()
    last_id: int | None = None
    finish = None
    in_body = stopped = sources = False
    note("sent")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode().rstrip("\r\n")
        if not in_body:
            name, _, value = line.partition(":")
            if name.lower() == "x-stream-id":
                note("stream_id", id=value.strip(), via="the X-Stream-Id header (curl -i)")
            in_body = line == ""
            continue
        if line.startswith("id:"):
            last_id = int(line[3:])
        if not line.startswith("data:") or line == "data: [DONE]" or stopped:
            continue
        chunk = json.loads(line[5:])
        if not sources and (key := sources_in(chunk)):
            sources = True
            count = len(chunk[key])
            note("sources", count=count, via="the chunk's top-level search_results, citations")
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("annotations"):
                note(
                    "linked",
                    count=len(delta["annotations"]),
                    via="delta.annotations (url_citation, marker offsets)",
                    items=delta["annotations"],
                )
            seen.add(delta.get("content") or "")
            finish = choice.get("finish_reason") or finish
        if seen.stop_now(args):
            note("stopping", how="Ctrl-C (SIGINT) to curl")
            proc.send_signal(signal.SIGINT)
            stopped = True
    code = proc.wait()
    stderr = proc.stderr.read().decode().strip() if proc.stderr else ""
    if code != 0 and not stopped:
        note(
            "error",
            type=f"curl exit status {code}",
            message=stderr[:300],
            text=seen.text,
            last_event_id=last_id,
        )
        return
    note("end", text=seen.text, finish=finish, last_event_id=last_id)
    if stopped:
        linger(args)


def probe_openai(args: ProbeArgs) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{args.url}/v1", api_key="none")
    seen = TextSeen()
    finish = None
    note("sent")
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=args.model,
            messages=args.messages(),  # type: ignore[arg-type]
            stream=True,
            max_tokens=args.max_tokens,
            temperature=0,
        )
        note(
            "stream_id",
            id=raw.headers.get("x-stream-id"),
            via="with_raw_response: .headers['x-stream-id']",
        )
        stream = raw.parse()
        sources = False
        for chunk in stream:
            extra = chunk.model_extra or {}
            if not sources and (key := sources_in(extra)):
                sources = True
                note("sources", count=len(extra[key]), via="chunk.model_extra['search_results']")
            for choice in chunk.choices:
                delta = choice.delta
                annotations = getattr(delta, "annotations", None)  # typed, or an extra
                if annotations:
                    typed = "annotations" in type(delta).model_fields
                    where = "delta.annotations" if typed else "delta.model_extra['annotations']"
                    note("linked", count=len(annotations), via=where, items=annotations)
                seen.add(delta.content or "")
                finish = choice.finish_reason or finish
            if seen.stop_now(args):
                note("stopping", how="stream.close()")
                stream.close()
                break
    except Exception as exc:
        error_note(exc, seen.text)
        return
    note("end", text=seen.text, finish=finish)
    if args.stopping:
        linger(args)


def langchain_model(args: ProbeArgs, keep_sources: bool) -> Any:
    from langchain_openai import ChatOpenAI

    class SourcesChatOpenAI(ChatOpenAI):
        """ChatOpenAI that copies rag-stream's sources and annotations into
        ``additional_kwargs`` (ChatOpenAI drops fields OpenAI's chat completions lack)."""

        def _convert_chunk_to_generation_chunk(
            self, chunk: dict[str, Any], default_chunk_class: type, base_generation_info: Any
        ) -> Any:
            generation = super()._convert_chunk_to_generation_chunk(
                chunk, default_chunk_class, base_generation_info
            )
            if generation is not None:
                kept = generation.message.additional_kwargs
                kept.update({key: chunk[key] for key in SOURCE_KEYS if key in chunk})
                for choice in chunk.get("choices") or []:
                    if (choice.get("delta") or {}).get("annotations"):
                        kept["annotations"] = choice["delta"]["annotations"]
            return generation

        def _create_chat_result(self, response: Any, generation_info: Any = None) -> Any:
            result = super()._create_chat_result(response, generation_info)
            data = response if isinstance(response, dict) else response.model_dump()
            kept = result.generations[0].message.additional_kwargs
            kept.update({key: data[key] for key in SOURCE_KEYS if key in data})
            if annotations := data["choices"][0]["message"].get("annotations"):
                kept["annotations"] = annotations
            return result

    kind = SourcesChatOpenAI if keep_sources else ChatOpenAI
    return kind(
        model=args.model,
        base_url=f"{args.url}/v1",
        api_key="none",
        temperature=0,
        max_tokens=args.max_tokens,
        include_response_headers=True,  # the only way to the stream id (X-Stream-Id)
    )


def message_fields(message: Any, found: dict[str, set[str]]) -> None:
    found["additional_kwargs"] |= set(message.additional_kwargs)
    found["response_metadata"] |= set(message.response_metadata)


def probe_langchain(args: ProbeArgs, keep_sources: bool = False) -> None:
    llm = langchain_model(args, keep_sources)
    seen = TextSeen()
    found: dict[str, set[str]] = {"additional_kwargs": set(), "response_metadata": set()}
    sources = False
    first_id = finish = None
    note("sent")
    try:
        for chunk in llm.stream(args.question):
            message_fields(chunk, found)
            if headers := chunk.response_metadata.get("headers"):
                note(
                    "stream_id",
                    id=headers.get("x-stream-id"),
                    via="include_response_headers=True: first chunk's "
                    "response_metadata['headers']['x-stream-id']",
                )
            first_id = first_id or chunk.id
            kept = chunk.additional_kwargs
            if not sources and (key := sources_in(kept) or sources_in(chunk.response_metadata)):
                sources = True
                via = f"AIMessageChunk.additional_kwargs['{key}']"
                note("sources", count=len(kept.get(key) or []), via=via)
            if kept.get("annotations"):
                via = "AIMessageChunk.additional_kwargs['annotations']"
                note("linked", count=len(kept["annotations"]), via=via, items=kept["annotations"])
            seen.add(chunk.text if isinstance(chunk.text, str) else str(chunk.content))
            finish = chunk.response_metadata.get("finish_reason") or finish
            if seen.stop_now(args):
                note("stopping", how="break out of the llm.stream() loop")
                break
    except Exception as exc:
        error_note(exc, seen.text)
        return
    fields = {name: sorted(keys) for name, keys in found.items()}
    note("end", text=seen.text, finish=finish, fields=fields, chunk_id=first_id)
    if args.stopping:
        linger(args)


def probe_langchain_invoke(args: ProbeArgs, keep_sources: bool = False) -> None:
    llm = langchain_model(args, keep_sources)
    found: dict[str, set[str]] = {"additional_kwargs": set(), "response_metadata": set()}
    note("sent")
    try:
        message = llm.invoke(args.question)
    except Exception as exc:
        error_note(exc, "")
        return
    message_fields(message, found)
    response_id = str(message.response_metadata.get("id") or "")
    if response_id.startswith("chatcmpl-"):
        note(
            "stream_id",
            id=response_id.removeprefix("chatcmpl-"),
            via="response_metadata['id'] (chatcmpl-<stream id>)",
        )
    kept = message.additional_kwargs
    if key := sources_in(kept):
        via = f"AIMessage.additional_kwargs['{key}']"
        note("sources", count=len(kept[key]), via=via)
    if kept.get("annotations"):
        count = len(kept["annotations"])
        via = "AIMessage.additional_kwargs['annotations']"
        note("linked", count=count, via=via, items=kept["annotations"])
    fields = {name: sorted(keys) for name, keys in found.items()}
    finish = message.response_metadata.get("finish_reason")
    note("text", chars=len(message.text))
    note("end", text=message.text, finish=finish, fields=fields, whole_message=True)


def probe_llamaindex(args: ProbeArgs, after_stop: str = "") -> None:
    """``after_stop``: what the app does after leaving the loop: nothing, ``gc`` (collect the
    garbage) or ``cancel`` (rag-stream's cancel route, with the id from ``raw.id``)."""
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(
        model=args.model,
        api_base=f"{args.url}/v1",
        api_key="none",
        is_chat_model=True,  # else stream_chat goes to /v1/completions
        max_tokens=args.max_tokens,
        temperature=0,
    )
    seen = TextSeen()
    sources = False
    stream_id = ""
    finish = None
    found: dict[str, set[str]] = {"additional_kwargs": set(), "message.additional_kwargs": set()}
    note("sent")
    try:
        for response in llm.stream_chat([ChatMessage(role="user", content=args.question)]):
            found["additional_kwargs"] |= set(response.additional_kwargs)
            found["message.additional_kwargs"] |= set(response.message.additional_kwargs)
            raw = response.raw  # the openai SDK's ChatCompletionChunk
            if not stream_id and getattr(raw, "id", None):
                stream_id = str(raw.id).removeprefix("chatcmpl-")
                note("stream_id", id=stream_id, via="ChatResponse.raw.id (chatcmpl-<stream id>)")
            extra = getattr(raw, "model_extra", None) or {}
            if not sources and (key := sources_in(extra)):
                sources = True
                via = "ChatResponse.raw.model_extra['search_results'] (raw: the openai chunk)"
                note("sources", count=len(extra[key]), via=via)
            for choice in getattr(raw, "choices", None) or []:
                annotations = (choice.delta.model_extra or {}).get("annotations")
                if annotations:
                    via = "ChatResponse.raw.choices[0].delta.model_extra['annotations']"
                    note("linked", count=len(annotations), via=via, items=annotations)
                finish = choice.finish_reason or finish
            seen.add(response.delta or "")
            if seen.stop_now(args):
                then = {
                    "": "",
                    "gc": ", then gc.collect()",
                    "cancel": ", then POST /v1/streams/{raw.id}/cancel",
                }[after_stop]
                note("stopping", how=f"break out of the stream_chat() loop{then}")
                break
    except Exception as exc:
        error_note(exc, seen.text)
        return
    if after_stop == "gc":
        # the generator that holds the connection sits in a reference cycle: only the
        # garbage collector closes it
        gc.collect()
    elif after_stop == "cancel":
        import httpx

        httpx.post(f"{args.url}/v1/streams/{stream_id}/cancel", timeout=30).raise_for_status()
    fields = {name: sorted(keys) for name, keys in found.items()}
    note("end", text=seen.text, finish=finish, fields=fields)
    if args.stopping:
        linger(args)


def probe_rag_stream_client(args: ProbeArgs) -> None:
    from rag_stream.client import Client

    def reconnecting(r: Any) -> None:
        note("reconnect", attempt=r.attempt, reason=r.reason, last_event_id=r.last_event_id)

    seen = TextSeen()
    citations = 0
    finish = None
    note("sent")
    with Client(args.url, on_reconnect=reconnecting) as client:
        try:
            stream = client.ask(
                args.model.removeprefix("kb:"),
                args.question,
                max_tokens=args.max_tokens,
                temperature=0,
            )
            for event in stream:
                if event.type == "stream":
                    via = "EventStream.stream_id (X-Stream-Id), and the `stream` event"
                    note("stream_id", id=stream.stream_id, via=via)
                elif event.type == "citation":
                    citations += 1
                    if citations == 1:
                        via = "`citation` events (n, title, heading, snippet, chunk_id, score)"
                        note("sources", count=1, via=via)
                elif event.type == "token":
                    seen.add(event.text)
                    if seen.stop_now(args):
                        note("stopping", how="client.cancel(stream_id)")
                        client.cancel(str(stream.stream_id))
                elif event.type == "done":
                    finish = event.finish_reason
                    if event.cited:
                        via = "done.cited (the [n] markers used), each n a `citation` event's"
                        note("linked", count=len(event.cited), via=via, items=event.cited)
                elif event.type == "error":
                    note("error", type=f"error event {event.code}", message=event.message)
        except Exception as exc:
            error_note(exc, seen.text)
            return
    note("end", text=seen.text, finish=finish, citations=citations)


PROBES: dict[str, Callable[[ProbeArgs], None]] = {
    "curl": probe_curl,
    "openai": probe_openai,
    "langchain": probe_langchain,
    "langchain-subclass": lambda args: probe_langchain(args, keep_sources=True),
    "langchain-invoke": probe_langchain_invoke,
    "langchain-invoke-subclass": lambda args: probe_langchain_invoke(args, keep_sources=True),
    "llamaindex": probe_llamaindex,
    "llamaindex-gc": lambda args: probe_llamaindex(args, after_stop="gc"),
    "llamaindex-cancel": lambda args: probe_llamaindex(args, after_stop="cancel"),
    "rag-stream-client": probe_rag_stream_client,
}


def probe_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="check_clients.py probe")
    parser.add_argument("client", choices=sorted(PROBES))
    parser.add_argument("scenario", choices=["answer", "stop", "drop"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--question", required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--stop-after", type=int, default=5)
    parser.add_argument("--linger", type=float, default=0)
    a = parser.parse_args(argv)
    args = ProbeArgs(**{k: v for k, v in vars(a).items()})
    PROBES[args.client](args)
    return 0


# =============================================================================================
# The checker: installs, server, runs, assessment, report. Runs in the project venv.


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def installed(python: Path, names: tuple[str, ...]) -> dict[str, str | None]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))"
    )
    out = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else dict.fromkeys(names)


def ensure_clients_venv() -> dict[str, Any]:
    """LangChain and LlamaIndex at the pinned versions in their own venv; what it took."""
    python = CLIENTS_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(CLIENTS_VENV)], check=True)
    if installed(python, tuple(CLIENT_PINS)) == CLIENT_PINS:
        return {"installed_now": False}
    pins = [f"{name}=={version}" for name, version in CLIENT_PINS.items()]
    log = DATA / "clients-venv-install.log"
    say(f"installing {' '.join(pins)} into {CLIENTS_VENV} (log: {log})")
    started = time.monotonic()
    with log.open("ab") as out:
        subprocess.run(
            [str(python), "-m", "pip", "install", *pins],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
        )
    return {"installed_now": True, "install_s": round(time.monotonic() - started, 1)}


def ensure_node_clients() -> None:
    """The Node program and the packages of its lockfile, outside the work tree."""
    NODE_WORK.mkdir(parents=True, exist_ok=True)
    lock = (NODE_SOURCE / "package-lock.json").read_text()
    stamp = NODE_WORK / "installed-lock.json"
    for name in NODE_FILES:
        shutil.copyfile(NODE_SOURCE / name, NODE_WORK / name)
    if (NODE_WORK / "node_modules").exists() and stamp.exists() and stamp.read_text() == lock:
        return
    say(f"npm ci in {NODE_WORK}")
    subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_WORK, check=True, capture_output=True
    )
    stamp.write_text(lock)


def node_versions() -> dict[str, str]:
    found = {"node": subprocess.run(["node", "--version"], capture_output=True, text=True).stdout}
    for name in ("ai", "@ai-sdk/openai", "@ai-sdk/perplexity"):
        manifest = NODE_WORK / "node_modules" / name / "package.json"
        found[name] = json.loads(manifest.read_text())["version"]
    return {k: v.strip() for k, v in found.items()}


def chat_grace(grace: float | None) -> float:
    if grace is not None:
        return grace
    from rag_stream.settings import load_settings

    streaming = load_settings().streaming
    return streaming.chat_abandon_after_s or streaming.abandon_after_s


@contextlib.contextmanager
def rag_stream_server(url: str | None) -> Iterator[str]:
    """``url``, or a server started here (default profile, its own data folder)."""
    if url:
        yield url.rstrip("/")
        return
    from tests.support.server import ServerProcess

    data = DATA / "clients" / "rag-stream"
    data.mkdir(parents=True, exist_ok=True)
    env = {
        "RAG_STREAM_PROFILE": "default",
        "RAG_STREAM_DATA_DIR": str(data),
        "RAG_STREAM_MODELS_DIR": os.environ.get("RAG_STREAM_MODELS_DIR", str(DATA / "models")),
    }
    command = [str(Path(sys.executable).parent / "rag-stream"), "serve"]
    server = ServerProcess(env, data / "server.log", command=command)
    say(f"rag-stream starting on {server.url} (log: {server.log_path})")
    try:
        server.wait_ready(timeout=900)
        yield server.url
    finally:
        server.stop()


# --- the server's side of a stream ----------------------------------------------------------


@dataclass
class Replay:
    text: str = ""
    finish: str | None = None
    last_event_id: int | None = None
    sources: int = 0


def read_events(url: str, stream_id: str, after: int | None = None) -> Replay:
    """A stream's events from the log (after ``after``, else from the start), in whatever shape
    it was started in (chat chunks or native events), to its end."""
    import httpx

    headers = {"Last-Event-ID": str(after)} if after is not None else {}
    replay = Replay()
    path = f"{url}/v1/streams/{stream_id}/events"
    with httpx.stream("GET", path, headers=headers, timeout=60) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("id:"):
                replay.last_event_id = int(line[3:])
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            data = json.loads(line[5:])
            replay.sources += len(data.get("search_results") or [])
            replay.sources += data.get("type") == "citation"
            if data.get("object") == "chat.completion.chunk":
                for choice in data["choices"]:
                    replay.text += (choice.get("delta") or {}).get("content") or ""
                    # a cancelled chat stream says finish_reason "stop", stop_reason "cancelled"
                    ended = choice.get("stop_reason") or choice.get("finish_reason")
                    replay.finish = ended or replay.finish
            elif data.get("type") == "token":
                replay.text += data["text"]
            elif data.get("type") == "done":
                replay.finish = data["finish_reason"]
    return replay


def stream_status(url: str, stream_id: str) -> dict[str, Any]:
    import httpx

    status: dict[str, Any] = httpx.get(f"{url}/v1/streams/{stream_id}", timeout=10).json()
    return status


def wait_ended(url: str, stream_id: str, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = stream_status(url, stream_id)
        if status["status"] != "running" or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


class StopWatch(threading.Thread):
    """From a client's Stop on: when the server's stream ended, and how."""

    def __init__(self, url: str, stream_id: str, stopped_at: float, timeout: float) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stream_id = stream_id
        self.stopped_at = stopped_at
        self.timeout = timeout
        self.at_stop = stream_status(url, stream_id)
        self.ended: dict[str, Any] | None = None
        self.ended_after_s: float | None = None

    def run(self) -> None:
        deadline = self.stopped_at + self.timeout
        while time.time() < deadline:
            status = stream_status(self.url, self.stream_id)
            if status["status"] != "running":
                self.ended, self.ended_after_s = status, time.time() - self.stopped_at
                return
            time.sleep(0.05)


# --- one run of one client ------------------------------------------------------------------


@dataclass
class Client:
    key: str
    runtime: str  # project (the project venv), clients (the clients venv) or node
    scenarios: tuple[str, ...] = ("answer", "stop", "drop")
    provider: str = "openai"  # node only


CLIENTS = (
    Client("curl", "project"),
    Client("openai", "project"),
    Client("langchain", "clients"),
    Client("langchain-invoke", "clients", ("answer",)),
    Client("langchain-subclass", "clients", ("answer",)),
    Client("langchain-invoke-subclass", "clients", ("answer",)),
    Client("llamaindex", "clients"),
    Client("llamaindex-gc", "clients", ("stop",)),
    Client("llamaindex-cancel", "clients", ("stop",)),
    Client("ai-sdk", "node"),
    Client("ai-sdk-perplexity", "node", ("answer",), provider="perplexity"),
    Client("rag-stream-client", "project"),
)


@dataclass
class Plan:
    url: str
    grace: float
    model: str
    question: str
    max_tokens: int
    stop_question: str
    stop_max_tokens: int
    stop_after: int
    cut_after: int


@dataclass
class Run:
    client: str
    scenario: str
    notes: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    exit_status: int | None = None
    stderr: str = ""

    def notes_of(self, what: str) -> list[dict[str, Any]]:
        return [n for n in self.notes if n["what"] == what]

    def first(self, what: str) -> dict[str, Any] | None:
        return next(iter(self.notes_of(what)), None)

    def at(self, what: str) -> float | None:
        """Seconds from the request to the first note ``what``."""
        found, sent = self.first(what), self.first("sent")
        return round(float(found["t"]) - float(sent["t"]), 2) if found and sent else None

    @property
    def stream_id(self) -> str | None:
        found = self.first("stream_id")
        return str(found["id"]) if found and found.get("id") else None


def probe_command(client: Client, scenario: str, s: Plan, url: str) -> list[str]:
    stop = scenario == "stop"
    question = s.stop_question if stop else s.question
    max_tokens = s.stop_max_tokens if stop else s.max_tokens
    common = ["--url", url, "--model", s.model, "--question", question]
    common += ["--max-tokens", str(max_tokens), "--stop-after", str(s.stop_after)]
    common += ["--linger", str(s.grace + 3)]
    if client.runtime == "node":
        program = str(NODE_WORK / "stream_text.mjs")
        return ["node", program, scenario, "--provider", client.provider, *common]
    python = sys.executable if client.runtime == "project" else str(CLIENTS_VENV / "bin/python")
    return [python, str(Path(__file__).resolve()), "probe", client.key, scenario, *common]


def lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """The probe's stdout, line by line, from a thread (None: closed)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def run_client(client: Client, scenario: str, s: Plan, timeout: float = 240) -> Run:
    from tests.support.proxy import TcpProxy

    run = Run(client.key, scenario)
    proxy = TcpProxy(int(s.url.rsplit(":", 1)[1])) if scenario == "drop" else None
    url = proxy.url if proxy else s.url
    proc = subprocess.Popen(
        probe_command(client, scenario, s, url),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines = lines_of(proc)
    watch: StopWatch | None = None
    exited_at: float | None = None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            try:
                found = json.loads(line)
            except json.JSONDecodeError:
                continue
            run.notes.append(found)
            what = found["what"]
            if proxy and what == "text" and len(run.notes_of("text")) == s.cut_after:
                run.facts["dropped_at"] = time.time()
                run.facts["connections_cut"] = proxy.drop()
            elif proxy and what in ("error", "end") and not run.facts.get("hand_tried"):
                run.facts["hand_tried"] = True
                resume_by_hand(run, s)
            elif what == "stopping" and run.stream_id:
                watch = StopWatch(s.url, run.stream_id, found["t"], timeout=s.grace + 60)
                watch.start()
        run.exit_status = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        exited_at = time.time()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proxy:
            proxy.close()
    run.stderr = (proc.stderr.read() if proc.stderr else "")[-2000:]
    if watch:
        watch.join(timeout=s.grace + 60)
        run.facts["stop"] = {
            "last_event_id_at_stop": watch.at_stop.get("last_event_id"),
            "ended": watch.ended,
            "ended_after_s": None if watch.ended_after_s is None else round(watch.ended_after_s, 2),
            "client_exited_after_s": exited_at and round(exited_at - watch.stopped_at, 2),
        }
    assess(run, s)
    return run


def resume_by_hand(run: Run, s: Plan) -> None:
    """What an app can do when its client gave up after a drop: fetch the rest of the stream
    from the log, within the grace."""
    stream_id = run.stream_id
    ended = run.notes[-1]
    if not stream_id:
        run.facts["resumed_by_hand"] = {"done": False, "why": "the client gave no stream id"}
        return
    if stream_status(s.url, stream_id)["status"] != "running":
        if ended["what"] == "error":
            run.facts["resumed_by_hand"] = {"done": False, "why": "the stream had ended"}
        return  # the client read it to the end: nothing to do by hand
    had = str(ended.get("text") or "")
    after = ended.get("last_event_id")
    started = time.time()
    rest = read_events(s.url, stream_id, after=after)
    text = had + rest.text if after is not None else rest.text
    run.facts["resumed_by_hand"] = {
        "done": True,
        "how": f"Last-Event-ID: {after}" if after is not None else "from the start",
        "after_drop_s": round(started - run.facts.get("dropped_at", started), 2),
        "had_chars": len(had),
        "prefix_matches": text.startswith(had),
        "text": text,
        "finish": rest.finish,
    }


def assess(run: Run, s: Plan) -> None:
    """The figures of a run, next to its notes."""
    facts = run.facts
    end = run.first("end")
    error = run.first("error")
    facts["stream_id"] = run.stream_id
    facts["client_finish"] = end.get("finish") if end else None
    facts["error"] = {k: error.get(k) for k in ("type", "message")} if error else None
    if not run.stream_id:
        return
    status = wait_ended(s.url, run.stream_id)
    facts["server_finish"] = status.get("finish_reason")
    server = read_events(s.url, run.stream_id)
    facts["server_text"] = server.text
    client_text = str((end or error or {}).get("text") or "")
    facts["client_text"] = client_text
    facts["text_equal"] = client_text == server.text
    facts["markers"] = sorted({int(m) for m in MARKER.findall(server.text)})
    facts["sources"] = server.sources
    if (hand := facts.get("resumed_by_hand")) and hand.get("done"):
        hand["text_equal"] = hand.pop("text") == server.text
    if stop := facts.get("stop"):
        ended = stop.get("ended") or {}
        after = stop.get("ended_after_s")
        stop["finish_reason"] = ended.get("finish_reason")
        stop["last_event_id_at_end"] = ended.get("last_event_id")
        stop["passed"] = (
            ended.get("finish_reason") == "cancelled" and after is not None and after <= s.grace + 1
        )


# --- the table ------------------------------------------------------------------------------

ROWS = (
    # label, how to connect, main client, workaround runs
    (
        "curl",
        "`curl -N $URL/v1/chat/completions`; stream id: the `X-Stream-Id` header (`-i`)",
        "curl",
        (),
    ),
    (
        "`openai` SDK (Python)",
        '`OpenAI(base_url=URL + "/v1", api_key="none")`; stream id: '
        "`with_raw_response.create(...).headers['x-stream-id']`",
        "openai",
        (),
    ),
    (
        "LangChain `ChatOpenAI`",
        '`ChatOpenAI(base_url=URL + "/v1", api_key="none", model="kb:docs")`; stream id: '
        "`include_response_headers=True`, first chunk's `response_metadata['headers']`",
        "langchain",
        ("langchain-subclass", "langchain-invoke", "langchain-invoke-subclass"),
    ),
    (
        "LlamaIndex `OpenAILike`",
        '`OpenAILike(api_base=URL + "/v1", api_key="none", model="kb:docs", '
        "is_chat_model=True)`; stream id: `ChatResponse.raw.id` (`chatcmpl-<id>`)",
        "llamaindex",
        ("llamaindex-gc", "llamaindex-cancel"),
    ),
    (
        "AI SDK Core `streamText`",
        '`createOpenAI({baseURL: URL + "/v1"}).chat("kb:docs")`; stream id: a `fetch` '
        "passed to the provider reads `X-Stream-Id`",
        "ai-sdk",
        ("ai-sdk-perplexity",),
    ),
    (
        "`rag_stream.client`",
        '`Client(URL).ask("docs", question)` (`/v1/answers`); stream id: `EventStream.stream_id`',
        "rag-stream-client",
        (),
    ),
)


def fmt(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.2f} s"


def sources_cell(runs: dict[tuple[str, str], Run], key: str, extra: tuple[str, ...]) -> str:
    run = runs.get((key, "answer"))
    if run is None:
        return "not run"
    found, first_text, sources_at = run.first("sources"), run.at("text"), run.at("sources")
    if found and (first_text is None or (sources_at or 0) <= first_text):
        cell = f"yes: {found['via']} at {fmt(sources_at)}; first text at {fmt(first_text)}"
    elif found:
        cell = (
            f"no: {found['via']} only at {fmt(run.at('sources'))}, after the first text "
            f"({fmt(first_text)}): one per cited source, from the annotations"
        )
    else:
        fields = (run.first("end") or {}).get("fields") or {}
        seen = "; ".join(f"{k}: {', '.join(v) or 'nothing'}" for k, v in fields.items())
        seen = f" (the app's messages carry {seen})" if seen else ""
        cell = f"no: search_results never reach the app{seen}; first text at {fmt(first_text)}"
    if run.facts.get("text_equal") is False:
        cell += " (its text is NOT the server's)"
    if raw := run.first("raw_sources"):
        raw_at = fmt(run.at("raw_sources"))
        cell += f". Workaround: {raw['via']} at {raw_at} (first text {fmt(first_text)})"
    for other in extra:
        side = runs.get((other, "answer"))
        if side is None:
            continue
        got = side.first("sources")
        if other.endswith("perplexity"):
            parts = len(side.notes_of("sources"))
            cell += f". `@ai-sdk/perplexity`: {parts} `source` parts"
            if not parts:
                cell += " (it reads `citations` from the first chunk only)"
        elif "invoke" in other:
            cell += f"; with the subclass: {got['via']}" if got else ". `.invoke()`: none either"
        elif got:
            cell += (
                f". Workaround, a ChatOpenAI subclass (`SourcesChatOpenAI` here): {got['via']} at "
                f"{fmt(side.at('sources'))}, first text at {fmt(side.at('text'))}"
            )
    return cell


def linked_cell(runs: dict[tuple[str, str], Run], key: str, extra: tuple[str, ...]) -> str:
    run = runs.get((key, "answer"))
    if run is None:
        return "not run"
    sources = run.facts.get("sources") or 0
    markers = [m for m in run.facts.get("markers") or [] if 1 <= m <= sources]
    shown = ", ".join(f"[{m}]" for m in markers)
    others = sorted(set(run.facts.get("markers") or []) - set(markers))
    if others:  # the model wrote a number no source has: nothing to link
        shown += f" (and {', '.join(f'[{m}]' for m in others)}, which name no source)"
    found = run.first("linked")
    if not markers:
        cell = "not seen: the answer had no [n] marker naming a source"
    elif found and key == "ai-sdk":
        cell = (
            f"partly: {found['count']} `source` part(s) (url, title) for the markers {shown}, "
            f"after the text at {fmt(run.at('linked'))}; marker offsets and n are dropped"
        )
    elif found:
        cell = f"yes: {found['via']}: {found['count']} for the markers {shown}"
    else:
        cell = f"no: the annotations for {shown} never reach the app"
    for other in extra:
        side = runs.get((other, "answer"))
        got = side.first("linked") if side else None
        if got:
            label = "`.invoke()` with the subclass" if "invoke" in other else "The subclass"
            cell += f". {label}: {got['via']}"
    return cell


def stop_outcome(run: Run, grace: float) -> tuple[bool, str]:
    """Whether the client's Stop ended the stream within grace + 1 s, and what happened."""
    how = (run.first("stopping") or {}).get("how", "?")
    stop = run.facts.get("stop")
    if not stop:
        return False, f"{how}, but no stream id to watch" if run.first("stopping") else "no Stop"
    ended, after = stop.get("finish_reason"), stop.get("ended_after_s")
    produced = (stop.get("last_event_id_at_end") or 0) - (stop.get("last_event_id_at_stop") or 0)
    events = f"{produced} event{'s' * (produced != 1)} after Stop"
    if after is None:
        return False, f"{how}: still running {grace + 60:.0f} s later"
    exiting, stopping = run.first("exiting"), run.first("stopping")
    exited = exiting["t"] - stopping["t"] if exiting and stopping else None
    if exited is not None and after >= exited:
        return False, (
            f"{how} leaves the connection open: `{ended}` only {fmt(after)} later, once the "
            f"client process had ended ({fmt(exited)} after Stop) and the grace had passed"
        )
    late = "" if stop["passed"] else f", over grace + 1 s = {grace + 1:g} s"
    return stop["passed"], f"{how} → `{ended}` {fmt(after)} later ({events}{late})"


def stop_cell(
    runs: dict[tuple[str, str], Run], key: str, extra: tuple[str, ...], grace: float
) -> str:
    run = runs.get((key, "stop"))
    if run is None:
        return "not run"
    passed, what = stop_outcome(run, grace)
    cell = f"{'yes' if passed else 'no'}: {what}"
    for other in extra:
        if side := runs.get((other, "stop")):
            cell += f". Workaround: {stop_outcome(side, grace)[1]}"
    return cell


def drop_cell(runs: dict[tuple[str, str], Run], key: str) -> str:
    run = runs.get((key, "drop"))
    if run is None:
        return "not run"
    reconnects = len(run.notes_of("reconnect"))
    error = run.facts.get("error")
    hand = run.facts.get("resumed_by_hand")
    if not error and not hand and run.facts.get("text_equal"):
        return f"yes: reconnected by itself ({reconnects}x), text equal to the server's"
    if error:
        message = " ".join(str(error["message"]).split())[:120]
        cell = f"no: raises `{error['type']}`: “{message}”"
    else:
        chars = len(run.facts.get("client_text") or "")
        cell = f"no, and silently: the answer just ends after {chars} chars"
    if hand and hand.get("done"):
        equal = "equal to" if hand.get("text_equal") else "NOT equal to"
        cell += (
            f". By hand: `GET /v1/streams/{{id}}/events` ({hand['how']}) "
            f"{fmt(hand['after_drop_s'])} after the cut: text {equal} the server's"
        )
    elif hand:
        cell += f". By hand: not possible ({hand['why']})"
    return cell


def table(runs: dict[tuple[str, str], Run], grace: float) -> str:
    head = (
        "| client | how to connect | sources first | [n] linked | Stop stops the engine | "
        "resume after a drop | resume after a reload |"
    )
    lines = [head, "|" + "---|" * 7]
    for label, connect, key, extra in ROWS:
        if not any(k == key for k, _ in runs):
            continue
        cells = [
            label,
            connect,
            sources_cell(runs, key, extra),
            linked_cell(runs, key, extra),
            stop_cell(runs, key, extra, grace),
            drop_cell(runs, key),
            "n/a (no page)",
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def run_line(run: Run) -> str:
    f = run.facts
    bits = [f"{run.client:<26} {run.scenario:<6}", f"id {f.get('stream_id')}"]
    if run.scenario == "answer":
        bits.append(f"sources {fmt(run.at('sources'))} first text {fmt(run.at('text'))}")
        bits.append(f"linked {fmt(run.at('linked'))} text_equal {f.get('text_equal')}")
    elif run.scenario == "stop" and (stop := f.get("stop")):
        bits.append(f"ended {stop.get('finish_reason')} after {fmt(stop.get('ended_after_s'))}")
    elif run.scenario == "drop":
        bits.append(f"error {(f.get('error') or {}).get('type')}")
        bits.append(f"reconnects {len(run.notes_of('reconnect'))}")
        hand = f.get("resumed_by_hand") or {}
        bits.append(f"by hand {hand.get('how')} equal {hand.get('text_equal')}")
    return "  ".join(bits)


def megabytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) // 2**20


def commit() -> str:
    """The commit the server ran, and whether the work tree differed from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    changed = git("status", "--porcelain", "--untracked-files=no").strip()
    return (git("rev-parse", "--short", "HEAD").strip() or "unknown") + (
        " with uncommitted changes" if changed else ""
    )


def markdown(report: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v)
    return (
        f"# Chat clients against rag-stream ({report['date']})\n\n"
        f"`scripts/check_clients.py` on {report['machine']}, rag-stream {report['commit']}, "
        f"model `{report['model']}` (greedy), chat abandon grace {report['grace_s']:g} s.\n"
        f"Versions: {versions}.\n\n{report['table']}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running rag-stream (default: start one here)")
    parser.add_argument("--grace", type=float, help="its streaming.chat_abandon_after_s")
    parser.add_argument("--model", default="kb:docs")
    parser.add_argument("--question", default="What is rag-stream?")
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument(
        "--stop-question",
        default="Write a long, detailed essay on how rag-stream streams, resumes and cancels "
        "answers, with many sections.",
    )
    parser.add_argument("--stop-max-tokens", type=int, default=600)
    parser.add_argument("--stop-after", type=int, default=5, help="text deltas before Stop")
    parser.add_argument("--cut-after", type=int, default=4, help="text deltas before the cut")
    parser.add_argument(
        "--only", help="comma-separated client keys: " + ", ".join(c.key for c in CLIENTS)
    )
    parser.add_argument("--report", type=Path, default=DATA / "clients-report.md")
    parser.add_argument(
        "--render",
        action="store_true",
        help="run nothing: write the table again from --report's JSON",
    )
    args = parser.parse_args(argv)
    if args.render:
        return render(args.report)

    chosen = [c for c in CLIENTS if not args.only or c.key in args.only.split(",")]
    sys.path.insert(0, str(ROOT))
    install = ensure_clients_venv() if any(c.runtime == "clients" for c in chosen) else {}
    if any(c.runtime == "node" for c in chosen):
        ensure_node_clients()
    runs: dict[tuple[str, str], Run] = {}
    with rag_stream_server(args.url) as url:
        grace = chat_grace(args.grace)
        plan = Plan(
            url,
            grace,
            args.model,
            args.question,
            args.max_tokens,
            args.stop_question,
            args.stop_max_tokens,
            args.stop_after,
            args.cut_after,
        )
        say(f"rag-stream at {url}; chat abandon grace {grace:g} s")
        for client in chosen:
            for scenario in client.scenarios:
                run = run_client(client, scenario, plan)
                runs[(client.key, scenario)] = run
                print(run_line(run), flush=True)
    versions = {k: v for k, v in installed(CLIENTS_VENV / "bin/python", VERSIONS_SHOWN).items()}
    versions["openai (clients venv)"] = versions.pop("openai")
    versions["openai (project venv)"] = installed(Path(sys.executable), ("openai",))["openai"]
    if any(c.runtime == "node" for c in chosen):
        versions |= node_versions()
    versions["curl"] = subprocess.run(
        ["curl", "--version"], capture_output=True, text=True
    ).stdout.split(" ")[1]
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.machine()}",
        "commit": commit(),
        "server": args.url or "started here",
        "model": args.model,
        "grace_s": grace,
        "versions": versions,
        "clients_venv": {"path": str(CLIENTS_VENV), "mb": megabytes(CLIENTS_VENV), **install},
        "table": table(runs, grace),
        "runs": [asdict(run) for run in runs.values()],
    }
    write_report(report, args.report)
    return 0 if all(r.notes for r in runs.values()) else 1


def write_report(report: dict[str, Any], path: Path) -> None:
    text = markdown(report)
    print("\n" + text)
    path.write_text(text)
    path.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"report: {path} (and {path.with_suffix('.json').name})")


def render(path: Path) -> int:
    """The table again from a report's runs (after a change to how cells are written)."""
    report = json.loads(path.with_suffix(".json").read_text())
    runs = {(r["client"], r["scenario"]): Run(**r) for r in report["runs"]}
    report["table"] = table(runs, report["grace_s"])
    write_report(report, path)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        sys.exit(probe_main(sys.argv[2:]))
    sys.exit(main())
