"""Buffer tensor descs, operator descs, feature levels, data types and the scalar union: every
validation rule fires with a message naming its field; valid random descs pass."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from dmlgraph.errors import DmlgraphError
from dmlgraph.ir.dtypes import INT32_MAX, INT32_MIN, DmlDataType, DmlTensorFlags, ScalarUnion
from dmlgraph.ir.ops import DiagonalMatrix1Desc, DiagonalMatrixDesc, FeatureLevel
from dmlgraph.ir.tensor import BufferTensorDesc, DescError, calc_buffer_tensor_size, packed_strides, view

T = DmlDataType
ALL_11 = [t for t in DmlDataType if t != T.UNKNOWN]
NO_64 = [t for t in ALL_11 if t not in (T.FLOAT64, T.INT64, T.UINT64)]


def out(t=T.FLOAT32, sizes=(4, 5), **kw):
    return BufferTensorDesc(t, sizes, **kw)


def dm1(output=None, value=None, begin=0, end=1, input=None):
    output = output or out()
    value = value or ScalarUnion.of(1, output.data_type)
    return DiagonalMatrix1Desc(output, value, begin, end, input)


# ------------------------------------------------------------------------------------------
# data types and the scalar union


def test_enum_values_match_directml_h():
    assert {t.name: int(t) for t in DmlDataType} == {
        "UNKNOWN": 0, "FLOAT32": 1, "FLOAT16": 2, "UINT32": 3, "UINT16": 4, "UINT8": 5,
        "INT32": 6, "INT16": 7, "INT8": 8, "FLOAT64": 9, "UINT64": 10, "INT64": 11}
    assert int(DmlTensorFlags.NONE) == 0 and int(DmlTensorFlags.OWNED_BY_DML) == 1


def test_feature_level_values_and_parse():
    assert int(FeatureLevel.L1_0) == 0x1000 and int(FeatureLevel.L5_1) == 0x5100
    assert int(FeatureLevel.L6_4) == 0x6400
    for text in ("5_1", "5.1", "L5_1", 0x5100, FeatureLevel.L5_1):
        assert FeatureLevel.parse(text) is FeatureLevel.L5_1
    with pytest.raises(DescError, match="unknown feature level"):
        FeatureLevel.parse("9_9")


def test_numpy_and_onnx_mappings():
    assert DmlDataType.from_onnx(TensorProto.BOOL) == T.UINT8
    assert DmlDataType.from_numpy(np.bool_) == T.UINT8
    assert DmlDataType.from_onnx(TensorProto.DOUBLE) == T.FLOAT64
    for t in ALL_11:
        assert DmlDataType.from_numpy(t.numpy) == t
    assert [T.FLOAT16.element_size, T.FLOAT32.element_size, T.INT64.element_size, T.UINT8.element_size] == [2, 4, 8, 1]
    with pytest.raises(DmlgraphError, match="BFLOAT16"):
        DmlDataType.from_onnx(TensorProto.BFLOAT16)
    with pytest.raises(DmlgraphError, match="complex64"):
        DmlDataType.from_numpy(np.complex64)


def test_scalar_union_is_8_bytes_and_float16_is_its_bits():
    s = ScalarUnion.of(1.0, T.FLOAT16)
    assert len(s.raw) == 8 and s.bits == 0x3C00
    assert ScalarUnion.of(-0.0, T.FLOAT16).bits == 0x8000
    assert ScalarUnion.of(1.0, T.FLOAT32).bits == 0x3F800000
    assert ScalarUnion.of(-1, T.INT8).bits == 0xFF
    assert ScalarUnion.of(-1, T.INT64).bits == 2**64 - 1
    assert ScalarUnion.of(2**64 - 1, T.UINT64).value == 2**64 - 1
    assert math.isnan(ScalarUnion.of(float("nan"), T.FLOAT64).value)
    assert ScalarUnion.of(np.float16(2.5), T.FLOAT16).numpy_value == np.float16(2.5)


@pytest.mark.parametrize("value,dtype,match", [
    (256, T.UINT8, r"does not fit UINT8 \(range 0..255\)"),
    (-1, T.UINT32, "does not fit UINT32"),
    (2**31, T.INT32, "does not fit INT32"),
    (2**64, T.UINT64, "does not fit UINT64"),
    (1.5, T.INT16, "not an integer"),
    ("x", T.INT16, "not an integer"),
    (1e6, T.FLOAT16, "overflows FLOAT16"),
    ("x", T.FLOAT32, "not a number"),
])
def test_scalar_union_rejects_with_clear_message(value, dtype, match):
    with pytest.raises(DmlgraphError, match=match):
        ScalarUnion.of(value, dtype)


# ------------------------------------------------------------------------------------------
# DML_BUFFER_TENSOR_DESC


@pytest.mark.parametrize("kwargs,match", [
    (dict(sizes=(4, 0)), "contain a zero"),
    (dict(sizes=()), "DimensionCount is 0"),
    (dict(sizes=(1,) * 9), "DimensionCount is 9"),
    (dict(sizes=(2**16, 2**16)), "at most 2\\^32-1"),
    (dict(sizes=(-1, 4)), "Sizes"),
    (dict(sizes=(2**32, 1)), "Sizes"),
    (dict(sizes=(4, 5), strides=(5,)), "Strides .* has 1 entries but Sizes has 2"),
    (dict(sizes=(4, 5), strides=(5, -1)), "Strides"),
    (dict(sizes=(4, 5), total_bytes=79), "TotalTensorSizeInBytes 79 is below the minimum 80"),
    (dict(sizes=(4, 5), strides=(8, 1), total_bytes=100), "TotalTensorSizeInBytes 100 is below the minimum 116"),
    (dict(sizes=(4, 5), alignment=12), "GuaranteedBaseOffsetAlignment 12 is not a power of two"),
    (dict(sizes=(4, 5), alignment=2), "GuaranteedBaseOffsetAlignment 2 is below the element size 4"),
    (dict(sizes=(4, 5), alignment=-4), "GuaranteedBaseOffsetAlignment"),
    (dict(sizes=(4, 5), flags=2), "Flags"),
])
def test_buffer_desc_rules(kwargs, match):
    with pytest.raises(DescError, match=match):
        BufferTensorDesc(T.FLOAT32, **kwargs)


def test_buffer_desc_unknown_type():
    with pytest.raises(DescError, match="DataType is UNKNOWN"):
        BufferTensorDesc(T.UNKNOWN, (2, 2), total_bytes=16)


def test_buffer_desc_valid_edges():
    assert BufferTensorDesc(T.UINT8, (1,) * 8).dimension_count == 8
    assert BufferTensorDesc(T.FLOAT64, (3, 3), alignment=8).alignment == 8
    assert BufferTensorDesc(T.FLOAT32, (4, 5), total_bytes=1000).total_bytes == 1000
    assert BufferTensorDesc(T.UINT8, (65535, 65537)).element_count == 2**32 - 1
    d = BufferTensorDesc(T.FLOAT32, (4, 5), flags=DmlTensorFlags.OWNED_BY_DML)
    assert d.to_dict()["flags"] == 1 and d.to_dict()["sizes"] == [4, 5]
    assert BufferTensorDesc.broadcast_scalar(T.FLOAT32, (3, 7)).total_bytes == 4


@pytest.mark.parametrize("dtype,sizes,strides,want", [
    (T.FLOAT16, (3,), None, 8),  # 6 bytes rounded up to 4
    (T.FLOAT32, (4, 5), None, 80),
    (T.UINT8, (1,), None, 4),
    (T.UINT8, (5,), None, 8),
    (T.INT64, (2, 3), None, 48),
    (T.FLOAT32, (4, 5), (8, 1), ((3 * 8 + 4 * 1) + 1) * 4),  # padded rows
    (T.FLOAT16, (2, 3), (0, 1), 8),  # broadcast rows: (2 + 1) * 2 = 6 -> 8
    (T.FLOAT32, (7, 9), (0, 0), 4),  # scalar broadcast
    (T.UINT8, (2, 2), (3, 1), 8),  # (3 + 1 + 1) = 5 -> 8
])
def test_calc_buffer_tensor_size(dtype, sizes, strides, want):
    assert calc_buffer_tensor_size(dtype, sizes, strides) == want
    assert BufferTensorDesc(dtype, sizes, strides).total_bytes == want


def test_view_errors_name_the_problem():
    d = BufferTensorDesc.packed(T.FLOAT32, (4, 5))
    with pytest.raises(DescError, match="buffer holds 40 bytes but the desc's TotalTensorSizeInBytes is 80"):
        view(np.zeros(40, np.uint8), d)
    with pytest.raises(DescError, match="C-contiguous"):
        view(np.zeros((20, 8), np.uint8)[:, ::2], d)


# ------------------------------------------------------------------------------------------
# DIAGONAL_MATRIX1


def test_diagonal_matrix1_valid_at_5_1_and_above():
    for level in (FeatureLevel.L5_1, FeatureLevel.L5_2, FeatureLevel.L6_4):
        dm1().validate(level)
    for t in ALL_11:
        dm1(out(t, (2, 3, 4)), input=out(t, (2, 3, 4))).validate()


@pytest.mark.parametrize("level", [FeatureLevel.L5_0, FeatureLevel.L4_1, FeatureLevel.L1_0])
def test_diagonal_matrix1_below_5_1(level):
    with pytest.raises(DescError, match=f"DIAGONAL_MATRIX1 needs feature level 5_1; the target is {level.label}"):
        dm1().validate(level)


@pytest.mark.parametrize("sizes", [(5,), (1, 2, 3, 4, 5)])
def test_diagonal_matrix1_rank(sizes):
    with pytest.raises(DescError, match=f"OutputTensor has {len(sizes)} dimensions; it supports 2 to 4"):
        dm1(out(sizes=sizes)).validate()
    with pytest.raises(DescError, match=f"InputTensor has {len(sizes)} dimensions"):
        dm1(out(sizes=(4, 5)), input=out(sizes=sizes)).validate()


def test_diagonal_matrix1_value_type_must_match_output():
    with pytest.raises(DescError, match="ValueDataType INT32 must equal the OutputTensor type FLOAT32"):
        dm1(value=ScalarUnion.of(1, T.INT32)).validate()


def test_diagonal_matrix1_input_output_constraints():
    with pytest.raises(DescError, match="InputTensor type FLOAT16 differs from OutputTensor type FLOAT32"):
        dm1(input=out(T.FLOAT16)).validate()
    with pytest.raises(DescError, match="same DimensionCount \\(3 vs 2\\)"):
        dm1(input=out(sizes=(1, 4, 5))).validate()
    with pytest.raises(DescError, match="InputTensor sizes \\[5, 4\\] differ"):
        dm1(input=out(sizes=(5, 4))).validate()


@pytest.mark.parametrize("field,kw", [("DiagonalFillBegin", {"begin": INT32_MIN - 1}),
                                      ("DiagonalFillEnd", {"end": INT32_MAX + 1})])
def test_diagonal_matrix1_bounds_are_int32(field, kw):
    with pytest.raises(DescError, match=f"{field} .* does not fit INT32"):
        dm1(**kw).validate()
    dm1(begin=INT32_MIN, end=INT32_MAX).validate()


# ------------------------------------------------------------------------------------------
# DIAGONAL_MATRIX support by feature level


def _dm(t, sizes, offset=0):
    return DiagonalMatrixDesc(out(t, sizes), offset, 1.0)


@pytest.mark.parametrize("level,dims,types", [
    (FeatureLevel.L2_0, (4,), [T.FLOAT32, T.FLOAT16]),
    (FeatureLevel.L2_1, (4,), NO_64),
    (FeatureLevel.L3_1, (4,), NO_64),
    (FeatureLevel.L4_0, (2, 3, 4), NO_64),
    (FeatureLevel.L5_0, (2, 3, 4), NO_64),
    (FeatureLevel.L5_1, (2, 3, 4), ALL_11),
    (FeatureLevel.L6_0, (2, 3, 4), ALL_11),
])
def test_diagonal_matrix_support_table(level, dims, types):
    for rank in range(1, 6):
        for t in ALL_11:
            d = _dm(t, (2,) * rank)
            if rank in dims and t in types:
                d.validate(level)
            elif rank not in dims:
                with pytest.raises(DescError, match=f"feature level {level.label} supports .* OutputTensor has {rank}"):
                    d.validate(level)
            else:
                with pytest.raises(DescError, match=f"feature level {level.label} does not support {t.name}"):
                    d.validate(level)


def test_diagonal_matrix_below_2_0_and_offset_range():
    with pytest.raises(DescError, match="DIAGONAL_MATRIX needs feature level 2_0; the target is 1_0"):
        _dm(T.FLOAT32, (1, 1, 2, 2)).validate(FeatureLevel.L1_0)
    with pytest.raises(DescError, match="Offset .* does not fit INT32"):
        _dm(T.FLOAT32, (1, 1, 2, 2), INT32_MAX + 1).validate()


def test_diagonal_matrix_as_diagonal_matrix1():
    d = DiagonalMatrixDesc(out(T.INT32, (3, 3)), -2, 10.6).as_diagonal_matrix1()
    assert (d.begin, d.end, d.value.value, d.value.data_type) == (-2, -1, 10, T.INT32)
    d.validate()
    top = DiagonalMatrixDesc(out(T.FLOAT32, (3, 3)), INT32_MAX, 1.0).as_diagonal_matrix1()
    assert top.end == INT32_MAX


# ------------------------------------------------------------------------------------------
# property tests


@st.composite
def buffer_descs(draw):
    t = draw(st.sampled_from(ALL_11))
    rank = draw(st.integers(1, 8))
    sizes = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    strides = None
    if draw(st.booleans()):
        packed = packed_strides(sizes)
        strides = tuple(draw(st.sampled_from([0, p, p + draw(st.integers(1, 5))])) for p in packed)
    extra = draw(st.integers(0, 64))
    align = draw(st.sampled_from([0] + [2**k for k in range(0, 9)]))
    if align and align < t.element_size:
        align = 0
    return t, sizes, strides, extra, align


@settings(max_examples=200, deadline=None)
@given(buffer_descs())
def test_valid_random_buffer_descs_pass_and_size_is_the_formula(case):
    t, sizes, strides, extra, align = case
    if strides is None:
        n = math.prod(sizes)
    else:
        n = sum((s - 1) * st_ for s, st_ in zip(sizes, strides)) + 1
    want = -(-n * t.element_size // 4) * 4
    d = BufferTensorDesc(t, sizes, strides, alignment=align)
    assert d.total_bytes == want == d.min_bytes
    assert d.total_bytes % 4 == 0
    d2 = BufferTensorDesc(t, sizes, strides, total_bytes=want + extra, alignment=align)
    d2.validate()
    if want > 4:
        with pytest.raises(DescError, match="TotalTensorSizeInBytes"):
            BufferTensorDesc(t, sizes, strides, total_bytes=want - 4)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(ALL_11), st.lists(st.integers(1, 5), min_size=2, max_size=4),
       st.integers(INT32_MIN, INT32_MAX), st.integers(INT32_MIN, INT32_MAX), st.booleans(), st.booleans())
def test_valid_random_diagonal_matrix1_descs_pass(t, sizes, begin, end, with_input, broadcast):
    o = BufferTensorDesc(t, tuple(sizes))
    i = None
    if with_input:
        i = BufferTensorDesc.broadcast_scalar(t, tuple(sizes)) if broadcast else BufferTensorDesc(t, tuple(sizes))
    d = DiagonalMatrix1Desc(o, ScalarUnion.of(1, t), begin, end, i)
    d.validate()
    for level in FeatureLevel:
        if level < FeatureLevel.L5_1:
            with pytest.raises(DescError, match="5_1"):
                d.validate(level)
        else:
            d.validate(level)
