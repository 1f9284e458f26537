"""A name -> component table per registry family; unknown names list the choices."""

from __future__ import annotations

from typing import Callable, Generic, Sequence, TypeVar

from archlab.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps a config name (e.g. ``"rope"``) to the class that implements it.

    ``field`` is the config path of the name (``"model.position.kind"``), used in error messages;
    ``members`` are the attributes every entry must have (e.g. the Component interface of archlab.nn).
    """

    def __init__(self, field: str, members: Sequence[str] = ()):
        self.field = field
        self.members = tuple(members)
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.field}: {name!r} is registered twice")
            missing = [m for m in self.members if not hasattr(entry, m)]
            if missing:
                raise TypeError(f"{self.field}: {name!r} lacks {', '.join(missing)}")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ConfigError(self.field, name, f"one of {sorted(self._entries)}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
