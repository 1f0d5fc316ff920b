"""The handlers' answers (other than inference) as Triton's protobuf messages, and the
repository parameters of a load or unload as the plain values the handler takes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from google.protobuf import json_format

from data_plane.handlers.models import ModelMetadata, TensorMetadata, VersionStats
from data_plane.handlers.server import ServerMetadata
from data_plane.repository import IndexEntry
from data_plane.shared_memory import CudaRegionStatus, RegionStatus
from foundation.proto import grpc_service_pb2 as pb


def server_metadata(meta: ServerMetadata) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(
        name=meta.name, version=meta.version, extensions=meta.extensions
    )


def model_metadata(meta: ModelMetadata) -> pb.ModelMetadataResponse:
    return pb.ModelMetadataResponse(
        name=meta.name,
        versions=meta.versions,
        platform=meta.platform,
        inputs=_tensors(meta.inputs),
        outputs=_tensors(meta.outputs),
    )


def _tensors(
    tensors: Iterable[TensorMetadata],
) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    return [
        pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=t.shape)
        for t in tensors
    ]


def model_statistics(records: Iterable[VersionStats]) -> pb.ModelStatisticsResponse:
    """The statistics of each version, read now; the JSON form HTTP answers has the
    message's field names, so the one conversion serves both."""
    response = pb.ModelStatisticsResponse()
    for record in records:
        json_format.ParseDict(
            record.stats.to_json(name=record.name, version=record.version),
            response.model_stats.add(),
        )
    return response


def repository_index(entries: Iterable[IndexEntry]) -> pb.RepositoryIndexResponse:
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(
                name=e.name,
                version="" if e.version is None else str(e.version),
                state=e.state or "",
                reason=e.reason,
            )
            for e in entries
        ]
    )


def repository_parameters(
    parameters: Mapping[str, pb.ModelRepositoryParameter],
) -> dict[str, object]:
    """Each parameter's value (bool, int, str or bytes; None when none is set), for the
    repository handler to check as it checks HTTP's JSON values."""
    values: dict[str, object] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        values[key] = None if choice is None else getattr(parameter, choice)
    return values


def system_shared_memory_status(
    regions: Iterable[RegionStatus],
) -> pb.SystemSharedMemoryStatusResponse:
    response = pb.SystemSharedMemoryStatusResponse()
    for region in regions:
        status = response.regions[region.name]
        status.name, status.key = region.name, region.key
        status.offset, status.byte_size = region.offset, region.byte_size
    return response


def cuda_shared_memory_status(
    regions: Iterable[CudaRegionStatus],
) -> pb.CudaSharedMemoryStatusResponse:
    response = pb.CudaSharedMemoryStatusResponse()
    for region in regions:
        status = response.regions[region.name]
        status.name, status.device_id, status.byte_size = (
            region.name,
            region.device_id,
            region.byte_size,
        )
    return response
