"""What a registration is checked against before it is accepted: the stored model itself.

On register and on every change the admin API inspects the model where it is stored,
without downloading weights: a listing, ``config.pbtxt`` or ``config.json``, and an ONNX
file's graph interface (kilobytes at its start). :mod:`.checks` judges what it reads by
the rules a worker applies at load and words each refusal as the worker would
(:class:`~control_plane.errors.InvalidRegistrationError`); :mod:`.files` is the small
interface it reads through, and :mod:`.sources` reads local folders and ``s3://`` through
the data plane's storage code.
"""

from __future__ import annotations

from control_plane.inspection.checks import Registration, check_registration
from control_plane.inspection.files import (
    GraphInterface,
    LocationError,
    ModelFiles,
    StoredListing,
)

__all__ = [
    "GraphInterface",
    "LocationError",
    "ModelFiles",
    "Registration",
    "StoredListing",
    "check_registration",
]
