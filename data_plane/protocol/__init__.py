"""Codec for Open Inference Protocol (KServe V2) infer requests and responses.

Covers the JSON body and Triton's binary tensor data extension (a JSON header followed by raw
tensor bytes, its length in ``Inference-Header-Content-Length``), plus the classification
extension. Transport-free: the HTTP routes pass bytes and header values in and write what comes
back; request compression lives in `data_plane.compression`.

Errors use Triton's texts (``shared/research/triton.md`` §1.5-§1.9 and the server source they
cite) so that tools matching on them keep working. Texts that Triton raises in its core rather
than its HTTP frontend carry the ``[request id: <id>] `` prefix, as Triton's do.

Tensors inside the server are numpy arrays with ``datatypes.NUMPY_DTYPES`` dtypes: BYTES is an
object array of ``bytes`` and BF16 is float32 (the wire carries the upper 16 bits).

Modules: `request` (request types and decoding), `json_data` (JSON tensor data), `tensors`
(binary tensor data), `response` (response encoding), `classification` (classification
extension), `shared_memory` (the parameters placing a tensor in a shared-memory region).
"""

from __future__ import annotations

from data_plane.protocol.classification import classify
from data_plane.protocol.request import (
    DEFAULT_MAX_INPUT_BYTES,
    RAW_INPUT_NAME,
    InferInput,
    InferRequest,
    RequestedOutput,
    bind_raw_input,
    decode_infer_request,
    parse_header_length,
)
from data_plane.protocol.response import OutputTensor, encode_infer_response
from data_plane.protocol.shared_memory import REGION_PARAMETER, SharedMemoryRef, shared_memory_ref

__all__ = [
    "DEFAULT_MAX_INPUT_BYTES",
    "RAW_INPUT_NAME",
    "REGION_PARAMETER",
    "InferInput",
    "InferRequest",
    "OutputTensor",
    "RequestedOutput",
    "SharedMemoryRef",
    "bind_raw_input",
    "classify",
    "decode_infer_request",
    "encode_infer_response",
    "parse_header_length",
    "shared_memory_ref",
]
