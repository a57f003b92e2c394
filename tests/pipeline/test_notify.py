"""Alerts: a webhook POST and an e-mail per night and outcome, retried, recorded, never failing the
night; luigi's own failure e-mail opens with the stage's error line."""

from __future__ import annotations

import datetime
import email
import email.policy
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import luigi.configuration
import pytest
from aiosmtpd.controller import Controller

from contract import ledger, run_lock
from pipeline import attempts, night_alerts, notify, params, status
from pipeline.notify_delivery import SmtpSettings
from tests.factories import PROJECT_ROOT

DATE = "2026-01-31"
REASON = "image folder /data/missing does not exist (or is not a folder)"
RETCODE_TASK_FAILED = 30  # luigi.cfg [retcode]


class Webhook:
    """A webhook on loopback that answers each POST with the next of `statuses`, then 200."""

    def __init__(self, statuses: tuple[int, ...] = ()) -> None:
        self.statuses = list(statuses)
        self.requests: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.requests.append(
                    {"type": self.headers["Content-Type"], "json": json.loads(body)}
                )
                self.send_response(hook.statuses.pop(0) if hook.statuses else 200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/nightly"
        # shutdown() waits for the loop's next poll: poll often, close at once.
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook(monkeypatch):
    """`webhook(statuses)`: a started Webhook, closed after the test."""
    for name in ("no_proxy", "NO_PROXY"):  # a proxy in the environment must not take it
        monkeypatch.setenv(name, "127.0.0.1")
    started: list[Webhook] = []

    def start(statuses: tuple[int, ...] = ()) -> Webhook:
        started.append(Webhook(statuses))
        return started[-1]

    yield start
    for hook in started:
        hook.close()


class Inbox:
    """aiosmtpd's handler: keeps each message delivered."""

    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's name)
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append(message)
        return "250 OK"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def smtp_server():
    """A real SMTP server on loopback: (its port, the inbox it delivers to)."""
    inbox, port = Inbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    yield port, inbox
    controller.stop()


@pytest.fixture
def luigi_config():
    """`set(section, option, value)` on luigi's configuration, each undone after the test."""
    config = luigi.configuration.get_config()
    changed: list[tuple[str, str, str | None]] = []

    def set_option(section: str, option: str, value: str) -> None:
        before = config.get(section, option, None) if config.has_section(section) else None
        changed.append((section, option, before))
        config.set(section, option, value)

    yield set_option
    for section, option, before in reversed(changed):
        if before is None:
            config.remove_option(section, option)
        else:
            config.set(section, option, before)


def settings(**values) -> notify.Settings:
    return notify.Settings(**({"retries": 2, "backoff_seconds": 0.01} | values))


def evaluated(root, blessed: bool, date: str = DATE) -> None:
    """A night's evaluation as the evaluate stage leaves it, and the trend page."""
    evaluate_dir = root / date / "evaluate"
    evaluate_dir.mkdir(parents=True)
    reasons = ["accuracy 0.8512 is below min_accuracy 0.9000"] if not blessed else []
    (evaluate_dir / "blessing.json").write_text(
        json.dumps({"blessed": blessed, "reasons": reasons})
    )
    (evaluate_dir / "metrics.json").write_text(json.dumps({"accuracy": 0.8512}))
    (evaluate_dir / "report.html").write_text("<html></html>")
    (root / "index.html").write_text("<html></html>")


def finish_attempt(root, alert_settings, entry_point="FullRun", date=DATE, failed_in=None):
    """Ends an attempt through the ledger hook, as luigi's run would: its ledger record."""
    attempt = attempts.Attempt(
        task_id="t", entry_point=entry_point, date=date, output_root=str(root), bytes_at_start=0
    )
    attempt.alert_settings = alert_settings
    if failed_in is None:
        attempt.succeeded = True
    else:
        attempt.stopped(ledger.FAILED, *failed_in)
    attempts._current = attempt
    record = attempts.finish()
    assert record is not None and ledger.read(str(root))[-1]["alerts"] == record["alerts"]
    return record


def test_a_night_not_blessed_is_posted_to_the_webhook(tmp_path, webhook):
    hook = webhook()
    evaluated(tmp_path, blessed=False)
    record = finish_attempt(tmp_path, settings(webhook_url=hook.url))
    assert record["outcome"] == ledger.NOT_BLESSED
    (request,) = hook.requests
    assert request["type"] == "application/json"
    body = request["json"]
    assert set(body) == {"date", "outcome", "reason", "links", "output_root"}
    assert (body["date"], body["outcome"]) == (DATE, notify.NOT_BLESSED)
    assert "NOT blessed" in body["reason"] and "below min_accuracy 0.9000" in body["reason"]
    assert body["links"]["report"] == str(tmp_path / DATE / "evaluate" / "report.html")
    assert body["links"]["trend"] == str(tmp_path / "index.html")
    assert body["output_root"] == str(tmp_path)
    (alert,) = record["alerts"]
    assert (alert["channel"], alert["status"], alert["tries"]) == ("webhook", "sent", 1)


def test_a_blessed_night_sends_nothing_unless_asked(tmp_path, webhook):
    hook = webhook()
    evaluated(tmp_path, blessed=True)
    assert finish_attempt(tmp_path, settings(webhook_url=hook.url))["alerts"] == []
    assert hook.requests == []
    on_success = settings(webhook_url=hook.url, notify_on_success=True)
    entries = notify.send(str(tmp_path), DATE, ledger.BLESSED, "blessed", settings=on_success)
    assert [e["status"] for e in entries] == ["sent"] and len(hook.requests) == 1


def test_a_webhook_that_fails_twice_then_answers_gets_three_requests(tmp_path, webhook):
    hook = webhook(statuses=(503, 500))
    alert_settings = settings(webhook_url=hook.url)
    entries = notify.send(str(tmp_path), DATE, notify.FAILED, REASON, settings=alert_settings)
    assert len(hook.requests) == 3
    assert [(e["status"], e["tries"], e["error"]) for e in entries] == [("sent", 3, None)]


def test_a_webhook_that_always_fails_leaves_the_night_as_it_was(tmp_path, webhook, caplog):
    hook = webhook(statuses=(500,) * 3)
    evaluated(tmp_path, blessed=False)
    with caplog.at_level(logging.WARNING, logger="luigi-interface"):
        record = finish_attempt(tmp_path, settings(webhook_url=hook.url))
    assert record["outcome"] == ledger.NOT_BLESSED and len(hook.requests) == 3
    (alert,) = ledger.read(str(tmp_path))[-1]["alerts"]
    assert (alert["channel"], alert["status"], alert["tries"]) == ("webhook", "failed", 3)
    assert "answered 500" in alert["error"]
    assert "the webhook alert of 2026-01-31 not-blessed failed after 3 tries" in caplog.text
    # Not delivered, so the next attempt tries again (the webhook answers now).
    again = finish_attempt(tmp_path, settings(webhook_url=hook.url))
    assert [a["status"] for a in again["alerts"]] == ["sent"]
    assert len(hook.requests) == 4


def test_a_client_error_is_not_retried(tmp_path, webhook):
    hook = webhook(statuses=(404,))
    alert_settings = settings(webhook_url=hook.url)
    (entry,) = notify.send(str(tmp_path), DATE, notify.FAILED, REASON, settings=alert_settings)
    assert (entry["status"], entry["tries"], len(hook.requests)) == ("failed", 1, 1)


def test_one_message_per_night_and_outcome(tmp_path, webhook):
    hook = webhook()
    evaluated(tmp_path, blessed=False)
    alert_settings = settings(webhook_url=hook.url)
    assert len(finish_attempt(tmp_path, alert_settings)["alerts"]) == 1
    assert finish_attempt(tmp_path, alert_settings)["alerts"] == []  # a rerun, nothing new
    assert len(hook.requests) == 1
    record = finish_attempt(tmp_path, alert_settings, failed_in=("Train", "the train stage..."))
    (alert,) = record["alerts"]
    assert (alert["outcome"], alert["reason"]) == (notify.FAILED, "Train: the train stage...")
    assert [r["json"]["outcome"] for r in hook.requests] == ["not-blessed", "failed"]
    kept = json.loads((tmp_path / DATE / "logs" / "alerts.json").read_text())["alerts"]
    assert [(a["outcome"], a["status"]) for a in kept] == [
        ("not-blessed", "sent"),
        ("failed", "sent"),
    ]


def test_a_data_gate_anomaly_alerts_as_such(tmp_path, webhook):
    hook = webhook()
    data_dir = tmp_path / DATE / "data"
    data_dir.mkdir(parents=True)
    found = [{"check": "drift", "description": "the label distribution moved"}]
    (data_dir / "anomalies.json").write_text(json.dumps({"anomalies": found, "accepted": False}))
    because = "data gate: the label distribution moved; the run stops before training"
    finish_attempt(tmp_path, settings(webhook_url=hook.url), failed_in=("DataGate", because))
    (request,) = hook.requests
    assert request["json"]["outcome"] == notify.DATA_GATE_ANOMALY
    assert request["json"]["reason"] == f"DataGate: {because}"


def day(offset: int) -> str:
    return (datetime.date(2026, 1, 1) + datetime.timedelta(days=offset)).isoformat()


def ledger_record(root, date: str) -> None:
    ledger.append(str(root), {"date": date, "started_utc": f"{date}T01:30:00+00:00"})


def test_the_next_run_alerts_a_missed_night_once(tmp_path, webhook):
    hook = webhook()
    ledger_record(tmp_path, day(0))
    alert_settings = settings(webhook_url=hook.url)
    record = finish_attempt(tmp_path, alert_settings, date=day(2), failed_in=("Train", "x"))
    assert [(a["date"], a["outcome"]) for a in record["alerts"]] == [
        (day(2), notify.FAILED),
        (day(1), notify.MISSED),
    ]
    missed = hook.requests[1]["json"]
    assert missed["date"] == day(1) and f"no attempt of {day(1)}" in missed["reason"]
    rerun = finish_attempt(tmp_path, alert_settings, date=day(2), failed_in=("Train", "x"))
    assert rerun["alerts"] == []
    # The night before the ledger's first night is not missed.
    assert finish_attempt(tmp_path, alert_settings, date=day(0))["alerts"] == []
    assert len(hook.requests) == 2


def test_a_night_whose_run_holds_the_lock_is_not_missed(tmp_path):
    ledger_record(tmp_path, day(0))
    assert night_alerts.missed(str(tmp_path), day(1))
    lock = run_lock.RunLock(str(tmp_path / day(1)))
    lock.acquire()
    try:
        assert run_lock.in_progress(str(tmp_path / day(1)))
        assert not night_alerts.missed(str(tmp_path), day(1))
    finally:
        lock.release()
    assert not run_lock.in_progress(str(tmp_path / day(1)))


def test_status_alerts_its_missing_last_night_once(tmp_path, webhook, luigi_config, capsys):
    hook = webhook()
    luigi_config("Notify", "webhook_url", hook.url)
    luigi_config("Notify", "backoff_seconds", "0")
    today = datetime.datetime.now(datetime.UTC).date()
    ledger_record(tmp_path, (today - datetime.timedelta(days=2)).isoformat())
    assert status.main(["--output-root", str(tmp_path)]) == 1
    assert status.main(["--output-root", str(tmp_path)]) == 1
    (request,) = hook.requests
    assert (request["json"]["date"], request["json"]["outcome"]) == (today.isoformat(), "missed")
    assert "found by python -m pipeline status" in request["json"]["reason"]


def test_an_email_alert_carries_the_reason_in_its_subject(tmp_path, smtp_server):
    port, inbox = smtp_server
    smtp = SmtpSettings(host="127.0.0.1", port=port, no_tls=True, sender="nightly@example.com")
    alert_settings = settings(email_to=("ops@example.com", "ml@example.com"), smtp=smtp)
    reason = f"Preprocess: {REASON}"
    (entry,) = notify.send(str(tmp_path), DATE, notify.FAILED, reason, settings=alert_settings)
    assert (entry["channel"], entry["status"]) == ("email", "sent")
    (message,) = inbox.messages
    assert message["Subject"] == f"nightly-trainer {DATE} failed: Preprocess: {REASON}"
    assert message["From"] == "nightly@example.com"
    assert message["To"] == "ops@example.com, ml@example.com"
    assert f"Preprocess: {REASON}" in message.get_content()


def test_an_smtp_server_that_is_not_there_is_a_failed_alert(tmp_path):
    smtp = SmtpSettings(host="127.0.0.1", port=free_port(), no_tls=True, timeout_seconds=2)
    alert_settings = settings(email_to=("ops@example.com",), smtp=smtp)
    (entry,) = notify.send(str(tmp_path), DATE, notify.FAILED, REASON, settings=alert_settings)
    assert (entry["status"], entry["tries"]) == ("failed", 3) and entry["error"]


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("webhook_url", "ftp://hooks.example.com/T0/secret", "'ftp://hooks.example.com/...' is"),
        ("webhook_url", "hooks.example.com/T0/secret", "'hooks.example.com/...' is not an http"),
        ("webhook_url", "https:///T0/secret", "'https:///...' is not an http:// or https:// URL"),
        ("email_to", "ops@example.com, ops", "email_to 'ops' is not an e-mail address"),
        ("retries", "-1", "retries -1 must be 0 or more"),
    ],
)
def test_bad_alert_settings_are_refused_in_one_line(
    tmp_path, luigi_config, capsys, option, value, named
):
    ledger_record(tmp_path, day(0))
    luigi_config("Notify", option, value)
    from pipeline import Preprocess

    with pytest.raises(params.BadParameterExit) as refused:
        params.refuse_bad_parameters(Preprocess(date=datetime.date(2026, 1, 31)))
    assert refused.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: [Notify] ") and named in line and "secret" not in line
    assert status.main(["--output-root", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [line]


@pytest.mark.slow  # the preprocess stage starts TensorFlow before it fails
def test_luigis_failure_email_opens_with_the_stages_error_line(tmp_path, smtp_server):
    port, inbox = smtp_server
    config = tmp_path / "alerts.cfg"
    config.write_text(
        "[email]\nreceiver = ops@example.com\nsender = nightly@example.com\n"
        f"[smtp]\nhost = 127.0.0.1\nport = {port}\nno_tls = true\n"
        "[Notify]\nemail_to = ops@example.com\nbackoff_seconds = 0\n"
    )
    missing = tmp_path / "missing"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "Preprocess", "--local-scheduler", f"--date={DATE}"]
        + [f"--output-root={tmp_path / 'runs'}", f"--dataset=imagefolder:{missing}"]
        + ["--num-workers=1"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"LUIGI_CONFIG_PATH": str(config), "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )
    assert result.returncode == RETCODE_TASK_FAILED, result.stderr[-3000:]
    reason = f"image folder {missing} does not exist (or is not a folder)"
    luigis, ours = sorted(inbox.messages, key=lambda m: not m["Subject"].startswith("Luigi:"))
    assert "Preprocess(" in luigis["Subject"] and "FAILED" in luigis["Subject"]
    body = next(p for p in luigis.walk() if p.get_content_type() == "text/plain").get_content()
    assert body.splitlines()[0] == f"Preprocess failed: {reason}"
    # A long subject is folded on the wire; unfolded, a fold at a space may leave two.
    subject = " ".join(str(ours["Subject"]).split())
    assert subject == f"nightly-trainer {DATE} failed: Preprocess: {reason}"
    (record,) = ledger.read(str(tmp_path / "runs"))
    assert [(a["channel"], a["status"]) for a in record["alerts"]] == [("email", "sent")]
