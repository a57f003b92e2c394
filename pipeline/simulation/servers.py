"""The alert receivers a simulation starts on loopback: a webhook and an SMTP server."""

from __future__ import annotations

import email
import email.message
import email.policy
import json
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOOPBACK = "127.0.0.1"
WEBHOOK_PATH = "/hooks/nightly"
# notify.email_text's subject: `nightly-trainer <date> <outcome>: <reason>`.
SUBJECT = re.compile(r"nightly-trainer (?P<date>\d{4}-\d{2}-\d{2}) (?P<outcome>[a-z-]+): ")

Alert = tuple[str, str]  # (date, outcome)


class Webhook:
    """An HTTP server on loopback that keeps the JSON body of every POST and answers 200."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    document = json.loads(body)
                except ValueError:
                    document = {"unreadable": body.decode(errors="replace")}
                with hook._lock:
                    hook.bodies.append(document)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.url = f"http://{LOOPBACK}:{self.server.server_port}{WEBHOOK_PATH}"
        # shutdown() waits for the loop's next poll: poll often, close at once.
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def alerts(self) -> list[Alert]:
        """(date, outcome) of every POST so far, in the order they came."""
        with self._lock:
            return [(str(b.get("date")), str(b.get("outcome"))) for b in self.bodies]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Mailbox:
    """An SMTP server on loopback (aiosmtpd) that keeps every message delivered to it."""

    def __init__(self) -> None:
        # Only here: aiosmtpd is a development dependency, needed only by a simulation.
        from aiosmtpd.controller import Controller

        self.messages: list[email.message.EmailMessage] = []
        self.port = free_port()
        self._controller = Controller(self, hostname=LOOPBACK, port=self.port)
        self._controller.start()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        """aiosmtpd's hook: keeps the message."""
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append(message)  # type: ignore[arg-type]
        return "250 OK"

    def alerts(self) -> list[Alert]:
        """(date, outcome) of every message so far, read off its subject; an e-mail that is
        not an alert's counts as ('?', its subject)."""
        found = []
        for message in list(self.messages):
            subject = str(message.get("Subject", ""))
            match = SUBJECT.search(subject)
            found.append((match["date"], match["outcome"]) if match else ("?", subject))
        return found

    def close(self) -> None:
        self._controller.stop()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


class Receivers:
    """Both servers, started together and closed together (a context manager)."""

    def __init__(self) -> None:
        self.webhook = Webhook()
        try:
            self.mailbox = Mailbox()
        except BaseException:
            self.webhook.close()
            raise

    def __enter__(self) -> Receivers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.mailbox.close()
        self.webhook.close()

    def channels(self) -> Iterator[tuple[str, list[Alert]]]:
        """(channel name, what it received so far), for each channel."""
        yield "webhook", self.webhook.alerts()
        yield "email", self.mailbox.alerts()
