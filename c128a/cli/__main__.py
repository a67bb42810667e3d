"""``python -m c128a.cli``: the ``c128a`` command without its script."""

import sys

from . import main

sys.exit(main())
