"""Print pip constraints that keep what vLLM's image was built with.

    python3 vllm_constraints.py vllm torch > constraints.txt

Each requirement the first distribution declares (those whose environment markers hold here,
extras left out) becomes a constraint with the range it declares, and every distribution
named is pinned at its installed version. ``pip install -c constraints.txt OTHER`` may then
add packages and move the others within vLLM's ranges, but never out of them, and never
moves vLLM or the PyTorch build its CUDA kernels were compiled against; ``pip check`` after
it finds whatever else the install broke. Runs in the image's Python with what vLLM's
dependencies bring (``packaging``).
"""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def constraints(names: list[str]) -> list[str]:
    """Constraint lines: ``names`` pinned as installed, then ``names[0]``'s own ranges."""
    pinned = {canonicalize_name(n): f"{canonicalize_name(n)}=={metadata.version(n)}" for n in names}
    ranges: dict[str, list[str]] = {}
    for line in metadata.requires(names[0]) or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is not None and not marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        specifier = str(requirement.specifier)
        if name not in pinned and specifier and specifier not in ranges.get(name, []):
            ranges.setdefault(name, []).append(specifier)
    lines = list(pinned.values()) + [f"{n}{','.join(s)}" for n, s in ranges.items()]
    return sorted(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: vllm_constraints.py DISTRIBUTION [PINNED ...]")
    print("\n".join(constraints(sys.argv[1:])))
