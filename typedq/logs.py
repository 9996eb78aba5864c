"""Logging helpers: the fields every log line about a job carries, and a JSON formatter.

typedq logs through the standard library only (loggers ``typedq.worker``,
``typedq.cli``, ...); configure them with :func:`logging.config.dictConfig` like any
other library. Every line about one job names it in its text (``job ID (TASK) attempt
N``) and carries the same facts as ``extra`` fields, which :class:`JsonFormatter` (or
any formatter that reads record attributes) turns into keys: ``job_id``, ``task``,
``queue``, ``attempt`` and ``worker_id``.

``typedq worker --log-format json`` installs :class:`JsonFormatter`: one JSON object per
line, with ``time``, ``level``, ``logger``, ``message``, every ``extra`` field, and
``exc_info`` (the formatted traceback) when the record has one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from .broker.base import ClaimedJob

__all__ = ["JsonFormatter", "job_fields"]

#: The attributes every LogRecord has: anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()) | {
    "message",
    "asctime",
    "taskName",
}


def job_fields(claimed: ClaimedJob, worker_id: str | None = None) -> dict[str, Any]:
    """The ``extra`` fields of a log line about ``claimed``: job_id, task, queue, attempt
    (and worker_id when given)."""
    message = claimed.message
    fields: dict[str, Any] = {
        "job_id": message.id,
        "task": message.task,
        "queue": message.queue,
        "attempt": claimed.attempt,
    }
    if worker_id is not None:
        fields["worker_id"] = worker_id
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, the
    record's ``extra`` fields, and ``exc_info`` / ``stack_info`` when present.

    Values JSON cannot carry are written as their ``str()``. Newlines inside the message
    (a traceback) are escaped by JSON, so a record is always exactly one line.

    :param static: fields added to every line (a service name, say)
    """

    def __init__(self, static: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        document.update(self.static)
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                document[key] = value
        if record.exc_info:
            document["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exc_info"] = record.exc_text
        if record.stack_info:
            document["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(document, default=str, ensure_ascii=False)
