"""The transformers engine itself: weights, continuous batching managers, token updates.

Synchronous and free of asyncio, so that it runs the same in the engine process
(:mod:`runtimes.llm.engine_process`, what the server uses) and called directly in one
process (the benchmark's baseline). Requests go in with :meth:`HFEngine.add`; what each
engine step produced comes out as one :class:`TokenUpdate` batch passed to the ``sink`` on the
manager's generation thread: a hop through another thread would wait for the interpreter lock
that the generation thread holds, and on a small model cost more than the step.

A manager either samples or takes the argmax for its whole batch (``do_sample``), and it
offers per-request temperature and top_p only when built with non-default ones. So greedy
requests (temperature 0) run on one manager and sampled ones on a second over the same
weights, built on the first sampled request with placeholder values that every request
overrides. transformers keeps one random generator per manager, so ``seed`` cannot be honoured
per request here (vLLM honours it).
"""

from __future__ import annotations

import gc
import logging
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

logger = logging.getLogger(__name__)

_DEVICE: Final = re.compile(r"cpu|cuda:\d+")

STOP_TIMEOUT_S: Final = 30.0
"""How long stopping a manager may wait for its generation thread to exit."""

_PLACEHOLDER_TEMPERATURE: Final = 0.5
_PLACEHOLDER_TOP_P: Final = 0.5
"""Non-default values that make transformers build the per-request temperature and top-p
processors of the sampling manager; every request passes its own values."""


class EngineLoadError(Exception):
    """The folder, the parameters or the device cannot make an engine; the message says why."""


@dataclass(frozen=True, slots=True)
class TokenUpdate:
    """What one engine step gave one request."""

    request_id: str
    tokens: tuple[int, ...]
    """Token ids new since the previous update of this request."""
    is_finished: bool
    error: str | None = None
    """Set when the engine failed the request (``is_finished`` then too)."""


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the server needs to know of a loaded engine."""

    max_model_len: int
    eos_ids: frozenset[int]


Sink = Callable[[list[TokenUpdate]], None]
"""Receives each batch of updates, on a manager's generation thread; must be quick."""


class HFEngine:
    """A Hugging Face causal LM served by transformers' continuous batching.

    Thread-safety: :meth:`add`, :meth:`cancel`, :meth:`sleep`, :meth:`wake` and
    :meth:`close` come from one thread; :meth:`load_counts` from any.
    """

    def __init__(self, model: Any, torch: Any, parameters: Mapping[str, Any], info: EngineInfo):
        self.info = info
        self._model = model
        self._torch = torch
        self._device = model.device
        self._parameters = dict(parameters)
        self._sink: Sink = _discard
        self._managers: dict[bool, Any] = {}
        """is_greedy -> started ContinuousBatchingManager."""
        self._delivery = _Delivery(self)
        self._lock = threading.Lock()
        self._active: dict[str, int] = {}
        """request id -> tokens forwarded so far; only these requests' outputs go out."""

    @classmethod
    def load(
        cls,
        model_dir: Path,
        device: str,
        parameters: Mapping[str, Any],
        *,
        fallback_eos_ids: frozenset[int] = frozenset(),
    ) -> HFEngine:
        """Load ``model_dir`` (safetensors only, nothing downloaded, no remote code).

        ``parameters`` are the runtime's resolved options (``dtype``, ``max_model_len``,
        ``max_num_seqs``, ``kv_cache_tokens``, ``page_size``, ``max_batch_tokens``);
        ``fallback_eos_ids`` (the tokenizer's) apply when the model names none.
        Raises EngineLoadError.
        """
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError as exc:
            raise EngineLoadError(
                "transformers and torch are not installed; pip install 'zeroserve[llm,torch]'"
            ) from exc
        if _DEVICE.fullmatch(device) is None:
            raise EngineLoadError(f"unknown device {device!r}; expected 'cpu' or 'cuda:N'")
        torch_device = torch.device(device)
        if torch_device.type == "cuda" and not torch.cuda.is_available():
            raise EngineLoadError(f"device {device} requested but torch sees no CUDA device")
        check_folder(model_dir)
        dtype = parameters["dtype"]
        if dtype == "auto":
            # Half precision on a CPU is slow or unsupported for many kernels.
            torch_dtype: Any = torch.float32 if torch_device.type == "cpu" else "auto"
        else:
            torch_dtype = getattr(torch, str(dtype))
        try:
            # On a GPU the weights go from the file straight to the device instead of
            # through a host copy as large as the model. On the H200 the time barely moved
            # (3.6 GB: 19.4 -> 18.3 s from a new engine process, bench/gpu_cold_start.py):
            # what the load pays there is the fresh interpreter, which a spare engine saves.
            model: Any = AutoModelForCausalLM.from_pretrained(
                model_dir,
                dtype=torch_dtype,
                use_safetensors=True,
                local_files_only=True,
                device_map=torch_device if torch_device.type == "cuda" else None,
            )
        except Exception as exc:
            raise EngineLoadError(f"transformers cannot load {model_dir.name}: {exc}") from exc
        model = model.to(torch_device).eval()
        configured = parameters["max_model_len"]
        own = getattr(model.config, "max_position_embeddings", None)
        if isinstance(configured, int):
            max_model_len = configured
        elif isinstance(own, int) and own > 0:
            max_model_len = own
        else:
            raise EngineLoadError(
                "the model config has no max_position_embeddings; set max_model_len"
            )
        eos_ids = _eos_ids(model) or fallback_eos_ids
        engine = cls(model, torch, parameters, EngineInfo(max_model_len, eos_ids))
        engine.start()
        return engine

    def set_sink(self, sink: Sink) -> None:
        """Where updates go from now on (before the first :meth:`add`)."""
        self._sink = sink

    def start(self) -> None:
        """Start the greedy manager (a load or a wake ends ready to serve at full speed)."""
        self._manager(is_greedy=True)

    # ---- requests ----

    def add(
        self,
        request_id: str,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
    ) -> None:
        """Start generating; a request the engine refuses gets a finished update with an
        error instead of an exception."""
        is_greedy = temperature == 0.0
        processors = {} if is_greedy else {"temperature": temperature, "top_p": top_p}
        with self._lock:
            self._active[request_id] = 0
        try:
            manager = self._manager(is_greedy=is_greedy)
            # Registered before the request is added: an output that came first would go to
            # the manager's shared queue, where nobody reads it. The router calls the
            # "loop"'s call_soon_threadsafe with each step's outputs; ours runs them there and
            # then (register_result_handler would want a running asyncio loop).
            with manager.output_router._lock:
                manager.output_router.result_handlers[request_id] = (
                    self._delivery.collect,
                    self._delivery,
                )
            added = manager.add_request(
                prompt_ids,
                request_id=request_id,
                max_new_tokens=max_new_tokens,
                streaming=True,
                eos_token_id=sorted(self.info.eos_ids) or -1,
                **processors,
            )
            if added is None:
                raise RuntimeError("the engine refuses requests")
        except Exception as exc:
            with self._lock:
                self._active.pop(request_id, None)
            self._forget(request_id)
            self._sink([TokenUpdate(request_id, (), True, str(exc) or type(exc).__name__)])

    def cancel(self, request_id: str) -> None:
        """Stop a request and drop its further outputs; a no-op for one that ended."""
        with self._lock:
            if self._active.pop(request_id, None) is None:
                return
        for manager in list(self._managers.values()):
            # Cancelling a request a manager does not hold is a no-op there.
            manager.cancel_request(request_id)
        self._forget(request_id)

    def load_counts(self) -> tuple[int, int]:
        """(running, waiting) requests inside the managers now."""
        running = waiting = 0
        for manager in list(self._managers.values()):
            waiting += manager.input_queue.qsize()
            processor = manager.batch_processor
            if processor is not None:
                running += len(processor.scheduler.active_requests)
                waiting += len(processor.scheduler.waiting_requests)
        return running, waiting

    def fatal_error(self) -> str | None:
        """Why a manager's generation thread died, once one did (the engine is useless)."""
        for manager in list(self._managers.values()):
            error = manager.background_thread_status.fatal_error
            if error is not None:
                return f"the engine failed: {error}"
        return None

    # ---- sleep, wake, close ----

    def sleep(self) -> None:
        """Free the KV caches (stop the managers) and, on CUDA, move the weights to host."""
        self._stop_managers(hard=False)
        if self._device.type == "cuda":
            self._model.to("cpu")
            gc.collect()
            self._torch.cuda.empty_cache()

    def wake(self) -> None:
        if self._device.type == "cuda":
            self._model.to(self._device)
        self.start()

    def close(self) -> None:
        """Stop the managers (failing what still runs) and drop the weights."""
        self._stop_managers(hard=True)
        model, self._model = self._model, None
        del model
        if self._device.type == "cuda":
            # Parameters can sit in reference cycles; collect before the caching allocator
            # hands its free blocks back to the driver.
            gc.collect()
            self._torch.cuda.synchronize(self._device)
            self._torch.cuda.empty_cache()

    # ---- managers ----

    def _manager(self, *, is_greedy: bool) -> Any:
        manager = self._managers.get(is_greedy)
        if manager is None:
            manager = self._start_manager(is_greedy)
            self._managers[is_greedy] = manager
        return manager

    def _start_manager(self, is_greedy: bool) -> Any:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        parameters = self._parameters
        page_size = int(parameters["page_size"])
        generation = GenerationConfig(  # type: ignore[no-untyped-call]
            do_sample=not is_greedy,
            max_new_tokens=self.info.max_model_len,
            eos_token_id=sorted(self.info.eos_ids) or None,
        )
        if not is_greedy:
            generation.temperature = _PLACEHOLDER_TEMPERATURE
            generation.top_p = _PLACEHOLDER_TOP_P
        batching = ContinuousBatchingConfig(
            page_size=page_size,
            num_blocks=math.ceil(int(parameters["kv_cache_tokens"]) / page_size),
            max_batch_tokens=int(parameters["max_batch_tokens"]),
            max_requests_per_batch=int(parameters["max_num_seqs"]),
            per_request_processors=not is_greedy,
            # The server's own bound (max_pending_requests) refuses requests before here.
            max_queue_size=0,
        )
        manager = self._model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=batching
        )
        # Builds the batch processor, with its KV cache, here rather than on the first
        # request (and captures CUDA graphs where they are used).
        manager.warmup()
        manager.start()
        return manager

    def _stop_managers(self, *, hard: bool) -> None:
        managers = list(self._managers.values())
        self._managers.clear()
        for manager in managers:
            try:
                manager.stop(block=True, timeout=STOP_TIMEOUT_S, hard_stop=hard)
                manager.destroy()
            except Exception:
                # Free the others (and the weights) even if one manager fails to stop.
                logger.exception("stopping a continuous batching manager failed")
        with self._lock:
            ended = list(self._active)
            self._active.clear()
        if ended:
            self._sink([TokenUpdate(r, (), True, "the engine stopped") for r in ended])

    def _forget(self, request_id: str) -> None:
        # The router drops a handler by itself only for handlers it registered.
        for manager in list(self._managers.values()):
            with manager.output_router._lock:
                manager.output_router.result_handlers.pop(request_id, None)

    def _forward(self, outputs: list[Any]) -> None:
        """Turn one step's cumulative outputs into updates and pass them on."""
        updates = []
        finished = []
        with self._lock:
            for output in outputs:
                seen = self._active.get(output.request_id)
                if seen is None:
                    continue  # cancelled, or one that already ended
                tokens = output.generated_tokens
                is_finished = bool(output.is_finished()) or output.error is not None
                if is_finished:
                    del self._active[output.request_id]
                    finished.append(output.request_id)
                else:
                    self._active[output.request_id] = len(tokens)
                error = None if output.error is None else str(output.error)
                updates.append(
                    TokenUpdate(output.request_id, tuple(tokens[seen:]), is_finished, error)
                )
        for request_id in finished:
            self._forget(request_id)
        if updates:
            self._sink(updates)


class _Delivery:
    """Stands in for the asyncio loop that transformers' output router hands outputs to:
    runs the router's callback at once, on the calling (generation) thread, and passes what
    it collected on as one batch."""

    def __init__(self, engine: HFEngine) -> None:
        self._engine = engine
        # Per thread: the greedy and the sampled manager each deliver from their own.
        self._local = threading.local()

    def collect(self, output: Any) -> None:
        self._local.outputs.append(output)

    def call_soon_threadsafe(self, callback: Callable[..., None], *args: Any) -> None:
        self._local.outputs = []
        callback(*args)
        try:
            self._engine._forward(self._local.outputs)
        except Exception:
            logger.exception("forwarding engine outputs failed")
        finally:
            self._local.outputs = []


def check_folder(model_dir: Path) -> None:
    """Raise EngineLoadError unless ``model_dir`` looks like a Hugging Face model folder."""
    if not (model_dir / "config.json").is_file():
        raise EngineLoadError(f"{model_dir} holds no config.json (a Hugging Face model)")
    if not any(model_dir.glob("*.safetensors")):
        raise EngineLoadError(f"{model_dir} holds no *.safetensors weights")


def _eos_ids(model: Any) -> frozenset[int]:
    """End-of-sequence ids from the model's generation config, else its config."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is None:
        configured = getattr(model.config, "eos_token_id", None)
    if configured is None:
        return frozenset()
    if isinstance(configured, int):
        return frozenset({configured})
    return frozenset(int(i) for i in configured)


def _discard(updates: list[TokenUpdate]) -> None:
    pass
