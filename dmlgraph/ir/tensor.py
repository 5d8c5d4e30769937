"""DML_BUFFER_TENSOR_DESC: sizes, strides, byte size and alignment, validated as the spec says.

A desc is also how the kernels see memory: `view(buffer, desc)` turns a flat byte buffer plus
sizes/strides into a numpy strided view, so zero strides broadcast and padded rows are honoured.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import numpy as np

from dmlgraph.errors import DmlgraphError
from dmlgraph.ir.dtypes import DmlDataType, DmlTensorFlags
from dmlgraph.ir.frozen import Frozen

MAX_DIMENSIONS = 8
MAX_ELEMENTS = 2**32 - 1
MIN_BUFFER_ALIGNMENT = 16  # buffers are always at least 16-byte aligned (spec)


class DescError(DmlgraphError):
    """A tensor or operator desc breaks a rule of the DirectML spec."""


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def packed_strides(sizes: Iterable[int]) -> tuple[int, ...]:
    """Strides (in elements) of a contiguous row-major tensor."""
    strides: list[int] = []
    acc = 1
    for s in reversed(tuple(sizes)):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def calc_buffer_tensor_size(data_type: DmlDataType, sizes: Iterable[int], strides: Iterable[int] | None = None) -> int:
    """DMLCalcBufferTensorSize: minimum bytes of the buffer holding a tensor, rounded up to 4."""
    elem = DmlDataType(data_type).element_size
    sizes = tuple(int(s) for s in sizes)
    if strides is None:
        n = int(np.prod(sizes, dtype=object))
    else:
        n = sum((s - 1) * st for s, st in zip(sizes, strides)) + 1
    return _round_up(n * elem, 4)


class BufferTensorDesc(Frozen):
    """DML_BUFFER_TENSOR_DESC. `total_bytes` defaults to DMLCalcBufferTensorSize."""

    data_type: DmlDataType
    sizes: tuple[int, ...]
    strides: tuple[int, ...] | None
    total_bytes: int | None  # never None once built
    alignment: int  # GuaranteedBaseOffsetAlignment; 0 = none guaranteed
    flags: DmlTensorFlags

    def __init__(self, data_type: DmlDataType, sizes: tuple[int, ...], strides: tuple[int, ...] | None = None,
                 total_bytes: int | None = None, alignment: int = 0, flags: DmlTensorFlags = DmlTensorFlags.NONE
                 ) -> None:
        self.__dict__.update(data_type=DmlDataType(data_type), sizes=tuple(int(s) for s in sizes),
                             strides=None if strides is None else tuple(int(s) for s in strides),
                             total_bytes=total_bytes, alignment=alignment, flags=DmlTensorFlags(flags))
        if total_bytes is None:
            self._validate_shape()
            self.__dict__["total_bytes"] = calc_buffer_tensor_size(self.data_type, self.sizes, self.strides)
        self.validate()

    @property
    def dimension_count(self) -> int:
        return len(self.sizes)

    @property
    def element_count(self) -> int:
        return int(np.prod(self.sizes, dtype=object))

    @property
    def effective_strides(self) -> tuple[int, ...]:
        return self.strides if self.strides is not None else packed_strides(self.sizes)

    @property
    def min_bytes(self) -> int:
        return calc_buffer_tensor_size(self.data_type, self.sizes, self.strides)

    def _validate_shape(self) -> None:
        n = len(self.sizes)
        if not 1 <= n <= MAX_DIMENSIONS:
            raise DescError(f"DimensionCount is {n}: a buffer tensor has 1 to {MAX_DIMENSIONS} dimensions")
        if any(s == 0 for s in self.sizes):
            raise DescError(f"Sizes {list(self.sizes)} contain a zero: a size of zero in any dimension "
                            "is invalid in DirectML")
        if any(s < 0 or s > 0xFFFFFFFF for s in self.sizes):
            raise DescError(f"Sizes {list(self.sizes)}: each size is a UINT (0 < size <= 2^32-1)")
        if self.element_count > MAX_ELEMENTS:
            raise DescError(f"Sizes {list(self.sizes)} hold {self.element_count} elements: a buffer tensor "
                            f"holds at most 2^32-1 ({MAX_ELEMENTS})")
        if self.strides is not None:
            if len(self.strides) != n:
                raise DescError(f"Strides {list(self.strides)} has {len(self.strides)} entries "
                                f"but Sizes has {n}: they must match DimensionCount")
            if any(s < 0 or s > 0xFFFFFFFF for s in self.strides):
                raise DescError(f"Strides {list(self.strides)}: each stride is a UINT number of elements")

    def validate(self) -> None:
        """Raise DescError naming the field and the rule if this desc breaks the spec."""
        self._validate_shape()
        if self.data_type == DmlDataType.UNKNOWN:
            raise DescError("DataType is UNKNOWN: a buffer tensor needs a concrete data type")
        if int(self.flags) & ~int(DmlTensorFlags.OWNED_BY_DML):  # IntFlag ~ drops unknown bits
            raise DescError(f"Flags {int(self.flags)}: only NONE (0) and OWNED_BY_DML (1) exist")
        total = cast(int, self.total_bytes)  # None only before __post_init__ sets it
        if total < self.min_bytes:
            raise DescError(f"TotalTensorSizeInBytes {self.total_bytes} is below the minimum "
                            f"{self.min_bytes} that DMLCalcBufferTensorSize gives for sizes "
                            f"{list(self.sizes)} and strides {self.strides and list(self.strides)}")
        if total > 2**64 - 1:
            raise DescError("TotalTensorSizeInBytes does not fit UINT64")
        a = self.alignment
        if a:
            if a & (a - 1):
                raise DescError(f"GuaranteedBaseOffsetAlignment {a} is not a power of two")
            if a < self.data_type.element_size:
                raise DescError(f"GuaranteedBaseOffsetAlignment {a} is below the element size "
                                f"{self.data_type.element_size} of {self.data_type.name}")
        elif a < 0:
            raise DescError(f"GuaranteedBaseOffsetAlignment {a} is negative")

    @classmethod
    def packed(cls, data_type: DmlDataType, sizes: Iterable[int], alignment: int = 0) -> "BufferTensorDesc":
        return cls(data_type, tuple(sizes), None, None, alignment)

    @classmethod
    def broadcast_scalar(cls, data_type: DmlDataType, sizes: Iterable[int]) -> "BufferTensorDesc":
        """One element seen at every coordinate: all strides zero (the spec's broadcast)."""
        return cls(data_type, tuple(sizes), (0,) * len(tuple(sizes)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "data_type": self.data_type.name,
            "flags": int(self.flags),
            "sizes": list(self.sizes),
            "strides": None if self.strides is None else list(self.strides),
            "total_bytes": int(cast(int, self.total_bytes)),
            "alignment": int(self.alignment),
        }


def view(buffer: np.ndarray, desc: BufferTensorDesc) -> np.ndarray:
    """A strided numpy view of `buffer` (any array owning >= desc.total_bytes bytes) through `desc`.

    Writes through the view land in `buffer`, so a kernel writing to the view honours padded
    output strides. Zero strides give a read-only broadcast view.
    """
    flat = buffer.reshape(-1).view(np.uint8) if buffer.flags.c_contiguous else None
    if flat is None:
        raise DescError("the buffer behind a tensor desc must be C-contiguous memory")
    if flat.nbytes < cast(int, desc.total_bytes):
        raise DescError(f"buffer holds {flat.nbytes} bytes but the desc's TotalTensorSizeInBytes is "
                        f"{desc.total_bytes}")
    dt = desc.data_type.numpy
    item = dt.itemsize
    typed = flat[: flat.nbytes // item * item].view(dt)
    byte_strides = tuple(s * item for s in desc.effective_strides)
    writeable = all(s != 0 for s, n in zip(desc.effective_strides, desc.sizes) if n > 1)
    return np.lib.stride_tricks.as_strided(typed, shape=desc.sizes, strides=byte_strides,
                                           writeable=writeable)
