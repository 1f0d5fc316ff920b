"""The pieces of ``bench/compare.py``: zeroserve side by side with MLServer and KServe.

``venvs`` installs each peer into its own virtual environment; ``contenders`` starts and
stops every server under test and loads and unloads models on it; ``measure`` runs one point
of load (wrk, or ``zeroserve bench`` as a library: the same client for every server) or of the
engine alone; ``cold_load`` times loading a large model; ``results`` turns repeats into
medians, tables and the plot; ``gpu`` holds what only a CUDA run needs.
"""
