"""luigi's failure e-mail for this pipeline's tasks: the stage's one-line error is its first line.

luigi e-mails a failed task when luigi.cfg's `[email] receiver` is set (through `[smtp]`, or
the `[email] method` chosen). Its body is a fixed headline, the task's parameters, the command
line and the task's `on_failure()` explanation. A stage task's explanation starts with the
stage's own `error: ...` line (`explanation`), and that line replaces luigi's generic headline,
so the body's first line, the one a mail client previews, says what went wrong.
"""

from __future__ import annotations

from typing import Any

from luigi import notifications

from contract.messages import ERROR_PREFIX, error_line


def explanation(reason: str, details: str) -> str:
    """A failed task's explanation (luigi's scheduler shows it, its e-mail carries it): the
    one-line `error: <reason>`, then `details` (luigi's traceback)."""
    return f"{error_line(reason)}\n\n{details}"


def headline(task: Any, formatted_exception: str | None) -> str | None:
    """`<Task> failed: <reason>` when the explanation starts with an error line, else None."""
    first = (formatted_exception or "").split("\n", 1)[0]
    if not first.startswith(ERROR_PREFIX):
        return None
    return f"{task.task_family} failed: {first[len(ERROR_PREFIX) :]}"


_luigi_format_task_error = notifications.format_task_error


def format_task_error(
    headline_text: str, task: Any, command: str, formatted_exception: str | None = None
) -> str:
    """luigi's `format_task_error`, headed by the stage's error line when there is one."""
    return _luigi_format_task_error(
        headline(task, formatted_exception) or headline_text, task, command, formatted_exception
    )


def install() -> None:
    """Makes luigi's worker format failure e-mails with `format_task_error` (it looks the
    function up on `luigi.notifications` each time it sends one)."""
    notifications.format_task_error = format_task_error
