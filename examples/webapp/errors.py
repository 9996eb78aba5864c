"""typedq's errors as HTTP answers: a recipe for web services that enqueue jobs.

Without it, an exception typedq raises inside a request handler (a payload over the size
limit, a full queue, Redis restarting) is a bare ``500 Internal Server Error``. With
:func:`install_error_handlers`, each becomes the status that tells the client what to do:

============================================  ======  =====================================
typedq error                                  status  meaning for the client
============================================  ======  =====================================
``PayloadTooLarge``                           413     send less (an id, not the data)
``InvalidPayload``, ``EncodeError``,          422     the request's data cannot be a job
``InvalidOption``, ``InvalidName``
``JobNotFound``                               404     no such job (or retention removed it)
``QueueFull``                                 503     back-pressure: retry after a while
``BrokerUnavailable``, other ``BrokerError``  503     the queue is down: retry after a while
``ResultTimeout``                             504     the job did not finish in time
============================================  ======  =====================================

A 503 carries ``Retry-After``. The body is ``{"error": "<TypeName>", "detail": "..."}``:
the error's own one-line message for a 4xx (it names what was wrong and the fix), and a
fixed text for a 5xx (typedq's message names the broker's host, which clients need not
see; it is logged instead). Any other typedq error (a ``ConfigError``: the service is
misconfigured) stays a 500.

FastAPI or Starlette::

    from examples.webapp.errors import install_error_handlers

    service = FastAPI(lifespan=lifespan)
    install_error_handlers(service)

Another framework: :func:`http_error` gives the status, headers and body for an error.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from typedq import (
    BrokerError,
    EncodeError,
    InvalidName,
    InvalidOption,
    InvalidPayload,
    JobNotFound,
    PayloadTooLarge,
    ResultTimeout,
    TypedqError,
)

__all__ = ["RETRY_AFTER", "STATUSES", "http_error", "install_error_handlers"]

log = logging.getLogger("examples.webapp")

#: Seconds a client is asked to wait before retrying after a 503.
RETRY_AFTER = 5

#: typedq error -> HTTP status; the first row whose type matches wins (a subclass first).
STATUSES: tuple[tuple[type[TypedqError], int], ...] = (
    (PayloadTooLarge, 413),
    (InvalidPayload, 422),
    (EncodeError, 422),
    (InvalidOption, 422),
    (InvalidName, 422),
    (JobNotFound, 404),
    (BrokerError, 503),  # QueueFull, BrokerUnavailable, RedisDataLost, ...
    (ResultTimeout, 504),
)

_SERVER_SIDE = {
    503: "the job queue is unavailable or full; retry later",
    504: "the job did not finish in time; ask for its result again later",
}


def http_error(exc: TypedqError) -> tuple[int, dict[str, str], dict[str, Any]] | None:
    """The status, headers and JSON body that answer ``exc``; None: not a client's
    concern (a 500)."""
    for error_type, status in STATUSES:
        if isinstance(exc, error_type):
            headers = {"Retry-After": str(RETRY_AFTER)} if status == 503 else {}
            detail = _SERVER_SIDE.get(status, str(exc))
            return status, headers, {"error": type(exc).__name__, "detail": detail}
    return None


async def _handle(request: Request, exc: Exception) -> Response:
    # Registered for the types of STATUSES only: each has an answer.
    answer = http_error(exc) if isinstance(exc, TypedqError) else None
    if answer is None:
        raise exc
    status, headers, body = answer
    if status >= 500:
        log.warning("%s %s: %d: %s", request.method, request.url.path, status, exc)
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(service: Any) -> None:
    """Answer typedq's errors in ``service`` (a FastAPI or Starlette app) with the statuses
    of :data:`STATUSES`."""
    for error_type, _ in STATUSES:
        service.add_exception_handler(error_type, _handle)
