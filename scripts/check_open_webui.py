"""Check rag-stream in a real Open WebUI, driven in headless Chromium: run it before saying
"rag-stream works in Open WebUI".

What runs (everything on 127.0.0.1, free ports, logs under the data folder):

1. Open WebUI (``open-webui==0.12.4`` unless ``--open-webui-version``) in its own venv,
   ``.data/open-webui/venv``; installed only when that venv lacks that version (several minutes).
2. rag-stream: ``.venv/bin/rag-stream serve``, default profile (it ingests the sample KB ``docs``),
   its state in ``.data/open-webui/rag-stream`` and the models prepared in ``.data/models``; or
   the server at ``--rag-stream-url``.
3. Open WebUI offline, with a fresh data folder each run, one OpenAI connection to rag-stream
   whose custom header ``X-Rag-Stream-Sources: open-webui`` (set with ``OPENAI_API_CONFIGS``) asks
   for sources as Open WebUI ``source`` events. Between them sits ``scripts/recording_proxy.py``:
   it passes every byte through and records what Open WebUI sent, each response's
   ``X-Stream-Id`` (which Open WebUI keeps to itself) and when each exchange ended.
4. Chromium opens Open WebUI, picks ``kb:docs`` in its model menu, asks, and checks:

   - ``header``:  every chat request reached rag-stream with the sources header;
   - ``answer``:  an answer arrives and ends, with no error on the page or in the saved chat;
   - ``sources``: the "N Sources" list has one chip per source in the server's stream, chip n
     opens a window with the server's source n (its URL and its snippet), and the chip drawn
     for an ``[n]`` marker in the answer opens source n too. SmolLM2 at Open WebUI's default
     temperature seldom writes a marker: without one, ``--inline-question`` is asked at
     temperature 0 (the user's own default parameter) for the inline chips;
   - ``stop``:    a long answer (the user's parameters: max_tokens ``--max-tokens`` and the
     custom parameter ``ignore_eos``, so it cannot end by itself first) is stopped with Open
     WebUI's Stop button; ``GET /v1/streams/{id}`` must say ``done``/``cancelled``
     within grace + 1 s of the click (grace: ``streaming.chat_abandon_after_s``, as rag-stream
     reads its settings here, or ``--grace``).

   The question is sent with Open WebUI's defaults (its built-in tools attached, its title, tags
   and follow-up requests sent to the same model); only Open WebUI's own document embedding is
   pointed away from a local model it could not download offline (``RAG_EMBEDDING_ENGINE``),
   which this check never uses.

5. A PASS/FAIL line per check with its figures, and the same as Markdown (to paste into
   docs/clients.md) and JSON: ``.data/open-webui/report.md`` and ``report.json``. Exit status 0
   when every check passes. Screenshots of the page go next to them.

    .venv/bin/python scripts/check_open_webui.py
    .venv/bin/python scripts/check_open_webui.py --rag-stream-url http://127.0.0.1:8000
    .venv/bin/python scripts/check_open_webui.py --open-webui-version 0.12.5 --show-browser
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rag_stream.schemas.openai import SOURCES_HEADER  # noqa: E402
from scripts.recording_proxy import Exchange, RecordingProxy  # noqa: E402
from tests.support.server import ServerProcess, free_port  # noqa: E402

DEFAULT_VERSION = "0.12.4"
DATA = ROOT / ".data" / "open-webui"
MODEL = "kb:docs"
SOURCES_SHAPE = "open-webui"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
    "--lang=en-US",
)
# Open WebUI's own pattern for citation markers (src/lib/utils/marked/citation-extension.ts):
# a run of bracket groups, each one or more ids; a group of one id is drawn as one chip.
MARKER_RUN = re.compile(r"(\[(?:\d+(?:#[^,\]\s]+)?(?:,\s*\d+(?:#[^,\]\s]+)?)*)\])+")
MARKER_GROUP = re.compile(r"\[([^\]]+)\]")

T = TypeVar("T")


@dataclass
class Check:
    name: str
    passed: bool = False
    summary: str = "not run"
    figures: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name:<8} {self.summary}"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def wait_for(check: Callable[[], T | None], timeout: float, what: str, poll: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(StaleElementReferenceException):
            value = check()
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


# ---------------------------------------------------------------------------------------------
# Processes


def installed_version(venv: Path) -> str | None:
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    code = "import importlib.metadata as m; print(m.version('open-webui'))"
    found = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def ensure_open_webui(venv: Path, version: str, log: Path) -> None:
    """``open-webui==version`` in ``venv``, unless it is there already."""
    if installed_version(venv) == version:
        say(f"Open WebUI {version} already installed in {venv}")
        return
    say(f"installing Open WebUI {version} into {venv} (several minutes; log: {log})")
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    with log.open("ab") as out:
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", f"open-webui=={version}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
        )
    if installed_version(venv) != version:
        raise RuntimeError(f"pip did not install open-webui {version}; see {log}")


def rag_stream_env(data: Path) -> dict[str, str]:
    return {
        "RAG_STREAM_PROFILE": "default",
        "RAG_STREAM_DATA_DIR": str(data),
        "RAG_STREAM_MODELS_DIR": os.environ.get(
            "RAG_STREAM_MODELS_DIR", str(ROOT / ".data" / "models")
        ),
    }


def start_rag_stream(data: Path) -> ServerProcess:
    data.mkdir(parents=True, exist_ok=True)
    command = [str(Path(sys.executable).parent / "rag-stream"), "serve"]
    server = ServerProcess(rag_stream_env(data), data / "server.log", command=command)
    say(f"rag-stream starting on {server.url} (log: {server.log_path})")
    server.wait_ready(timeout=900)
    return server


def abandon_grace(env: dict[str, str]) -> float:
    """The grace after which rag-stream stops a chat stream nobody reads, as its settings say
    with this environment (0 there means: the general abandon_after_s)."""
    code = (
        "from rag_stream.settings import load_settings; s = load_settings().streaming; "
        "print(s.chat_abandon_after_s or s.abandon_after_s)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def wait_for_model(url: str, api_key: str, model: str) -> None:
    def listed() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(f"{url}/v1/models", headers=auth(api_key), timeout=5)
            return r.status_code == 200 and any(m["id"] == model for m in r.json()["data"])
        return False

    wait_for(listed, 600, f"{model} in {url}/v1/models", poll=1)


def auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def open_webui_env(upstream: str, api_key: str) -> dict[str, str]:
    """Open WebUI's settings here (its data folder and secret key come at start)."""
    return {
        "OFFLINE_MODE": "true",
        "HF_HUB_OFFLINE": "1",
        "ENABLE_OLLAMA_API": "false",
        "WEBUI_AUTH": "false",
        "OPENAI_API_BASE_URL": f"{upstream}/v1",
        "OPENAI_API_KEY": api_key,
        # connection 0's custom headers (Admin > Connections > Headers), sent on every request
        "OPENAI_API_CONFIGS": json.dumps({"0": {"headers": {SOURCES_HEADER: SOURCES_SHAPE}}}),
        # its default local embedder (sentence-transformers all-MiniLM-L6-v2) cannot be fetched
        # offline and would load torch at start; it embeds only files uploaded into Open WebUI
        "RAG_EMBEDDING_ENGINE": "openai",
        "ANONYMIZED_TELEMETRY": "false",
        "DO_NOT_TRACK": "true",
        "SCARF_NO_ANALYTICS": "true",
    }


def start_open_webui(venv: Path, folder: Path, settings: dict[str, str]) -> ServerProcess:
    data = folder / "data"
    shutil.rmtree(data, ignore_errors=True)  # a fresh one: env config is only a first default
    data.mkdir(parents=True)
    env = {
        **settings,
        "DATA_DIR": str(data),
        "WEBUI_SECRET_KEY": secrets.token_urlsafe(24),  # else it writes a key file in the cwd
    }
    port = free_port()
    command = [
        str(venv / "bin" / "open-webui"),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    server = ServerProcess(env, folder / "open-webui.log", port=port, command=command)
    say(f"Open WebUI starting on {server.url} (log: {server.log_path})")
    started = time.monotonic()

    def healthy() -> bool:
        if server.proc.poll() is not None:
            raise RuntimeError(f"Open WebUI exited:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{server.url}/api/config", timeout=5).status_code == 200
        return False

    wait_for(healthy, 600, "Open WebUI to answer /api/config", poll=1)
    say(f"Open WebUI up in {time.monotonic() - started:.1f} s")
    return server


def start_chromium(show: bool) -> webdriver.Chrome:
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never look for another driver
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        if show and flag.startswith("--headless"):
            continue
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='owui-chromium-')}")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(180)
    driver.set_script_timeout(60)
    return driver


# ---------------------------------------------------------------------------------------------
# Open WebUI's page

# Every toast the page shows (svelte-sonner), kept: they vanish after a few seconds.
TOAST_RECORDER = """
if (!window.__toasts) {
  window.__toasts = [];
  const seen = new WeakSet();
  new MutationObserver(() => {
    for (const t of document.querySelectorAll('[data-sonner-toast]')) {
      if (seen.has(t)) continue;
      seen.add(t);
      window.__toasts.push({type: t.getAttribute('data-type'), text: t.innerText});
    }
  }).observe(document.body, {childList: true, subtree: true});
}
"""

CITATION_WINDOW = """
const close = document.querySelector('[role=dialog] [aria-label="Close citation modal"]');
if (!close) return null;
const d = close.closest('[role=dialog]');
return {text: d.innerText, hrefs: [...d.querySelectorAll('a[href]')].map(a => a.href)};
"""

FETCH_JSON = """
const done = arguments[arguments.length - 1];
fetch(arguments[0], {method: arguments[1], headers: {'Content-Type': 'application/json',
  Authorization: 'Bearer ' + localStorage.token}, body: arguments[2]})
  .then(r => r.json()).then(done, e => done({fetch_error: String(e)}));
"""


class OpenWebUIPage:
    def __init__(self, driver: webdriver.Chrome, url: str, shots: Path) -> None:
        self.driver = driver
        self.url = url
        self.shots = shots

    def css(self, selector: str, within: WebElement | None = None) -> list[WebElement]:
        return (within or self.driver).find_elements(By.CSS_SELECTOR, selector)

    def visible(self, selector: str) -> WebElement | None:
        return next((e for e in self.css(selector) if e.is_displayed()), None)

    def open_new_chat(self) -> None:
        self.driver.get(self.url + "/")
        wait_for(lambda: self.visible("#chat-input"), 180, "the chat input")
        self.driver.execute_script(TOAST_RECORDER)
        # "What's New" opens over the page on a first visit; it may come a moment late
        with contextlib.suppress(TimeoutError):
            button = wait_for(self._changelog_button, 5, "the What's New window")
            button.click()
            wait_for(lambda: not self._changelog_button(), 10, "What's New to close")

    def _changelog_button(self) -> WebElement | None:
        return next((b for b in self.css("[role=dialog] button") if "Let's Go" in b.text), None)

    def choose_model(self, model: str) -> None:
        self.visible("button[id^='model-selector-'][id$='-button']").click()  # type: ignore[union-attr]
        search = wait_for(lambda: self.visible("#model-search-input"), 20, "the model search")
        search.send_keys(model)
        option = wait_for(
            lambda: self.visible(f"[role=option][data-value='{model}']"), 20, f"{model} listed"
        )
        option.click()
        wait_for(
            lambda: self.visible(f"button[aria-label='Selected model: {model}']"),
            20,
            f"{model} selected",
        )

    def send(self, text: str) -> float:
        box = self.visible("#chat-input")
        assert box is not None
        box.click()
        box.send_keys(text)
        button = wait_for(lambda: self.visible("#send-message-button"), 20, "the send button")
        sent = time.time()
        button.click()
        return sent

    def assistant_message_id(self) -> str | None:
        ids = self.driver.execute_script(
            "return [...document.querySelectorAll('[id^=\"message-\"]')]"
            ".filter(e => /^message-[0-9a-f-]{36}$/.test(e.id))"
            ".filter(e => e.querySelector('.chat-assistant'))"
            ".map(e => e.id.slice(8));"
        )
        return ids[-1] if ids else None

    def message(self, mid: str) -> WebElement:
        return self.driver.find_element(By.ID, f"message-{mid}")

    def answer_text(self, mid: str) -> str:
        found = self.css("#response-content-container", self.message(mid))
        return str(found[0].get_attribute("innerText") or "").strip() if found else ""

    def finished(self, mid: str) -> bool:
        # the message's action buttons (Copy first) are drawn once the message is done
        return bool(self.css("button[aria-label='Copy']", self.message(mid)))

    def chat_id(self) -> str | None:
        found = re.search(r"/c/([^/?#]+)", self.driver.current_url)
        return found.group(1) if found else None

    def api(self, method: str, path: str, body: Any = None) -> Any:
        payload = None if body is None else json.dumps(body)
        return self.driver.execute_async_script(FETCH_JSON, path, method, payload)

    def saved_message(self, mid: str) -> dict[str, Any]:
        chat = self.api("GET", f"/api/v1/chats/{self.chat_id()}")
        messages = (((chat or {}).get("chat") or {}).get("history") or {}).get("messages") or {}
        found: dict[str, Any] = messages.get(mid) or {}
        return found

    def error_toasts(self) -> list[str]:
        toasts = self.driver.execute_script("return window.__toasts || []")
        return [t["text"] for t in toasts if t.get("type") == "error"]

    def set_params(self, params: dict[str, Any]) -> None:
        """The user's own default parameters (Settings > General > Advanced Parameters), saved
        as the settings window saves them; the page reads them when it next loads."""
        current = self.api("GET", "/api/v1/users/user/settings") or {}
        ui = {**(current.get("ui") or {}), "params": params}
        self.api("POST", "/api/v1/users/user/settings/update", {"ui": ui})

    def citation_window(self) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.driver.execute_script(CITATION_WINDOW)
        return found

    def open_citation(self, chip: WebElement) -> dict[str, Any]:
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", chip)
        chip.click()
        shown = wait_for(self.citation_window, 20, "the source window")
        close = self.visible("[role=dialog] [aria-label='Close citation modal']")
        if close is not None:
            close.click()
        wait_for(lambda: self.citation_window() is None, 20, "the source window to close")
        return shown

    def screenshot(self, name: str) -> str:
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        with contextlib.suppress(WebDriverException):
            self.driver.save_screenshot(str(path))
        return str(path)


# ---------------------------------------------------------------------------------------------
# What the server says


@dataclass
class Source:
    n: int
    name: str
    url: str
    snippet: str


def server_sources(rag_stream: str, api_key: str, stream_id: str) -> list[Source]:
    """The sources of a stream as rag-stream numbers them, from its replay (rendered in the
    stream's own format: one Open WebUI ``source`` event per source, named ``[n] title``)."""
    r = httpx.get(f"{rag_stream}/v1/streams/{stream_id}/events", headers=auth(api_key), timeout=120)
    r.raise_for_status()
    found: list[Source] = []
    for line in r.text.splitlines():
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        event = json.loads(line[5:]).get("event") or {}
        if event.get("type") != "source":
            continue
        data = event["data"]
        name = data["source"]["name"]
        numbered = re.match(r"\[(\d+)\]", name)
        n = int(numbered.group(1)) if numbered else len(found) + 1
        found.append(Source(n, name, data["source"]["url"], data["document"][0]))
    return found


def stream_status(rag_stream: str, api_key: str, stream_id: str) -> dict[str, Any]:
    r = httpx.get(f"{rag_stream}/v1/streams/{stream_id}", headers=auth(api_key), timeout=10)
    r.raise_for_status()
    status: dict[str, Any] = r.json()
    return status


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def shows_snippet(window_text: str, snippet: str) -> float:
    """The share of the snippet's words the window shows (it renders the snippet as Markdown,
    so compare words, not characters)."""
    wanted = words(snippet)
    shown = set(words(window_text))
    return sum(w in shown for w in wanted) / len(wanted) if wanted else 0.0


def window_shows(window: dict[str, Any], source: Source) -> tuple[bool, float]:
    linked = any(h == source.url or h.startswith(source.url + "#") for h in window["hrefs"])
    share = shows_snippet(window["text"], source.snippet)
    return linked and share >= 0.9, share


def chip_markers(answer: str) -> list[int]:
    """The n of each marker Open WebUI draws as one inline chip, in order: a run of bracket
    groups naming one id in all (``[2]``); a run naming several (``[1][2]``, ``[1, 2]``) is one
    "+k more" button instead."""
    out = []
    for run in MARKER_RUN.finditer(answer):
        ids = [
            part.strip().split("#")[0]
            for group in MARKER_GROUP.findall(run.group(0))
            for part in group.split(",")
        ]
        if len(ids) == 1 and ids[0].isdigit():
            out.append(int(ids[0]))
    return out


def is_answer_to(question: str) -> Callable[[Exchange], bool]:
    def match(ex: Exchange) -> bool:
        body = ex.body if isinstance(ex.body, dict) else {}
        messages = body.get("messages") or [{}]
        return (
            ex.path.endswith("/chat/completions")
            and bool(body.get("stream"))
            and messages[-1].get("content") == question
            and ex.stream_id is not None
        )

    return match


# ---------------------------------------------------------------------------------------------
# The checks


@dataclass
class Run:
    page: OpenWebUIPage
    proxy: RecordingProxy
    rag_stream: str
    api_key: str
    args: argparse.Namespace


@dataclass
class Answered:
    """A question asked in a new chat and its answer, as the page and the server saw it."""

    question: str
    exchange: Exchange
    message_id: str
    first_text_s: float
    done_s: float
    text: str  # as Open WebUI saved it
    saved: dict[str, Any]
    errors: list[str]
    status: dict[str, Any]  # GET /v1/streams/{id}


def ask(run: Run, question: str, params: dict[str, Any] | None = None) -> Answered:
    """Ask in a new chat with model kb:docs, and wait for the whole answer. ``params``: the
    user's default parameters first (None: Open WebUI's own defaults, untouched)."""
    page = run.page
    if params is not None:
        page.set_params(params)
    page.open_new_chat()
    page.choose_model(MODEL)
    sent = page.send(question)
    say(f"asked {question!r}" + (f" with {params}" if params else ""))
    ex = run.proxy.wait_for(is_answer_to(question), 120, "carrying the question")
    mid = wait_for(page.assistant_message_id, 60, "the answer's message")
    timeout = run.args.answer_timeout
    wait_for(lambda: page.answer_text(mid), timeout, "the answer's first text")
    first_text = time.time() - sent
    wait_for(lambda: page.finished(mid), timeout, "the answer to end")
    done = time.time() - sent
    saved = page.saved_message(mid)
    errors = page.error_toasts()
    if saved.get("error"):
        errors.append(f"message error: {saved['error']}")
    status = stream_status(run.rag_stream, run.api_key, ex.stream_id or "")
    text = str(saved.get("content") or "")
    return Answered(question, ex, mid, first_text, done, text, saved, errors, status)


def check_answer(answered: Answered) -> Check:
    a = answered
    check = Check("answer")
    check.figures = {
        "question": a.question,
        "stream_id": a.exchange.stream_id,
        "first_text_s": round(a.first_text_s, 2),
        "done_s": round(a.done_s, 2),
        "answer_chars": len(a.text),
        "server_status": a.status.get("status"),
        "server_finish_reason": a.status.get("finish_reason"),
        "errors_shown": a.errors,
        "answer": a.text,
    }
    check.passed = bool(a.text.strip()) and not a.errors and a.status.get("status") == "done"
    check.summary = (
        f"{len(a.text)} chars; first text {a.first_text_s:.1f} s, done {a.done_s:.1f} s after "
        f"send; server {a.status.get('status')}/{a.status.get('finish_reason')}; "
        + (f"errors shown: {a.errors}" if a.errors else "no error shown")
    )
    return check


def list_chips(run: Run, a: Answered, expected: list[Source]) -> list[dict[str, Any]]:
    """Open the message's "N Sources" list and each chip in it, in turn."""
    page = run.page
    message = page.message(a.message_id)
    toggles = [b for b in page.css("button[aria-label^='Toggle']", message) if "ource" in b.text]
    if not toggles:
        return []
    toggles[0].click()
    prefix = f"source-{a.message_id}-"
    wait_for(lambda: page.css(f"button[id^='{prefix}']"), 20, "the sources list")
    out = []
    for n in range(1, len(page.css(f"button[id^='{prefix}']")) + 1):
        chip = page.driver.find_element(By.ID, f"{prefix}{n}")
        label = " ".join(chip.text.split())
        window = page.open_citation(chip)
        want = next((s for s in expected if s.n == n), None)
        ok, share = window_shows(window, want) if want else (False, 0.0)
        titled = want is not None and want.name in window["text"]
        out.append(
            {
                "chip": n,
                "label": label,
                "opens_source_n": ok,
                "snippet_shown": share,
                "window_shows_name": titled,
            }
        )
    return out


def inline_chips(run: Run, a: Answered, expected: list[Source]) -> dict[str, Any]:
    """The chips drawn for the answer's ``[n]`` markers, paired in order with the markers that
    name a source; the first chip of each n (up to 6) opened. Open WebUI draws nothing for a
    marker past the last source: the marker just drops out of the text (``orphans``)."""
    page = run.page
    by_n = {s.n: s for s in expected}
    markers = chip_markers(a.text)
    named = [n for n in markers if n in by_n]
    chips = [
        b
        for b in page.css(
            "#response-content-container button[aria-label^='View source']",
            page.message(a.message_id),
        )
        if not (b.get_attribute("id") or "").startswith("source-")
    ]
    found: dict[str, Any] = {
        "markers": markers,
        "naming_a_source": len(named),
        "chips": len(chips),
        "opened": [],
        "orphans": [n for n in markers if n not in by_n],
    }
    if len(chips) != len(named):
        return found
    for chip, n in zip(chips, named, strict=True):
        if len(found["opened"]) < 6 and all(o["marker"] != n for o in found["opened"]):
            label = " ".join(chip.text.split())
            ok, share = window_shows(page.open_citation(chip), by_n[n])
            found["opened"].append(
                {"marker": n, "label": label, "opens_source_n": ok, "snippet_shown": share}
            )
    return found


def check_sources(run: Run, first: Answered) -> Check:
    """List chips on the first answer; inline chips on it too when it has a marker naming a
    source, else on an answer to ``--inline-question`` asked greedily (temperature 0)."""
    check = Check("sources")
    expected = server_sources(run.rag_stream, run.api_key, first.exchange.stream_id or "")
    listed = list_chips(run, first, expected)
    run.page.screenshot("sources")
    inline_on, inline_expected = first, expected
    if not any(n <= len(expected) for n in chip_markers(first.text)):
        say("the answer has no [n] marker naming a source: asking again for the inline chips")
        inline_on = ask(run, run.args.inline_question, {"temperature": 0})
        sid = inline_on.exchange.stream_id or ""
        inline_expected = server_sources(run.rag_stream, run.api_key, sid)
        run.page.screenshot("inline")
    inline = inline_chips(run, inline_on, inline_expected)
    opened = inline["opened"]
    paired = inline["chips"] == inline["naming_a_source"]
    list_ok = len(listed) == len(expected) > 0 and all(c["opens_source_n"] for c in listed)
    inline_ok = paired and bool(opened) and all(c["opens_source_n"] for c in opened)
    check.passed = list_ok and inline_ok
    check.figures = {
        "server_sources": [asdict(s) for s in expected],
        "stored_sources": len(first.saved.get("sources") or []),
        "list_chips": listed,
        "inline_question": inline_on.question,
        "inline_stream_id": inline_on.exchange.stream_id,
        "inline_answer": inline_on.text,
        "inline_server_sources": len(inline_expected),
        "inline": inline,
    }
    worst = min((c["snippet_shown"] for c in listed + opened), default=0.0)
    orphans = inline["orphans"]
    check.summary = (
        f"server sent {len(expected)} sources, Open WebUI stored "
        f"{check.figures['stored_sources']} and lists {len(listed)} chips; list chip n opens "
        f"source n (URL and snippet): {sum(c['opens_source_n'] for c in listed)}/{len(listed)}"
        f', its window shows the name "[n] title": '
        f"{sum(c['window_shows_name'] for c in listed)}/{len(listed)}; "
        f"inline: {inline['chips']} chips for {inline['naming_a_source']} [n] markers naming "
        "a source"
        + ("" if inline_on is first else " (greedy answer to the inline question)")
        + f", the first chip of each n opens source n: "
        f"{sum(c['opens_source_n'] for c in opened)}/{len(opened)}; "
        f"least share of snippet words shown {worst:.0%}"
        + (
            f"; {len(orphans)} marker(s) past the last source (e.g. [{orphans[0]}]) dropped "
            "from the text by Open WebUI"
            if orphans
            else ""
        )
    )
    return check


def check_stop(run: Run, grace: float) -> Check:
    check = Check("stop")
    page, args = run.page, run.args
    # Open WebUI passes unknown "custom parameters" into the body as they are: with vLLM's
    # ignore_eos the answer runs to max_tokens, so it cannot end by itself before the Stop
    page.set_params({"max_tokens": args.max_tokens, "custom_params": {"ignore_eos": True}})
    page.open_new_chat()
    page.choose_model(MODEL)
    sent = page.send(args.essay)
    say(
        f"asked {args.essay!r} (max_tokens {args.max_tokens}, ignore_eos); "
        f"Stop after {args.stop_after} chars"
    )
    ex = run.proxy.wait_for(is_answer_to(args.essay), 120, "carrying the essay question")
    sid = ex.stream_id or ""
    mid = wait_for(page.assistant_message_id, 60, "the answer's message")
    wait_for(
        lambda: len(page.answer_text(mid)) >= args.stop_after,
        args.answer_timeout,
        f"{args.stop_after} characters of answer",
    )
    before = stream_status(run.rag_stream, run.api_key, sid)
    button = wait_for(lambda: page.visible("button[aria-label='Stop']"), 10, "the Stop button")
    chars_at_click = len(page.answer_text(mid))
    clicked = time.time()
    button.click()
    limit = grace + 1.0

    def ended() -> dict[str, Any] | None:
        status = stream_status(run.rag_stream, run.api_key, sid)
        return status if status["status"] != "running" else None

    took: float | None
    try:
        after = wait_for(ended, limit + 30, "the stream to end", poll=0.05)
        took = time.time() - clicked
    except TimeoutError:
        after, took = stream_status(run.rag_stream, run.api_key, sid), None
    closed = ex.ended - clicked if ex.ended is not None and ex.ended_by == "client" else None
    time.sleep(2)  # what the page does after the Stop: keep writing, or show an error
    chars_later = len(page.answer_text(mid))
    page.screenshot("stop")
    errors = page.error_toasts()
    saved = page.saved_message(mid)
    if saved.get("error"):
        errors.append(f"message error: {saved['error']}")
    check.figures = {
        "question": args.essay,
        "stream_id": sid,
        "grace_s": grace,
        "limit_s": limit,
        "stop_clicked_after_send_s": round(clicked - sent, 2),
        "was_running_at_click": before["status"] == "running",
        "events_at_click": before["last_event_id"],
        "events_at_end": after["last_event_id"],
        "upstream_closed_after_click_s": None if closed is None else round(closed, 3),
        "server_ended_after_click_s": None if took is None else round(took, 2),
        "server_status": after["status"],
        "server_finish_reason": after["finish_reason"],
        "page_chars_at_click": chars_at_click,
        "page_chars_2s_after_end": chars_later,
        "errors_shown": errors,
    }
    check.passed = (
        before["status"] == "running"
        and after["status"] == "done"
        and after["finish_reason"] == "cancelled"
        and took is not None
        and took <= limit
    )
    closed_text = "not seen" if closed is None else f"{closed:.2f} s"
    took_text = "did not end" if took is None else f"{took:.2f} s"
    check.summary = (
        f"clicked {clicked - sent:.1f} s after send; stream {after['status']}/"
        f"{after['finish_reason']} {took_text} after the click (limit: grace {grace:g} + 1 = "
        f"{limit:g} s); Open WebUI closed its upstream connection {closed_text} after the click; "
        f"{after['last_event_id'] - before['last_event_id']} events written after the click; "
        f"page {chars_at_click} -> {chars_later} chars"
        + (f"; errors shown: {errors}" if errors else "; no error shown")
    )
    return check


def check_header(proxy: RecordingProxy) -> Check:
    check = Check("header")
    chats = [ex for ex in proxy.snapshot() if ex.path.endswith("/chat/completions")]
    carrying = [ex for ex in chats if ex.headers.get(SOURCES_HEADER.lower()) == SOURCES_SHAPE]
    check.passed = bool(chats) and len(carrying) == len(chats)
    check.summary = (
        f"{SOURCES_HEADER}: {SOURCES_SHAPE} on {len(carrying)}/{len(chats)} chat requests"
    )
    check.figures = {"chat_requests": len(chats), "with_header": len(carrying)}
    return check


def traffic(proxy: RecordingProxy, finished: float) -> list[dict[str, Any]]:
    """What Open WebUI sent rag-stream, one row per request; one still open when the checks
    ``finished`` is marked so (stopping Open WebUI then closed it)."""
    rows = []
    exchanges = proxy.snapshot()
    for ex in exchanges:
        body = ex.body if isinstance(ex.body, dict) else {}
        messages = body.get("messages") or []
        last = str((messages[-1] if messages else {}).get("content") or "")
        task = re.search(r"### Task:\s*(.+)", last)
        rows.append(
            {
                "at_s": round(ex.started - exchanges[0].started, 2),
                "request": f"{ex.method} {ex.path}",
                "status": ex.status,
                "stream": body.get("stream"),
                "fields": sorted(body),
                "tools": len(body.get("tools") or []),
                "max_tokens": body.get("max_tokens"),
                "asks": (task.group(1) if task else last)[:70],
                "stream_id": ex.stream_id,
                "ended_by": (
                    "open at the end" if ex.ended is None or ex.ended >= finished else ex.ended_by
                ),
                "took_s": None if ex.ended is None else round(ex.ended - ex.started, 2),
                "headers": {
                    k: v for k, v in ex.headers.items() if k not in ("content-length", "host")
                },
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Report


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"## Open WebUI {report['open_webui_version']} with rag-stream: check report",
        "",
        f"`scripts/check_open_webui.py`, run {report['date']} on {report['machine']}; "
        f"rag-stream at commit {report['commit']}, {report['rag_stream']}; model `{MODEL}`, "
        f"chat abandon grace {report['grace_s']:g} s.",
        "",
        "Open WebUI ran offline with "
        + " ".join(f"`{k}={v}`" for k, v in report["open_webui_env"].items())
        + " (`OPENAI_API_BASE_URL` is the recording proxy in front of rag-stream), a fresh "
        "`DATA_DIR`, and its default settings otherwise.",
        "",
        "| check | result | figures |",
        "|---|---|---|",
    ]
    for c in report["checks"]:
        lines.append(f"| {c['name']} | {'PASS' if c['passed'] else 'FAIL'} | {c['summary']} |")
    lines += ["", "What Open WebUI sent rag-stream (recorded between them):", ""]
    lines += [
        "| at s | request | stream | body fields | tools | max_tokens | asks | ended by | took s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["traffic"]:
        fields = ", ".join(f for f in r["fields"] if f != "messages") or "-"
        asks = r["asks"].replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {r['at_s']} | {r['request']} | {r['stream']} | {fields} | {r['tools']} | "
            f"{r['max_tokens']} | {asks} | {r['ended_by']} | {r['took_s']} |"
        )
    chat = next((r for r in report["traffic"] if r["request"].endswith("/chat/completions")), None)
    if chat:
        shown = ", ".join(f"`{k}: {v}`" for k, v in sorted(chat["headers"].items()))
        lines += ["", f"Headers of a chat request: {shown}."]
    return "\n".join(lines) + "\n"


def commit() -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return found.stdout.strip() or "unknown"


@contextlib.contextmanager
def stopping(server: ServerProcess | None) -> Iterator[ServerProcess | None]:
    try:
        yield server
    finally:
        if server is not None:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--open-webui-version", default=DEFAULT_VERSION)
    parser.add_argument("--data-dir", type=Path, default=DATA, help="venv, logs, report")
    parser.add_argument("--rag-stream-url", help="use this server instead of starting one")
    parser.add_argument(
        "--rag-stream-data-dir", type=Path, help="the started server's state (data-dir/rag-stream)"
    )
    parser.add_argument("--api-key", default="none", help="rag-stream key, if it needs one")
    parser.add_argument("--grace", type=float, help="rag-stream's chat_abandon_after_s")
    parser.add_argument("--question", default="How do I resume a stream after a disconnect?")
    parser.add_argument(
        "--essay",
        default="Write a long, detailed essay on how rag-stream streams, resumes and cancels "
        "answers, with many sections.",
    )
    parser.add_argument(
        "--inline-question",
        default="What is rag-stream?",
        help="asked greedily when the first answer has no [n] marker naming a source",
    )
    parser.add_argument("--max-tokens", type=int, default=1024, help="for the Stop check")
    parser.add_argument("--stop-after", type=int, default=120, help="answer chars before Stop")
    parser.add_argument("--answer-timeout", type=float, default=600)
    parser.add_argument("--report", type=Path, help="Markdown report (default data-dir/report.md)")
    parser.add_argument("--show-browser", action="store_true", help="not headless")
    args = parser.parse_args(argv)

    data: Path = args.data_dir.resolve()
    data.mkdir(parents=True, exist_ok=True)
    report_md: Path = args.report or data / "report.md"
    venv = data / "venv"
    ensure_open_webui(venv, args.open_webui_version, data / "install.log")

    rs_data = (args.rag_stream_data_dir or data / "rag-stream").resolve()
    started = None if args.rag_stream_url else start_rag_stream(rs_data)
    checks: list[Check] = []
    report: dict[str, Any] = {}
    with stopping(started):
        rag_stream = (args.rag_stream_url or (started.url if started else "")).rstrip("/")
        wait_for_model(rag_stream, args.api_key, MODEL)
        grace = args.grace if args.grace is not None else abandon_grace(rag_stream_env(rs_data))
        say(f"rag-stream ready at {rag_stream} with {MODEL}; chat abandon grace {grace:g} s")
        proxy = RecordingProxy(rag_stream, free_port())
        proxy.start()
        owui_env = open_webui_env(proxy.url, args.api_key)
        try:
            with stopping(start_open_webui(venv, data, owui_env)) as owui:
                assert owui is not None
                driver = start_chromium(args.show_browser)
                try:
                    page = OpenWebUIPage(driver, owui.url, data / "screenshots")
                    run = Run(page, proxy, rag_stream, args.api_key, args)
                    checks = run_checks(run, grace)
                finally:
                    finished = time.time()
                    driver.quit()
        finally:
            proxy.stop()
        report = {
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.machine()}",
            "open_webui_version": installed_version(venv),
            "rag_stream": f"started by the script (state in {rs_data})"
            if started
            else f"at {rag_stream}",
            "open_webui_env": owui_env,
            "commit": commit(),
            "grace_s": grace,
            "passed": all(c.passed for c in checks),
            "checks": [asdict(c) for c in checks],
            "traffic": traffic(proxy, finished),
        }

    for c in checks:
        print(c.line())
    report_md.write_text(markdown(report))
    report_md.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"report: {report_md} (and {report_md.with_suffix('.json').name})")
    return 0 if report["passed"] else 1


def run_checks(run: Run, grace: float) -> list[Check]:
    """Each check in turn; one that cannot run is a FAIL with the reason, the rest still run."""
    checks: list[Check] = []
    try:
        first = ask(run, run.args.question)
        run.page.screenshot("answer")
        checks.append(check_answer(first))
        try:
            checks.append(check_sources(run, first))
        except Exception as exc:
            run.page.screenshot("sources-failed")
            checks.append(Check("sources", summary=f"could not check: {exc}"))
    except Exception as exc:
        run.page.screenshot("answer-failed")
        checks += [Check("answer", summary=f"could not check: {exc}"), Check("sources")]
    try:
        checks.append(check_stop(run, grace))
    except Exception as exc:
        run.page.screenshot("stop-failed")
        checks.append(Check("stop", summary=f"could not check: {exc}"))
    checks.insert(0, check_header(run.proxy))
    return checks


if __name__ == "__main__":
    sys.exit(main())
