"""The Lua scripts of the Redis broker, read once from ``typedq/broker/lua/``.

Every state transition is one script. Each file starts with a ``#!lua`` shebang (its
flags, such as ``allow-oom``); ``common.lua`` (shared helpers) is inserted after it, so
each script is self-contained and runs by its SHA1 (``EVALSHA``), re-sent as ``EVAL``
when Redis answers ``NOSCRIPT``. Redis Cluster runs the sharded variant
(:data:`SHARDED_SCRIPTS`): ``sharded.lua`` takes the place of the ``--@sharded`` line of
``common.lua``, so the wake-ups go to each queue's own channels with ``SPUBLISH``. The
standalone scripts carry none of it (the script cache counts against maxmemory).
"""

from __future__ import annotations

import hashlib
from importlib import resources

__all__ = ["SCRIPTS", "SHARDED_SCRIPTS", "load_scripts"]

#: The line of ``common.lua`` where the sharded variant inserts ``sharded.lua``.
_SHARDED_AT = "--@sharded\n"
#: Files of ``lua/`` that are parts of every script, not scripts.
_PARTS = ("common.lua", "sharded.lua")


def _without_comments(lua: str) -> str:
    """``lua`` with its whole-line comments left empty (line numbers in errors still
    match the files). Redis keeps the source of every script it ran in memory, and
    ``common.lua`` is in each one: the comments would be most of that memory, which
    counts against ``maxmemory``. (The scripts hold no long strings, where a line
    starting with ``--`` would be text.)"""
    return "\n".join("" if line.lstrip().startswith("--") else line for line in lua.split("\n"))


def load_scripts(*, sharded: bool = False) -> dict[str, tuple[str, str]]:
    """Read ``lua/*.lua``, insert ``common.lua`` after each shebang; name -> (source, sha1).

    :param sharded: the Redis Cluster variant (wake-ups by ``SPUBLISH`` on per-queue
        channels)
    """
    folder = resources.files("typedq.broker").joinpath("lua")
    common = folder.joinpath("common.lua").read_text("utf-8")
    if _SHARDED_AT not in common:
        raise RuntimeError(f"typedq/broker/lua/common.lua must hold {_SHARDED_AT!r}")
    if sharded:
        part = folder.joinpath("sharded.lua").read_text("utf-8")
        common = common.replace(_SHARDED_AT, part, 1)
    # After the marker is replaced: the marker is itself a comment line.
    common = _without_comments(common)
    scripts: dict[str, tuple[str, str]] = {}
    for entry in folder.iterdir():
        name = entry.name
        if not name.endswith(".lua") or name in _PARTS:
            continue
        text = entry.read_text("utf-8")
        shebang, _, body = text.partition("\n")
        if not shebang.startswith("#!lua"):
            raise RuntimeError(f"typedq/broker/lua/{name} must start with a #!lua shebang")
        source = f"{shebang}\n{common}\n{_without_comments(body)}"
        sha = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()
        scripts[name.removesuffix(".lua")] = (source, sha)
    return scripts


#: Script name (the file name without ``.lua``) -> (source, sha1).
SCRIPTS = load_scripts()
#: The same for Redis Cluster (sharded pub/sub wake-ups).
SHARDED_SCRIPTS = load_scripts(sharded=True)
