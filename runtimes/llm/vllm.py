"""vLLM behind :class:`~runtimes.llm.base.LLMRuntime`: an adapter, imported lazily, pinned.

``vllm`` (the ``zeroserve[vllm]`` extra, pinned to 0.11.0) is imported inside :meth:`load`,
so this module imports on machines without it or without a GPU. The engine is vLLM's
``AsyncLLM`` built from ``AsyncEngineArgs`` over the model folder fetched through the node
cache, its engine core started with spawn (:mod:`runtimes.llm.vllm_setup`); engine arguments
come from the config's ``parameters`` (the common ones plus ``gpu_memory_utilization``,
derived from ``memory_bytes`` and the GPU's total when not given, ``tensor_parallel_size``,
``enable_sleep_mode`` (on by default), ``enforce_eager``, ``enable_prefix_caching``,
``kv_cache_dtype``, ``swap_space``). Prompts are
tokenized here (the folder's tokenizer, as vLLM would load it) and handed over as token ids,
so the OpenAI surface counts the same tokens the engine sees.

Our interface maps onto vLLM's: ``generate`` onto ``AsyncLLM.generate`` (deltas, one
sequence), aborting onto ``abort``, ``sleep``/``wake`` onto ``sleep(level=1)`` (weights to
host memory, KV cache discarded; the prefix cache is reset first) and ``wake_up()``,
``is_dead`` onto ``errored``, and unload onto ``shutdown()``. vLLM's ``EngineDeadError``
becomes ours (the worker exits to be replaced) and ``EngineGenerateError`` an InternalError.

vLLM places itself on the GPUs the process sees: start the worker with
``CUDA_VISIBLE_DEVICES`` to choose them; the config's instance group must name GPU 0.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Any, Final

from runtimes.errors import EngineDeadError, InternalError, UnsupportedError
from runtimes.llm.base import LLMRuntime
from runtimes.llm.parameters import COMMON, Option
from runtimes.llm.vllm_setup import gpu_memory_utilization, use_spawn
from runtimes.nvml import device_memory_total
from runtimes.sampling import Delta, EngineLoad, FinishReason, SamplingParams

logger = logging.getLogger(__name__)

OPTIONS: Final[Mapping[str, Option]] = {
    **COMMON,
    "gpu_memory_utilization": Option(
        float, None, "share of GPU memory vLLM may take; default: from memory_bytes", 0.01
    ),
    "tensor_parallel_size": Option(int, 1, "GPUs the model is split over", minimum=1),
    "enable_sleep_mode": Option(bool, True, "allow sleep (level 1) between loaded and not"),
    "enforce_eager": Option(bool, False, "skip CUDA graph capture (faster start, slower run)"),
    "enable_prefix_caching": Option(bool, None, "reuse the KV cache of shared prefixes"),
    "kv_cache_dtype": Option(str, "auto", "KV cache dtype (auto, fp8, ...)"),
    "swap_space": Option(float, 4.0, "CPU swap space per GPU in GiB", minimum=0.0),
}

_FINISH: Final[Mapping[str, FinishReason]] = {"stop": "stop", "length": "length", "abort": "abort"}

_ENGINE_ARG_KEYS: Final = (
    "tensor_parallel_size",
    "enable_sleep_mode",
    "enforce_eager",
    "kv_cache_dtype",
    "swap_space",
    "max_num_seqs",
)
"""Parameters passed to ``AsyncEngineArgs`` under the same name."""


class VllmRuntime(LLMRuntime):
    """Serves a Hugging Face folder with vLLM's ``AsyncLLM`` on CUDA."""

    kind = "vllm"
    engine_label = "vLLM"
    engine_options = OPTIONS

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._engine: Any = None
        self._vllm: Any = None
        self._started: set[str] = set()
        """Requests that produced output (running); the others wait."""

    async def _load_engine(self, model_dir: Path, device: str) -> None:
        if device != "cuda:0":
            raise self.load_error(
                f"vLLM needs a GPU and places itself on the visible ones (device {device}); "
                "use a KIND_GPU instance group on GPU 0 and CUDA_VISIBLE_DEVICES"
            )
        self._engine = await self.run_blocking(self._load_sync, model_dir)

    def _load_sync(self, model_dir: Path) -> Any:
        # Before vLLM is imported: its environment is read when the engine starts.
        use_spawn(os.environ)
        values = self.parameters
        configured = values["gpu_memory_utilization"]
        budget = int(values["memory_bytes"] or 0)
        try:
            fraction = gpu_memory_utilization(
                configured=None if configured is None else float(configured),
                memory_bytes=budget,
                # NVML, not torch: CUDA stays uninitialised in this process.
                device_total_bytes=device_memory_total(0)
                if configured is None and budget
                else None,
            )
        except ValueError as exc:
            raise self.load_error(str(exc)) from exc
        try:
            import vllm
            from transformers import AutoTokenizer
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise self.load_error(
                f"vLLM is not installed ({exc}); pip install 'zeroserve[vllm]'"
            ) from exc
        arguments: dict[str, Any] = {key: values[key] for key in _ENGINE_ARG_KEYS}
        arguments["gpu_memory_utilization"] = fraction
        if values["max_model_len"] is not None:
            arguments["max_model_len"] = values["max_model_len"]
        if values["enable_prefix_caching"] is not None:
            arguments["enable_prefix_caching"] = values["enable_prefix_caching"]
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            # Built off the event loop: AsyncLLM starts its output handler on the first
            # request when no loop runs in the constructing thread.
            engine = AsyncLLM.from_engine_args(
                AsyncEngineArgs(
                    model=str(model_dir),
                    tokenizer=str(model_dir),
                    served_model_name=[self.name],
                    dtype=str(values["dtype"]),
                    disable_log_stats=True,
                    **arguments,
                )
            )
        except Exception as exc:
            raise self.load_error(f"vLLM cannot load {model_dir.name}: {exc}") from exc
        self._vllm = vllm
        self._tokenizer = tokenizer
        self.max_model_len = int(engine.model_config.max_model_len)
        return engine

    async def _stream(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncGenerator[Delta, None]:
        vllm, engine = self._vllm, self._engine
        if engine is None or vllm is None:
            raise EngineDeadError(f"model '{self.name}' has no engine")
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError as VllmDeadError, EngineGenerateError

        sampling = vllm.SamplingParams(
            n=1,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=list(params.stop) or None,
            seed=params.seed,
            output_kind=RequestOutputKind.DELTA,
        )
        prompt = vllm.TokensPrompt(prompt_token_ids=prompt_ids)
        try:
            async for output in engine.generate(prompt, sampling, request_id):
                self._started.add(request_id)
                sequence = output.outputs[0]
                reason = _FINISH.get(sequence.finish_reason or "", None)
                if output.finished and reason is None:
                    reason = "stop"
                yield Delta(sequence.text, len(sequence.token_ids), reason)
                if output.finished:
                    return
        except VllmDeadError as exc:
            raise EngineDeadError(f"the vLLM engine of '{self.name}' died: {exc}") from exc
        except EngineGenerateError as exc:
            raise InternalError(f"vLLM failed to generate: {exc}") from exc
        finally:
            self._started.discard(request_id)

    async def _abort_engine(self, request_id: str) -> None:
        engine = self._engine
        self._started.discard(request_id)
        if engine is not None and not engine.errored:
            await engine.abort(request_id)

    def load_counts(self) -> EngineLoad:
        # AsyncLLM keeps its scheduler in the engine-core process; what this process knows is
        # which requests have produced output.
        running = len(self._started)
        return EngineLoad(running=running, waiting=max(self.in_flight - running, 0))

    @property
    def is_dead(self) -> bool:
        engine = self._engine
        return engine is not None and bool(engine.errored)

    async def _sleep_engine(self) -> None:
        if not self.parameters["enable_sleep_mode"]:
            raise UnsupportedError(f"model '{self.name}' was loaded with enable_sleep_mode off")
        engine = self._engine
        if engine is None:
            raise EngineDeadError(f"model '{self.name}' has no engine")
        # Level 1 keeps the weights in host memory and discards the KV cache, so cached
        # prefixes would point at freed blocks after a wake.
        await engine.reset_prefix_cache()
        await engine.sleep(level=1)

    async def _wake_engine(self) -> None:
        engine = self._engine
        if engine is None:
            raise EngineDeadError(f"model '{self.name}' has no engine")
        await engine.wake_up()

    def _free_engine(self) -> None:
        """Shut the engine core down; its process holds the device memory, which goes
        with it."""
        engine, self._engine = self._engine, None
        self._tokenizer = None
        self._vllm = None
        if engine is not None:
            engine.shutdown()

    def _forget_engine(self) -> None:
        super()._forget_engine()
        self._engine = None
        self._vllm = None
