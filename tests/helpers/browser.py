"""A real headless Chromium driven over the DevTools protocol, for the dashboard's page tests.

Chromium is started with ``--remote-debugging-pipe``: it reads protocol messages (JSON, each
ended by a NUL byte) on its file descriptor 3 and writes answers and events on 4, so no
websocket client and no port are needed. Waits are on page states with deadlines: a
JavaScript condition evaluated in the page until it holds (``Page.wait_for``), never a sleep.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")

_FLAGS = (
    "--headless",
    "--no-sandbox",  # tests may run as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
)


class BrowserError(AssertionError):
    pass


class Chromium:
    """One browser process; :meth:`page` opens a tab."""

    def __init__(self, profile: Path, log: Path) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        self._log = log
        with log.open("wb") as out:
            # fds 3 and 4 of the browser must be these two pipes; bash puts them there (dash
            # takes one-digit descriptors only).
            self.proc = subprocess.Popen(
                [
                    "bash",
                    "-c",
                    f'exec "$0" "$@" 3<&{to_child_r} 4>&{from_child_w}',
                    str(CHROMIUM),
                    *_FLAGS,
                    f"--user-data-dir={profile}",
                    "about:blank",
                ],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        os.close(to_child_r)
        os.close(from_child_w)
        self._ids = itertools.count(1)
        self._waiting: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                break
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        box = self._waiting.pop(msg["id"], None)
                    if box is not None:
                        box.put(msg)
                else:
                    self.events.append(msg)
        with self._lock:
            for box in self._waiting.values():
                box.put({"error": {"message": "the browser exited"}})
            self._waiting.clear()

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        msg_id = next(self._ids)
        box: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._waiting[msg_id] = box
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        try:
            answer = box.get(timeout=timeout)
        except queue.Empty:
            raise BrowserError(f"{method}: no answer within {timeout} s\n{self.log()}") from None
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error'].get('message')}\n{self.log()}")
        return dict(answer.get("result", {}))

    def page(self, width: int = 1280, height: int = 900) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        page = Page(self, target, session)
        page.send("Page.enable")
        page.send("Runtime.enable")
        page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return page

    def log(self) -> str:
        try:
            return self._log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except BrowserError:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        self._reader.join(timeout=10)
        os.close(self._from_child)


class Page:
    """One tab: navigate, evaluate JavaScript, wait for a state, take a screenshot."""

    def __init__(self, browser: Chromium, target: str, session: str) -> None:
        self.browser = browser
        self.target = target
        self.session = session

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, session=self.session)

    def goto(self, url: str) -> None:
        answer = self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise BrowserError(f"navigating to {url}: {answer['errorText']}")

    def evaluate(self, expression: str, timeout: float = 60.0) -> Any:
        result = self.browser.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session=self.session,
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"{expression[:80]}...: {text}")
        return result["result"].get("value")

    def wait_for(self, condition: str, timeout: float, what: str) -> Any:
        """Wait until the JavaScript expression ``condition`` is truthy in the page (checked
        on every animation frame and timer tick there), or fail after ``timeout`` seconds
        naming ``what``. Survives navigations: a check lost with its document is retried."""
        deadline = time.monotonic() + timeout
        script = (
            "new Promise((resolve) => { const end = Date.now() + %d;"
            " const check = () => { let v = false; try { v = !!(%s); } catch (e) { v = false; }"
            " if (v || Date.now() > end) resolve(v); else setTimeout(check, 25); };"
            " check(); })"
        )
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                state = self.evaluate("document.body ? document.body.innerText.slice(0, 600) : ''")
                raise BrowserError(
                    f"timed out after {timeout} s waiting for {what}; page:\n{state}"
                )
            try:
                value = self.evaluate(script % (int(left * 1000), condition), timeout=left + 30)
            except BrowserError as exc:
                if "context" not in str(exc).lower() and "navigat" not in str(exc).lower():
                    raise
                continue
            if value:
                return value

    def exceptions(self) -> list[str]:
        """Uncaught JavaScript exceptions this tab has thrown so far."""
        return [
            str(e["params"]["exceptionDetails"].get("exception", {}).get("description"))
            for e in self.browser.events
            if e.get("method") == "Runtime.exceptionThrown" and e.get("sessionId") == self.session
        ]

    def screenshot(self, path: Path, full_page: bool = True) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
            )
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
            params["captureBeyondViewport"] = True
        data = base64.b64decode(self.send("Page.captureScreenshot", params)["data"])
        path.write_bytes(data)
        return data

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})
