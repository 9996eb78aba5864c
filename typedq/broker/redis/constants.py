"""The values the Lua scripts share with the Python side, stated once, here.

:func:`typedq.broker.redis.scripts.build_library` writes :data:`LUA_CONSTANTS` at the top
of the library as ``local NAME = value`` lines (:func:`lua_preamble`), ahead of the shared
parts (``lua/common/*.lua``): every part and script reads them by name, and no ``.lua``
file restates them (``tests/test_redis_functions.py`` checks both). A value of literals
only is a constant of the library (set once, at load; see :mod:`.scripts`), so reading
one costs a call what the literal did.

Each entry takes its value from where the Python side keeps it (the backend-neutral
broker modules, :mod:`.keys`); a value only the Lua uses stays in its ``.lua`` file.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ...errors import FailureRecord
from ..flow import FLOW_BROKEN_MESSAGE, HELD_AT
from ..messages import CLAIM_RECORD_TTL, ERROR_HISTORY, HISTORY_MINUTES, MAX_SPAN_LINKS
from ..records import (
    CANCELLED_ON_HAND_BACK,
    CANCELLED_WITH_FLOW,
    CANCELLED_WORKER_LOST,
    RUN_CANCELLED,
    BrokerFailure,
    broker_failure,
    cancelled_while,
    stalled_message,
)
from .keys import INDEX_BUCKETS

__all__ = ["LUA_CONSTANTS", "lua_literal", "lua_preamble"]


def _record(kind: BrokerFailure) -> FailureRecord:
    """A record of ``kind`` as the memory broker writes it (for its reason and type)."""
    return broker_failure(kind, "", attempt=0, failed_at=0.0)


def _stalled_format() -> str:
    """:func:`stalled_message` as a ``string.format`` pattern (``%d`` for each number,
    in the order the message names them: stalls, stalls, max_stalls)."""
    stalls, limit = 1_000_000_007, 1_000_000_009  # numbers no message text holds
    text = stalled_message(stalls, limit).replace("%", "%%")
    return text.replace(str(stalls), "%d").replace(str(limit), "%d")


_CANCELLED, _STALLED, _BROKEN = _record("cancelled"), _record("stalled"), _record("flow_broken")

#: Lua name -> value (an int or a str; a str becomes a Lua string literal).
LUA_CONSTANTS: Mapping[str, int | str] = MappingProxyType(
    {
        # Milliseconds a request record (a claim's jobs, an enqueue's or a cancel's
        # answer) is kept: longer than redis-py's whole retry window, so a re-sent script
        # finds the first copy's answer. Text: what SET ... PX is given.
        "REQ_TTL_MS": str(round(CLAIM_RECORD_TTL * 1000)),
        # The failure records a job keeps ('eh'), newest last.
        "ERR_HISTORY": ERROR_HISTORY,
        # The most minutes of throughput rollups history.lua answers (the rollups expire
        # after a day and an hour, common/bookkeeping.lua's ROLLUP_TTL_S).
        "HISTORY_MINUTES": HISTORY_MINUTES,
        # A fan-in callback's span links: the first members' by index.
        "MAX_SPAN_LINKS": MAX_SPAN_LINKS,
        # Buckets of a queue's waiting index (idx_bucket in common/keys.lua computes the
        # bucket for this number: its low 13 bits).
        "IDX_BUCKETS": INDEX_BUCKETS,
        # A held step of a flow is scheduled at this time (µs), past any real one.
        "HELD_US": round(HELD_AT * 1_000_000),
        # The records a broker writes itself (typedq/broker/records.py): reason, error
        # type and messages.
        "FLOW_BROKEN": FLOW_BROKEN_MESSAGE,
        "FLOW_BROKEN_REASON": _BROKEN.reason.value,
        "FLOW_BROKEN_TYPE": _BROKEN.error_type,
        "CANCELLED_REASON": _CANCELLED.reason.value,
        "CANCELLED_TYPE": _CANCELLED.error_type,
        "CANCELLED_WITH_FLOW": CANCELLED_WITH_FLOW,
        "CANCELLED_ON_HAND_BACK": CANCELLED_ON_HAND_BACK,
        "CANCELLED_WORKER_LOST": CANCELLED_WORKER_LOST,
        "CANCELLED_WHILE": cancelled_while(""),  # + the state's name
        "RUN_CANCELLED": RUN_CANCELLED,  # a durable run's record (common/runs.lua)
        "STALLED_REASON": _STALLED.reason.value,
        "STALLED_TYPE": _STALLED.error_type,
        "STALLED_FORMAT": _stalled_format(),  # string.format(_, stalls, stalls, max_stalls)
    }
)


def lua_literal(value: int | str) -> str:
    """``value`` as Lua source: an integer's digits, a string in single quotes."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"a Lua constant is an int or a str, not {value!r}")
    if isinstance(value, int):
        return str(value)
    escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"


def lua_preamble(constants: Mapping[str, int | str] = LUA_CONSTANTS) -> list[str]:
    """The library's generated lines: ``local NAME = value`` per constant, in order."""
    return [f"local {name} = {lua_literal(value)}" for name, value in constants.items()]
