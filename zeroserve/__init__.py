"""The ``zeroserve`` command line: one entry point for every component."""
