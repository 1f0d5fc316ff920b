"""Triton's protobuf schemas and the Python code generated from them.

``model_config.proto`` (the ModelConfig of ``config.pbtxt`` files) and ``grpc_service.proto``
(the ``inference.GRPCInferenceService`` messages, which import the first) keep Triton's
package, message and field names, so their descriptors are the ones ``tritonclient.grpc``
registers too and both load in one process. The ``*_pb2.py`` and ``*_pb2.pyi`` files are
generated, never edited; from this folder::

    python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. model_config.proto grpc_service.proto

then make ``grpc_service_pb2``'s import of ``model_config_pb2`` absolute
(``from foundation.proto import model_config_pb2 as ...``) in both generated files.
"""
