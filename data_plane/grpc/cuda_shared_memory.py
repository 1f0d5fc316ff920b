"""CUDA shared memory on a server without CUDA: Triton's answers where its build has no GPU
support. No region can be registered, so none exists: the status lists none (and a named
one is not found), unregistering finds nothing to do, and registering is refused."""

from __future__ import annotations

from data_plane.errors import InvalidArgumentError, NotFoundError
from foundation.proto import grpc_service_pb2 as pb


class CudaSharedMemoryServicer:
    """The three CUDA shared-memory RPCs."""

    def status(
        self, request: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        if request.name:
            raise NotFoundError(f"Unable to find cuda shared memory region: '{request.name}'")
        return pb.CudaSharedMemoryStatusResponse()

    def register(
        self, request: pb.CudaSharedMemoryRegisterRequest
    ) -> pb.CudaSharedMemoryRegisterResponse:
        raise InvalidArgumentError(
            f"failed to register CUDA shared memory region: '{request.name}', GPUs not supported"
        )

    def unregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()
