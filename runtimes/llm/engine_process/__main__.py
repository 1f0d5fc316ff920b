"""``python -m runtimes.llm.engine_process --fd N [--log-level LEVEL]``: an engine process."""

from runtimes.llm.engine_process.core import main

main()
