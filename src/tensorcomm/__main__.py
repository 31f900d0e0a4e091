"""``python -m tensorcomm ...``: the same as the ``tensorcomm`` console script."""

from __future__ import annotations

import sys

from tensorcomm.cli import main

if __name__ == "__main__":
    sys.exit(main())
