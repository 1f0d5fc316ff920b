"""The peers' side of ``bench/compare.py``: model code that runs inside MLServer and KServe.

These files are copied into each peer's working folder and imported there, by the peer's own
interpreter (its virtual environment under the benchmark's cache folder); nothing in zeroserve
imports them. ``ort_session.py`` builds the ONNX Runtime session exactly as zeroserve's
runtime and the engine-alone baseline do, so that every server runs the same engine setup.
"""
