"""How a model version's ``InferenceSession`` is opened: providers, options, fallback.

Execution providers follow the device: ``cuda:N`` tries TensorRT (where it really loads),
then CUDA (its arena bounded by the model's ``memory_bytes``), then falls back to CPU; ``cpu``
uses the CPU provider only (:mod:`runtimes.onnx.providers`). Session options come from the
server's defaults and the model configuration's ``parameters`` (Triton's ORT backend names
where it has them): thread counts, whether idle threads spin, whether weights are prepacked.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import onnxruntime as ort

from foundation.proto import model_config_pb2 as mc
from runtimes.base import RuntimeOptions, instance_count
from runtimes.errors import ModelLoadError
from runtimes.onnx.providers import CPU, TENSORRT, Provider, choose_providers, tensorrt_version
from runtimes.onnx.threads import ThreadPolicy, choose_threads, latency_threads

logger = logging.getLogger(__name__)

INTRA_OP_THREADS_PARAMETER: Final = "intra_op_thread_count"
"""Config ``parameters`` key overriding the intra-op thread count (Triton's ORT backend name)."""
INTER_OP_THREADS_PARAMETER: Final = "inter_op_thread_count"
"""Config ``parameters`` key overriding the inter-op thread count (Triton's ORT backend name)."""
ALLOW_SPINNING_PARAMETER: Final = "allow_spinning"
"""Config ``parameters`` key: ``true``/``false`` lets ONNX Runtime's idle threads spin or not.

Unset, :mod:`runtimes.onnx.threads` decides (with the thread count): a small model runs on
one thread with no pool to spin, switching to a spinning pool while it is latency-bound; a
large one spins its pool.
"""
DISABLE_PREPACKING_PARAMETER: Final = "disable_prepacking"
"""Config ``parameters`` key: ``true`` skips weight prepacking at session creation.

Prepacking copies every weight into a layout the CPU kernels prefer: a load reads all the
weights up front, and later inferences are faster. Without it, a load from the warm engine
cache memory-maps the weights and returns in milliseconds, and the first inference pays
for paging them in. Which is better is per model; ``bench/cold_start.py`` measures both."""
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off", ""})
MEMORY_BYTES_PARAMETER: Final = "memory_bytes"
"""Config ``parameters`` key: the model's device-memory budget in bytes (the control plane
sets it from the registration's ``resources.memory_bytes``); bounds the CUDA arena."""
_CUDA_DEVICE: Final = re.compile(r"cuda:(\d+)")


@dataclass(frozen=True)
class SessionBuilder:
    """Opens sessions for one model version: its name, configuration and weight size.

    Each method raises :class:`ModelLoadError` for the model when the device, a
    configuration parameter or the file is not usable.
    """

    model: str
    config: mc.ModelConfig
    options: RuntimeOptions
    weight_bytes: int
    """The version folder's files, in bytes; decides threads and spinning unless configured."""
    cores: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    """Cores this process may run on, shared among the model's instances."""

    def load_error(self, reason: str) -> ModelLoadError:
        """The error a failed load of this model raises."""
        return ModelLoadError(model=self.model, reason=reason)

    def providers(self, device: str, *, trt_cache: Path | None) -> list[Provider]:
        """The providers for ``device`` in order of preference, CPU last
        (:func:`runtimes.onnx.providers.choose_providers`).

        ``trt_cache``: the folder TensorRT keeps its engines in (created); None for none.
        """
        if device == "cpu":
            return [(CPU, {})]
        match = _CUDA_DEVICE.fullmatch(device)
        if match is None:
            raise self.load_error(f"unknown device {device!r}; expected 'cpu' or 'cuda:N'")
        return choose_providers(
            device_id=match.group(1),
            available=ort.get_available_providers(),
            tensorrt=tensorrt_version(),
            config=self.config,
            memory_bytes=self.memory_bytes(),
            trt_cache=trt_cache,
        )

    def memory_bytes(self) -> int:
        """The model's device-memory budget from its ``memory_bytes`` parameter; 0: none."""
        if MEMORY_BYTES_PARAMETER not in self.config.parameters:
            return 0
        text = self.config.parameters[MEMORY_BYTES_PARAMETER].string_value
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise self.load_error(
                f"parameter {MEMORY_BYTES_PARAMETER} must be a non-negative integer, not {text!r}"
            )
        return value

    def session_options(self, policy: ThreadPolicy | None = None) -> ort.SessionOptions:
        """Fresh options with the thread counts (``policy``, by default
        :meth:`thread_policy`'s), spinning and prepacking this model gets."""
        policy = policy or self.thread_policy()
        options = ort.SessionOptions()
        options.intra_op_num_threads = policy.intra_op_threads
        options.inter_op_num_threads = self._thread_count(
            INTER_OP_THREADS_PARAMETER, self.options.inter_op_threads
        )
        spinning = "1" if policy.is_spinning else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
        if self._flag(DISABLE_PREPACKING_PARAMETER):
            options.add_session_config_entry("session.disable_prepacking", "1")
        return options

    def thread_policy(self) -> ThreadPolicy:
        """Threads and spinning: the configuration's parameters, then the server's
        ``intra_op_threads`` setting, then :func:`choose_threads` for this model."""
        chosen = choose_threads(
            weight_bytes=self.weight_bytes, instances=instance_count(self.config), cores=self.cores
        )
        threads = self._thread_count(
            INTRA_OP_THREADS_PARAMETER, self.options.intra_op_threads or chosen.intra_op_threads
        )
        if ALLOW_SPINNING_PARAMETER in self.config.parameters:
            is_spinning = self._flag(ALLOW_SPINNING_PARAMETER)
        else:
            # A single thread has no pool to keep awake; an explicit count keeps the
            # size-based choice.
            is_spinning = chosen.is_spinning and threads != 1
        return ThreadPolicy(intra_op_threads=threads, is_spinning=is_spinning)

    def latency_policy(self, device: str) -> ThreadPolicy | None:
        """The wide session's threads for while the model is latency-bound
        (:func:`runtimes.onnx.threads.latency_threads`), or None: also on a GPU, and when
        the configuration or the server sets threads or spinning, which then hold for
        every batch."""
        configured = (INTRA_OP_THREADS_PARAMETER, ALLOW_SPINNING_PARAMETER)
        if (
            device != "cpu"
            or self.options.intra_op_threads
            or any(key in self.config.parameters for key in configured)
        ):
            return None
        return latency_threads(
            weight_bytes=self.weight_bytes,
            max_batch_size=self.config.max_batch_size,
            cores=self.cores,
        )

    def open(
        self, path: Path, options: ort.SessionOptions, providers: list[Provider]
    ) -> ort.InferenceSession:
        """A session of ``path``; when TensorRT fails, retried once without it."""
        # ORT's own fallback (enable_fallback) would print to stdout on any error, corrupt
        # files included, and retry with provider names only, losing device_id. Ours keeps
        # the options and retries only what can help: the same providers without TensorRT,
        # whose libraries are often absent even where the wheel lists the provider.
        attempts = [providers]
        if providers[0][0] == TENSORRT:
            attempts.append(providers[1:])
        for attempt, attempt_providers in enumerate(attempts, start=1):
            try:
                return ort.InferenceSession(
                    str(path), sess_options=options, providers=attempt_providers, enable_fallback=0
                )
            except Exception as exc:
                if attempt == len(attempts):
                    raise self.load_error(f"ONNX Runtime cannot load {path.name}: {exc}") from exc
                logger.warning(
                    "TensorRT failed for model %s (%s); retrying without it",
                    self.model,
                    exc,
                    extra={"model": self.model},
                )
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _thread_count(self, key: str, default: int) -> int:
        # `key in` rather than indexing: indexing a protobuf map inserts the key.
        if key not in self.config.parameters:
            return default
        text = self.config.parameters[key].string_value
        try:
            count = int(text)
        except ValueError:
            count = -1
        if count < 0:
            raise self.load_error(f"parameter {key} must be a non-negative integer, not {text!r}")
        return count

    def _flag(self, key: str) -> bool:
        if key not in self.config.parameters:
            return False
        text = self.config.parameters[key].string_value.strip().lower()
        if text not in _TRUE | _FALSE:
            raise self.load_error(f"parameter {key} must be true or false, not {text!r}")
        return text in _TRUE
