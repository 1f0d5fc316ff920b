"""Python-backend models: Triton's contract in stub processes, and zeroserve's dict
contract in the server's process.

Server side: ``runtime`` (StubRuntime: one stub process per instance, requests one by
one), ``process`` (starting a stub, its channel, noticing its death), ``limits``,
``environment`` (``EXECUTION_ENV_PATH``), ``complete`` (``auto_complete_config``),
``contract`` (which contract a ``model.py`` follows), ``inprocess`` (the dict contract).
Stub side: ``stub`` (the process's entry point), ``model_host`` (runs the model),
``pb_utils`` and ``pb_config`` (``triton_python_backend_utils``). Both sides: ``messages``
(the control messages and their framing), ``arena`` (the shared memory tensors cross in),
``tensors`` (tensors in an arena).

This file imports nothing: the stub imports the package in the model's own Python
environment, which needs only numpy and the standard library.
"""
