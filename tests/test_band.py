"""Band analysis: soundness (a returned pattern always materializes to the input, bit for bit),
completeness (every DIAGONAL_MATRIX1 pattern is found, checked by brute force), canonical form,
typical masks, broadcast batches and memory-mapped arrays in bounded memory."""
from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmlgraph.ir.band import BandPattern, analyze_band
from dmlgraph.ir.dtypes import INT32_MAX, INT32_MIN

DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
          np.uint64, np.uint32, np.uint16, np.uint8, np.bool_]
QUIET_NAN_WITH_PAYLOAD = {2: 0x7E01, 4: 0x7FC00001, 8: 0x7FF8000000000001}

SETTINGS = settings(max_examples=int(os.environ.get("BAND_EXAMPLES", "150")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


# ---- helpers -------------------------------------------------------------------------------------
def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}").newbyteorder(a.dtype.byteorder)
                  if a.dtype.byteorder in "<>" else np.dtype(f"u{a.dtype.itemsize}"))


def bitwise_equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype.newbyteorder("=") == b.dtype.newbyteorder("=") \
        and np.array_equal(bits(a).astype(np.uint64), bits(b).astype(np.uint64))


def from_bits(b: int, dtype) -> np.generic:
    dt = np.dtype(dtype)
    return np.array([b], dtype=f"u{dt.itemsize}").view(dt)[0]


def reference(shape, dtype, begin, end, value, other) -> np.ndarray:
    """The spec's pseudocode, literally (Input = `other` broadcast everywhere)."""
    out = np.empty(shape, dtype)
    for coord in np.ndindex(*shape):
        y, x = coord[-2], coord[-1]
        top_x = x - y
        use_value = (end >= begin) ^ (top_x >= begin) ^ (top_x < end)
        out[coord] = value if use_value else other
    return out


def brute_force_is_band(arr: np.ndarray) -> bool:
    """Is there any (begin, end) in [-H-1, W+1]^2 and value/other that reproduce arr exactly?"""
    h, w = arr.shape[-2:]
    b = bits(arr).reshape(-1, h, w)
    top_x = np.arange(w)[None, :] - np.arange(h)[:, None]
    seen = set()
    for begin in range(-h - 1, w + 2):
        for end in range(-h - 1, w + 2):
            use = (end >= begin) ^ (top_x >= begin) ^ (top_x < end)
            key = use.tobytes()
            if key in seen:
                continue
            seen.add(key)
            inside, outside = b[:, use], b[:, ~use]
            if (inside.size == 0 or (inside == inside.flat[0]).all()) and \
               (outside.size == 0 or (outside == outside.flat[0]).all()):
                return True
    return False


def check_canonical(p: BandPattern, arr: np.ndarray) -> None:
    h, w = arr.shape[-2:]
    assert (p.height, p.width) == (h, w)
    assert p.dtype == arr.dtype.newbyteorder("=")
    assert type(p.value) is arr.dtype.newbyteorder("=").type and type(p.other) is type(p.value)
    assert INT32_MIN <= p.begin <= INT32_MAX and INT32_MIN <= p.end <= INT32_MAX
    lo, hi = -(h - 1), w - 1
    distinct = set(np.unique(bits(arr)).tolist())
    if p.begin == p.end:  # fills nothing: only the all-zero array
        assert (p.begin, p.value_bits, p.other_bits) == (0, 0, 0) and distinct == {0}
        return
    use = p.use_mask()
    if use.all():  # constant nonzero array
        assert (p.begin, p.end) == (INT32_MIN, INT32_MAX) and p.is_generator and distinct == {p.value_bits}
        return
    assert p.value_bits != p.other_bits and distinct == {p.value_bits, p.other_bits}
    if 0 in distinct:
        assert p.is_generator
    if p.inverted:
        assert lo < p.end < p.begin <= hi and p.is_generator
    else:
        assert p.begin == INT32_MIN or lo < p.begin <= hi
        assert p.end == INT32_MAX or lo < p.end <= hi
        assert p.begin != INT32_MIN or use[h - 1, 0]  # sentinel only where the value reaches the corner
        assert p.end != INT32_MAX or use[0, w - 1]
    if not p.is_generator:
        sig = np.concatenate([use[:0:-1, 0], use[0, :]])
        changes = int(np.count_nonzero(sig[1:] != sig[:-1]))
        assert not p.inverted
        if changes == 1:
            assert use[0, w - 1]  # both parts are runs: value is the top-right (upper) part
    # unique: analysing the pattern's own expansion gives the same pattern back
    assert analyze_band(p.materialize()) == p


def assert_sound(arr: np.ndarray, p: BandPattern | None) -> None:
    if p is not None:
        assert bitwise_equal(p.materialize(arr.shape), arr)


# ---- strategies ----------------------------------------------------------------------------------
@st.composite
def scalars(draw, dtype):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return np.bool_(draw(st.booleans()))
    if dt.kind in "iu":
        info = np.iinfo(dt)
        special = [0, 1, info.min, info.max] + ([-1, -10000 if dt.itemsize > 1 else -100] if dt.kind == "i" else [])
        return dt.type(draw(st.one_of(st.sampled_from(special), st.integers(int(info.min), int(info.max)))))
    fi = np.finfo(dt)
    special = [0.0, -0.0, 1.0, -1.0, -10000.0, np.inf, -np.inf, np.nan, float(fi.min), float(fi.max), float(fi.tiny)]
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return from_bits(QUIET_NAN_WITH_PAYLOAD[dt.itemsize], dt)
    if kind == 1:
        return from_bits(draw(st.integers(0, 2 ** (8 * dt.itemsize) - 1)), dt)  # any bits, NaNs included
    with np.errstate(over="ignore"):
        return dt.type(draw(st.one_of(st.sampled_from(special), st.floats(width=8 * dt.itemsize))))


def bounds(h, w):
    return st.one_of(st.sampled_from([INT32_MIN, INT32_MAX, INT32_MIN + 1, INT32_MAX - 1, 0]),
                     st.integers(-h - 3, w + 3))


@st.composite
def bands(draw):
    dtype = draw(st.sampled_from(DTYPES))
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    begin, end = draw(bounds(h, w)), draw(bounds(h, w))
    value = draw(scalars(dtype))
    other = draw(st.one_of(st.just(np.zeros((), dtype)[()]), scalars(dtype)))
    arr = reference(batch + (h, w), dtype, begin, end, value, other)
    return arr, (begin, end, value, other)


# ---- round trip, canonical form ------------------------------------------------------------------
def test_reference_builder_keeps_bits():
    nan = from_bits(QUIET_NAN_WITH_PAYLOAD[4], np.float32)
    arr = reference((2, 3), np.float32, 0, 1, nan, np.float32(-0.0))
    assert bits(arr)[0, 0] == QUIET_NAN_WITH_PAYLOAD[4] and bits(arr)[0, 1] == 0x80000000


@SETTINGS
@given(bands(), st.one_of(st.none(), st.integers(1, 5)))
def test_every_band_is_found_and_round_trips(band, block_rows):
    arr, _ = band
    p = analyze_band(arr, block_rows=block_rows)
    assert p is not None
    assert bitwise_equal(p.materialize(arr.shape), arr)
    check_canonical(p, arr)


@SETTINGS
@given(bands(), st.data())
def test_perturbed_band_sound_and_complete(band, data):
    arr, (_, _, value, other) = band
    arr = arr.copy()
    flat = arr.reshape(-1)
    i = data.draw(st.integers(0, flat.size - 1))
    flat[i] = data.draw(st.one_of(st.sampled_from([value, other]), scalars(arr.dtype.type)))
    p = analyze_band(arr, block_rows=data.draw(st.integers(1, 4)))
    assert_sound(arr, p)
    assert (p is not None) == brute_force_is_band(arr)
    if p is not None:
        check_canonical(p, arr)


@SETTINGS
@given(st.integers(1, 9), st.integers(1, 9), st.sampled_from(DTYPES), st.data())
def test_random_two_valued_arrays_match_brute_force(h, w, dtype, data):
    a, b = data.draw(scalars(dtype)), data.draw(scalars(dtype))
    if data.draw(st.booleans()):  # Toeplitz from a random diagonal signature: often a band, often not
        sig = np.array(data.draw(st.lists(st.booleans(), min_size=h + w - 1, max_size=h + w - 1)))
        mask = sig[np.arange(w)[None, :] - np.arange(h)[:, None] + h - 1]
    else:
        mask = np.array(data.draw(st.lists(st.booleans(), min_size=h * w, max_size=h * w))).reshape(h, w)
    arr = np.where(mask, np.array(a, dtype), np.array(b, dtype))
    p = analyze_band(arr)
    assert_sound(arr, p)
    assert (p is not None) == brute_force_is_band(arr)
    if p is not None:
        check_canonical(p, arr)


# ---- typical masks ---------------------------------------------------------------------------------
def _d(h, w):
    return np.arange(w)[None, :] - np.arange(h)[:, None]


F16MIN, F32MIN = np.finfo(np.float16).min, np.finfo(np.float32).min


@pytest.mark.parametrize("arr, expected", [
    (np.tril(np.ones((6, 6), bool)), (INT32_MIN, 1, True, False)),
    (np.tril(np.ones((6, 6), np.float32)), (INT32_MIN, 1, 1.0, 0.0)),
    (np.tril(np.ones((4, 7), np.int64), 2), (INT32_MIN, 3, 1, 0)),
    (np.triu(np.full((5, 5), -np.inf, np.float32), 1), (1, INT32_MAX, -np.inf, 0.0)),
    (np.where(np.tril(np.ones((5, 5), bool)), np.float32(1), np.float32(-10000)), (1, INT32_MAX, -10000.0, 1.0)),
    (np.triu(np.full((8, 8), F32MIN, np.float32), 1), (1, INT32_MAX, F32MIN, 0.0)),
    (np.triu(np.full((8, 8), F16MIN, np.float16), 1), (1, INT32_MAX, F16MIN, 0.0)),
    (np.eye(5, dtype=np.int64), (0, 1, 1, 0)),
    (np.eye(3, 6, k=2, dtype=np.uint8), (2, 3, 1, 0)),
    (np.eye(6, 3, k=-2, dtype=np.float64), (-2, -1, 1.0, 0.0)),
    # sliding window of 3 (causal): keep -2 <= x - y <= 0
    (((_d(8, 8) <= 0) & (_d(8, 8) > -3)), (-2, 1, True, False)),
    # additive sliding-window mask: -inf outside the window -> inverted generator
    (np.where((_d(8, 8) <= 0) & (_d(8, 8) > -3), np.float32(0), np.float32(-np.inf)), (1, -2, -np.inf, 0.0)),
    # symmetric band of half-width 1 with two nonzero values: the band is the value, no inversion
    (np.where(abs(_d(6, 6)) <= 1, 3.0, 2.0), (-1, 2, 3.0, 2.0)),
    (np.full((3, 4), 7, np.int16), (INT32_MIN, INT32_MAX, 7, 0)),
    (np.zeros((3, 4), np.float32), (0, 0, 0.0, 0.0)),
    (np.full((3, 4), -0.0), (INT32_MIN, INT32_MAX, -0.0, 0.0)),  # -0.0 is a value, not zero
    (np.array([[1, 0, 0]], np.int8), (INT32_MIN, 1, 1, 0)),  # H = 1: diagonal 0 is the first one
    (np.array([[0], [1], [1]], np.int8), (INT32_MIN, 0, 1, 0)),  # W = 1
    (np.array([[5]], np.uint64), (INT32_MIN, INT32_MAX, 5, 0)),
])
def test_typical_masks(arr, expected):
    p = analyze_band(arr)
    assert p is not None
    begin, end, value, other = expected
    assert (p.begin, p.end) == (begin, end)
    assert bitwise_equal(p.value, np.array(value, arr.dtype)) and bitwise_equal(p.other, np.array(other, arr.dtype))
    assert bitwise_equal(p.materialize(), arr)
    assert p.is_generator == (bits(np.array(other, arr.dtype)) == 0)
    check_canonical(p, arr)


def test_bool_mask_scalars_are_numpy_bools():
    p = analyze_band(np.tril(np.ones((3, 3), bool)))
    assert type(p.value) is np.bool_ and type(p.other) is np.bool_ and p.is_generator and not p.inverted


def test_nan_value_and_negative_zero_other_reproduced():
    nan = from_bits(QUIET_NAN_WITH_PAYLOAD[2], np.float16)
    arr = reference((4, 4), np.float16, 1, INT32_MAX, nan, np.float16(-0.0))
    p = analyze_band(arr)
    assert p is not None and not p.is_generator  # -0.0 needs an input: the generator writes +0
    assert bitwise_equal(p.materialize(), arr)
    assert p == analyze_band(arr.copy())  # bitwise equality: NaN patterns compare equal
    assert hash(p) == hash(analyze_band(arr.copy()))
    arr[0, 3] = np.float16(np.nan)  # a different NaN payload is a third value
    assert analyze_band(arr) is None


def test_materialize_with_batch_shape():
    p = analyze_band(np.eye(3, 4, dtype=np.float32))
    out = p.materialize((2, 5, 3, 4))
    assert out.shape == (2, 5, 3, 4) and out.flags.c_contiguous and bitwise_equal(out[1, 4], np.eye(3, 4, dtype=np.float32))


# ---- rejections ------------------------------------------------------------------------------------
def test_not_bands():
    causal = np.tril(np.ones((5, 5), np.float32))
    three = causal.copy()
    three[4, 4] = 2
    assert analyze_band(three) is None  # three values
    assert analyze_band(np.tile([1.0, 0.0], (4, 2))) is None  # two values, not diagonal
    assert analyze_band(np.stack([causal, np.triu(causal)])) is None  # batch slices differ
    late = np.broadcast_to(causal, (3, 4, 5, 5)).copy()
    late[2, 3, 4, 0] = 0
    assert analyze_band(late) is None  # only the last slice differs
    assert analyze_band(late, block_rows=1) is None
    assert analyze_band(late, block_rows=100) is None
    # Toeplitz but three runs of a value along the diagonals
    d = _d(6, 6)
    assert analyze_band(((d == 0) | (d == 2)).astype(np.int32)) is None


@pytest.mark.parametrize("arr", [
    np.float32(1), np.ones(4), np.ones((0, 3)), np.ones((3, 0)), np.ones((2, 0, 3, 3)),
    np.eye(3, dtype=np.complex64), np.eye(3).astype(object), np.array([["a", "b"], ["c", "d"]]),
    np.eye(3).astype("datetime64[s]"), np.zeros((2, 2), dtype=[("a", "f4")]),
])
def test_rejected_inputs(arr):
    assert analyze_band(arr) is None


def test_rejected_extended_types():
    if np.dtype(np.longdouble).itemsize > 8:
        assert analyze_band(np.eye(3, dtype=np.longdouble)) is None
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert analyze_band(np.eye(3).astype(ml_dtypes.bfloat16)) is None


# ---- layouts: non-native, non-contiguous, broadcast --------------------------------------------------
def test_big_endian_and_strided_inputs():
    causal = np.where(np.tril(np.ones((6, 6), bool)), 0.0, -np.inf)
    be = causal.astype(">f8")
    p = analyze_band(be)
    assert p == analyze_band(causal) and p.dtype == np.float64 and bitwise_equal(p.materialize(), be)
    for view in (causal.T, np.asfortranarray(causal), causal[::-1, ::-1], causal[::2, ::3],
                 np.broadcast_to(np.float32(3), (4, 5)), np.broadcast_to(np.arange(3.0), (4, 3))):
        p = analyze_band(view)
        assert_sound(view, p)
        assert (p is not None) == brute_force_is_band(view)


def test_broadcast_batch_is_analysed_without_copying():
    base = np.where(np.tril(np.ones((64, 64), bool)), np.float32(0), np.float32(-10000))
    arr = np.broadcast_to(base, (1000, 8, 64, 64))  # 131 MB if it were materialized
    tracemalloc.start()
    try:
        p = analyze_band(arr)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert p is not None and (p.begin, p.end) == (1, INT32_MAX) and p.value == np.float32(-10000)
    assert peak < 1 << 20
    # a real batch axis next to a broadcast one: every real slice is compared
    mixed = np.broadcast_to(np.stack([base, base, base])[:, None], (3, 50, 64, 64))
    assert analyze_band(mixed) == p
    different = np.broadcast_to(np.stack([base, base, base.T])[:, None], (3, 50, 64, 64))
    assert analyze_band(different) is None


def test_many_small_batch_slices():
    eye = np.eye(4, 5, dtype=np.int16)
    arr = np.broadcast_to(eye, (7, 300, 4, 5)).copy()
    assert analyze_band(arr) == analyze_band(eye)
    assert analyze_band(arr, block_rows=3) == analyze_band(eye)
    arr[6, 299, 3, 4] = 1
    assert analyze_band(arr) is None and analyze_band(arr, block_rows=3) is None


# ---- memory-mapped arrays in bounded memory ---------------------------------------------------------
def _write_causal_memmap(path, n):
    mm = np.memmap(path, dtype=np.float32, mode="w+", shape=(n, n))
    cols = np.arange(n)
    for y0 in range(0, n, 256):
        ys = np.arange(y0, min(y0 + 256, n))[:, None]
        mm[y0:y0 + 256] = np.where(cols[None, :] > ys, np.float32(-10000), np.float32(0))
    mm.flush()
    del mm


def test_memmap_causal_mask_bounded_memory(tmp_path):
    n = 2048
    path = tmp_path / "mask.bin"
    _write_causal_memmap(path, n)
    arr = np.memmap(path, dtype=np.float32, mode="r", shape=(n, n))
    tracemalloc.start()
    try:
        p = analyze_band(arr, block_rows=32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert p is not None
    assert (p.begin, p.end, p.value, p.other) == (1, INT32_MAX, np.float32(-10000), np.float32(0))
    assert p.is_generator and not p.inverted
    assert peak < arr.nbytes / 16  # 16 MiB array; a 32-row block is 256 KiB
    del arr


def test_np_load_mmap_with_batch(tmp_path):
    d = _d(300, 200)
    mask = ((d <= 0) & (d > -16))  # sliding window of 16
    path = tmp_path / "mask.npy"
    np.save(path, np.broadcast_to(mask, (2, 300, 200)))
    arr = np.load(path, mmap_mode="r")
    p = analyze_band(arr, block_rows=17)
    assert p is not None and (p.begin, p.end, bool(p.value), bool(p.other)) == (-15, 1, True, False)
    assert bitwise_equal(p.materialize(arr.shape), arr)
    del arr
