"""The public front door that buffers requests during cold starts. Not built yet."""
