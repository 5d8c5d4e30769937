"""DirectML tensor data types, flags and the scalar union, with their numpy and ONNX mappings.

Enum values are DirectML.h's, so a desc written here means the same thing to a DML runtime.
"""
from __future__ import annotations

import enum
import struct
from typing import Any

import numpy as np
import numpy.typing as npt
from onnx import TensorProto

from dmlgraph.errors import DmlgraphError
from dmlgraph.ir.frozen import Frozen

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


class DmlDataType(enum.IntEnum):
    """DML_TENSOR_DATA_TYPE."""

    UNKNOWN = 0
    FLOAT32 = 1
    FLOAT16 = 2
    UINT32 = 3
    UINT16 = 4
    UINT8 = 5
    INT32 = 6
    INT16 = 7
    INT8 = 8
    FLOAT64 = 9
    UINT64 = 10
    INT64 = 11

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(_NUMPY[self])

    @property
    def element_size(self) -> int:
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        return self in (DmlDataType.FLOAT16, DmlDataType.FLOAT32, DmlDataType.FLOAT64)

    @classmethod
    def from_numpy(cls, dtype: npt.DTypeLike) -> "DmlDataType":
        dt = np.dtype(dtype)
        if dt == np.bool_:
            return cls.UINT8
        for member, name in _NUMPY.items():
            if np.dtype(name) == dt:
                return member
        raise DmlgraphError(f"numpy dtype {dt} has no DirectML data type "
                            f"(supported: {', '.join(m.name for m in _NUMPY)})")

    @classmethod
    def from_onnx(cls, elem_type: int) -> "DmlDataType":
        try:
            return _FROM_ONNX[elem_type]
        except KeyError:
            name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else str(elem_type)
            raise DmlgraphError(f"ONNX type {name} has no DirectML data type") from None


class DmlTensorFlags(enum.IntFlag):
    """DML_TENSOR_FLAGS."""

    NONE = 0
    OWNED_BY_DML = 1


_NUMPY = {
    DmlDataType.FLOAT32: "float32", DmlDataType.FLOAT16: "float16", DmlDataType.FLOAT64: "float64",
    DmlDataType.UINT32: "uint32", DmlDataType.UINT16: "uint16", DmlDataType.UINT8: "uint8",
    DmlDataType.UINT64: "uint64", DmlDataType.INT32: "int32", DmlDataType.INT16: "int16",
    DmlDataType.INT8: "int8", DmlDataType.INT64: "int64",
}

_FROM_ONNX: dict[int, DmlDataType] = {
    TensorProto.FLOAT: DmlDataType.FLOAT32, TensorProto.FLOAT16: DmlDataType.FLOAT16,
    TensorProto.DOUBLE: DmlDataType.FLOAT64, TensorProto.UINT32: DmlDataType.UINT32,
    TensorProto.UINT16: DmlDataType.UINT16, TensorProto.UINT8: DmlDataType.UINT8,
    TensorProto.UINT64: DmlDataType.UINT64, TensorProto.INT32: DmlDataType.INT32,
    TensorProto.INT16: DmlDataType.INT16, TensorProto.INT8: DmlDataType.INT8,
    TensorProto.INT64: DmlDataType.INT64,
    # ONNX bool is one byte of 0/1: DML carries it as UINT8.
    TensorProto.BOOL: DmlDataType.UINT8,
}

# The 11 data types DIAGONAL_MATRIX1 supports (its spec page's table), in DirectML.h order.
ALL_TYPES: tuple[DmlDataType, ...] = tuple(_NUMPY)


def onnx_type_name(elem_type: int) -> str:
    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"<unknown elem_type {elem_type}>"


def bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape, dtype and bits (so -0.0 != 0.0 and NaN payloads count)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        u = np.dtype(f"u{a.dtype.itemsize}")
        return np.array_equal(np.ascontiguousarray(a).view(u), np.ascontiguousarray(b).view(u))
    return np.array_equal(a, b)


class ScalarUnion(Frozen):
    """DML_SCALAR_UNION: 8 bytes, read as `data_type` (float16 carried as its 16 bits).

    Built with `ScalarUnion.of(value, data_type)`, which refuses a value the type cannot hold
    (so Value never wraps or rounds silently, except float narrowing, which is IEEE rounding).
    """

    data_type: DmlDataType
    raw: bytes  # 8 bytes, little-endian, value in the low bytes

    def __init__(self, data_type: DmlDataType, raw: bytes) -> None:
        self.__dict__.update(data_type=data_type, raw=raw)

    @classmethod
    def of(cls, value: Any, data_type: DmlDataType) -> "ScalarUnion":
        data_type = DmlDataType(data_type)
        dt = data_type.numpy
        if isinstance(value, (np.generic, np.ndarray)):
            value = np.asarray(value).item()
        if isinstance(value, bool):
            value = int(value)
        if data_type.is_float:
            try:
                fv = float(value)
            except (TypeError, ValueError):
                raise DmlgraphError(f"Value {value!r} is not a number for {data_type.name}") from None
            with np.errstate(over="ignore"):
                cast = dt.type(fv)
            if np.isinf(cast) and np.isfinite(fv):
                raise DmlgraphError(f"Value {value!r} overflows {data_type.name} (max {np.finfo(dt).max})")
            encoded = cast.tobytes()
        else:
            if isinstance(value, float):
                if not value.is_integer():
                    raise DmlgraphError(f"Value {value!r} is not an integer, so it does not fit {data_type.name}")
                value = int(value)
            if not isinstance(value, int):
                raise DmlgraphError(f"Value {value!r} is not an integer for {data_type.name}")
            info = np.iinfo(dt)
            if not info.min <= value <= info.max:
                raise DmlgraphError(f"Value {value} does not fit {data_type.name} "
                                    f"(range {info.min}..{info.max})")
            encoded = np.array(value, dtype=dt).tobytes()
        return cls(data_type, encoded.ljust(8, b"\0"))

    @property
    def value(self) -> int | float:
        """The Python value (float or int) the union holds."""
        dt = self.data_type.numpy
        return np.frombuffer(self.raw[: dt.itemsize], dtype=dt)[0].item()

    @property
    def numpy_value(self) -> np.generic:
        dt = self.data_type.numpy
        return np.frombuffer(self.raw[: dt.itemsize], dtype=dt)[0]

    @property
    def bits(self) -> int:
        """The union's 8 bytes as an unsigned 64-bit integer (what a DML caller memcpy's)."""
        return struct.unpack("<Q", self.raw)[0]

    def __repr__(self) -> str:
        return f"ScalarUnion({self.value!r}, {self.data_type.name})"
