"""Delivers one alert: a JSON POST to a webhook or an e-mail through luigi's `[smtp]`, with retries.

Each try that fails (a refused connection, a timeout, a 5xx answer, an SMTP error) is retried
after a wait that doubles each time; an answer that another try cannot change (a 4xx other
than 408 and 429) ends the tries at once. Nothing here raises: the caller gets how many tries
were made and the last error, and records them.
"""

from __future__ import annotations

import dataclasses
import email.message
import json
import smtplib
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# 4xx answers that a later try may not get (a timeout, too many requests).
RETRYABLE_CLIENT_ERRORS = (408, 429)


class PermanentError(Exception):
    """A failure that another try cannot fix."""


@dataclasses.dataclass(frozen=True)
class SmtpSettings:
    """Where and how to send e-mail: luigi's `[smtp]` and `[email] sender` as read at start."""

    host: str = "localhost"
    port: int = 0
    ssl: bool = False
    no_tls: bool = False
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    local_hostname: str | None = None
    timeout_seconds: float = 10.0
    sender: str = "nightly-trainer@localhost"


@dataclasses.dataclass(frozen=True)
class Delivery:
    """What became of one alert on one channel."""

    delivered: bool
    tries: int
    error: str | None = None


def with_retries(send_once: Callable[[], None], retries: int, backoff_seconds: float) -> Delivery:
    """Calls `send_once` until it returns, at most `retries + 1` times.

    Args:
        send_once: one try; raises on failure (PermanentError: do not try again).
        retries: tries after the first failed one.
        backoff_seconds: the wait before the first retry; each later wait is twice the last.
    """
    error = None
    for tries in range(1, retries + 2):
        try:
            send_once()
            return Delivery(True, tries)
        except PermanentError as e:
            return Delivery(False, tries, _one_line(e))
        except Exception as e:  # noqa: BLE001 - any failure of a try is recorded, never raised
            error = _one_line(e)
        if tries <= retries:
            time.sleep(backoff_seconds * 2 ** (tries - 1))
    return Delivery(False, retries + 1, error)


def post_json(url: str, document: Mapping[str, Any], timeout_seconds: float) -> None:
    """POSTs `document` as JSON to `url`; returns on a 2xx answer.

    Raises:
        PermanentError: a 4xx answer other than 408 or 429.
        OSError: no answer, or another status (urllib's HTTPError and URLError are OSErrors).
    """
    request = urllib.request.Request(
        url,
        data=json.dumps(document, sort_keys=True).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "nightly-trainer"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            status = response.status
    except urllib.error.HTTPError as e:
        # The URL is left out of every message: a webhook's path is often its secret.
        if 400 <= e.code < 500 and e.code not in RETRYABLE_CLIENT_ERRORS:
            raise PermanentError(f"the webhook answered {e.code} {e.reason}") from None
        raise OSError(f"the webhook answered {e.code} {e.reason}") from None
    if not 200 <= status < 300:
        raise OSError(f"the webhook answered {status}")


def send_email(smtp: SmtpSettings, recipients: Sequence[str], subject: str, body: str) -> None:
    """Sends one plain-text e-mail through the SMTP server `smtp` names.

    STARTTLS is used when the server offers it, unless `no_tls`; `ssl` connects with TLS from
    the start; the login is used when both username and password are set.

    Raises:
        OSError: no connection, or the server refused (smtplib's errors are OSErrors).
    """
    message = email.message.EmailMessage()
    message["Subject"] = subject
    message["From"] = smtp.sender
    message["To"] = ", ".join(recipients)
    message.set_content(body)
    connect = smtplib.SMTP_SSL if smtp.ssl else smtplib.SMTP
    with connect(
        host=smtp.host,
        port=smtp.port,
        local_hostname=smtp.local_hostname,
        timeout=smtp.timeout_seconds,
    ) as connection:
        connection.ehlo_or_helo_if_needed()
        if not smtp.ssl and not smtp.no_tls and connection.has_extn("starttls"):
            connection.starttls()
            connection.ehlo()
        if smtp.username and smtp.password:
            connection.login(smtp.username, smtp.password)
        connection.send_message(message, from_addr=smtp.sender, to_addrs=list(recipients))


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
