"""The supervisor's restart backoff on virtual time: real child processes, no waiting.

A child that keeps dying is restarted after 0.5 s, then 1, 2, 4 ... up to 30 s; a child
that ran for a minute before it died starts the sequence again. The pauses and the run
time are read from the supervisor's clock, so a test moves a VirtualClock instead of
sleeping through 0.5 + 1 + 2 + ... seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from typedq.clock import VirtualClock
from typedq.supervisor import BACKOFF_FIRST, BACKOFF_MAX, STABLE_AFTER, Supervisor

pytestmark = pytest.mark.anyio

#: A child that fails once the file named by its argument exists (the test lets it).
DYING_CHILD = [
    sys.executable,
    "-c",
    "import os, sys, time\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.005)\n"
    "raise SystemExit(1)",
]


async def _next_pause(
    supervisor: Supervisor, clock: VirtualClock, let_die: anyio.Path, *, ran: float
) -> float:
    """Let the child run ``ran`` seconds of the clock, then die; the pause the supervisor
    then waits before its restart."""
    # Polling: the supervisor offers no event for a child's start or for its pause.
    with anyio.fail_after(30):
        while supervisor.children[0].process is None:  # noqa: ASYNC110
            await anyio.sleep(0.005)
        clock.advance_nowait(ran)
        await let_die.touch()
        while clock.sleepers == 0:  # noqa: ASYNC110
            await anyio.sleep(0.005)
    await let_die.unlink()
    pause = clock.next_deadline()
    assert pause is not None
    return pause


async def test_a_dying_child_is_restarted_with_doubling_pauses_reset_by_a_long_run(
    tmp_path: Path,
) -> None:
    clock = VirtualClock()
    let_die = anyio.Path(tmp_path / "die")
    supervisor = Supervisor([*DYING_CHILD, str(let_die)], 1, clock=clock)
    pauses: list[float] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(supervisor.run)
        for ran in (0, 0, 0, 0, 0, 0, 0, 0, STABLE_AFTER, 0):
            if pauses:
                await clock.advance(pauses[-1])  # the restart
            pauses.append(await _next_pause(supervisor, clock, let_die, ran=ran))
        tg.cancel_scope.cancel()  # in its last pause: no child is running
    first = BACKOFF_FIRST
    doubling = [first, 2 * first, 4 * first, 8 * first, 16 * first, 32 * first]
    assert pauses == [*doubling, BACKOFF_MAX, BACKOFF_MAX, first, 2 * first]
    assert supervisor.children[0].restarts == len(pauses)
    assert supervisor.children[0].codes == [1] * len(pauses)
