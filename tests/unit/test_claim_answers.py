"""The Redis listener's next due time of a worker's queues, from claim answers that
arrive in any order (the claim loop's own claims and the refills sent with completions
travel on different connections)."""

from __future__ import annotations

import time

from typedq.broker.redis.keys import Keys
from typedq.broker.redis.listener import Notifications


def notes() -> Notifications:
    return Notifications(Keys("claims"))


def test_an_answer_brings_the_next_due_time_closer_never_later() -> None:
    n = notes()
    n.claim_answered(["q"], 2_000_000)  # due in 2 s
    n.claim_answered(["q"], 5_000_000)  # an answer read late: does not push it back
    due = n._next_due[("q",)]
    assert due - time.monotonic() <= 2.0
    n.claim_answered(["q"], 500_000)  # closer: taken
    assert n._next_due[("q",)] - time.monotonic() <= 0.5


def test_an_answer_with_nothing_scheduled_keeps_a_due_time_still_ahead() -> None:
    """A refill that ran on Redis before a job was scheduled, read after the claim that
    saw the job, must not drop its due time (the worker would sleep past it)."""
    n = notes()
    n.claim_answered(["q"], 1_000_000)
    n.claim_answered(["q"], -1)
    assert ("q",) in n._next_due
    # Once passed, a due time goes with the next answer that has none.
    n._next_due[("q",)] = time.monotonic() - 0.1
    n.claim_answered(["q"], -1)
    assert ("q",) not in n._next_due
