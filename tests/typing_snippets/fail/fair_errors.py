"""Fair key functions are checked against the handler's input model (typedq.mypy_plugin),
and the weights by the signature.

Key lambdas only by mypy with the plugin (``# P: ok``, docs/typing.md).
"""

from __future__ import annotations

from snip import Image, SendInvoice, app

from typedq import Fair


# E: attr-defined "SendInvoice" has no attribute "tenant"  # P: ok key= needs the mypy plugin
@app.task(fair=Fair(key=lambda inv: inv.tenant))
async def unknown_field(invoice: SendInvoice) -> None:
    pass


# Fair shares typed for another model.
WRONG: Fair[Image] = Fair(key=lambda image: image.url)


@app.task(fair=WRONG)  # E: arg-type "Fair[Image]"  # P: ok key= needs the mypy plugin
async def wrong_model(invoice: SendInvoice) -> None:
    pass


Fair(key=str, default_weight="2")  # E: arg-type "str"  # P: reportArgumentType "Literal['2']"
