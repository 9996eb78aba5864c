"""A function of a released migration, restated by a later one with some statements
changed: migrations 14, 15, 16 and 17 take the released text and replace only what they fix,
so the rest of each function is the released one word for word."""

from __future__ import annotations

__all__ = ["function_of"]


def function_of(sql: str, head: str, changes: tuple[tuple[str, str], ...], why: str) -> str:
    """The function of a released migration's ``sql`` that starts with ``head``, each
    statement of ``changes`` replaced (each found once), as a CREATE OR REPLACE headed by
    the comment ``why``."""
    start = sql.index(head)
    body = sql[start : sql.index("END $$;", start) + len("END $$;")]
    for old, new in changes:
        assert body.count(old) == 1, old
        body = body.replace(old, new)
    body = body.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    return f"-- {why}\n{body}\n"
