"""``python -m control_plane``: the same as ``zeroserve control-plane``."""

from __future__ import annotations

import sys

from zeroserve.cli import main

if __name__ == "__main__":
    sys.exit(main(["control-plane", *sys.argv[1:]]))
