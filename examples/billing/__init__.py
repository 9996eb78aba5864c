"""The billing service (worker side): models in ``models.py``, handlers in ``tasks.py``.

This package's ``__init__`` imports nothing, so a producer can import
``examples.billing.models`` (through ``stubs/billing.py``) without the handlers.
"""
