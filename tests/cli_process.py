"""A ``typedq`` command run as a real process whose stderr lines a test can wait for."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class TypedqProcess:
    """``python -m typedq ARGS`` with stderr read line by line in a thread.

    :param env: extra environment (``TYPEDQ_BROKER`` is cleared unless given here)
    """

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "typedq", *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TYPEDQ_BROKER": "", **(env or {})},
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # EOF marker, wakes the waiters
            self._changed.notify_all()

    @property
    def text(self) -> str:
        """Everything written to stderr so far."""
        with self._changed:
            return "\n".join(self.lines)

    def wait_for(self, needle: str, timeout: float = 30) -> str:
        """The first stderr line containing ``needle``; fails on timeout or exit."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                if self.lines[-1:] == [""] or time.monotonic() > deadline:
                    raise AssertionError(f"no line with {needle!r} in:\n" + "\n".join(self.lines))
                self._changed.wait(max(0.0, deadline - time.monotonic()))

    def wait(self, timeout: float = 30) -> int:
        """The exit code, once the process and its stderr are done; a process still
        running after ``timeout`` fails the test with everything it wrote to stderr."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running after {timeout:g}s: typedq {' '.join(self.args)}; "
                f"its stderr:\n{self.text}"
            ) from None
        self._reader.join(timeout)
        return code

    def close(self) -> None:
        """Kill the process if it still runs, and close its pipe."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
