"""examples/durable.py runs end to end on the embedded broker, on virtual time: a day's
sleep, an approval, a declined card compensated, a week's timeout; and the tests of it
that docs/durable.md shows pass."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import anyio
import pytest

from tests.support import TEST_DEADLINE
from typedq.testing import FakeClock, run_worker

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = [
    "ada: account created (1/3)",
    "ada: reviewed by grace (2/3)",
    "ada: charged (3/3)",
    "Onboarded(account_id='acct-ada', active=True, risk=58, note='rcpt-acct-ada')",
    "Onboarded(account_id='acct-bob', active=False, risk=64, note='declined: insufficient_funds')",
    "Onboarded(account_id='acct-cy', active=False, risk=0, note='not reviewed')",
    "bob's completed steps: create_account, send_mail, close_account, send_mail",
]


def test_durable_example_on_the_embedded_broker() -> None:
    result = subprocess.run(
        [sys.executable, "examples/durable.py"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == EXPECTED, result.stdout
    # The declined card is a typed domain error the run caught, not a crash.
    assert "Traceback" not in result.stderr


# The tests docs/durable.md shows ("Testing runs on virtual time"), on the example's app.


@pytest.mark.anyio
async def test_onboarding_waits_a_day_then_for_approval() -> None:
    from examples.durable import Approval, NewUser, approval, onboard
    from examples.durable import app as onboarding

    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(onboarding, clock=FakeClock(1_767_225_600.0)) as harness:
            handle = await onboard.start(NewUser("ada@example.com", "4242"), run_id="t-1")
            await harness.idle()  # suspended in its day's sleep
            [record] = await onboarding.broker.get_runs(["t-1"])
            assert record is not None
            assert record.wake_at == 1_767_225_600.0 + 86_400
            await harness.advance(timedelta(days=1).total_seconds())
            await harness.idle()  # now waiting for its approval
            await handle.send(approval, Approval(ok=True, reviewer="qa"))
            assert (await handle.result(timeout=5)).active


@pytest.mark.anyio
async def test_nobody_approves_within_a_week() -> None:
    from examples.durable import NewUser, onboard
    from examples.durable import app as onboarding

    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(onboarding, clock=FakeClock(1_767_225_600.0)) as harness:
            handle = await onboard.start(NewUser("cy@example.com", "4242"), run_id="t-2")
            await harness.idle()
            await harness.advance(timedelta(days=1).total_seconds())  # the sleep ends
            await harness.idle()  # the 7-day wait starts now
            await harness.advance(timedelta(days=7).total_seconds())
            assert (await handle.result(timeout=5)).note == "not reviewed"
