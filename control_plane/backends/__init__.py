"""Where workers run: the ``PodBackend`` interface and its ``local`` implementation."""
