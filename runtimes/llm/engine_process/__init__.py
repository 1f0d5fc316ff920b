"""The transformers engine in a process of its own.

``client`` is the server's end (start a process or take the spare one, load, send requests,
receive tokens); ``core`` the process's end (one engine driven by the server's messages);
``messages`` what they say to each other, one typed class per message kind.
``python -m runtimes.llm.engine_process`` runs the core. This package imports neither end,
so that the engine process loads only its own.
"""
