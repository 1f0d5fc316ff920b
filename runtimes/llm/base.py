"""The LLM runtime interface: streaming generation on one engine, with abort and sleep.

A version folder holds a Hugging Face causal LM (``config.json``, safetensors weights, a
tokenizer with its chat template). The data plane's OpenAI and Triton generate surfaces
tokenize with :meth:`LLMRuntime.encode` / :meth:`LLMRuntime.encode_chat` and stream with
:meth:`LLMRuntime.generate`; V2 infer with a ``text_input`` BYTES tensor reaches
:meth:`LLMRuntime.infer` through the batcher like any other model (Triton's vLLM backend
names: ``text_input``, ``sampling_parameters``, ``exclude_input_in_output`` in,
``text_output`` out).

A generation that stops being consumed before its end (the client left, its task was
cancelled, the consumer closed the stream) is aborted in the engine: its KV cache and batch
slot go to the others at once. :meth:`sleep` refuses new requests, lets those in flight
finish (bounded by ``RuntimeOptions.drain_timeout_s``, then aborts them) and puts the engine
in its sleeping state; :meth:`wake` brings it back without reading the weights again.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import orjson

from foundation.proto import model_config_pb2 as mc
from runtimes.base import ExecutorRuntime, RuntimeCapabilities, RuntimeOptions, RuntimeState
from runtimes.capabilities import Capabilities, GenerationObserver, GenerationRecord
from runtimes.errors import (
    ContextLengthError,
    InvalidArgumentError,
    InvalidParameterError,
    ModelLoadError,
    ModelNotReadyError,
    QueueFullError,
)
from runtimes.llm.options import LLMOptions
from runtimes.llm.parameters import COMMON, Option, ParameterError, read_parameters
from runtimes.sampling import (
    Delta,
    EngineLoad,
    FinishReason,
    SamplingParams,
    sampling_from_mapping,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

TEXT_INPUT = "text_input"
SAMPLING_INPUT = "sampling_parameters"
EXCLUDE_INPUT = "exclude_input_in_output"
TEXT_OUTPUT = "text_output"

INLINE_ENCODE_CHARS = 2048
"""Prompts up to this long are tokenized on the event loop: a fast tokenizer takes tens of
microseconds there, while the hop to the executor and back waits for the interpreter lock
(milliseconds on a busy server)."""

DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` of a completion or V2 infer that names none (OpenAI's and vLLM's value)."""


@dataclass(frozen=True, slots=True)
class Completion:
    """A generation run to its end."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason


class LLMRuntime(ExecutorRuntime):
    """A causal LM engine: tokenize, stream tokens, abort, sleep.

    Thread-safety: every method is called from the event loop. Tokenization and blocking
    engine calls run on the runtime's ``llm-<model>`` executor.
    """

    capabilities = RuntimeCapabilities(can_sleep=True)
    model_filename = "config.json"
    engine_options: ClassVar[Mapping[str, Option]] = COMMON
    """The config ``parameters`` this engine takes."""

    def __init__(
        self,
        *,
        name: str,
        version: int,
        options: RuntimeOptions,
        llm_options: LLMOptions | None = None,
    ) -> None:
        super().__init__(name=name, version=version, options=options)
        self.llm_options = llm_options or LLMOptions()
        self.max_model_len = 0
        """Context window in tokens (prompt plus completion); set by the load."""
        self.observer: GenerationObserver | None = None
        """Told about each generation as it ends; set by the server after the load."""
        self.parameters: dict[str, int | float | bool | str | None] = {}
        self._tokenizer: Any = None
        self._requests: set[str] = set()
        self._drained = asyncio.Event()
        self._drained.set()

    # ---- config and load ----

    @classmethod
    def complete_config(cls, version_dir: Path, config: mc.ModelConfig) -> None:
        """Give the model Triton vLLM backend's tensors and as many instances (concurrent
        V2 infer calls) as the engine decodes sequences at once, unless the config says."""
        if not config.input:
            config.input.add(name=TEXT_INPUT, data_type=mc.TYPE_STRING, dims=[1])
            config.input.add(name=SAMPLING_INPUT, data_type=mc.TYPE_STRING, dims=[1], optional=True)
            config.input.add(name=EXCLUDE_INPUT, data_type=mc.TYPE_BOOL, dims=[1], optional=True)
        if not config.output:
            config.output.add(name=TEXT_OUTPUT, data_type=mc.TYPE_STRING, dims=[-1])
        if not config.instance_group:
            values = read_parameters(config, cls.engine_options)
            max_num_seqs = values["max_num_seqs"]
            assert isinstance(max_num_seqs, int)
            config.instance_group.add(count=max_num_seqs)

    async def load(self, model_dir: Path, config: mc.ModelConfig, device: str) -> None:
        """Build the engine and tokenizer from the HF folder ``model_dir`` on ``device``.

        Raises :class:`ModelLoadError` for unknown or bad ``parameters``, a missing engine
        package, an unusable device and a folder the engine cannot load.
        """
        if self.state is not RuntimeState.NEW:
            raise RuntimeError(f"load() called on a runtime in state {self.state.value}")
        self.state = RuntimeState.LOADING
        try:
            self.parameters = read_parameters(config, self.engine_options)
        except ParameterError as exc:
            self.state = RuntimeState.FAILED
            raise self.load_error(str(exc)) from exc
        executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"llm-{self.name}")
        self._executor = executor
        try:
            await self._load_engine(model_dir, device)
        except BaseException:
            self._executor = None
            executor.shutdown(wait=False, cancel_futures=True)
            self.state = RuntimeState.FAILED
            raise
        self.state = RuntimeState.READY
        logger.info(
            "loaded %s model %s version %s on %s (context %d tokens)",
            self.engine_label,
            self.name,
            self.version,
            device,
            self.max_model_len,
            extra={"model": self.name, "version": self.version, "device": device},
        )

    @abc.abstractmethod
    async def _load_engine(self, model_dir: Path, device: str) -> None:
        """Build the engine; set ``self._tokenizer`` and ``self.max_model_len``.

        ``self._executor`` is set already; blocking work goes there (``self.run_blocking``).
        Raises ModelLoadError; leaves nothing allocated on failure.
        """

    def resolve_capabilities(self) -> Capabilities:
        """Every LLM runtime generates text, sleeps, can die and reports its generations."""
        return Capabilities(generation=self, sleep=self, health=self, generation_metrics=self)

    def load_error(self, reason: str) -> ModelLoadError:
        return ModelLoadError(model=self.name, reason=reason)

    async def run_blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the runtime's executor."""
        executor = self._executor
        if executor is None:
            raise ModelNotReadyError(f"model '{self.name}' version {self.version} is not loaded")
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    # ---- tokens ----

    async def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt (with the tokenizer's special tokens, BOS)."""
        self.check_serving()
        if len(text) <= INLINE_ENCODE_CHARS:
            return self._encode_sync(text, True)
        return await self.run_blocking(self._encode_sync, text, True)

    async def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Token ids of a chat rendered with the tokenizer's template, ready for the reply.

        Raises InvalidParameterError (``messages``) when the model has no chat template or
        the template rejects the messages.
        """
        self.check_serving()
        return await self.run_blocking(self._encode_chat_sync, list(messages))

    async def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (special tokens left out)."""
        self.check_serving()
        return await self.run_blocking(self._decode_sync, list(token_ids))

    def _decode_sync(self, token_ids: list[int]) -> str:
        return str(self._tokenizer.decode(token_ids, skip_special_tokens=True))

    def _encode_sync(self, text: str, special: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=special))

    def _encode_chat_sync(self, messages: list[Mapping[str, Any]]) -> list[int]:
        tokenizer = self._tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidParameterError(
                f"model '{self.name}' has no chat template; use /v1/completions",
                param="messages",
            )
        try:
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # jinja2's TemplateError and whatever a template raises
            raise InvalidParameterError(
                f"the chat template rejected the messages: {exc}", param="messages"
            ) from None
        # The template writes the special tokens (BOS) it wants itself.
        return self._encode_sync(str(text), False)

    def resolve_max_tokens(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """``max_tokens``, or all the context leaves; raises ContextLengthError when the
        prompt and the completion do not fit."""
        limit = self.max_model_len
        wanted = max_tokens if max_tokens is not None else limit - prompt_tokens
        if prompt_tokens + max(wanted, 1) > limit:
            raise ContextLengthError(
                max_model_len=limit, prompt_tokens=prompt_tokens, max_tokens=max(wanted, 1)
            )
        return wanted

    # ---- generation ----

    def check_serving(self) -> None:
        """Raise ModelNotReadyError unless READY (sleeping, loading, unloading, failed)."""
        if self.state is not RuntimeState.READY:
            state = "sleeping" if self.state is RuntimeState.SLEEPING else self.state.value
            raise ModelNotReadyError(
                f"model '{self.name}' version {self.version} is not ready ({state})"
            )

    def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, request_id: str | None = None
    ) -> AsyncGenerator[Delta, None]:
        """Stream the completion of ``prompt_ids``; the last delta has a finish reason.

        Admission is checked here, before the stream starts, so that a caller can still
        answer with a status code: raises ModelNotReadyError when not READY,
        QueueFullError past ``max_pending_requests``, InvalidParameterError for an empty
        prompt or unknown token ids and ContextLengthError. The stream raises
        InternalError (EngineDeadError) when the engine fails. Closing it early
        (``aclose``, or cancelling the task iterating it) aborts the request in the engine.
        """
        self.check_serving()
        max_pending = self.parameters["max_pending_requests"]
        assert isinstance(max_pending, int)
        if len(self._requests) >= max_pending:
            raise QueueFullError(request_id=request_id)
        self.check_prompt(prompt_ids)
        max_tokens = self.resolve_max_tokens(len(prompt_ids), params.max_tokens)
        if params.max_tokens != max_tokens:
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                stop=params.stop,
                seed=params.seed,
            )
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._requests:
            raise InvalidArgumentError(f"request id '{request_id}' is already generating")
        return self._generate(list(prompt_ids), params, request_id)

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """Raise InvalidParameterError (``prompt``) for an empty prompt or unknown ids."""
        if not prompt_ids:
            raise InvalidParameterError("the prompt is empty (no tokens)", param="prompt")
        vocab = len(self._tokenizer) if self._tokenizer is not None else 0
        if vocab and (min(prompt_ids) < 0 or max(prompt_ids) >= vocab):
            raise InvalidParameterError(
                f"token ids must be in [0, {vocab - 1}] for model '{self.name}'", param="prompt"
            )

    async def _generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncGenerator[Delta, None]:
        self._requests.add(request_id)
        self._drained.clear()
        started = time.monotonic()
        last: float | None = None
        first: float | None = None
        gaps: list[float] = []
        tokens = 0
        reason: FinishReason = "abort"
        try:
            async with contextlib.aclosing(self._stream(request_id, prompt_ids, params)) as stream:
                async for delta in stream:
                    if delta.tokens:
                        now = time.monotonic()
                        if first is None:
                            first = now - started
                        elif last is not None:
                            gaps.append(now - last)
                        last = now
                        tokens += delta.tokens
                    if delta.finish_reason is not None:
                        reason = delta.finish_reason
                    yield delta
                    if delta.finish_reason is not None:
                        return
        finally:
            self._requests.discard(request_id)
            if not self._requests:
                self._drained.set()
            if reason == "abort":
                await self._abort_engine(request_id)
            observer = self.observer
            if observer is not None:
                observer(
                    GenerationRecord(
                        prompt_tokens=len(prompt_ids),
                        completion_tokens=tokens,
                        finish_reason=reason,
                        e2e_s=time.monotonic() - started,
                        first_token_s=first,
                        token_gaps_s=tuple(gaps),
                    )
                )

    async def complete(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, request_id: str | None = None
    ) -> Completion:
        """:meth:`generate` run to its end, as one text."""
        parts: list[str] = []
        completion_tokens = 0
        reason: FinishReason = "abort"
        async with contextlib.aclosing(
            self.generate(prompt_ids, params, request_id=request_id)
        ) as stream:
            async for delta in stream:
                parts.append(delta.text)
                completion_tokens += delta.tokens
                if delta.finish_reason is not None:
                    reason = delta.finish_reason
        return Completion("".join(parts), len(prompt_ids), completion_tokens, reason)

    async def abort(self, request_id: str) -> None:
        """End a generation now; its stream ends with finish reason ``abort``."""
        if request_id in self._requests:
            await self._abort_engine(request_id)

    @abc.abstractmethod
    def _stream(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncGenerator[Delta, None]:
        """The engine's deltas for one request (``params.max_tokens`` resolved), ending
        with one that carries the finish reason. Closing it early must leave the engine
        able to abort the request (:meth:`_abort_engine` is called next)."""

    @abc.abstractmethod
    async def _abort_engine(self, request_id: str) -> None:
        """Stop the request in the engine and free what it holds; no-op if it is gone."""

    @abc.abstractmethod
    def load_counts(self) -> EngineLoad:
        """Requests running and waiting in the engine now (cheap: read at every scrape)."""

    @property
    def is_dead(self) -> bool:
        """The engine stopped for good; the server should exit so that it is replaced."""
        return False

    @property
    def in_flight(self) -> int:
        """Generations started through :meth:`generate` and not ended."""
        return len(self._requests)

    # ---- V2 infer ----

    async def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Complete every ``text_input`` element (Triton vLLM backend's contract).

        ``sampling_parameters`` is a JSON object (OpenAI names: max_tokens, temperature,
        top_p, stop, seed; max_tokens defaults to 16); ``text_output`` holds the prompt and
        its completion unless ``exclude_input_in_output`` is true.
        """
        self.check_serving()
        texts = batch.get(TEXT_INPUT)
        if texts is None:
            raise InvalidArgumentError(f"expected inference input '{TEXT_INPUT}'")
        prompts = [_text(item, TEXT_INPUT) for item in texts.reshape(-1).tolist()]
        params = _sampling(batch.get(SAMPLING_INPUT))
        exclude = batch.get(EXCLUDE_INPUT)
        is_excluded = exclude is not None and exclude.size > 0 and bool(exclude.reshape(-1)[0])

        async def one(prompt: str) -> bytes:
            completion = await self.complete(await self.encode(prompt), params)
            text = completion.text if is_excluded else prompt + completion.text
            return text.encode("utf-8")

        results = await asyncio.gather(*(one(p) for p in prompts))
        output = np.empty(len(results), dtype=object)
        output[:] = results
        return {TEXT_OUTPUT: output.reshape(texts.shape)}

    async def unload(self) -> None:
        """Let generations in flight finish (bounded, then abort them), then free the
        engine, the tokenizer and the executor; see :meth:`ModelRuntime.unload`."""
        if self._requests and self.state is RuntimeState.READY:
            self.state = RuntimeState.UNLOADING
            await self._drain("unload")
        await super().unload()

    async def _drain(self, why: str) -> None:
        try:
            async with asyncio.timeout(self.options.drain_timeout_s):
                await self._drained.wait()
        except TimeoutError:
            logger.warning(
                "%d requests of %s still running after %.1f s; aborting them to %s",
                len(self._requests),
                self.name,
                self.options.drain_timeout_s,
                why,
            )
            for request_id in list(self._requests):
                await self._abort_engine(request_id)

    # ---- sleep ----

    async def sleep(self) -> None:
        """Refuse new requests, drain (bounded; then abort), and put the engine to sleep:
        KV cache freed, weights in host memory. Idempotent while sleeping."""
        if self.state is RuntimeState.SLEEPING:
            return
        self.check_serving()
        self.state = RuntimeState.SLEEPING
        started = time.monotonic()
        await self._drain("sleep")
        try:
            await self._sleep_engine()
        except BaseException:
            self.state = RuntimeState.FAILED
            raise
        logger.info(
            "%s model %s version %s asleep in %.3f s",
            self.engine_label,
            self.name,
            self.version,
            time.monotonic() - started,
            extra={"model": self.name, "version": self.version},
        )

    async def wake(self) -> None:
        """Bring a sleeping engine back; it serves as before. Idempotent while READY."""
        if self.state is RuntimeState.READY:
            return
        if self.state is not RuntimeState.SLEEPING:
            self.check_serving()
        started = time.monotonic()
        try:
            await self._wake_engine()
        except BaseException:
            self.state = RuntimeState.FAILED
            raise
        self.state = RuntimeState.READY
        logger.info(
            "%s model %s version %s awake in %.3f s",
            self.engine_label,
            self.name,
            self.version,
            time.monotonic() - started,
            extra={"model": self.name, "version": self.version},
        )

    @abc.abstractmethod
    async def _sleep_engine(self) -> None:
        """Free the KV cache and move the weights to host memory (no request runs)."""

    @abc.abstractmethod
    async def _wake_engine(self) -> None:
        """Undo :meth:`_sleep_engine`; greedy outputs afterwards equal those before."""

    def _forget_engine(self) -> None:
        self._tokenizer = None


def _text(item: Any, name: str) -> str:
    if isinstance(item, bytes):
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgumentError(f"input '{name}' is not valid UTF-8") from None
    if isinstance(item, str):
        return item
    raise InvalidArgumentError(f"input '{name}' must hold text")


def _sampling(tensor: np.ndarray | None) -> SamplingParams:
    if tensor is None or not tensor.size:
        return SamplingParams(max_tokens=DEFAULT_MAX_TOKENS)
    raw = _text(tensor.reshape(-1)[0], SAMPLING_INPUT)
    try:
        doc = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"'{SAMPLING_INPUT}' is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError(f"'{SAMPLING_INPUT}' must be a JSON object")
    return sampling_from_mapping(doc, default_max_tokens=DEFAULT_MAX_TOKENS)
