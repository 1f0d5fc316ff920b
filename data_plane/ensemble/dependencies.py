"""Which ensembles use which models: for refusing cycles, and for taking an ensemble out
of service with a model it uses and back in with it, as Triton does.

Triton unloads every ensemble that uses a model being unloaded (they cannot serve
without it) and loads them again when that model is loaded again. A cycle (an ensemble
that uses itself, directly or through others) is refused when the last of its ensembles
loads, with Triton's text.
"""

from __future__ import annotations

from collections.abc import Iterable


class EnsembleCycleError(ValueError):
    """Loading an ensemble would close a cycle of ensembles; the message is Triton's for
    :attr:`ensemble`."""

    def __init__(self, ensemble: str, cycle: tuple[str, ...]) -> None:
        self.ensemble = ensemble
        self.cycle = cycle
        """The ensembles of the cycle, ``ensemble`` first, each using the next, the last
        using ``ensemble``."""
        super().__init__(cycle_text(ensemble, cycle[-1]))

    def seen_from(self, ensemble: str) -> EnsembleCycleError | None:
        """The same cycle as ``ensemble``, one of its members, reports it; None when
        ``ensemble`` is not in it."""
        if ensemble not in self.cycle:
            return None
        start = self.cycle.index(ensemble)
        return EnsembleCycleError(ensemble, self.cycle[start:] + self.cycle[:start])


def cycle_text(ensemble: str, last: str) -> str:
    """Triton's text for a cycle from ``ensemble`` back to it through ``last``."""
    return f"circular dependency between ensembles: {ensemble} -> ... -> {last} -> {ensemble}"


class Dependencies:
    """The models each known ensemble uses, and the ensembles out of service because a
    model they use was unloaded. Not thread-safe: the event loop's alone."""

    def __init__(self) -> None:
        self._uses: dict[str, tuple[str, ...]] = {}
        self._waiting: set[str] = set()

    def declare(self, ensemble: str, composing: Iterable[str]) -> None:
        """``ensemble`` (loading now) uses ``composing``; raises EnsembleCycleError, and
        records nothing, when that closes a cycle through the ensembles declared."""
        uses = tuple(composing)
        path = self._path_back(ensemble, uses)
        if path is not None:
            raise EnsembleCycleError(ensemble, (ensemble, *path))
        self._uses[ensemble] = uses
        self._waiting.discard(ensemble)

    def forget(self, ensemble: str) -> None:
        """``ensemble`` was unloaded on purpose or failed to load: it uses nothing now."""
        self._uses.pop(ensemble, None)
        self._waiting.discard(ensemble)

    def users_of(self, model: str) -> list[str]:
        """The declared ensembles in service or loading that use ``model`` directly, by
        name."""
        return sorted(
            name for name, uses in self._uses.items() if model in uses and name not in self._waiting
        )

    def uses_of(self, ensemble: str) -> tuple[str, ...] | None:
        """The models ``ensemble`` uses; None when it is not declared."""
        return self._uses.get(ensemble)

    def restore(self, ensemble: str, uses: tuple[str, ...] | None) -> None:
        """Put back what :meth:`uses_of` said before a load that failed."""
        if uses is None:
            self.forget(ensemble)
        else:
            self._uses[ensemble] = uses

    def park(self, ensemble: str, uses: tuple[str, ...]) -> None:
        """``ensemble``, which uses ``uses``, went out of service because one of them
        did: it is to be loaded again with that model."""
        self._uses[ensemble] = uses
        self._waiting.add(ensemble)

    def waiting_on(self, model: str) -> list[str]:
        """The ensembles out of service for want of a model, that use ``model``, by name."""
        return sorted(name for name in self._waiting if model in self._uses[name])

    def _path_back(self, ensemble: str, uses: tuple[str, ...]) -> tuple[str, ...] | None:
        """A chain of declared ensembles from one of ``uses`` back to ``ensemble``, the
        ensemble that uses ``ensemble`` last; None when there is none."""
        stack: list[tuple[str, tuple[str, ...]]] = [(model, (model,)) for model in uses]
        seen: set[str] = set()
        while stack:
            model, path = stack.pop()
            if model == ensemble:
                return path[:-1] if len(path) > 1 else path
            if model in seen:
                continue
            seen.add(model)
            for used in self._uses.get(model, ()):
                stack.append((used, (*path, used)))
        return None
