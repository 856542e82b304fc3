"""Headless Debian Chromium driven by Selenium, and the chat page as a test sees it.

The browser and its driver are the system's (``/usr/bin/chromium``, ``/usr/bin/chromedriver``,
installed by ``.ci/run``), passed explicitly so that Selenium Manager never looks for, or
downloads, another. Screenshots go to ``tests/output/screenshots/`` (git-ignored; CI keeps
``tests/output/`` as an artefact).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from tests.support.server import ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = ROOT / "tests" / "output" / "screenshots"
KEY_ITEM = "rag-stream.api-key"  # where the page keeps the key (static/api.js)

T = TypeVar("T")

# Installed by a test after the page loaded: what the thread's last turn showed, in order (cards
# and answer characters), every text the status line took, and the upload bar shown and hidden.
RECORDER = """
const seen = (window.__seen = { order: [], statuses: [], progress: [] });
const thread = document.getElementById("thread");
new MutationObserver(() => {
  const turn = thread.lastElementChild;
  if (!turn) return;
  const cards = turn.querySelectorAll(".card").length;
  const text = turn.querySelector(".answer").textContent.length;
  const last = seen.order[seen.order.length - 1] || { cards: 0, text: 0 };
  if (cards !== last.cards || text !== last.text) seen.order.push({ cards, text });
}).observe(thread, { childList: true, subtree: true, characterData: true });
const status = document.getElementById("status");
new MutationObserver(() => seen.statuses.push(status.textContent)).observe(status, {
  childList: true, subtree: true, characterData: true,
});
const bar = document.getElementById("upload-progress");
new MutationObserver(() => seen.progress.push({ hidden: bar.hidden, value: bar.value })).observe(
  bar, { attributes: true, attributeFilter: ["hidden"] },
);
"""


def start_chromium() -> webdriver.Chrome:
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never reach the network
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,960",
        "--lang=en-US",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


def wait_for(check: Callable[[], T | None], timeout: float = 60, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except StaleElementReferenceException:
            value = None  # the page redrew the element under the check: look again
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}")
        time.sleep(0.05)


class ChatPage:
    def __init__(self, driver: webdriver.Chrome, url: str) -> None:
        self.driver = driver
        self.url = url

    def open(self, api_key: str | None) -> None:
        """Load the page with that key saved in the browser (or none), as a person who once
        typed it in would find it."""
        self.driver.get(self.url + "/static/style.css")  # the origin, without running the page
        self.driver.execute_script(
            "arguments[0] ? localStorage.setItem(arguments[1], arguments[0])"
            " : localStorage.removeItem(arguments[1]); sessionStorage.clear();",
            api_key,
            KEY_ITEM,
        )
        self.driver.get(self.url + "/")
        if api_key:
            wait_for(lambda: self.driver.find_elements(By.CSS_SELECTOR, "#kb option"), what="KBs")
        self.driver.execute_script(RECORDER)

    def el(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def choose_kb(self, name: str) -> None:
        self.driver.execute_script(
            "const s = document.getElementById('kb'); s.value = arguments[0];"
            "s.dispatchEvent(new Event('change'));",
            name,
        )
        wait_for(lambda: self.el("#kb").get_attribute("value") == name, what="the KB chosen")

    def set_max_tokens(self, n: int) -> None:
        if not self.el("details").get_attribute("open"):
            self.el("details summary").click()
        field = self.el("#max-tokens")
        field.clear()
        field.send_keys(str(n))

    def ask(self, question: str) -> WebElement:
        """Type the question and press Enter; the new turn."""
        before = len(self.driver.find_elements(By.CSS_SELECTOR, "#thread .turn"))
        self.el("#question").send_keys(question + "\n")
        turns = wait_for(
            lambda: self.driver.find_elements(By.CSS_SELECTOR, "#thread .turn")[before:],
            what="the new turn",
        )
        return turns[0]

    def answer_text(self, turn: WebElement) -> str:
        return str(turn.find_element(By.CSS_SELECTOR, ".answer").get_attribute("textContent"))

    def wait_ended(self, turn: WebElement, timeout: float = 120) -> None:
        wait_for(
            lambda: "ended" in (turn.get_attribute("class") or ""),
            timeout,
            "the answer to end",
        )

    def wait_text(self, turn: WebElement, chars: int, timeout: float = 120) -> str:
        def enough() -> str | None:
            text = self.answer_text(turn)
            return text if len(text) >= chars else None

        return wait_for(enough, timeout, f"{chars} characters of answer")

    def seen(self) -> dict[str, Any]:
        seen: dict[str, Any] = self.driver.execute_script("return window.__seen")
        return seen

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path
