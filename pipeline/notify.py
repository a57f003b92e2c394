"""Alerts for nights that need an operator: a webhook POST and an e-mail, one per night and outcome.

`send(output_root, date, outcome, reason, links)` is the one way out, for every entry point: the
ledger hook (`pipeline.attempts`) for a night not blessed, failed, refused or stopped by the data
gate and for a missed night, `python -m pipeline status` when its last night needs attention
(`pipeline.night_alerts` says when), and a rollback. It sends on each channel luigi.cfg's
`[Notify]` configures (`webhook_url`, `email_to`) that has not delivered the same night and
outcome yet: what each channel delivered or failed to is kept in
`<output_root>/<date>/logs/alerts.json` and returned for the ledger record. Alerting never
fails or changes the night: a channel that fails every try is recorded, and a warning logged.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import urllib.parse
import warnings
from collections.abc import Mapping
from typing import Any

import luigi
from luigi import notifications

from contract import atomic, gfile, layout, ledger, storage
from pipeline import notify_delivery
from pipeline.notify_delivery import SmtpSettings

logger = logging.getLogger("luigi-interface")

ALERTS_FILE = "alerts.json"
WEBHOOK, EMAIL = "webhook", "email"
SENT, FAILED_TO_SEND = "sent", "failed"
# The evaluate stage's report and the trend page at the output root.
REPORT_FILE = "report.html"
TREND_PAGE_FILE = "index.html"
SUBJECT_REASON_CHARS = 160

# What an alert says became of a night; a ledger outcome where there is one.
NOT_BLESSED = ledger.NOT_BLESSED
FAILED = ledger.FAILED
REFUSED = ledger.REFUSED
DATA_GATE_ANOMALY = "data-gate-anomaly"
ROLLBACK = "rollback"
MISSED = "missed"
# Sent only with notify_on_success.
SUCCESSES = (ledger.BLESSED, ledger.SUCCEEDED)


class Notify(luigi.Config):
    """[Notify]: where alerts of nights that need attention go."""

    webhook_url = luigi.Parameter(
        default="",
        description="http:// or https:// URL that gets a JSON POST ({date, outcome, reason, "
        "links, output_root}) for each night not blessed, failed, refused, stopped by the data "
        "gate, missed or rolled back; empty: none.",
    )
    email_to = luigi.Parameter(
        default="",
        description="Comma-separated addresses that get an e-mail for each such night, sent "
        "through luigi's [smtp] settings from [email] sender; empty: none.",
    )
    timeout_seconds = luigi.FloatParameter(
        default=10.0,
        description="How long one webhook try waits for the answer, in seconds (an e-mail "
        "waits [smtp] timeout).",
    )
    retries = luigi.IntParameter(
        default=2,
        description="Tries after a failed one, for each alert on each channel.",
    )
    backoff_seconds = luigi.FloatParameter(
        default=2.0,
        description="The wait before the first retry, in seconds; each later wait is twice "
        "the one before.",
    )
    notify_on_success = luigi.BoolParameter(
        default=False,
        description="Also alert a blessed night (and a stage run alone that succeeded).",
    )


class NotifySettingsError(ValueError):
    """A [Notify] setting cannot be used; the message names it and how to fix it."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """The alert channels, as read once from [Notify], [smtp] and [email]."""

    webhook_url: str = ""
    email_to: tuple[str, ...] = ()
    timeout_seconds: float = 10.0
    retries: int = 2
    backoff_seconds: float = 2.0
    notify_on_success: bool = False
    smtp: SmtpSettings = dataclasses.field(default_factory=SmtpSettings)
    subject_prefix: str = ""

    @property
    def channels(self) -> tuple[str, ...]:
        """The channels configured, in the order they are tried."""
        return tuple(
            name for name, on in ((WEBHOOK, self.webhook_url), (EMAIL, self.email_to)) if on
        )

    def check(self) -> None:
        """Refuses settings that cannot send.

        Raises:
            NotifySettingsError: naming the setting, its value and what to give instead.
        """
        where = "in luigi.cfg's [Notify] (or --Notify-... on the command line)"
        if self.webhook_url:
            url = urllib.parse.urlsplit(self.webhook_url)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise NotifySettingsError(
                    f"[Notify] webhook_url {_without_path(self.webhook_url)!r} is not an "
                    f"http:// or https:// URL; give the webhook's address {where}, or leave it "
                    "empty for none"
                )
        for address in self.email_to:
            if "@" not in address or any(c.isspace() for c in address):
                raise NotifySettingsError(
                    f"[Notify] email_to {address!r} is not an e-mail address; give "
                    f"comma-separated addresses {where}, or leave it empty for none"
                )
        if not (math.isfinite(self.timeout_seconds) and self.timeout_seconds > 0):
            raise NotifySettingsError(
                f"[Notify] timeout_seconds {self.timeout_seconds} must be a number above 0; "
                f"set it {where}"
            )
        if self.retries < 0:
            raise NotifySettingsError(
                f"[Notify] retries {self.retries} must be 0 or more; set it {where}"
            )
        if not (math.isfinite(self.backoff_seconds) and self.backoff_seconds >= 0):
            raise NotifySettingsError(
                f"[Notify] backoff_seconds {self.backoff_seconds} must be a number, 0 or more; "
                f"set it {where}"
            )


def _without_path(url: str) -> str:
    """`url` up to its host, for a message: a webhook's path is often its secret."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    head, slash, _ = rest.partition("/")
    return f"{scheme}{sep}{head}" + ("/..." if slash else "")


def current_settings() -> Settings:
    """[Notify], luigi's [smtp] and [email] as luigi reads them now (inside a luigi run, the
    command line's values too).

    Raises:
        NotifySettingsError: a value luigi cannot parse (`retries = two`).
    """
    try:
        with warnings.catch_warnings():
            # luigi's [smtp] gives string parameters None defaults, and warns about its own.
            warnings.simplefilter("ignore", UserWarning)
            config, smtp, mail = Notify(), notifications.smtp(), notifications.email()
    except ValueError as e:
        raise NotifySettingsError(f"[Notify], [smtp] or [email]: {e}") from None
    return Settings(
        webhook_url=config.webhook_url.strip(),
        email_to=tuple(a.strip() for a in config.email_to.split(",") if a.strip()),
        timeout_seconds=config.timeout_seconds,
        retries=config.retries,
        backoff_seconds=config.backoff_seconds,
        notify_on_success=config.notify_on_success,
        smtp=SmtpSettings(
            host=smtp.host,
            port=smtp.port,
            ssl=smtp.ssl,
            no_tls=smtp.no_tls,
            username=smtp.username,
            password=smtp.password,
            local_hostname=smtp.local_hostname,
            timeout_seconds=smtp.timeout,
            sender=mail.sender,
        ),
        subject_prefix=mail.prefix,
    )


def check_settings() -> Settings:
    """The current settings, checked.

    Raises:
        NotifySettingsError: a setting that cannot be used.
    """
    settings = current_settings()
    settings.check()
    return settings


def alerts_path(output_root: str, date: str) -> str:
    """`<output_root>/<date>/logs/alerts.json`: what each channel delivered, or failed to."""
    return layout.join(layout.logs_dir(output_root, date), ALERTS_FILE)


def read_alerts(output_root: str, date: str) -> list[dict[str, Any]]:
    """The night's alerts so far (none when the file is missing or unreadable)."""
    errors: tuple[type[BaseException], ...] = (*gfile.file_errors(), ValueError)
    try:
        document = atomic.read_json(alerts_path(output_root, date))
    except errors:
        return []
    alerts = document.get("alerts") if isinstance(document, dict) else None
    return [a for a in alerts if isinstance(a, dict)] if isinstance(alerts, list) else []


def default_links(output_root: str, date: str) -> dict[str, str | None]:
    """The night's report, the trend page and the night's logs; None for one not there."""
    paths = {
        "report": layout.join(layout.evaluate_dir(output_root, date), REPORT_FILE),
        "trend": layout.join(output_root, TREND_PAGE_FILE),
        "logs": layout.logs_dir(output_root, date),
    }
    return {name: storage.absolute(p) if gfile.exists(p) else None for name, p in paths.items()}


def send(
    output_root: str,
    date: str,
    outcome: str,
    reason: str,
    links: Mapping[str, str | None] | None = None,
    settings: Settings | None = None,
) -> list[dict[str, Any]]:
    """Alerts `outcome` of the night `date` on each configured channel that has not yet.

    Never raises: a failure is in the returned entries, in alerts.json and in the log.

    Args:
        output_root: the output root.
        date: the night, `YYYY-MM-DD`.
        outcome: what became of it (NOT_BLESSED, FAILED, ROLLBACK, MISSED, ...).
        reason: one line: why.
        links: name -> path or URL (default: `default_links`).
        settings: the channels (default: `current_settings()`).

    Returns:
        One entry per channel tried (channel, date, outcome, reason, status `sent` or
        `failed`, tries, error, at_utc); empty when nothing was due.
    """
    try:
        settings = current_settings() if settings is None else settings
        settings.check()
        return _send(output_root, date, outcome, reason, links, settings)
    except Exception as e:  # noqa: BLE001 - an alert must never fail what sends it
        logger.warning("no alert of %s %s sent: %s", date, outcome, e)
        return [failed_entry(date, outcome, str(e))]


def _send(
    output_root: str,
    date: str,
    outcome: str,
    reason: str,
    links: Mapping[str, str | None] | None,
    settings: Settings,
) -> list[dict[str, Any]]:
    if not settings.channels or (outcome in SUCCESSES and not settings.notify_on_success):
        return []
    history = read_alerts(output_root, date)
    due = [c for c in settings.channels if not _delivered(history, date, outcome, c)]
    if not due:
        return []
    links = default_links(output_root, date) if links is None else dict(links)
    document = {
        "date": date,
        "outcome": outcome,
        "reason": " ".join(reason.split()),
        "links": links,
        "output_root": storage.absolute(output_root),
    }
    entries = [_entry(c, date, outcome, reason, _deliver(c, document, settings)) for c in due]
    for entry in entries:
        if entry["status"] != SENT:
            logger.warning(
                "the %s alert of %s %s failed after %d tries: %s; the night is unchanged",
                entry["channel"],
                date,
                outcome,
                entry["tries"],
                entry["error"],
            )
    try:
        gfile.makedirs(layout.logs_dir(output_root, date))
        atomic.write_json_atomic(alerts_path(output_root, date), {"alerts": history + entries})
    except Exception as e:  # noqa: BLE001 - the record of an alert must not fail the night
        logger.warning("could not write %s: %s", alerts_path(output_root, date), e)
    return entries


def _delivered(history: list[dict[str, Any]], date: str, outcome: str, channel: str) -> bool:
    return any(
        (a.get("date"), a.get("outcome"), a.get("channel"), a.get("status"))
        == (date, outcome, channel, SENT)
        for a in history
    )


def failed_entry(date: str, outcome: str, error: str) -> dict[str, Any]:
    """The entry of an alert that could not be tried at all (its settings unreadable, say)."""
    return _entry(None, date, outcome, error, notify_delivery.Delivery(False, 0, error))


def _entry(
    channel: str | None,
    date: str,
    outcome: str,
    reason: str,
    delivery: notify_delivery.Delivery,
) -> dict[str, Any]:
    return {
        "channel": channel,
        "date": date,
        "outcome": outcome,
        "reason": " ".join(reason.split()),
        "status": SENT if delivery.delivered else FAILED_TO_SEND,
        "tries": delivery.tries,
        "error": delivery.error,
        "at_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _deliver(
    channel: str, document: dict[str, Any], settings: Settings
) -> notify_delivery.Delivery:
    if channel == WEBHOOK:

        def send_once() -> None:
            notify_delivery.post_json(settings.webhook_url, document, settings.timeout_seconds)

    else:
        subject, body = email_text(document, settings.subject_prefix)

        def send_once() -> None:
            notify_delivery.send_email(settings.smtp, settings.email_to, subject, body)

    return notify_delivery.with_retries(send_once, settings.retries, settings.backoff_seconds)


def email_text(document: Mapping[str, Any], prefix: str = "") -> tuple[str, str]:
    """An alert's e-mail: the subject names the night, the outcome and the reason."""
    reason = document["reason"]
    if len(reason) > SUBJECT_REASON_CHARS:
        reason = reason[: SUBJECT_REASON_CHARS - 3] + "..."
    subject = f"nightly-trainer {document['date']} {document['outcome']}: {reason}"
    lines = [
        f"{document['date']}: {document['outcome']}",
        "",
        document["reason"],
        "",
        *(f"{name}: {path or '(none)'}" for name, path in document["links"].items()),
        f"output root: {document['output_root']}",
    ]
    return (f"{prefix} {subject}" if prefix else subject), "\n".join(lines) + "\n"
