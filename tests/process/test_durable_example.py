"""examples/durable.py runs end to end on the embedded broker, on virtual time: a day's
sleep, an approval, a declined card compensated, a week's timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
