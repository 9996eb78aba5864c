"""A throwaway PostgreSQL cluster for the tests: ``initdb`` in a temp dir, ``pg_ctl``
on a free port (never the machine's service on 5432, never a shared database).

Run as root (a container), the server runs as the ``postgres`` user (``initdb`` refuses
root) through ``runuser``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.redis_harness import free_port

__all__ = ["PG_BIN", "PgCluster", "pg_missing"]


def _find_bin() -> Path | None:
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        for version in sorted(root.iterdir(), reverse=True):
            if (version / "bin" / "initdb").exists():
                return version / "bin"
    return None


PG_BIN = _find_bin()


def pg_missing() -> str | None:
    """Why no throwaway cluster can start here (None: it can)."""
    if PG_BIN is None:
        return "PostgreSQL's initdb is not installed (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root with no 'postgres' user to run initdb as"
    return None


class PgCluster:
    """One PostgreSQL server in its own temp directory, on a free port, trust auth."""

    def __init__(self) -> None:
        assert PG_BIN is not None
        self.bin = PG_BIN
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="typedq-pg-"))
        self.data = self.dir / "data"
        self._as: list[str] = []
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self.user = "postgres"

    def _run(self, *args: str) -> None:
        subprocess.run(
            [*self._as, *args], check=True, capture_output=True, timeout=120, cwd=self.dir
        )

    def start(self) -> None:
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.user,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        options = (
            f"-c port={self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.dir} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300 "
            "-c shared_buffers=64MB"
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "log"),
            "-o",
            options,
            "-w",
            "start",
        )

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def database_url(self, name: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)
