"""A real headless Chromium (Debian's package) driven over the DevTools protocol, for page tests.

`find_or_install_chromium()` returns `chromium` from PATH, or installs Debian's package with
apt-get (as root, or through passwordless `sudo -n`), or says why it could not. `Browser`
starts it with `--remote-debugging-port=0`, reads the port Chromium chose from
`DevToolsActivePort` in its profile folder, and talks to its one page over a websocket
(websocket-client): navigate, evaluate JavaScript, take a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import urllib.request
from typing import Any

import websocket

from tests.waiting import wait_until

APT_PACKAGE = "chromium"
EXECUTABLE = "chromium"
INSTALL_TIMEOUT_SECONDS = 900
START_TIMEOUT_SECONDS = 60
LOAD_TIMEOUT_SECONDS = 30


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def find_or_install_chromium() -> tuple[str | None, str]:
    """Chromium's path, installing Debian's package when it is missing.

    Returns:
        (path, "") when Chromium is there, else (None, the reason it could not be had).
    """
    found = shutil.which(EXECUTABLE)
    if found:
        return found, ""
    if shutil.which("apt-get") is None:
        return None, f"{EXECUTABLE} is not on PATH and there is no apt-get to install it"
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo"):
        prefix = ["sudo", "-n"]
    else:
        return None, f"{EXECUTABLE} is not on PATH, and installing it needs root (no sudo here)"
    # Another install may hold dpkg's lock (the Docker tests' mmdebstrap, beside this test
    # under xdist): apt waits for it instead of failing at once.
    apt_get = [*prefix, "apt-get", "-o", f"DPkg::Lock::Timeout={INSTALL_TIMEOUT_SECONDS}"]
    install = [*apt_get, "install", "-y", "--no-install-recommends", APT_PACKAGE]
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}

    def attempt(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS
        )

    try:
        result = attempt(install)
        if result.returncode != 0:
            # Package lists may be missing or stale on a fresh machine: refresh, then retry.
            attempt([*apt_get, "update"])
            result = attempt(install)
    except subprocess.TimeoutExpired:
        return None, f"`{' '.join(install)}` took over {INSTALL_TIMEOUT_SECONDS} s"
    found = shutil.which(EXECUTABLE)
    if result.returncode != 0 or not found:
        return None, (
            f"{EXECUTABLE} is not on PATH and `{' '.join(install)}` failed "
            f"(exit {result.returncode}): {_last_line(result.stderr or result.stdout)}"
        )
    return found, ""


class BrowserError(Exception):
    """Chromium answered a DevTools command with an error, or a script threw."""


class Browser:
    """One headless Chromium with one page; close it with `close()` (or use `with`)."""

    def __init__(self, executable: str, profile_dir: str, width: int = 1280, height: int = 900):
        os.makedirs(profile_dir, exist_ok=True)
        self._log = open(os.path.join(profile_dir, "chromium.log"), "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                executable,
                "--headless=new",
                "--no-sandbox",  # root in a container has no usable sandbox
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile_dir}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: renderers go with it
        )
        self._next_id = 0
        try:
            self.socket = websocket.create_connection(
                self._page_socket_url(profile_dir),
                timeout=LOAD_TIMEOUT_SECONDS,
                suppress_origin=True,
            )
        except BaseException:
            self.close()
            raise

    def _page_socket_url(self, profile_dir: str) -> str:
        port_file = os.path.join(profile_dir, "DevToolsActivePort")

        def port_written() -> bool:
            if not os.path.exists(port_file):
                return False
            with open(port_file) as f:
                return len(f.read().splitlines()) >= 2

        alive = lambda: self.process.poll() is None  # noqa: E731
        wait_until(
            port_written,
            timeout=START_TIMEOUT_SECONDS,
            failure=lambda: f"chromium never wrote {port_file}; see {self._log.name}",
            alive=alive,
        )
        with open(port_file) as f:
            port = int(f.read().splitlines()[0])
        pages: list[dict[str, Any]] = []

        def page_listed() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages[:] = [t for t in json.load(r) if t.get("type") == "page"]
            return bool(pages)

        wait_until(
            page_listed,
            timeout=START_TIMEOUT_SECONDS,
            failure=lambda: f"chromium on port {port} lists no page",
            alive=alive,
        )
        return str(pages[0]["webSocketDebuggerUrl"])

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Sends one DevTools command and returns its result (events meanwhile are dropped)."""
        self._next_id += 1
        message_id = self._next_id
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") != message_id:
                continue
            if "error" in message:
                raise BrowserError(f"{method} failed: {message['error']}")
            result: dict[str, Any] = message.get("result", {})
            return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values only)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        """Navigates to `url` and waits until the page and its images have loaded.

        Raises:
            BrowserError: the navigation failed (a missing file gives net::ERR_FILE_NOT_FOUND).
        """
        result = self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise BrowserError(f"opening {url} failed: {result['errorText']}")
        wait_until(
            lambda: (
                self.evaluate("document.readyState") == "complete"
                and self.evaluate("location.href") == url
            ),
            timeout=LOAD_TIMEOUT_SECONDS,
            failure=lambda: f"{url} did not finish loading",
            interval=0.05,
        )

    def screenshot(self) -> bytes:
        """A PNG of the whole page, beyond the window's height too."""
        size = self.send("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.send(
            "Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip
        )
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        """Closes the connection and ends the Chromium this object started (its pid only)."""
        if getattr(self, "socket", None) is not None:
            self.socket.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
