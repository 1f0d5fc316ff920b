"""Benchmarks of zeroserve, run as scripts (``python bench/data_plane.py``).

Each benchmark generates what it measures (models, repositories, request bodies), starts the
server as a subprocess on a loopback port, and writes its results, with the machine described,
under ``bench/results/``. Nothing here is imported by the server.
"""
