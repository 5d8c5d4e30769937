"""DIAGONAL_MATRIX1 / DIAGONAL_MATRIX kernels: spec examples, a literal pseudocode oracle,
property tests over all 11 types and strided descs."""
from __future__ import annotations

import math
import sys
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmlgraph.errors import DmlgraphError
from dmlgraph.ir.dtypes import INT32_MAX, INT32_MIN, DmlDataType, ScalarUnion
from dmlgraph.ir.ops import DiagonalMatrix1Desc, DiagonalMatrixDesc
from dmlgraph.ir.tensor import BufferTensorDesc
from dmlgraph.runtime import binding, kernels

TYPES = ["float64", "float32", "float16", "int64", "int32", "int16", "int8",
         "uint64", "uint32", "uint16", "uint8"]

SPEC_INPUT = np.array([[4, 7, 3, 7, 9],
                       [1, 2, 8, 6, 9],
                       [9, 4, 1, 8, 7],
                       [4, 3, 4, 2, 4]], np.float32)


def bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def assert_bits_equal(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if not np.array_equal(bits(got), bits(want)):
        bad = np.argwhere(bits(got) != bits(want))[:5]
        raise AssertionError(f"mismatch at {bad.tolist()}: got {got[tuple(bad[0])]!r} want {want[tuple(bad[0])]!r}")


def pseudocode(shape, dtype, value, begin, end, input=None) -> np.ndarray:
    """A literal, element-by-element transcription of the spec's pseudocode (pure Python loops)."""
    dtype = np.dtype(dtype)
    out = np.empty(shape, dtype)
    v = np.array(value, dtype)[()]
    zero = np.zeros((), dtype)[()]
    src = None if input is None else np.broadcast_to(np.asarray(input, dtype), shape)
    for coord in np.ndindex(*shape):
        y, x = coord[-2], coord[-1]
        top_x = x - y
        use_value = (end >= begin) ^ (top_x >= begin) ^ (top_x < end)
        if use_value:
            out[coord] = v
        elif src is not None:
            out[coord] = src[coord]
        else:
            out[coord] = zero
    return out


# ------------------------------------------------------------------------------------------
# the spec pages' examples


def test_spec_example_identity_gives_value_7_not_1():
    # The spec page shows 1s here; its own pseudocode gives Value (7). Known doc erratum.
    got = kernels.diagonal_matrix1((4, 5), np.float32, 7, 0, 1)
    want = np.eye(4, 5, dtype=np.float32) * 7
    assert_bits_equal(got, want)


def test_spec_example_three_wide_strip():
    got = kernels.diagonal_matrix1((4, 5), np.float32, 7, 0, 3)
    want = np.array([[7, 7, 7, 0, 0],
                     [0, 7, 7, 7, 0],
                     [0, 0, 7, 7, 7],
                     [0, 0, 0, 7, 7]], np.float32)
    assert_bits_equal(got, want)


def test_spec_example_keep_strict_upper_triangle():
    got = kernels.diagonal_matrix1((4, 5), np.float32, 0, INT32_MIN, 1, input=SPEC_INPUT)
    want = np.array([[0, 7, 3, 7, 9],
                     [0, 0, 8, 6, 9],
                     [0, 0, 0, 8, 7],
                     [0, 0, 0, 0, 4]], np.float32)
    assert_bits_equal(got, want)


def test_spec_example_keep_diagonal_only():
    got = kernels.diagonal_matrix1((4, 5), np.float32, 0, 1, 0, input=SPEC_INPUT)
    want = np.array([[4, 0, 0, 0, 0],
                     [0, 2, 0, 0, 0],
                     [0, 0, 1, 0, 0],
                     [0, 0, 0, 2, 0]], np.float32)
    assert_bits_equal(got, want)


@pytest.mark.parametrize("offset,shape,want", [
    (0, (1, 1, 3, 3), [[1, 0, 0], [0, 1, 0], [0, 0, 1]]),
    (1, (1, 1, 3, 3), [[0, 1, 0], [0, 0, 1], [0, 0, 0]]),
    (-1, (1, 1, 3, 2), [[0, 0], [1, 0], [0, 1]]),
    (-3, (1, 1, 3, 2), [[0, 0], [0, 0], [0, 0]]),
])
def test_diagonal_matrix_spec_examples(offset, shape, want):
    got = kernels.diagonal_matrix(shape, np.float32, offset, 1.0)
    assert_bits_equal(got, np.array(want, np.float32).reshape(shape))


@pytest.mark.parametrize("dtype", ["int32", "int8", "int64", "uint8", "uint16", "int16"])
@pytest.mark.parametrize("value,want", [(10.6, 10), (-10.6, -10), (0.9, 0), (-0.9, 0), (3.0, 3)])
def test_diagonal_matrix_truncates_toward_zero(dtype, value, want):
    if want < 0 and np.dtype(dtype).kind == "u":
        pytest.skip("negative value in an unsigned type")
    got = kernels.diagonal_matrix((3, 4), dtype, 1, value)
    assert_bits_equal(got, (np.eye(3, 4, 1) * want).astype(dtype))


def test_diagonal_matrix_float_value_is_a_float32():
    got = kernels.diagonal_matrix((2, 2), np.float64, 0, 0.1)
    assert got[0, 0] == np.float64(np.float32(0.1))
    assert_bits_equal(kernels.diagonal_matrix((2, 2), np.float16, 0, -0.0),
                      np.array([[-0.0, 0.0], [0.0, -0.0]], np.float16))


def test_diagonal_matrix_value_out_of_range_is_refused():
    with pytest.raises(DmlgraphError, match="uint8"):
        kernels.diagonal_matrix((2, 2), np.uint8, 0, 300.0)
    with pytest.raises(DmlgraphError, match="int32"):
        kernels.diagonal_matrix((2, 2), np.int32, 0, float("nan"))


def test_diagonal_matrix_equals_diagonal_matrix1_with_end_offset_plus_1():
    for offset in (-5, -1, 0, 2, 7, INT32_MIN, INT32_MAX - 1):
        a = kernels.diagonal_matrix((2, 6, 5), np.float32, offset, 2.5)
        b = kernels.diagonal_matrix1((2, 6, 5), np.float32, 2.5, offset, offset + 1)
        assert_bits_equal(a, b)


# ------------------------------------------------------------------------------------------
# fixed edge cases


@pytest.mark.parametrize("begin,end", [
    (0, 0), (5, 5), (INT32_MIN, INT32_MIN), (INT32_MAX, INT32_MAX),  # empty
    (INT32_MIN, INT32_MAX), (INT32_MAX, INT32_MIN),  # everything / inverted everything-but-nothing
    (1, 0), (0, 1), (3, -2), (-2, 3), (INT32_MIN, 0), (1, INT32_MAX), (-100, 100), (100, -100),
])
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (7, 1), (5, 3), (3, 5), (2, 3, 4, 6)])
def test_ranges_against_pseudocode(shape, begin, end):
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape) + 1
    for inp in (None, x):
        assert_bits_equal(kernels.diagonal_matrix1(shape, np.float32, -1.5, begin, end, input=inp),
                          pseudocode(shape, np.float32, -1.5, begin, end, input=inp))


@pytest.mark.parametrize("value", [-0.0, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_special_float_values_keep_their_bits(dtype, value):
    x = np.full((6, 7), -0.0, dtype)
    x[::2] = np.nan
    for begin, end in ((-1, 2), (2, -1), (INT32_MIN, 0)):
        got = kernels.diagonal_matrix1((6, 7), dtype, value, begin, end, input=x)
        assert_bits_equal(got, pseudocode((6, 7), dtype, value, begin, end, input=x))


def test_nan_payload_is_preserved():
    payload = np.array([0x7FC01234], np.uint32).view(np.float32)[0]
    got = kernels.diagonal_matrix1((3, 3), np.float32, payload, 0, 1)
    assert bits(got)[1, 1] == 0x7FC01234


def test_bool_output_is_uint8_semantics():
    x = np.ones((4, 6), bool)
    got = kernels.diagonal_matrix1((4, 6), bool, False, INT32_MIN, 0, input=x)
    assert got.dtype == np.bool_
    assert_bits_equal(got, np.triu(x))
    big = np.ones((300, 300), bool)
    assert_bits_equal(kernels.diagonal_matrix1((300, 300), bool, False, 1, INT32_MAX, input=big),
                      np.tril(big))


def test_zero_strided_broadcast_input():
    shape = (3, 70, 90)
    x = np.broadcast_to(np.float32(2.5), shape)
    got = kernels.diagonal_matrix1(shape, np.float32, 1, -3, 4, input=x)
    assert_bits_equal(got, kernels.diagonal_matrix1_reference(shape, np.float32, 1, -3, 4, input=x))
    row = np.broadcast_to(np.arange(90, dtype=np.int16), shape)  # broadcast along batch and rows
    got = kernels.diagonal_matrix1(shape, np.int16, 7, 10, -10, input=row)
    assert_bits_equal(got, kernels.diagonal_matrix1_reference(shape, np.int16, 7, 10, -10, input=row))


def test_out_noncontiguous_padding_untouched():
    buf = np.full((2, 40, 55), 99, np.int32)
    out = buf[:, :, 3:50]
    got = kernels.diagonal_matrix1((2, 40, 47), np.int32, -7, INT32_MIN, 5, out=out)
    assert got is out
    assert_bits_equal(out, pseudocode((2, 40, 47), np.int32, -7, INT32_MIN, 5))
    assert (buf[:, :, :3] == 99).all() and (buf[:, :, 50:] == 99).all()


def test_uncollapsible_batch_axes():
    base = np.zeros((3, 4, 9, 8), np.float64)
    out = base.transpose(1, 0, 2, 3)  # batch axes that cannot merge into one
    x = np.arange(4 * 3 * 9 * 8, dtype=np.float64).reshape(4, 3, 9, 8)
    kernels.diagonal_matrix1(out.shape, np.float64, 0, INT32_MIN, 1, input=x, out=out)
    assert_bits_equal(out, pseudocode(out.shape, np.float64, 0, INT32_MIN, 1, input=x))


def test_rank_5_and_above_is_batch():
    shape = (2, 1, 2, 3, 4, 5)
    assert_bits_equal(kernels.diagonal_matrix1(shape, np.uint16, 3, -1, 2),
                      pseudocode(shape, np.uint16, 3, -1, 2))


def test_large_matrices_against_reference():
    rng = np.random.default_rng(1)
    for shape, dtype in (((700, 900), "float32"), ((900, 700), "uint8"), ((3, 300, 260), "int64"),
                         ((2, 2, 130, 140), "float16"), ((5, 40000), "int8"), ((40000, 3), "uint32")):
        x = rng.integers(0, 100, shape).astype(dtype)
        h, w = shape[-2:]
        for begin, end, value in ((INT32_MIN, 0, 0), (1, INT32_MAX, 0), (-2, 3, 5), (3, -2, 0),
                                  (0, 1, 1), (INT32_MIN, w - 8, 0), (-h // 2, w // 3, 9),
                                  (w // 3, -h // 2, 9), (h, -w, 1)):
            for inp in (x, None):
                got = kernels.diagonal_matrix1(shape, dtype, value, begin, end, input=inp)
                want = kernels.diagonal_matrix1_reference(shape, dtype, value, begin, end, input=inp)
                assert_bits_equal(got, want)


@pytest.mark.parametrize("knobs", [
    {"SMALL_TEMPLATE_BYTES": 0, "BLOCK_BYTES": 3000, "MIN_BLOCK_ROWS": 3},
    {"SMALL_TEMPLATE_BYTES": 0, "NARROW": 0, "OVERLAY_ROWS": 7},
    {"SMALL_TEMPLATE_BYTES": 0, "NARROW": 1000, "MASK_ROWS": 1},
    {"SMALL_TEMPLATE_BYTES": 0, "TEMPLATE_BYTES": 0},
    {"SMALL_TEMPLATE_BYTES": 0, "TEMPLATE_CACHE_BYTES": 0},
    {"TINY_ELEMENTS": 0},
])
def test_every_strategy_is_exact(monkeypatch, knobs):
    """The tuning knobs pick between code paths; each path must be exact on its own."""
    for k, v in knobs.items():
        monkeypatch.setattr(kernels, k, v)
    rng = np.random.default_rng(2)
    for shape in ((37, 41), (3, 33, 29), (2, 2, 20, 45), (1, 64), (64, 1)):
        x = rng.integers(0, 50, shape).astype(np.float32)
        for begin, end in ((INT32_MIN, 0), (1, INT32_MAX), (-2, 3), (3, -2), (-20, 25), (25, -20),
                           (0, 1), (-60, 60), (5, 5)):
            for inp in (x, None):
                assert_bits_equal(kernels.diagonal_matrix1(shape, np.float32, 4, begin, end, input=inp),
                                  kernels.diagonal_matrix1_reference(shape, np.float32, 4, begin, end,
                                                                     input=inp))


def test_errors():
    with pytest.raises(DmlgraphError, match="2 dimensions"):
        kernels.diagonal_matrix1((5,), np.float32, 1, 0, 1)
    with pytest.raises(DmlgraphError, match="complex64"):
        kernels.diagonal_matrix1((2, 2), np.complex64, 1, 0, 1)
    with pytest.raises(DmlgraphError, match="out has shape"):
        kernels.diagonal_matrix1((2, 2), np.float32, 1, 0, 1, out=np.empty((2, 3), np.float32))
    with pytest.raises(TypeError):
        kernels.diagonal_matrix1((2, 2), np.float32, 1, 0.5, 1)


def test_zero_size_shape_returns_empty():
    assert kernels.diagonal_matrix1((0, 3), np.float32, 1, 0, 1).shape == (0, 3)


# ------------------------------------------------------------------------------------------
# property tests against the literal pseudocode


def _value_strategy(dtype: str):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return st.sampled_from([0.0, -0.0, 1.0, -2.5, 7.0, float("nan"), float("inf"), float("-inf"), 0.1])
    info = np.iinfo(dt)
    return st.one_of(st.sampled_from([0, 1, info.min, info.max]), st.integers(info.min, info.max))


@st.composite
def kernel_cases(draw):
    dtype = draw(st.sampled_from(TYPES))
    rank = draw(st.integers(2, 4))
    h = draw(st.integers(1, 7))
    w = draw(st.integers(1, 7))
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=rank - 2, max_size=rank - 2)))
    shape = lead + (h, w)
    bound = st.one_of(st.sampled_from([INT32_MIN, INT32_MAX, INT32_MIN + 1, INT32_MAX - 1, 0]),
                      st.integers(-h - 2, w + 2))
    begin, end = draw(bound), draw(bound)
    value = draw(_value_strategy(dtype))
    return shape, dtype, value, begin, end


def _random_input(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=math.prod(shape) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)  # every bit pattern, NaNs and -0.0 included


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kernel_cases(), st.sampled_from(["none", "full", "broadcast"]), st.booleans(), st.integers(0, 2**32 - 1))
def test_property_matches_pseudocode(case, input_kind, strided_out, seed):
    shape, dtype, value, begin, end = case
    inp = None
    if input_kind == "full":
        inp = _random_input(shape, dtype, seed)
    elif input_kind == "broadcast":
        inp = np.broadcast_to(_random_input((1,) * (len(shape) - 1) + (shape[-1],), dtype, seed), shape)
    want = pseudocode(shape, dtype, value, begin, end, input=inp)
    out = None
    if strided_out:
        buf = np.full(shape[:-1] + (shape[-1] + 3,), 0x5A, np.uint8) if dtype == "uint8" else \
            np.zeros(shape[:-1] + (shape[-1] + 3,), dtype)
        sentinel = buf.copy()
        out = buf[..., 1:shape[-1] + 1]
    got = kernels.diagonal_matrix1(shape, dtype, value, begin, end, input=inp, out=out)
    assert_bits_equal(got, want)
    assert_bits_equal(kernels.diagonal_matrix1_reference(shape, dtype, value, begin, end, input=inp), want)
    if strided_out:
        assert got is out
        assert_bits_equal(buf[..., 0], sentinel[..., 0])
        assert_bits_equal(buf[..., shape[-1] + 1:], sentinel[..., shape[-1] + 1:])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(TYPES), st.integers(20, 150), st.integers(20, 150), st.integers(1, 3),
       st.integers(-160, 160), st.integers(-160, 160), st.booleans(), st.integers(0, 2**32 - 1),
       st.sampled_from([0, 64 * 1024, 1 << 30]), st.sampled_from([None, 0]))
def test_property_fast_path_matches_reference(dtype, h, w, batch, begin, end, with_input, seed,
                                              small_template, template):
    """Shapes big enough for the blocked / skewed / template paths, against the np.where oracle."""
    shape = (batch, h, w)
    inp = _random_input(shape, dtype, seed) if with_input else None
    value = np.array(3, dtype)
    knobs = {"SMALL_TEMPLATE_BYTES": small_template, "BLOCK_BYTES": 16 * 1024, "MIN_BLOCK_ROWS": 8}
    if template is not None:
        knobs["TEMPLATE_BYTES"] = template
    with patch.multiple(kernels, **knobs):
        got = kernels.diagonal_matrix1(shape, dtype, value, begin, end, input=inp)
    assert_bits_equal(got, kernels.diagonal_matrix1_reference(shape, dtype, value, begin, end, input=inp))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(TYPES + ["bool"]), st.lists(st.integers(1, 3), max_size=2),
       st.sampled_from([1, 3, 7, 20, 33, 64, 130]), st.sampled_from([1, 4, 7, 20, 33, 64, 130]),
       st.integers(-140, 140), st.integers(-140, 140),
       st.sampled_from(["none", "full", "broadcast", "strided", "other_dtype", "list"]),
       st.integers(0, 2**32 - 1), st.sampled_from([None, 4096]))
def test_prepared_kernel_equals_the_plain_call(dtype, lead, h, w, begin, end, input_kind, seed, block_bytes):
    """prepare_diagonal_matrix1 (tiny index, templates, or the plain call) is the plain call, bit for bit,
    for every input it is given, including the ones it hands back to the plain call."""
    shape = tuple(lead) + (h, w)
    rng = np.random.default_rng(seed)
    value = np.array(True) if dtype == "bool" else np.array(rng.integers(0, 100), dtype)
    full = (rng.integers(0, 2, shape).astype(bool) if dtype == "bool" else _random_input(shape, dtype, seed))
    inp = {"none": None, "full": full, "broadcast": np.broadcast_to(full[..., :1, :], shape),
           "strided": np.repeat(full, 2, axis=-1)[..., ::2], "other_dtype": (full != 0).astype(np.int16),
           "list": None if full.size > 4096 else full.tolist()}[input_kind]
    with patch.object(kernels, "BLOCK_BYTES", block_bytes or kernels.BLOCK_BYTES):
        run = kernels.prepare_diagonal_matrix1(shape, dtype, value, begin, end)
        for _ in range(2):  # the prepared state is reused, never written
            got = run(inp)
            want = kernels.diagonal_matrix1(shape, dtype, value, begin, end, input=inp)
            assert_bits_equal(got, want)
    assert got.flags.c_contiguous and got.flags.writeable


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(TYPES + ["bool"]), st.lists(st.integers(1, 3), max_size=2),
       st.sampled_from([1, 3, 7, 20, 33, 64, 130]), st.sampled_from([1, 4, 7, 20, 33, 64, 130]),
       st.integers(-140, 140), st.integers(-140, 140), st.sampled_from(["row", "column", "matrix", "vector"]),
       st.integers(0, 2**32 - 1), st.sampled_from([None, 4096]))
def test_prepared_kernel_for_a_broadcast_input_shape(dtype, lead, h, w, begin, end, kind, seed, block_bytes):
    """Prepared for inputs of a shape that broadcasts to the output (a padding row, one matrix for
    a batch, a lower rank), the kernel is the plain call on the broadcast input, bit for bit; an
    input of another shape still gets the plain call."""
    shape = tuple(lead) + (h, w)
    rng = np.random.default_rng(seed)
    value = np.array(True) if dtype == "bool" else np.array(rng.integers(0, 100), dtype)
    full = (rng.integers(0, 2, shape).astype(bool) if dtype == "bool" else _random_input(shape, dtype, seed))
    inp = np.ascontiguousarray({"row": full[..., :1, :], "column": full[..., :, :1],
                                "matrix": full.reshape(-1, h, w)[0], "vector": full.reshape(-1, w)[0]}[kind])
    with patch.object(kernels, "BLOCK_BYTES", block_bytes or kernels.BLOCK_BYTES):
        run = kernels.prepare_diagonal_matrix1(shape, dtype, value, begin, end, input_shape=inp.shape)
        for x in (inp, inp, full, None):  # reused, never written; another shape; no input
            got = run(x)
            assert_bits_equal(got, kernels.diagonal_matrix1(shape, dtype, value, begin, end, input=x))
            assert got.shape == shape and got.flags.c_contiguous and got.flags.writeable
    with pytest.raises(DmlgraphError):
        kernels.prepare_diagonal_matrix1(shape, dtype, value, begin, end, input_shape=(h + 1, w + 1))


def test_prepared_kernel_refuses_what_the_plain_call_refuses():
    with pytest.raises(DmlgraphError):
        kernels.prepare_diagonal_matrix1((4,), np.float32, 1, 0, 1)
    with pytest.raises(DmlgraphError):
        kernels.prepare_diagonal_matrix1((4, 4), np.complex64, 1, 0, 1)
    assert kernels.prepare_diagonal_matrix1((0, 3), np.float32, 1, 0, 1)().shape == (0, 3)


# ------------------------------------------------------------------------------------------
# desc-level entry point: strided buffers


def test_run_desc_broadcast_input_by_zero_strides():
    out_desc = BufferTensorDesc.packed(DmlDataType.FLOAT32, (2, 5, 6))
    in_desc = BufferTensorDesc.broadcast_scalar(DmlDataType.FLOAT32, (2, 5, 6))
    desc = DiagonalMatrix1Desc(out_desc, ScalarUnion.of(-10000.0, DmlDataType.FLOAT32), 1, INT32_MAX,
                               in_desc)
    in_buf = np.zeros(in_desc.total_bytes, np.uint8)
    in_buf.view(np.float32)[0] = 1.0
    out_buf = np.zeros(out_desc.total_bytes, np.uint8)
    got = binding.run_desc(desc, out_buf, in_buf)
    want = pseudocode((2, 5, 6), np.float32, -10000.0, 1, INT32_MAX, input=np.float32(1))
    assert_bits_equal(got, want)
    assert_bits_equal(out_buf.view(np.float32).reshape(2, 5, 6), want)


@pytest.mark.parametrize("dtype", [DmlDataType.FLOAT16, DmlDataType.UINT8, DmlDataType.INT64])
def test_run_desc_padded_output_rows_keep_padding(dtype):
    sizes = (2, 7, 9)
    strides = (7 * 12, 12, 1)  # 3 elements of padding after every row
    out_desc = BufferTensorDesc(dtype, sizes, strides)
    in_desc = BufferTensorDesc.packed(dtype, sizes)
    npt = dtype.numpy
    x = _random_input(sizes, npt, 5)
    in_buf = np.frombuffer(x.tobytes().ljust(in_desc.total_bytes, b"\0"), np.uint8).copy()
    out_buf = np.full(out_desc.total_bytes, 0xAB, np.uint8)
    desc = DiagonalMatrix1Desc(out_desc, ScalarUnion.of(1, dtype), INT32_MIN, 0, in_desc)
    got = binding.run_desc(desc, out_buf, in_buf)
    assert_bits_equal(got, pseudocode(sizes, npt, 1, INT32_MIN, 0, input=x))
    touched = np.zeros(out_buf.size, bool)
    item = npt.itemsize
    for b in range(2):
        for y in range(7):
            start = (b * 7 * 12 + y * 12) * item
            touched[start:start + 9 * item] = True
    assert (out_buf[~touched] == 0xAB).all(), "padding bytes of the output were written"


def test_run_desc_diagonal_matrix():
    out_desc = BufferTensorDesc(DmlDataType.INT32, (1, 1, 3, 4), (0, 0, 6, 1))
    desc = DiagonalMatrixDesc(out_desc, -1, 10.6)
    out_buf = np.full(out_desc.total_bytes, 0xCD, np.uint8)
    got = binding.run_desc(desc, out_buf)
    assert_bits_equal(got, (np.eye(3, 4, -1) * 10).astype(np.int32).reshape(1, 1, 3, 4))
    for y in range(2):  # elements 4 and 5 of rows 0 and 1 are padding
        assert (out_buf[y * 24 + 16: y * 24 + 24] == 0xCD).all()


def test_run_desc_errors():
    out_desc = BufferTensorDesc.packed(DmlDataType.FLOAT32, (3, 3))
    desc = DiagonalMatrix1Desc(out_desc, ScalarUnion.of(1, DmlDataType.FLOAT32), 0, 1)
    with pytest.raises(DmlgraphError, match="input buffer"):
        binding.run_desc(desc, np.zeros(64, np.uint8), np.zeros(64, np.uint8))
    with_input = DiagonalMatrix1Desc(out_desc, ScalarUnion.of(1, DmlDataType.FLOAT32), 0, 1, out_desc)
    with pytest.raises(DmlgraphError, match="no input buffer"):
        binding.run_desc(with_input, np.zeros(64, np.uint8))
    bad = DiagonalMatrix1Desc(out_desc, ScalarUnion.of(1, DmlDataType.INT32), 0, 1)
    with pytest.raises(DmlgraphError, match="ValueDataType"):
        binding.run_desc(bad, np.zeros(64, np.uint8))
    with pytest.raises(DmlgraphError, match="TotalTensorSizeInBytes"):
        binding.run_desc(desc, np.zeros(8, np.uint8))
    bcast_out = BufferTensorDesc.broadcast_scalar(DmlDataType.FLOAT32, (3, 3))
    with pytest.raises(DmlgraphError, match="alias"):
        binding.run_desc(DiagonalMatrix1Desc(bcast_out, ScalarUnion.of(1, DmlDataType.FLOAT32), 0, 1),
                         np.zeros(64, np.uint8))


# ------------------------------------------------------------------------------------------
# the compiled (numba) row kernel and the numpy path, each against the oracle

COMPILED = pytest.param("compiled", marks=pytest.mark.skipif(
    not kernels.compiled_available(), reason="numba is not installed (the dmlgraph[fast] extra)"))


def _run_path(path: str, *args, **kwargs) -> np.ndarray:
    """diagonal_matrix1 forced through one path: the compiled kernel at every size, or numpy only."""
    if path == "numpy":
        with kernels.numpy_only():
            return kernels.diagonal_matrix1(*args, **kwargs)
    with patch.object(kernels, "COMPILED_MIN_BYTES", 0):
        return kernels.diagonal_matrix1(*args, **kwargs)


BOUNDS = st.one_of(st.sampled_from([INT32_MIN, INT32_MAX, INT32_MIN + 1, INT32_MAX - 1, 0, 1, -1]),
                   st.integers(-40, 40))


@pytest.mark.parametrize("path", ["numpy", COMPILED])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(TYPES + ["bool"]),
       shape=st.sampled_from([(1, 37), (37, 1), (1, 1), (33, 20), (20, 33), (3, 30, 31), (2, 2, 17, 40),
                              (1, 300)]),
       begin=BOUNDS, end=BOUNDS, input_kind=st.sampled_from(["none", "full", "batch_broadcast", "row_broadcast"]),
       seed=st.integers(0, 2**32 - 1))
def test_both_paths_match_the_oracle(path, dtype, shape, begin, end, input_kind, seed):
    """Every type (float16 and bool as bits), 1xN / Nx1 / batched shapes, INT32 extremes and
    inverted ranges, inputs full or broadcast: bit-exact against diagonal_matrix1_reference."""
    rng = np.random.default_rng(seed)
    full = (rng.integers(0, 2, shape).astype(bool) if dtype == "bool" else _random_input(shape, dtype, seed))
    inp = {"none": None, "full": full,
           "batch_broadcast": np.broadcast_to(full[..., :1, :, :] if len(shape) > 2 else full, shape),
           "row_broadcast": np.broadcast_to(full[..., :1, :], shape)}[input_kind]
    value = np.array(True) if dtype == "bool" else np.array(rng.integers(0, 100), dtype)
    got = _run_path(path, shape, dtype, value, begin, end, input=inp)
    assert_bits_equal(got, kernels.diagonal_matrix1_reference(shape, dtype, value, begin, end, input=inp))


@pytest.mark.parametrize("dtype", ["float16", "bool", "int8", "uint64", "float64"])
def test_compiled_kernel_takes_wide_triangles_and_matches(dtype):
    """A large triangle goes through the compiled kernel when numba is there (and is exact);
    the same call under numpy_only() never touches it and gives the same bits."""
    shape = (1, 300, 310)
    x = _random_input(shape, "uint8" if dtype == "bool" else dtype, 5)
    x = x.astype(bool) if dtype == "bool" else x
    calls = []
    real = _compiled_module()
    if real is not None:
        class Spy:  # counts the calls into either compiled kernel
            def __getattr__(self, name: str):
                def call(*args):
                    calls.append(name)
                    return getattr(real, name)(*args)
                return call
        patch_ctx = patch.object(kernels, "_COMPILED", Spy())
    else:
        patch_ctx = patch.object(kernels, "_COMPILED", False)
    with patch_ctx:
        got = kernels.diagonal_matrix1(shape, dtype, 1, 1, INT32_MAX, input=x)
    with kernels.numpy_only():
        plain = kernels.diagonal_matrix1(shape, dtype, 1, 1, INT32_MAX, input=x)
    assert_bits_equal(got, kernels.diagonal_matrix1_reference(shape, dtype, 1, 1, INT32_MAX, input=x))
    assert_bits_equal(plain, got)
    assert len(calls) == (1 if real is not None else 0)


def test_numpy_path_when_numba_is_absent(monkeypatch):
    """Without numba the lookup answers None once and every call takes the numpy path."""
    monkeypatch.setitem(sys.modules, "dmlgraph.runtime.kernels_compiled", None)  # import fails
    monkeypatch.setattr(kernels, "_COMPILED", None)
    assert not kernels.compiled_available()
    shape = (3, 200, 150)
    x = _random_input(shape, "float32", 9)
    assert_bits_equal(kernels.diagonal_matrix1(shape, "float32", 2, -7, 40, input=x),
                      kernels.diagonal_matrix1_reference(shape, "float32", 2, -7, 40, input=x))
    run = kernels.prepare_diagonal_matrix1((200, 150), "float16", 1, 1, INT32_MAX)
    assert_bits_equal(run(), kernels.diagonal_matrix1_reference((200, 150), "float16", 1, 1, INT32_MAX))


def test_kernel_env_switch_selects_numpy(monkeypatch):
    monkeypatch.setenv("DMLGRAPH_KERNEL", "numpy")
    monkeypatch.setattr(kernels, "_COMPILED", None)
    assert not kernels.compiled_available()


@pytest.mark.skipif(not kernels.compiled_available(), reason="numba is not installed (the dmlgraph[fast] extra)")
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dtype", ["uint8", "float16", "int32", "uint64", "float64", "bool"])
def test_compiled_kernel_spans_and_bases(dtype, stream):
    """Every mode of the compiled kernel (every span of a row; a whole-matrix base, then a narrow
    Value; non-temporal stores) is exact, with byte-uniform Values (memset) and others (copied
    from a row of Values), for full, batch-broadcast and absent inputs (the last two: the first
    matrix copied)."""
    shape = (3, 70, 90)
    x = _random_input(shape, "uint8" if dtype == "bool" else dtype, 11)
    x = x.astype(bool) if dtype == "bool" else x
    values = (False, True) if dtype == "bool" else (0, 5, -1 if dtype[0] != "u" else 255)
    with patch.multiple(kernels, COMPILED_MIN_BYTES=0, STREAM_MIN_BYTES=0 if stream else 1 << 40):
        for begin, end in ((INT32_MIN, 0), (1, INT32_MAX), (30, -20), (-20, 30), (-2, 3), (0, 1), (INT32_MIN, 85),
                           (3, -2)):
            for value in values:
                for inp in (x, np.broadcast_to(x[:1], shape), None):
                    got = kernels.diagonal_matrix1(shape, dtype, value, begin, end, input=inp)
                    want = kernels.diagonal_matrix1_reference(shape, dtype, value, begin, end, input=inp)
                    assert_bits_equal(got, want)


def _compiled_module():
    """The compiled kernels (`dmlgraph.runtime.kernels_compiled`) when large outputs go through them, else None."""
    if not kernels.compiled_available():
        return None
    from dmlgraph.runtime import kernels_compiled
    return kernels_compiled


class _KernelSpy:
    """Stands in for the compiled module and records which kernel each call took."""

    def __init__(self, real):
        self.real, self.names = real, []

    def __getattr__(self, name: str):
        self.names.append(name)
        return getattr(self.real, name)


@pytest.mark.skipif(not kernels.compiled_available(), reason="numba is not installed (the dmlgraph[fast] extra)")
@pytest.mark.parametrize("dtype", ["uint8", "bool", "float16", "int32", "float64"])
def test_generated_kernel_writes_whole_lines_exactly(dtype):
    """The streamed line writer for outputs without an input: rows shorter and longer than a line,
    batches, every Value interval shape, byte-uniform and other Values, and outputs starting at
    every offset within a 64-byte line (bytes around the output untouched)."""
    spy = _KernelSpy(_compiled_module())
    itemsize = np.dtype(dtype).itemsize
    values = (False, True) if dtype == "bool" else (0, 1, -1 if dtype[0] != "u" else 255, 2.5 if dtype[0] == "f" else 77)
    with patch.multiple(kernels, _COMPILED=spy, COMPILED_MIN_BYTES=0, GENERATED_MIN_BYTES=0,
                        GENERATED_MAX_ROW_BYTES=1 << 40, SMALL_TEMPLATE_BYTES=0):
        for shape in ((1, 1), (1, 37), (37, 1), (3, 7, 9), (2, 33, 70), (65, 65), (2, 1, 40, 129)):
            nbytes = math.prod(shape) * itemsize
            for begin, end in ((INT32_MIN, 1), (1, INT32_MAX), (0, 1), (-2, 3), (3, -2), (30, -20), (INT32_MIN, 85)):
                for k, value in enumerate(values):
                    offset = (7 * k + len(shape) + begin % 64) % 64 // itemsize * itemsize
                    buf = np.full(nbytes + 128, 0xA5, np.uint8)
                    out = buf[offset:offset + nbytes].view(dtype).reshape(shape)
                    kernels.diagonal_matrix1(shape, dtype, value, begin, end, out=out)
                    assert_bits_equal(out, kernels.diagonal_matrix1_reference(shape, dtype, value, begin, end))
                    assert (buf[:offset] == 0xA5).all() and (buf[offset + nbytes:] == 0xA5).all()
    assert "generated" in spy.names


@pytest.mark.skipif(not kernels.compiled_available(), reason="numba is not installed (the dmlgraph[fast] extra)")
def test_compiled_calls_follow_values_inputs_and_thresholds():
    """The compiled call made once per signature serves every Value (all 64 bits of a uint64,
    -0.0 and NaN payloads), with and without an input, and follows thresholds changed after it
    was made (tests and benchmarks patch them)."""
    spy = _KernelSpy(_compiled_module())
    shape = (130, 140)
    with patch.multiple(kernels, _COMPILED=spy, COMPILED_MIN_BYTES=0):
        for dtype, values in (("uint64", (2**64 - 1, 2**63, 1)), ("int64", (-1, -(2**63), 5)),
                              ("float32", (-0.0, np.frombuffer(b"\x01\x00\xc0\x7f", np.float32)[0], 1.0))):
            x = _random_input(shape, dtype, 3)
            for generated_min in (1 << 40, 0):
                with patch.object(kernels, "GENERATED_MIN_BYTES", generated_min):
                    for value in values:
                        v = np.array(value, dtype)
                        for inp in (None, x):
                            got = kernels.diagonal_matrix1(shape, dtype, v, INT32_MIN, 1, input=inp)
                            assert_bits_equal(got, kernels.diagonal_matrix1_reference(shape, dtype, v, INT32_MIN, 1,
                                                                                      input=inp))
                assert spy.names[-2:] == ["rows" if generated_min else "generated", "rows"]


def test_compiled_call_follows_every_setting_it_reads():
    """The call cached per signature is made again when any setting `_compiled_call` reads
    changes, not only the size thresholds (here the longest row `generated` takes)."""
    spy = _KernelSpy(_compiled_module())
    shape, dtype = (130, 140), "uint8"
    with patch.multiple(kernels, _COMPILED=spy, COMPILED_MIN_BYTES=0, GENERATED_MIN_BYTES=0):
        for max_row, name in ((1 << 20, "generated"), (0, "rows")):
            with patch.object(kernels, "GENERATED_MAX_ROW_BYTES", max_row):
                got = kernels.diagonal_matrix1(shape, dtype, 7, INT32_MIN, 1)
            assert spy.names[-1] == name
            assert_bits_equal(got, kernels.diagonal_matrix1_reference(shape, dtype, 7, INT32_MIN, 1))


@pytest.mark.parametrize("shape, dtype", [((2, 600, 1000), "uint8"), ((3, 300, 300), "float64"), ((1, 2, 700, 800), "bool")])
def test_narrow_values_on_batches_of_large_matrices(shape, dtype):
    """Batches of matrices too large to copy from cache: each is written again (zeros by blocks
    of rows, then the Values), exactly; with an input the first path is unchanged."""
    x = _random_input(shape, "uint8" if dtype == "bool" else dtype, 4)
    x = x.astype(bool) if dtype == "bool" else x
    for begin, end in ((0, 1), (-2, 3), (5, 6), (-599, -598)):
        for value in ((True,) if dtype == "bool" else (1, 7)):
            for inp in (None, x):
                got = kernels.diagonal_matrix1(shape, dtype, value, begin, end, input=inp)
                assert_bits_equal(got, kernels.diagonal_matrix1_reference(shape, dtype, value, begin, end, input=inp))


def test_signature_cache_keeps_every_call_exact():
    """What is cached per (shape, dtype, Begin, End) never leaks between calls: other Values
    (-0.0 and 0.0, a 0-d array used as is, Python scalars), inputs, dtype spellings, list shapes;
    a float Begin is still refused after the int one is cached."""
    for shape in ((4, 5), (2, 40, 50)):
        x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
        for dtype in ("float32", np.float32, np.dtype("float32")):
            for value in (-0.0, 0.0, np.array(-0.0, np.float32), np.array(7, np.float64), 3, float("nan")):
                for inp in (x, None, x.tolist()):
                    got = kernels.diagonal_matrix1(list(shape), dtype, value, -3, 4, input=inp)
                    want = pseudocode(shape, np.float32, value, -3, 4, input=None if inp is None else x)
                    assert_bits_equal(got, want)
        with pytest.raises(TypeError):
            kernels.diagonal_matrix1(shape, np.float32, 1, -3.0, 4)


@pytest.mark.parametrize("dtype", TYPES + ["bool"])
def test_tiny_outputs_cached_per_value_and_put(dtype):
    """Tiny outputs: without an input, a cached output per Value (more Values than are cached,
    -0.0 and NaN payloads among them, each its own); with one, the Value put at cached positions
    (maybe none); what is cached is never handed out or written."""
    shape = (2, 4, 5)
    full = _random_input(shape, "uint8" if dtype == "bool" else dtype, 7)
    full = full.astype(bool) if dtype == "bool" else full
    if dtype == "bool":
        values = [np.array(True), np.array(False), 1, 0]
    elif np.dtype(dtype).kind == "f":
        isz = np.dtype(dtype).itemsize
        payload = np.array((0x7C01, 0x7F801234, 0x7FF0000000000123)[isz // 4], f"u{isz}").view(dtype)  # signaling
        values = [np.array(v, dtype) for v in (0.0, -0.0, 1.0, np.nan, -np.inf, 2.5, 7.0)] + [payload]
    else:
        info = np.iinfo(dtype)
        values = [np.array(v, dtype) for v in (0, 1, info.min, info.max, 3, 5)] + [7]
    for begin, end in ((0, 1), (INT32_MIN, 0), (3, -2), (-3, -3), (INT32_MIN, -4), (INT32_MIN, INT32_MAX)):
        for _ in range(2):
            for value in values:
                for inp in (None, full, np.broadcast_to(full[..., :1, :], shape), (full != 0).astype(np.int16)):
                    want = kernels.diagonal_matrix1_reference(shape, dtype, value, begin, end, input=inp)
                    got = kernels.diagonal_matrix1(shape, dtype, value, begin, end, input=inp)
                    assert_bits_equal(got, want)
                    got[...] = 1  # (a returned array is the caller's)
                    out = np.zeros(shape[:-1] + (7,), dtype)[..., 1:6]
                    assert kernels.diagonal_matrix1(shape, dtype, value, begin, end, input=inp, out=out) is out
                    assert_bits_equal(out, want)


def test_tiny_setting_and_signature_lookups_follow_changes(monkeypatch):
    """A signature made while TINY_ELEMENTS allowed the tiny path follows the setting when it
    changes; signatures found by a plain dict lookup (tuple shapes, int bounds) agree with the
    other spellings (list shapes, numpy ints, bools), also after the dict was emptied."""
    shape = (4, 5)
    x = _random_input(shape, "float32", 3)
    want = kernels.diagonal_matrix1_reference(shape, "float32", 2, -1, 2, input=x)
    assert_bits_equal(kernels.diagonal_matrix1(shape, "float32", 2, -1, 2, input=x), want)
    monkeypatch.setattr(kernels, "TINY_ELEMENTS", 0)
    spied = []
    fast = kernels.run_fast_path
    monkeypatch.setattr(kernels, "run_fast_path", lambda *args: spied.append(args) or fast(*args))
    with kernels.numpy_only():
        assert_bits_equal(kernels.diagonal_matrix1(shape, "float32", 2, -1, 2, input=x), want)
    assert spied
    monkeypatch.undo()
    monkeypatch.setattr(kernels, "SEEN_SIGNATURES", 2)
    for _ in range(3):
        for begin, end in ((-1, 2), (np.int64(-1), np.int32(2)), (False, True), (-1, 2)):
            for s in (shape, list(shape), (np.int64(4), 5)):
                got = kernels.diagonal_matrix1(s, np.float32, 2, begin, end, input=x)
                assert_bits_equal(got, kernels.diagonal_matrix1_reference(shape, "float32", 2, int(begin), int(end),
                                                                          input=x))
    with pytest.raises(TypeError):
        kernels.diagonal_matrix1(shape, np.float32, 2, -1.0, 2)
    with pytest.raises(TypeError):
        kernels.diagonal_matrix1(shape, np.float32, 2, -1, 2.0)


@pytest.mark.skipif(not kernels.compiled_available(), reason="numba is not installed (the dmlgraph[fast] extra)")
@pytest.mark.parametrize("dtype", ["uint8", "bool", "float16", "float32", "int64"])
def test_compiled_single_diagonals(dtype):
    """The compiled kernel writes a one-diagonal Value along the diagonal (identities and
    DIAGONAL_MATRIX): every offset in and around the matrix, batches, full, batch-broadcast and
    absent inputs, byte-uniform and other Values, exactly."""
    values = (True,) if dtype == "bool" else (1, 0, -1 if dtype[0] != "u" else 255)
    with patch.multiple(kernels, COMPILED_MIN_BYTES=0, STREAM_MIN_BYTES=1 << 40, TINY_ELEMENTS=0):
        for shape in ((1, 1), (5, 9), (9, 5), (3, 17, 16), (2, 2, 33, 40)):
            x = _random_input(shape, "uint8" if dtype == "bool" else dtype, 8)
            x = x.astype(bool) if dtype == "bool" else x
            h, w = shape[-2:]
            for d in range(-h - 1, w + 2):
                for value in values:
                    for inp in (None, x, np.broadcast_to(x[..., :1, :, :] if len(shape) > 2 else x, shape)):
                        got = kernels.diagonal_matrix1(shape, dtype, value, d, d + 1, input=inp)
                        want = kernels.diagonal_matrix1_reference(shape, dtype, value, d, d + 1, input=inp)
                        assert_bits_equal(got, want)


@pytest.mark.parametrize("shape", [(3, 3), (300, 300)])  # the tiny path, and the compiled or numpy one
def test_a_value_that_is_a_view_of_out_is_read_before_out_is_written(shape):
    """Value given as a view of `out` (a 0-d or 1-element one): `out` gets the input first, so the
    Value must be taken before that, as the reference does."""
    x = np.full(shape, 5, np.float32)
    for view in (lambda o: o[:1, :1], lambda o: o[0, 0, ...]):
        out = np.zeros(shape, np.float32)
        out[0, 0] = 7
        want = kernels.diagonal_matrix1_reference(shape, np.float32, 7, 0, 1, input=x)
        assert_bits_equal(kernels.diagonal_matrix1(shape, np.float32, view(out), 0, 1, input=x, out=out), want)


def test_value_must_be_one_element_and_out_writeable():
    """A Value of one element in any shape is that element; more is refused, as is a read-only
    `out` on every path (numpy's own error; the compiled kernel would write through it)."""
    for shape in ((4, 5), (300, 300)):
        want = kernels.diagonal_matrix1_reference(shape, np.float32, 3, -1, 2)
        for value in (np.array([3], np.float32), np.array([[3]], np.int64), [3]):
            assert_bits_equal(kernels.diagonal_matrix1(shape, np.float32, value, -1, 2), want)
        with pytest.raises(DmlgraphError, match="one element"):
            kernels.diagonal_matrix1(shape, np.float32, np.array([3, 4], np.float32), -1, 2)
        out = np.zeros(shape, np.float32)
        out.setflags(write=False)
        with pytest.raises((DmlgraphError, ValueError), match="read-only"):
            kernels.diagonal_matrix1(shape, np.float32, 3, -1, 2, out=out)
        assert not out.any()


def test_template_cache_takes_calls_from_many_threads(monkeypatch):
    """The numpy path's template cache, evicting all the time (a small budget), under 8 threads
    switching every microsecond: every result exact, no error (eviction walked the dict while
    another thread added to it: ~1% of calls raised)."""
    import threading
    monkeypatch.setattr(kernels, "TEMPLATE_CACHE_BYTES", 64 << 10)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            with kernels.numpy_only():
                for _ in range(300):
                    h, w = int(rng.integers(8, 40)), int(rng.integers(8, 40))
                    begin = int(rng.integers(-h, w))
                    shape = (3, h, w)
                    x = np.ones(shape, np.float32)
                    got = kernels.diagonal_matrix1(shape, np.float32, 2, begin, begin + 20, input=x)
                    assert_bits_equal(got, kernels.diagonal_matrix1_reference(shape, np.float32, 2, begin,
                                                                              begin + 20, input=x))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
