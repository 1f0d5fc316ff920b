"""transformers behind :class:`~runtimes.llm.base.LLMRuntime`, on CPU or GPU.

The version folder is a Hugging Face causal LM (``config.json``, ``*.safetensors``, the
tokenizer files). Weights load with ``AutoModelForCausalLM`` from safetensors only (never a
pickle), nothing is downloaded and no remote code runs. Requests are served by transformers'
own continuous batching (``model.init_continuous_batching()``, a
``ContinuousBatchingManager``: its scheduler, its paged KV cache, its generation thread); this
module submits token ids, receives each request's outputs on the event loop
(``register_result_handler``) and turns them into text deltas.

A manager either samples or takes the argmax for its whole batch (``do_sample``), and it
offers per-request temperature and top_p only when built with non-default ones. So greedy
requests (temperature 0) run on one manager and sampled ones on a second over the same
weights, built on the first sampled request with placeholder values that every request
overrides. transformers keeps one random generator per manager, so ``seed`` cannot be honoured
per request here (vLLM honours it).

Sleep stops the managers (their KV caches and batch state are freed) and, on CUDA, moves the
weights to host memory; wake moves them back and starts a new greedy manager. Parameters
beyond the common ones: ``kv_cache_tokens`` (KV cache size in tokens), ``page_size`` (tokens
per cache page) and ``max_batch_tokens`` (tokens in one forward pass; longer prompts are
prefilled in chunks).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import re
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from data_plane.errors import EngineDeadError, InternalError
from runtimes.llm.base import LLMRuntime
from runtimes.llm.parameters import COMMON, Option
from runtimes.llm.sampling import Delta, EngineLoad, FinishReason, SamplingParams
from runtimes.llm.text import IncrementalDetokenizer, StopStrings

logger = logging.getLogger(__name__)

_DEVICE: Final = re.compile(r"cpu|cuda:\d+")

_STOP_TIMEOUT_S: Final = 30.0
"""How long stopping a manager may wait for its generation thread to exit."""

_PLACEHOLDER_TEMPERATURE: Final = 0.5
_PLACEHOLDER_TOP_P: Final = 0.5
"""Non-default values that make transformers build the per-request temperature and top-p
processors of the sampling manager; every request passes its own values."""

OPTIONS: Final[Mapping[str, Option]] = {
    **COMMON,
    "kv_cache_tokens": Option(int, 16384, "KV cache size in tokens", minimum=16),
    "page_size": Option(int, 32, "tokens per KV cache page", minimum=4),
    "max_batch_tokens": Option(int, 512, "tokens in one forward pass", minimum=16),
}


class _Slot:
    """The newest output of one request. Outputs are cumulative (every one carries all
    tokens so far), so keeping only the newest loses nothing and needs no queue."""

    def __init__(self) -> None:
        self._output: Any = None
        self._event = asyncio.Event()
        self.is_aborted = False

    def put(self, output: Any) -> None:
        """Called on the event loop by the manager's output router."""
        self._output = output
        self._event.set()

    def abort(self) -> None:
        self.is_aborted = True
        self._event.set()

    async def next(self, timeout_s: float) -> Any:
        """The newest output once there is a new one; None once aborted.

        Raises TimeoutError after ``timeout_s`` without one.
        """
        async with asyncio.timeout(timeout_s):
            await self._event.wait()
        self._event.clear()
        return None if self.is_aborted else self._output


@dataclass
class _Engine:
    """The loaded model and what serves it."""

    torch: Any
    model: Any
    device: Any
    eos_ids: frozenset[int]
    managers: dict[bool, Any]
    """is_greedy -> started ContinuousBatchingManager."""


class TransformersRuntime(LLMRuntime):
    """Serves a Hugging Face causal LM with transformers' continuous batching."""

    kind = "transformers"
    engine_label = "transformers"
    engine_options = OPTIONS

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._engine: _Engine | None = None
        self._slots: dict[str, _Slot] = {}
        self._manager_lock = asyncio.Lock()

    # ---- load, sleep, wake, free ----

    async def _load_engine(self, model_dir: Path, device: str) -> None:
        self._engine = await self.run_blocking(self._load_sync, model_dir, device)
        await self._manager(is_greedy=True)

    def _load_sync(self, model_dir: Path, device: str) -> _Engine:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise self.load_error(
                "transformers and torch are not installed; pip install 'zeroserve[llm,torch]'"
            ) from exc
        if _DEVICE.fullmatch(device) is None:
            raise self.load_error(f"unknown device {device!r}; expected 'cpu' or 'cuda:N'")
        torch_device = torch.device(device)
        if torch_device.type == "cuda" and not torch.cuda.is_available():
            raise self.load_error(f"device {device} requested but torch sees no CUDA device")
        if not (model_dir / "config.json").is_file():
            raise self.load_error(f"{model_dir} holds no config.json (a Hugging Face model)")
        if not any(model_dir.glob("*.safetensors")):
            raise self.load_error(f"{model_dir} holds no *.safetensors weights")
        dtype = self.parameters["dtype"]
        if dtype == "auto":
            # Half precision on a CPU is slow or unsupported for many kernels.
            torch_dtype: Any = torch.float32 if torch_device.type == "cpu" else "auto"
        else:
            torch_dtype = getattr(torch, str(dtype))
        model: Any
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=torch_dtype, use_safetensors=True, local_files_only=True
            )
        except Exception as exc:
            raise self.load_error(f"transformers cannot load {model_dir.name}: {exc}") from exc
        model = model.to(torch_device).eval()
        configured = self.parameters["max_model_len"]
        own = getattr(model.config, "max_position_embeddings", None)
        if isinstance(configured, int):
            self.max_model_len = configured
        elif isinstance(own, int) and own > 0:
            self.max_model_len = own
        else:
            raise self.load_error(
                "the model config has no max_position_embeddings; set max_model_len"
            )
        self._tokenizer = tokenizer
        return _Engine(torch, model, torch_device, _eos_ids(model, tokenizer), {})

    async def _manager(self, *, is_greedy: bool) -> Any:
        engine = self._engine
        if engine is None:
            raise EngineDeadError(f"model '{self.name}' has no engine")
        manager = engine.managers.get(is_greedy)
        if manager is not None:
            return manager
        async with self._manager_lock:
            manager = engine.managers.get(is_greedy)
            if manager is None:
                manager = await self.run_blocking(self._start_manager, engine, is_greedy)
                engine.managers[is_greedy] = manager
        return manager

    def _start_manager(self, engine: _Engine, is_greedy: bool) -> Any:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        page_size = _int(self.parameters["page_size"])
        generation = GenerationConfig(  # type: ignore[no-untyped-call]
            do_sample=not is_greedy,
            max_new_tokens=self.max_model_len,
            eos_token_id=sorted(engine.eos_ids) or None,
        )
        if not is_greedy:
            generation.temperature = _PLACEHOLDER_TEMPERATURE
            generation.top_p = _PLACEHOLDER_TOP_P
        batching = ContinuousBatchingConfig(
            page_size=page_size,
            num_blocks=math.ceil(_int(self.parameters["kv_cache_tokens"]) / page_size),
            max_batch_tokens=_int(self.parameters["max_batch_tokens"]),
            max_requests_per_batch=_int(self.parameters["max_num_seqs"]),
            per_request_processors=not is_greedy,
            # Our own bound (max_pending_requests) refuses requests before they get here.
            max_queue_size=0,
        )
        manager = engine.model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=batching
        )
        # Builds the batch processor, with its KV cache, here rather than on the first
        # request (and captures CUDA graphs where they are used): a load or a wake returns
        # with the engine ready to serve at full speed.
        manager.warmup()
        manager.start()
        return manager

    async def _sleep_engine(self) -> None:
        engine = self._engine
        if engine is not None:
            await self.run_blocking(self._sleep_sync, engine)

    def _sleep_sync(self, engine: _Engine) -> None:
        _stop_managers(engine, hard=False)
        if engine.device.type == "cuda":
            engine.model.to("cpu")
            gc.collect()
            engine.torch.cuda.empty_cache()

    async def _wake_engine(self) -> None:
        engine = self._engine
        if engine is None:
            raise EngineDeadError(f"model '{self.name}' has no engine")
        if engine.device.type == "cuda":
            await self.run_blocking(engine.model.to, engine.device)
        await self._manager(is_greedy=True)

    def _free_engine(self) -> None:
        """Stop the managers (failing what still runs), drop the model, empty CUDA's cache."""
        engine, self._engine = self._engine, None
        self._tokenizer = None
        if engine is None:
            return
        _stop_managers(engine, hard=True)
        torch, device = engine.torch, engine.device
        del engine
        if device.type == "cuda":
            # Parameters can sit in reference cycles; collect before the caching allocator
            # hands its free blocks back to the driver. (On a CPU the memory is plain heap.)
            gc.collect()
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()

    def _forget_engine(self) -> None:
        super()._forget_engine()
        self._engine = None

    # ---- generation ----

    async def _stream(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncGenerator[Delta, None]:
        manager = await self._manager(is_greedy=params.is_greedy)
        engine = self._engine
        if engine is None:
            raise EngineDeadError(f"model '{self.name}' has no engine")
        timeout_s = float(self.parameters["token_timeout_s"] or 0)
        slot = _Slot()
        self._slots[request_id] = slot
        # Registered before the request is added: an output that came first would go to the
        # manager's shared queue, where nobody reads it.
        manager.register_result_handler(request_id, slot.put)
        processors = (
            {}
            if params.is_greedy
            else {"temperature": float(params.temperature), "top_p": float(params.top_p)}
        )
        try:
            added = manager.add_request(
                prompt_ids,
                request_id=request_id,
                max_new_tokens=params.max_tokens,
                streaming=True,
                eos_token_id=sorted(engine.eos_ids) or -1,
                **processors,
            )
            if added is None:
                raise EngineDeadError(f"the engine of '{self.name}' refuses requests")
            detokenizer = IncrementalDetokenizer(self._tokenizer, prompt_ids)
            stops = StopStrings(params.stop)
            seen = 0
            while True:
                try:
                    output = await slot.next(timeout_s)
                except TimeoutError:
                    raise InternalError(
                        f"no token from '{self.name}' for {timeout_s:.0f} s"
                    ) from None
                if output is None:
                    yield Delta("", 0, "abort")
                    return
                if output.error is not None:
                    if self.is_dead:
                        raise EngineDeadError(f"the engine of '{self.name}' failed: {output.error}")
                    raise InternalError(f"generation failed: {output.error}")
                tokens = list(output.generated_tokens)
                new, seen = tokens[seen:], len(tokens)
                is_finished = bool(output.is_finished())
                text = detokenizer.add(new)
                if is_finished:
                    text += detokenizer.flush()
                text = stops.feed(text, is_last=is_finished)
                if stops.is_stopped:
                    # The engine would go on to max_tokens: the stop string is ours.
                    manager.cancel_request(request_id)
                    yield Delta(text, len(new), "stop")
                    return
                if is_finished:
                    yield Delta(text, len(new), self._finish_reason(tokens, engine))
                    return
                if new or text:
                    yield Delta(text, len(new))
        finally:
            self._slots.pop(request_id, None)
            _forget_handler(manager, request_id)

    @staticmethod
    def _finish_reason(tokens: list[int], engine: _Engine) -> FinishReason:
        return "stop" if tokens and tokens[-1] in engine.eos_ids else "length"

    async def _abort_engine(self, request_id: str) -> None:
        slot = self._slots.get(request_id)
        if slot is not None:
            slot.abort()
        engine = self._engine
        if engine is None:
            return
        for manager in engine.managers.values():
            # Cancelling a request a manager does not hold is a no-op there.
            manager.cancel_request(request_id)
            _forget_handler(manager, request_id)

    def load_counts(self) -> EngineLoad:
        engine = self._engine
        running = waiting = 0
        if engine is not None:
            for manager in list(engine.managers.values()):
                processor = manager.batch_processor
                waiting += manager.input_queue.qsize()
                if processor is not None:
                    running += len(processor.scheduler.active_requests)
                    waiting += len(processor.scheduler.waiting_requests)
        return EngineLoad(running=running, waiting=waiting)

    @property
    def is_dead(self) -> bool:
        engine = self._engine
        if engine is None:
            return False
        return any(
            m.background_thread_status.fatal_error is not None for m in engine.managers.values()
        )


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """End-of-sequence ids: the model's generation config, else the tokenizer's."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is None:
        configured = tokenizer.eos_token_id
    if configured is None:
        return frozenset()
    if isinstance(configured, int):
        return frozenset({configured})
    return frozenset(int(i) for i in configured)


def _stop_managers(engine: _Engine, *, hard: bool) -> None:
    managers = list(engine.managers.values())
    engine.managers.clear()
    for manager in managers:
        try:
            manager.stop(block=True, timeout=_STOP_TIMEOUT_S, hard_stop=hard)
            manager.destroy()
        except Exception:
            # Free the others (and the weights) even if one manager fails to stop.
            logger.exception("stopping a continuous batching manager failed")


def _forget_handler(manager: Any, request_id: str) -> None:
    # The router drops a handler by itself only after a finished output; an aborted or
    # abandoned request would leave its handler behind for ever.
    manager.output_router.result_handlers.pop(request_id, None)


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value
