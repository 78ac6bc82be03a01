"""Headless Chromium with WebGPU on SwiftShader, for the tests that run exported bundles
(tests/browser/runner.js) and the demo page (examples/browser/) in a real browser."""

import base64
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

RUNNER = Path(__file__).parent / "browser"
EXAMPLE = Path(__file__).parent.parent / "examples" / "browser"
# what the runner page needs beside the bundles: its own files and the shared check
RUNNER_FILES = (RUNNER / "runner.html", RUNNER / "runner.js", EXAMPLE / "check.js")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def run_in_chromium(url: str, timeout: float = 240) -> list[str]:
    """Console lines of `url` in headless Chromium with WebGPU on SwiftShader."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("chromium is not installed (.ci/setup installs it)")
    # Chromium's child processes may still write the profile while they exit.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        command = [
            browser,
            "--headless=new",
            "--no-sandbox",
            "--enable-unsafe-webgpu",
            "--use-webgpu-adapter=swiftshader",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            url,
        ]
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: killed whole below
        )
        lines, deadline = [], time.monotonic() + timeout
        try:
            for line in process.stderr:
                if "CONSOLE" in line or "AUTOTUNE" in line:
                    lines.append(line)
                if "AUTOTUNE_DONE" in line or time.monotonic() > deadline:
                    break
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    return lines


def run_bundles(folder: Path, names, query: str = "") -> dict[str, dict]:
    """The runner on the bundles named (NAME.js in folder), all in one Chromium launch,
    with folder served over http (module scripts need http, not file): its result per
    name."""
    for file in RUNNER_FILES:
        shutil.copy(file, folder / file.name)
    with serving(folder) as base:
        url = f"{base}/runner.html?bundles={','.join(names)}{query}"
        return decoded_results(run_in_chromium(url))


@contextlib.contextmanager
def serving(folder: Path):
    """`folder` served over http on a free local port while inside: its base URL."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def decoded_results(lines: list[str]) -> dict[str, dict]:
    """The runner's result per bundle name, after checking it ran to the end on
    SwiftShader."""
    assert any("AUTOTUNE_DONE" in line for line in lines), "".join(lines[-20:])
    messages = [re.search(r"(AUTOTUNE_\w+) ([A-Za-z0-9+/=]+)", line) for line in lines]
    decoded = [(m[1], json.loads(base64.b64decode(m[2]))) for m in messages if m]
    adapter = next(value for tag, value in decoded if tag == "AUTOTUNE_ADAPTER")
    assert adapter["architecture"] == "swiftshader", adapter
    return {value["name"]: value for tag, value in decoded if tag == "AUTOTUNE_RESULT"}
