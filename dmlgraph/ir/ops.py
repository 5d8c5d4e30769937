"""Operator descs for DIAGONAL_MATRIX1 and DIAGONAL_MATRIX, and the feature levels that gate them.

A desc validates itself against a feature level's support table (the spec pages' tables), so
"can this node be lowered at level L?" has one answer with one reason.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable

from dmlgraph.ir.dtypes import INT32_MAX, INT32_MIN, DmlDataType, ScalarUnion
from dmlgraph.ir.frozen import Frozen
from dmlgraph.ir.tensor import BufferTensorDesc, DescError

_T = DmlDataType


class FeatureLevel(enum.IntEnum):
    """DML_FEATURE_LEVEL."""

    L1_0 = 0x1000
    L2_0 = 0x2000
    L2_1 = 0x2100
    L3_0 = 0x3000
    L3_1 = 0x3100
    L4_0 = 0x4000
    L4_1 = 0x4100
    L5_0 = 0x5000
    L5_1 = 0x5100
    L5_2 = 0x5200
    L6_0 = 0x6000
    L6_1 = 0x6100
    L6_2 = 0x6200
    L6_3 = 0x6300
    L6_4 = 0x6400

    @property
    def label(self) -> str:
        return self.name[1:]

    @classmethod
    def parse(cls, text: "FeatureLevel | int | str") -> "FeatureLevel":
        """Accept '5_1', '5.1', 'L5_1' or 0x5100."""
        if isinstance(text, FeatureLevel):
            return text
        if isinstance(text, int) and not isinstance(text, bool) and text in {m.value for m in cls}:
            return cls(text)
        key = "L" + str(text).strip().upper().lstrip("L").replace(".", "_")
        try:
            return cls[key]
        except KeyError:
            raise DescError(f"unknown feature level {text!r}; choose one of "
                            f"{', '.join(m.label for m in cls)}") from None


_ALL_11 = frozenset(DmlDataType) - {_T.UNKNOWN}
_NO_64 = _ALL_11 - {_T.FLOAT64, _T.INT64, _T.UINT64}

# DIAGONAL_MATRIX support by level (spec page tables): (min level, dimension counts, data types).
DIAGONAL_MATRIX_SUPPORT = (
    (FeatureLevel.L5_1, range(2, 5), _ALL_11),
    (FeatureLevel.L4_0, range(2, 5), _NO_64),
    (FeatureLevel.L2_1, range(4, 5), _NO_64),
    (FeatureLevel.L2_0, range(4, 5), frozenset({_T.FLOAT32, _T.FLOAT16})),
)
DIAGONAL_MATRIX1_LEVEL = FeatureLevel.L5_1
DIAGONAL_MATRIX1_DIMS = range(2, 5)
DIAGONAL_MATRIX1_TYPES = _ALL_11


def _types(types: Iterable[DmlDataType]) -> str:
    return ", ".join(t.name for t in sorted(types))


class DiagonalMatrix1Desc(Frozen):
    """DML_DIAGONAL_MATRIX1_OPERATOR_DESC.

    out[..., y, x] = value if (end >= begin) ^ (x - y >= begin) ^ (x - y < end)
                     else (input[..., y, x] if input else 0)
    """

    output: BufferTensorDesc
    value: ScalarUnion
    begin: int
    end: int
    input: BufferTensorDesc | None

    def __init__(self, output: BufferTensorDesc, value: ScalarUnion, begin: int, end: int,
                 input: BufferTensorDesc | None = None) -> None:
        self.__dict__.update(output=output, value=value, begin=begin, end=end, input=input)

    name = "DIAGONAL_MATRIX1"

    @property
    def value_data_type(self) -> DmlDataType:
        return self.value.data_type

    def validate(self, level: FeatureLevel = FeatureLevel.L5_1) -> None:
        """Raise DescError with the rule broken; None if the desc is valid at `level`."""
        level = FeatureLevel.parse(level)
        if level < DIAGONAL_MATRIX1_LEVEL:
            raise DescError(f"DIAGONAL_MATRIX1 needs feature level {DIAGONAL_MATRIX1_LEVEL.label}; "
                            f"the target is {level.label}")
        for role, t in (("OutputTensor", self.output), ("InputTensor", self.input)):
            if t is None:
                continue
            if t.dimension_count not in DIAGONAL_MATRIX1_DIMS:
                raise DescError(f"DIAGONAL_MATRIX1 {role} has {t.dimension_count} dimensions; "
                                "it supports 2 to 4")
            if t.data_type not in DIAGONAL_MATRIX1_TYPES:
                raise DescError(f"DIAGONAL_MATRIX1 {role} type {t.data_type.name} is not supported "
                                f"({_types(DIAGONAL_MATRIX1_TYPES)})")
        if self.input is not None:
            if self.input.data_type != self.output.data_type:
                raise DescError(f"DIAGONAL_MATRIX1 InputTensor type {self.input.data_type.name} differs "
                                f"from OutputTensor type {self.output.data_type.name}")
            if self.input.dimension_count != self.output.dimension_count:
                raise DescError("DIAGONAL_MATRIX1 InputTensor and OutputTensor must have the same "
                                f"DimensionCount ({self.input.dimension_count} vs "
                                f"{self.output.dimension_count})")
            if self.input.sizes != self.output.sizes:
                raise DescError(f"DIAGONAL_MATRIX1 InputTensor sizes {list(self.input.sizes)} differ from "
                                f"OutputTensor sizes {list(self.output.sizes)} (broadcast with strides)")
        if self.value.data_type != self.output.data_type:
            raise DescError(f"DIAGONAL_MATRIX1 ValueDataType {self.value.data_type.name} must equal the "
                            f"OutputTensor type {self.output.data_type.name}")
        for field, v in (("DiagonalFillBegin", self.begin), ("DiagonalFillEnd", self.end)):
            if not INT32_MIN <= v <= INT32_MAX:
                raise DescError(f"{field} {v} does not fit INT32")

    def to_dict(self) -> dict:
        return {
            "operator": self.name,
            "begin": self.begin,
            "end": self.end,
            "value": self.value.value,
            "value_data_type": self.value.data_type.name,
            "input": None if self.input is None else self.input.to_dict(),
            "output": self.output.to_dict(),
        }


class DiagonalMatrixDesc(Frozen):
    """DML_DIAGONAL_MATRIX_OPERATOR_DESC: out[..., y, x] = value if y + offset == x else 0.

    `value` is a FLOAT; integer outputs get it truncated toward zero (10.6 -> 10).
    """

    output: BufferTensorDesc
    offset: int
    value: float

    def __init__(self, output: BufferTensorDesc, offset: int, value: float = 1.0) -> None:
        self.__dict__.update(output=output, offset=offset, value=value)

    name = "DIAGONAL_MATRIX"

    def validate(self, level: FeatureLevel = FeatureLevel.L5_1) -> None:
        level = FeatureLevel.parse(level)
        t = self.output
        for min_level, dims, types in DIAGONAL_MATRIX_SUPPORT:  # noqa: B007 - read after the loop
            if level >= min_level:
                break
        else:
            raise DescError(f"DIAGONAL_MATRIX needs feature level 2_0; the target is {level.label}")
        if t.dimension_count not in dims:
            raise DescError(f"DIAGONAL_MATRIX at feature level {level.label} supports "
                            f"{dims.start}..{dims.stop - 1} dimensions; OutputTensor has {t.dimension_count}")
        if t.data_type not in types:
            raise DescError(f"DIAGONAL_MATRIX at feature level {level.label} does not support "
                            f"{t.data_type.name} (supported: {_types(types)})")
        if not INT32_MIN <= self.offset <= INT32_MAX:
            raise DescError(f"Offset {self.offset} does not fit INT32")

    def as_diagonal_matrix1(self) -> DiagonalMatrix1Desc:
        """The spec's equivalence: Begin = Offset, End = Offset + 1, no input (value truncated)."""
        dt = self.output.data_type
        v = self.value if dt.is_float else int(self.value)
        end = min(self.offset + 1, INT32_MAX)
        return DiagonalMatrix1Desc(self.output, ScalarUnion.of(v, dt), self.offset, end)

    def to_dict(self) -> dict:
        return {"operator": self.name, "offset": self.offset, "value": self.value,
                "output": self.output.to_dict()}


BOUND_LIMIT = 2**62  # |bound| beyond this means the same as the limit on any matrix DML can hold


def clamp_bound(b: int | None) -> int | None:
    """Keep a static int64-space bound (k + 1 may leave int64) inside +-2^62: same meaning, no overflow."""
    return None if b is None else min(max(int(b), -BOUND_LIMIT), BOUND_LIMIT)


def bind_range(begin: int | None, end: int | None, k: int, height: int, width: int) -> tuple[int, int]:
    """Int32 DiagonalFillBegin/End for int64-space bounds shifted by `k`, on an HxW matrix.

    None is an unbounded end (INT32_MIN / INT32_MAX in the desc) and never shifts. topX = x - y
    only spans [-(H-1), W-1], so clamping each bounded end to [-H, W] keeps the meaning and rules
    out int32 overflow (onnxruntime's DML provider wraps an int64 k instead). An inverted range
    whose ends clamp together covered all of topX, so it becomes the full range, not an empty one.
    """
    b = None if begin is None else int(begin) + k
    e = None if end is None else int(end) + k
    cb = INT32_MIN if b is None else min(max(b, -height), width)
    ce = INT32_MAX if e is None else min(max(e, -height), width)
    if b is not None and e is not None and b > e and cb <= ce:
        return INT32_MIN, INT32_MAX
    return cb, ce
