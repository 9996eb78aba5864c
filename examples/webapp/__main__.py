"""``python -m examples.webapp --broker URL``: run the producer demo."""

from __future__ import annotations

import sys

from .service import main

sys.exit(main())
