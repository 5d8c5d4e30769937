"""A base for immutable values compared and hashed by their fields, as a frozen dataclass is.

Creating a frozen dataclass compiles five methods from source at import (about 3 M instructions
each, a tenth of the rule modules' import); here the methods are written once and shared. A
subclass writes its `__init__`, which stores the fields in `__dict__` in the order they compare.
"""
from __future__ import annotations

from dataclasses import FrozenInstanceError


class Frozen:
    """Equal when of the same class with equal fields; hashed by the fields; read-only."""

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return tuple(self.__dict__.values()) == tuple(other.__dict__.values())

    def __hash__(self) -> int:
        return hash(tuple(self.__dict__.values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"{self.__class__.__qualname__}({fields})"
