"""The Lua scripts of the Redis broker, read once from ``typedq/broker/lua/``.

Every state transition is one script. Each file starts with a ``#!lua`` shebang (its
flags, such as ``allow-oom``); ``common.lua`` (shared helpers) is inserted after it, so
each script is self-contained and runs by its SHA1 (``EVALSHA``), re-sent as ``EVAL``
when Redis answers ``NOSCRIPT``.
"""

from __future__ import annotations

import hashlib
from importlib import resources

__all__ = ["SCRIPTS", "load_scripts"]


def _without_comments(lua: str) -> str:
    """``lua`` with its whole-line comments left empty (line numbers in errors still
    match the files). Redis keeps the source of every script it ran in memory, and
    ``common.lua`` is in each one: the comments would be most of that memory, which
    counts against ``maxmemory``. (The scripts hold no long strings, where a line
    starting with ``--`` would be text.)"""
    return "\n".join("" if line.lstrip().startswith("--") else line for line in lua.split("\n"))


def load_scripts() -> dict[str, tuple[str, str]]:
    """Read ``lua/*.lua``, insert ``common.lua`` after each shebang; name -> (source, sha1)."""
    folder = resources.files("typedq.broker").joinpath("lua")
    common = _without_comments(folder.joinpath("common.lua").read_text("utf-8"))
    scripts: dict[str, tuple[str, str]] = {}
    for entry in folder.iterdir():
        name = entry.name
        if not name.endswith(".lua") or name == "common.lua":
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
