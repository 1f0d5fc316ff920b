"""Turning token ids into text as they come, and cutting the text at stop strings.

Both run on the event loop: each call decodes a handful of tokens (microseconds in the
Rust tokenizers), so handing them to a thread would cost more than it saves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

_CONTEXT_TOKENS: Final = 6
"""Prompt tokens decoded along with the first generated ones. Tokenizers that drop a leading
space at the start of a decode (SentencePiece) then keep the space a word carries after the
prompt."""

_INCOMPLETE: Final = "\ufffd"
"""What a decode ends with while a multi-byte character is split across tokens."""


class IncrementalDetokenizer:
    """Text of the tokens added so far, returned as deltas.

    Each call decodes a short window twice: from a few tokens back up to the last emitted
    token, and up to the newest one; the difference is the new text. Decoding only that
    window keeps each step cheap, and the overlap gives the tokenizer the context it needs to
    place spaces and join characters split across tokens.
    """

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)

    def add(self, token_ids: Sequence[int]) -> str:
        """The text ``token_ids`` add; empty while a character is still incomplete."""
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith(_INCOMPLETE):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever text is held back (an incomplete character at the very end)."""
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :]

    def _decode(self, ids: list[int]) -> str:
        text: str = self._tokenizer.decode(ids, skip_special_tokens=True)
        return text


class StopStrings:
    """Cuts generated text at the first stop string, holding back what may begin one.

    Text that ends with the start of a stop string is not returned until the next tokens
    show whether the stop string follows, so a stream never shows part of one.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._text = ""
        self._emitted = 0
        self.is_stopped = False

    def feed(self, text: str, *, is_last: bool = False) -> str:
        """The part of everything fed so far that is safe to show now.

        Sets ``is_stopped`` once a stop string appears; the text after it is dropped and
        later calls return nothing.
        """
        if self.is_stopped:
            return ""
        self._text += text
        if not self._stops:
            out = self._text[self._emitted :]
            self._emitted = len(self._text)
            return out
        start = max(0, self._emitted - self._longest + 1)
        found = [i for i in (self._text.find(s, start) for s in self._stops) if i >= 0]
        if found:
            end = min(found)
            self.is_stopped = True
        elif is_last:
            end = len(self._text)
        else:
            end = len(self._text) - self._partial_suffix()
        out = self._text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return out

    def _partial_suffix(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        text = self._text
        for size in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-size:]
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0
