"""Apps and models the stub, schema and inspect tests load by MODULE:APP.

Each module is one situation: models apart from handlers (``models_a``/``models_b``,
``tasks``), the versions of one model a producer and a worker may disagree on
(``orders_v1``/``orders_v2``/``orders_v2_optional``), and the inputs the generator must
refuse (``empty``, ``broken``, ``inline``, ``local``, ``generic``).
"""
