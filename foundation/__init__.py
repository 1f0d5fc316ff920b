"""What every component stands on, and nothing above it: the bottom layer.

The ModelConfig vocabulary (Triton's ``model_config.proto`` in ``proto/``, its
normalisation in ``model_config``, tensor ``datatypes`` and model ``names``), the root of
the error tree (``errors``), the platform's ``records`` shared by the control plane and the
activator through the state store, API ``keys`` (their records, format and checks), the
HTTP server plumbing (``http``), the keep-alive HTTP/1.1 client connection
(``http1_client``), the CloudWatch publisher and what commands print (``output``: tables,
json and yaml). Nothing here
imports another zeroserve package; the import-linter contracts in pyproject.toml keep it so.
"""
