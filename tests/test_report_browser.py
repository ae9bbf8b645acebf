"""The HTML report in a real headless Chromium, without a network: it loads, makes no request, every plot decodes,
the tables have the report's rows, and a click on a header sorts. A screenshot is kept: $CIFAR_RAY_SCREENSHOT, or
html-report.png in pytest's base temp folder (/tmp/pytest-of-$USER/pytest-current/); the path is printed (-s).

Chromium is driven over --remote-debugging-pipe (the DevTools protocol: NUL-separated JSON on fds 3 and 4), so no
websocket package is needed. Without Chromium (`apt-get install chromium`) the test skips, saying so."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import make_run

from cifar_ray.report import build_report, write_report
from cifar_ray.report.document import Table
from cifar_ray.report.export import report_document

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REPLY_TIMEOUT_S = 120  # one DevTools reply; the machine may be busy
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")


class Browser:
    """One headless Chromium on a throw-away profile, one page, every network request recorded."""

    def __init__(self, profile: Path) -> None:
        reads, self._to_browser = os.pipe()  # Chromium reads requests on fd 3
        self._replies, writes = os.pipe()  # and writes replies and events on fd 4

        def on_fds_3_and_4() -> None:
            # In the child: the pipe ends onto fds 3 and 4 through copies (either end may sit on 3 or 4 already),
            # inheritable (close_fds=False: Python's own fds are not, so Chromium gets only 0-4).
            copies = os.dup(reads), os.dup(writes)
            for fd, copy in zip((3, 4), copies):
                os.dup2(copy, fd)
                os.set_inheritable(fd, True)

        self.process = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--remote-debugging-pipe",
                "--no-sandbox",  # as root (CI containers) Chromium refuses to start with its sandbox
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--host-resolver-rules=MAP * ~NOTFOUND",  # no name resolves: nothing could load from a network
                f"--user-data-dir={profile}",
                "--window-size=1280,1000",
                "about:blank",
            ],
            preexec_fn=on_fds_3_and_4,
            close_fds=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(reads)
        os.close(writes)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Network", "Runtime", "Log"):
                self.page(f"{domain}.enable")
            self.page(
                "Network.emulateNetworkConditions", offline=True, latency=0, downloadThroughput=-1, uploadThroughput=-1
            )
        except BaseException:
            self.close()
            raise

    def _receive(self) -> dict:
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._replies], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._replies, 1 << 20) if ready else b""
            if not chunk:
                raise RuntimeError(f"Chromium sent nothing for {REPLY_TIMEOUT_S} s or closed the pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params} | (
            {"sessionId": session} if session else {}
        )
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def page(self, method: str, **params) -> dict:
        return self.call(method, self.session, **params)

    def open(self, url: str) -> None:
        self.page("Page.navigate", url=url)
        while not any(event.get("method") == "Page.loadEventFired" for event in self.events):
            self.events.append(self._receive())

    def evaluate(self, expression: str):
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed, released) in the middle of the element, scrolled into view first."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.page("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def close(self) -> None:
        """Ask Chromium to quit; kill it if it cannot be asked or does not quit in 30 s."""
        try:
            self.call("Browser.close")
            self.process.wait(timeout=30)
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            os.close(self._to_browser)
            os.close(self._replies)


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> tuple[Path, Path]:
    run_dir = tmp_path_factory.mktemp("runs") / "bs-workers"
    make_run(run_dir)
    return run_dir, write_report(run_dir, tmp_path_factory.mktemp("html"), fmt="html")


@pytest.fixture
def browser(tmp_path):
    chromium = Browser(tmp_path / "profile")
    yield chromium
    chromium.close()


def column(browser: Browser, table: str, header: str) -> list[str]:
    return browser.evaluate(
        f"(() => {{ const t = document.getElementById({json.dumps(table)});"
        f" const i = Array.from(t.tHead.rows[0].cells).findIndex(c => c.textContent === {json.dumps(header)});"
        " return Array.from(t.tBodies[0].rows, r => r.cells[i].textContent); })()"
    )


def header(browser: Browser, table: str, text: str) -> str:
    """A CSS selector of the header cell `text` of the table with id `table`."""
    headers = browser.evaluate(f"Array.from(document.querySelectorAll('#{table} th'), h => h.textContent)")
    return f"#{table} th:nth-child({headers.index(text) + 1})"


def test_report_page_loads_offline_decodes_its_plots_and_sorts(report_page, browser, tmp_path_factory):
    run_dir, page = report_page
    url = page.as_uri()
    browser.open(url)

    requested = [e["params"]["request"]["url"] for e in browser.events if e["method"] == "Network.requestWillBeSent"]
    assert requested and all(u == url or u.startswith("data:image/png;base64,") for u in requested), requested
    failed = [e["params"] for e in browser.events if e["method"] == "Network.loadingFailed"]
    errors = [e["params"] for e in browser.events if e["method"] == "Runtime.exceptionThrown"] + [
        e["params"]
        for e in browser.events
        if e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
    ]  # a Content-Security-Policy violation is a logged error
    assert not failed and not errors, (failed, errors)

    assert not list(page.parent.glob("*.png"))  # self-contained: every plot inside the page, none beside it
    plots = page.read_text(encoding="utf-8").count('<img src="data:image/png;base64,')
    assert browser.evaluate("Promise.all(Array.from(document.images, i => i.decode())).then(() => true)") is True
    widths = browser.evaluate("Array.from(document.images, i => [i.complete, i.naturalWidth, i.naturalHeight])")
    assert len(widths) == plots >= 4 and all(done and w > 100 and h > 100 for done, w, h in widths)

    # Every table of the document is on the page, under its name, with its rows.
    report = build_report(run_dir)
    document = report_document(report, tmp_path_factory.mktemp("document"))
    expected = {block.name: len(block.rows) for block in document if isinstance(block, Table)}
    shown = browser.evaluate(
        "Object.fromEntries(Array.from(document.querySelectorAll('table'), t => [t.id, t.tBodies[0].rows.length]))"
    )
    trials = report.trials
    assert shown == expected and shown["trials"] == len(trials) == 8

    # One click sorts ascending (the trial without a test accuracy last), a second one descending.
    accuracy = "final test acc (%)"
    by_accuracy = trials.sort_values("final_test_acc", na_position="last")["trial"].tolist()
    assert column(browser, "trials", "trial") == trials["trial"].tolist()
    browser.click(header(browser, "trials", accuracy))
    assert column(browser, "trials", accuracy)[-1] == "—"
    assert column(browser, "trials", "trial") == by_accuracy
    browser.click(header(browser, "trials", accuracy))
    assert column(browser, "trials", "trial") == [*by_accuracy[-2::-1], by_accuracy[-1]]
    # Numbers sort as numbers ("6.17" before "12.12", which text order would put first).
    speed = header(browser, "trials", "time/epoch (s)")
    browser.click(speed)
    times = [float(s.replace(",", "")) for s in column(browser, "trials", "time/epoch (s)") if s != "—"]
    assert times == sorted(times) and max(times) >= 10 > min(times)
    assert browser.evaluate(f"document.querySelector('{speed}').getAttribute('aria-sort')") == "ascending"

    # In a 1280-px window the page never scrolls sideways: the trial table's headers wrap, and a table still too
    # wide scrolls inside its own box.
    assert browser.evaluate("window.innerWidth") == 1280
    assert browser.evaluate("document.documentElement.scrollWidth") <= 1280
    boxes = browser.evaluate(
        "Array.from(document.querySelectorAll('.table'), b => [b.firstElementChild.id, b.getBoundingClientRect().right,"
        " getComputedStyle(b).overflowX])"
    )
    assert boxes and all(right <= 1280 and overflow == "auto" for _, right, overflow in boxes), boxes
    trial_table = browser.evaluate("document.getElementById('trials').getBoundingClientRect().width")
    assert trial_table <= browser.evaluate("document.body.clientWidth"), trial_table

    shot = Path(os.environ.get("CIFAR_RAY_SCREENSHOT") or tmp_path_factory.getbasetemp() / "html-report.png")
    browser.evaluate("document.querySelectorAll('.table').forEach(box => { box.scrollLeft = 0; })")
    size = browser.page("Page.getLayoutMetrics")["cssContentSize"]
    whole_page = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    png = browser.page("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=whole_page)["data"]
    shot.write_bytes(base64.b64decode(png))
    print(f"screenshot of the HTML report: {shot}")
