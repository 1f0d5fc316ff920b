"""``python -m data_plane``: the same as ``zeroserve serve``."""

from __future__ import annotations

import sys

from zeroserve.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
