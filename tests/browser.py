"""A headless Chromium driven over the DevTools protocol, for the tests of the HTML report: open a local page,
collect what the console reported, evaluate JavaScript, click, screenshot. Chromium is the Debian package `make test`
installs (`make browser`); the protocol is spoken over a WebSocket (`websocket-client`), nothing else."""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import websocket


class Browser:
    """One headless Chromium with one page. Use as a context manager; `errors` holds every console error, uncaught
    exception and failed load the page produced."""

    def __init__(self, timeout: float = 30.0) -> None:
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if exe is None:
            raise RuntimeError("chromium is not installed: `make test` installs it (Debian: apt-get install chromium)")
        self.profile = tempfile.mkdtemp(prefix="evotrainer-chromium-")
        self.proc = subprocess.Popen([exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      "--disable-extensions", "--disable-background-networking",
                                      f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
                                      "--window-size=1280,900", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url, deadline = None, time.time() + timeout
        while url is None and time.time() < deadline:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/..."
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            if m := re.search(r"DevTools listening on (ws://\S+)", line):
                url = m.group(1)
        if url is None:
            self.close()
            raise RuntimeError("chromium did not start its DevTools endpoint")
        self.ws = websocket.create_connection(url, timeout=timeout)
        self.ids = itertools.count(1)
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    def call(self, method: str, session: bool = False, **params) -> dict:
        msg_id = next(self.ids)
        msg = {"id": msg_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def open(self, path: Path) -> None:
        """Load a local file and wait for its load event."""
        self.call("Page.navigate", session=True, url=Path(path).resolve().as_uri())
        deadline = time.time() + 30
        while time.time() < deadline:
            if any(e.get("method") == "Page.loadEventFired" for e in self.events):
                return
            self.events.append(json.loads(self.ws.recv()))
        raise RuntimeError(f"{path} did not load")

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        res = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                        awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    @property
    def errors(self) -> list[str]:
        out = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                out.append(p.get("exceptionDetails", {}).get("text", "exception"))
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            try:
                self.ws.close()
            except OSError:
                pass
        self.proc.kill()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_report(page: Path, branches: list[str], shot: Path) -> None:
    """The report of a run opened in Chromium: no console error, every candidate branch in the lineage, a click on
    a candidate opens it and shows its diff, and a screenshot of the opened page."""
    with Browser() as b:
        b.open(page)
        shown = b.js("[...document.querySelectorAll('details.candidate')].map(d => d.id)")
        assert sorted(shown) == sorted(branches), (shown, branches)
        first = json.dumps(branches[0])
        diff = f"document.getElementById({first}).querySelector('pre.diff')"
        assert b.js(f"{diff}.checkVisibility()") is False  # collapsed: its diff is not shown until it is opened
        b.js(f"document.getElementById({first}).querySelector('summary').click()")
        opened = b.js(f"[document.getElementById({first}).open, {diff}.checkVisibility(), "
                      f"{diff}.getBoundingClientRect().height, {diff}.innerText]")
        assert opened[:2] == [True, True] and opened[2] > 0 and "\n+" in opened[3], opened
        b.screenshot(shot)
        assert b.errors == [], b.errors
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
