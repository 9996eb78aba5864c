"""``python -m typedq``: the same as the ``typedq`` command."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
