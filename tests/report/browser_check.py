#!/usr/bin/env python3
"""Opens a `vlmtrain report` page in a real headless browser (Debian's chromium) and checks that
it draws: every chart has a size, the loss chart's area is not blank (pixels of the training
curve's colour in a screenshot of that chart alone), and the page logged no error, threw no
exception and fetched nothing from elsewhere. Optionally saves a screenshot of the whole page.

It drives the browser over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON
messages ending in NUL on file descriptors 3 and 4), so it needs no network port and no Python
package beyond Pillow (for reading the PNG). Exit 0 when the page passes, 1 otherwise.

Usage: browser_check.py REPORT.html [--screenshot PAGE.png] [--chromium PATH]
"""
import argparse
import base64
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

LOSS_COLOUR = (0x1F, 0x77, 0xB4)  # palette(0): the training loss of a single run


class Browser:
    def __init__(self, chromium, profile):
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        command = (f"exec '{chromium}' --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage "
                   "--no-first-run --no-default-browser-check --disable-extensions "
                   f"--user-data-dir='{profile}' --remote-debugging-pipe "
                   f"--window-size=1280,1000 about:blank "
                   f"3<&{to_child_r} 4>&{from_child_w} 2>/dev/null")
        self.process = subprocess.Popen(["sh", "-c", command],
                                        pass_fds=(to_child_r, from_child_w))
        os.close(to_child_r)
        os.close(from_child_w)
        self.buffer = b""
        self.next_id = 0
        self.events = []

    def _read_message(self, deadline):
        while b"\0" not in self.buffer:
            if time.time() > deadline:
                raise TimeoutError("the browser did not answer")
            chunk = os.read(self.from_child, 1 << 16)
            if not chunk:
                raise RuntimeError("the browser closed its pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, params=None, session=None, timeout=60):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_child, json.dumps(message).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method, timeout=60):
        deadline = time.time() + timeout
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._read_message(deadline)
            if event.get("method") == method:
                return event
            self.events.append(event)

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except Exception:  # the browser may already be gone
            pass
        self.process.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("report")
    parser.add_argument("--screenshot")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args()
    page = Path(args.report).resolve()
    problems = []
    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(args.chromium, profile)
        try:
            target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = browser.call("Target.attachToTarget",
                                   {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                browser.call(f"{domain}.enable", session=session)
            browser.call("Page.navigate", {"url": page.as_uri()}, session=session)
            browser.wait_for("Page.loadEventFired")
            charts = browser.call("Runtime.evaluate", {
                "expression": "JSON.stringify([...document.querySelectorAll('svg.chart')].map("
                              "e => { const r = e.getBoundingClientRect(); return {id: e.id, "
                              "x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height}; }))",
                "returnByValue": True}, session=session)["result"]["value"]
            charts = json.loads(charts)
            if not charts:
                problems.append("no chart on the page")
            for chart in charts:
                if chart["w"] < 100 or chart["h"] < 100:
                    problems.append(f"chart {chart['id']} is {chart['w']}x{chart['h']} px")
            loss = next((c for c in charts if c["id"] == "chart-loss"), None)
            if loss is None:
                problems.append("no loss chart")
            else:
                shot = browser.call("Page.captureScreenshot", {
                    "format": "png", "captureBeyondViewport": True,
                    "clip": {"x": loss["x"], "y": loss["y"], "width": loss["w"],
                             "height": loss["h"], "scale": 1}}, session=session)
                image = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
                raw = image.tobytes()
                pixels = [tuple(raw[i:i + 3]) for i in range(0, len(raw), 3)]
                curve = sum(1 for p in pixels
                            if all(abs(a - b) <= 40 for a, b in zip(p, LOSS_COLOUR)))
                colours = len(set(pixels))
                print(f"browser: {len(charts)} charts; the loss chart "
                      f"{image.width}x{image.height} px holds {curve} pixels of the training "
                      f"curve's colour and {colours} colours")
                if curve < 200:
                    problems.append(f"the loss chart is blank: {curve} pixels of its curve")
            if args.screenshot:
                size = browser.call("Runtime.evaluate", {
                    "expression": "JSON.stringify([document.documentElement.scrollWidth, "
                                  "document.documentElement.scrollHeight])",
                    "returnByValue": True}, session=session)["result"]["value"]
                width, height = json.loads(size)
                shot = browser.call("Page.captureScreenshot", {
                    "format": "png", "captureBeyondViewport": True,
                    "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}},
                    session=session)
                Path(args.screenshot).write_bytes(base64.b64decode(shot["data"]))
                print(f"browser: the page ({width}x{height} px) saved to {args.screenshot}")
            time.sleep(0.2)
            browser.call("Runtime.evaluate", {"expression": "1"}, session=session)
        finally:
            browser.close()
    for event in browser.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            problems.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            problems.append(f"logged: {params['entry'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            problems.append("console.error called")
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith(("file:", "data:", "about:")):
                problems.append(f"fetched {url}")
    for problem in problems:
        print(f"browser: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
