"""The OpenAI-compatible surface of the data plane: ``/v1/completions``,
``/v1/chat/completions`` (with SSE streaming) and ``/v1/models`` over LLM runtimes.

``routes`` parses HTTP and encodes answers and errors (OpenAI's error body), ``protocol``
checks request bodies, ``serving`` runs them on the engines.
"""
