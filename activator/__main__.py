"""``python -m activator``: the same as ``zeroserve activator`` (composed in
``zeroserve.activator_server``, where the control plane's state store is opened)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """``zeroserve activator`` with ``argv`` (default: this process's arguments)."""
    from zeroserve.cli import main as cli_main

    return cli_main(["activator", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
