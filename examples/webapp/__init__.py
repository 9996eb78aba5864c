"""The web tier (producer side): enqueues billing tasks through ``stubs/billing.py``.

It never imports ``examples.billing.tasks`` (the handlers and their heavy dependencies);
everything it needs, tasks and models, comes from the generated stub.
"""
