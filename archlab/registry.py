"""A name -> class table per registry family; unknown names list the choices."""

from __future__ import annotations

from typing import Callable, Generic, Optional, Protocol, Sequence, TypeVar

from archlab.errors import ConfigError

E = TypeVar("E")
E_co = TypeVar("E_co", covariant=True)


class Registry(Generic[E]):
    """Maps a config name (e.g. ``"rope"``) to the class that implements it: ``Registry[type[Norm]]``.

    ``field`` is the config path of the name (``"model.position.kind"``), used in error messages.
    ``base`` is the family's base class, which declares its interface (``archlab.nn``'s families): an
    entry that does not derive from it is refused. A family with no base class names the attributes
    every entry must have in ``members`` instead (the tokenizers).
    """

    def __init__(self, field: str, members: Sequence[str] = (), base: Optional[type] = None):
        self.field = field
        self.members = tuple(members)
        self.base = base
        self._entries: dict[str, E] = {}

    def register(self, name: str) -> Callable[[E], E]:
        def add(entry: E) -> E:
            if name in self._entries:
                raise ValueError(f"{self.field}: {name!r} is registered twice")
            if self.base is not None and not (isinstance(entry, type) and issubclass(entry, self.base)):
                raise TypeError(
                    f"{self.field}: {name!r} is {entry!r}, not a subclass of {self.base.__qualname__}, "
                    "the family's interface"
                )
            missing = [m for m in self.members if not hasattr(entry, m)]
            if missing:
                raise TypeError(f"{self.field}: {name!r} lacks {', '.join(missing)}")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: object) -> E:
        """The entry named ``name``; any other value (a name not registered, or not a string: a recorded
        spec without its ``kind``) is a ``ConfigError`` listing the names."""
        if not isinstance(name, str) or name not in self._entries:
            raise ConfigError(self.field, name, f"one of {sorted(self._entries)}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


class Lookup(Protocol[E_co]):
    """What reading a registry needs (``get``): a ``Registry[type[Norm]]`` is a ``Lookup[type[Component]]``,
    so registries of several families fit in one table."""

    def get(self, name: object) -> E_co: ...
