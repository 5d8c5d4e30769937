"""dmlgraph.ir.frozen.Frozen keeps what the frozen dataclasses it replaced gave: value equality and
hash within a class, read-only fields, the dataclass repr, pickling."""
import dataclasses
import pickle

import numpy as np
import pytest

from dmlgraph.passes.symbolic import Band, Clamp, Lin


def test_equal_and_hashed_by_fields_within_a_class():
    a, b = Lin((("S", 2),), 1), Lin((("S", 2),), 1)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Lin((("S", 2),), 2) and a != Lin((("T", 2),), 1)
    assert Clamp(Lin.of(0), 0, None) != Lin.of(0) and Lin.of(0) != (Lin.of(0).terms, 0)
    assert {Clamp(a, 0, 5): 1}[Clamp(b, 0, 5)] == 1


def test_fields_are_read_only():
    a = Lin.of(3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.const = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del a.const
    assert a.const == 3


def test_repr_and_pickle_as_the_dataclass():
    band = Band(np.dtype(np.float32), (Lin.sym("S"),), (Lin.of(1),), (np.float32(0), np.float32(-np.inf)))
    assert repr(Lin((("S", 1),), 2)) == "Lin(terms=(('S', 1),), const=2)"
    assert repr(Clamp(Lin.of(0), 0, None)) == "Clamp(inner=Lin(terms=(), const=0), lo=0, hi=None)"
    assert pickle.loads(pickle.dumps(band)) == band
