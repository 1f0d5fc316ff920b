"""transformers behind :class:`~runtimes.llm.base.LLMRuntime`, on CPU or GPU.

The version folder is a Hugging Face causal LM (``config.json``, ``*.safetensors``, the
tokenizer files). The engine (:mod:`runtimes.llm.hf_engine`: transformers' own continuous
batching, its scheduler, its paged KV cache, its generation thread) runs in a process of its
own (:mod:`runtimes.llm.engine_process`), so that the server's event loop and the engine
never wait for each other's interpreter lock. This module keeps the tokenizer: it encodes
prompts, sends token ids, receives each step's new tokens and turns them into text deltas.

Sleep stops the engine's managers (their KV caches and batch state are freed) and, on CUDA,
moves the weights to host memory; wake moves them back. Unload stops the process, which gives
all of its memory back. Parameters beyond the common ones: ``kv_cache_tokens`` (KV cache size
in tokens), ``page_size`` (tokens per cache page) and ``max_batch_tokens`` (tokens in one
forward pass; longer prompts are prefilled in chunks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Any, Final

from runtimes.errors import EngineDeadError, InternalError
from runtimes.llm.base import LLMRuntime
from runtimes.llm.engine_process.client import EngineProcess, EngineProcessError
from runtimes.llm.engine_process.messages import CallName
from runtimes.llm.hf_engine import EngineInfo, EngineLoadError, TokenUpdate, check_folder
from runtimes.llm.parameters import COMMON, Option
from runtimes.llm.text import IncrementalDetokenizer, StopStrings
from runtimes.sampling import Delta, EngineLoad, FinishReason, SamplingParams

logger = logging.getLogger(__name__)

_START_TIMEOUT_S: Final = 600.0
"""How long the engine process may take to start and load the weights."""

_CALL_TIMEOUT_S: Final = 120.0
"""How long a sleep or a wake may take in the engine process."""

OPTIONS: Final[Mapping[str, Option]] = {
    **COMMON,
    "kv_cache_tokens": Option(int, 16384, "KV cache size in tokens", minimum=16),
    "page_size": Option(int, 32, "tokens per KV cache page", minimum=4),
    "max_batch_tokens": Option(int, 512, "tokens in one forward pass", minimum=16),
}


class _Slot:
    """The updates of one request not consumed yet."""

    def __init__(self) -> None:
        self._updates: deque[TokenUpdate] = deque()
        self._event = asyncio.Event()
        self.is_aborted = False

    def put(self, update: TokenUpdate) -> None:
        self._updates.append(update)
        self._event.set()

    def abort(self) -> None:
        self.is_aborted = True
        self._event.set()

    async def next(self, timeout_s: float) -> list[TokenUpdate] | None:
        """The updates since the last call, once there are some; None once aborted.

        Raises TimeoutError after ``timeout_s`` without one (0: no limit).
        """
        async with asyncio.timeout(timeout_s or None):
            await self._event.wait()
        self._event.clear()
        if self.is_aborted:
            return None
        updates = list(self._updates)
        self._updates.clear()
        return updates


class TransformersRuntime(LLMRuntime):
    """Serves a Hugging Face causal LM with transformers' continuous batching."""

    kind = "transformers"
    engine_label = "transformers"
    engine_options = OPTIONS

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._process: EngineProcess | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._slots: dict[str, _Slot] = {}

    # ---- load, sleep, wake, free ----

    async def _load_engine(self, model_dir: Path, device: str) -> None:
        try:
            check_folder(model_dir)
        except EngineLoadError as exc:
            raise self.load_error(str(exc)) from None
        self._tokenizer = await self.run_blocking(self._load_tokenizer, model_dir)
        try:
            process, info = await EngineProcess.start(
                model_dir,
                device,
                self.parameters,
                fallback_eos_ids=_tokenizer_eos(self._tokenizer),
                on_updates=self._on_updates,
                on_exit=self._on_engine_exit,
                timeout_s=_START_TIMEOUT_S,
                spares=self.llm_options.spare_engines,
            )
        except (EngineProcessError, TimeoutError) as exc:
            self._tokenizer = None
            raise self.load_error(str(exc) or "the engine process did not start in time") from None
        self._process = process
        self._apply(info)
        logger.info(
            "engine process %d serves %s version %s",
            process.pid,
            self.name,
            self.version,
            extra={"model": self.name, "version": self.version},
        )

    def _load_tokenizer(self, model_dir: Path) -> Any:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise self.load_error(
                "transformers and torch are not installed; pip install 'zeroserve[llm,torch]'"
            ) from exc
        try:
            return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        except Exception as exc:
            raise self.load_error(f"transformers cannot load {model_dir.name}: {exc}") from exc

    def _apply(self, info: EngineInfo) -> None:
        self.max_model_len = info.max_model_len
        self._eos_ids = info.eos_ids

    async def _sleep_engine(self) -> None:
        await self._call("sleep")

    async def _wake_engine(self) -> None:
        await self._call("wake")

    async def _call(self, name: CallName) -> None:
        process = self._process
        if process is None:
            raise EngineDeadError(f"model '{self.name}' has no engine")
        try:
            await process.call(name, timeout_s=_CALL_TIMEOUT_S)
        except EngineProcessError as exc:
            raise EngineDeadError(f"the engine of '{self.name}': {exc}") from exc

    def _free_engine(self) -> None:
        """Stop the engine process (blocking: it frees the weights, then exits)."""
        process, self._process = self._process, None
        self._tokenizer = None
        if process is not None:
            process.close()

    def _forget_engine(self) -> None:
        super()._forget_engine()
        self._process = None

    # ---- generation ----

    async def _stream(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncGenerator[Delta, None]:
        process = self._process
        if process is None:
            raise EngineDeadError(f"model '{self.name}' has no engine")
        timeout_s = float(self.parameters["token_timeout_s"] or 0)
        slot = _Slot()
        self._slots[request_id] = slot
        try:
            try:
                process.add(
                    request_id,
                    prompt_ids,
                    max_new_tokens=_int(params.max_tokens),
                    temperature=float(params.temperature),
                    top_p=float(params.top_p),
                )
            except EngineProcessError as exc:
                raise EngineDeadError(f"the engine of '{self.name}': {exc}") from exc
            detokenizer = IncrementalDetokenizer(self._tokenizer, prompt_ids)
            stops = StopStrings(params.stop)
            last_token: int | None = None
            while True:
                try:
                    updates = await slot.next(timeout_s)
                except TimeoutError:
                    raise InternalError(
                        f"no token from '{self.name}' for {timeout_s:.0f} s"
                    ) from None
                if updates is None:
                    yield Delta("", 0, "abort")
                    return
                new: list[int] = []
                is_finished = False
                for update in updates:
                    if update.error is not None:
                        if self.is_dead:
                            raise EngineDeadError(
                                f"the engine of '{self.name}' failed: {update.error}"
                            )
                        raise InternalError(f"generation failed: {update.error}")
                    new.extend(update.tokens)
                    is_finished = is_finished or update.is_finished
                if new:
                    last_token = new[-1]
                text = detokenizer.add(new)
                if is_finished:
                    text += detokenizer.flush()
                text = stops.feed(text, is_last=is_finished)
                if stops.is_stopped:
                    # The engine would go on to max_tokens: the stop string is ours.
                    with contextlib.suppress(EngineProcessError):
                        process.cancel(request_id)
                    yield Delta(text, len(new), "stop")
                    return
                if is_finished:
                    reason: FinishReason = "stop" if last_token in self._eos_ids else "length"
                    yield Delta(text, len(new), reason)
                    return
                if new or text:
                    yield Delta(text, len(new))
        finally:
            self._slots.pop(request_id, None)

    def _on_updates(self, updates: list[TokenUpdate]) -> None:
        for update in updates:
            slot = self._slots.get(update.request_id)
            if slot is not None:
                slot.put(update)

    def _on_engine_exit(self, reason: str) -> None:
        logger.error(
            "the engine of %s version %s is gone: %s",
            self.name,
            self.version,
            reason,
            extra={"model": self.name, "version": self.version},
        )
        for request_id, slot in list(self._slots.items()):
            slot.put(TokenUpdate(request_id, (), True, reason))

    async def _abort_engine(self, request_id: str) -> None:
        slot = self._slots.get(request_id)
        if slot is not None:
            slot.abort()
        process = self._process
        if process is not None and process.death is None:
            with contextlib.suppress(EngineProcessError):  # died meanwhile: nothing to cancel
                process.cancel(request_id)

    def load_counts(self) -> EngineLoad:
        process = self._process
        running, waiting = process.load if process is not None else (0, 0)
        return EngineLoad(running=running, waiting=waiting)

    @property
    def is_dead(self) -> bool:
        process = self._process
        return process is not None and process.death is not None


def _tokenizer_eos(tokenizer: Any) -> frozenset[int]:
    configured = getattr(tokenizer, "eos_token_id", None)
    if configured is None:
        return frozenset()
    if isinstance(configured, int):
        return frozenset({configured})
    return frozenset(int(i) for i in configured)


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value
