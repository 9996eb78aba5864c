"""A model defined inside a function: the generator cannot import it."""

# No `from __future__ import annotations`: the handler's annotations must be real
# objects, because the model is a local of `build`, which typing.get_type_hints cannot see.
import msgspec

from typedq import App


def build() -> App:
    """Make an app whose input model is local to this function."""
    app = App("local")

    class Hidden(msgspec.Struct):
        n: int

    @app.task
    async def hide(h: Hidden) -> None:
        del h

    return app


app = build()
