"""Band analysis: is an ndarray one DIAGONAL_MATRIX1 pattern, and which one?

`analyze_band` decides exactly, bit for bit, whether every [..., H, W] slice of an array is `value`
on a (possibly inverted) run of diagonals and `other` elsewhere, and returns the canonical
`BandPattern`, or None, in memory bounded by a block of rows (memory-mapped weights are fine).
How (a Toeplitz signature, then a blockwise comparison): docs/internals.md, ir/band.py.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from dmlgraph.ir.dtypes import INT32_MAX, INT32_MIN

__all__ = ["BandPattern", "analyze_band", "diagonal_use_mask", "index_vector", "two_valued_matrix",
           "DEFAULT_BLOCK_ELEMENTS"]

# Block size when `block_rows` is not given: about 2**20 elements per block (4 MiB of float32).
DEFAULT_BLOCK_ELEMENTS = 1 << 20

# dtype.kind -> item sizes DIAGONAL_MATRIX1 can carry (bool travels as UINT8).
_SUPPORTED = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8)}


def _supported(dtype: np.dtype) -> bool:
    return dtype.itemsize in _SUPPORTED.get(dtype.kind, ()) and dtype.fields is None and dtype.subdtype is None


def _bits_dtype(dtype: np.dtype) -> np.dtype:
    """The unsigned dtype of the same size and byte order: viewing through it reads bit patterns."""
    u = np.dtype(f"u{dtype.itemsize}")
    return u.newbyteorder(dtype.byteorder) if dtype.byteorder in "<>" else u


def _scalar_bits(v: npt.ArrayLike) -> int:
    a = np.asarray(v)
    return int(a.view(_bits_dtype(a.dtype)).item())


def _scalar_from_bits(bits: int, dtype: np.dtype) -> np.generic:
    native = dtype.newbyteorder("=")
    return np.array([bits], dtype=np.dtype(f"u{native.itemsize}")).view(native)[0]


def diagonal_use_mask(height: int, width: int, begin: int, end: int) -> np.ndarray:
    """The [H, W] bool mask of cells DIAGONAL_MATRIX1 fills with Value (the spec's useValue)."""
    top_x = np.arange(width, dtype=np.int64)[None, :] - np.arange(height, dtype=np.int64)[:, None]
    return (end >= begin) ^ (top_x >= begin) ^ (top_x < end)


@dataclass(frozen=True, eq=False)
class BandPattern:
    """One DIAGONAL_MATRIX1 fill of an H x W matrix (repeated over every batch slice).

    Fields: `begin`/`end` (int32 DiagonalFillBegin/End), `value` (numpy scalar of the array's
    dtype, native byte order; np.bool_ for bool), `other` (the else-value, same type), `height`,
    `width` (the analysed H, W).

    Lowering: `other` bitwise +0 -> a pure generator (no input). Otherwise the input is the scalar
    `other` broadcast with all-zero strides. (-0.0 is not +0: the generator writes +0.0.)

    Canonical form (what `analyze_band` returns; unique for a given array). topX only spans
    R = [-(H-1), W-1]; let S be the diagonals holding `value`:
    * S is one run [lo, hi] of R (non-inverted, begin < end): begin = lo, or INT32_MIN if lo is
      R's first diagonal; end = hi + 1, or INT32_MAX if hi is R's last diagonal. So a finite bound
      always lies strictly inside R: -(H-1) < begin <= W-1 and -(H-1) < end <= W-1.
      E.g. tril of ones: (INT32_MIN, 1); strict triu: (1, INT32_MAX); eye: (0, 1) (for H > 1).
    * S is a prefix and a suffix of R around a gap [g, h] (inverted, begin > end):
      end = g, begin = h + 1, both finite: -(H-1) < end < begin <= W-1.
    * S = R (constant array, nonzero bits): (INT32_MIN, INT32_MAX), other = 0 (a generator).
    * S empty (all-zero bits array): value = other = 0 and begin = end = 0 (fills nothing).

    Which of two values {a, b} is `value`: (1) if one is bitwise +0 it is `other` (a generator,
    possibly inverted); (2) otherwise the one whose diagonals form one run (non-inverted); (3) if
    both do (the array has a single value change along the diagonals, e.g. a triangle), the one
    in the top-right corner (the upper part: end = INT32_MAX). An inverted pattern is therefore
    always a generator.
    """

    begin: int
    end: int
    value: np.generic
    other: np.generic
    height: int
    width: int

    def __post_init__(self) -> None:
        for name in ("begin", "end"):
            v = int(getattr(self, name))
            if not INT32_MIN <= v <= INT32_MAX:
                raise ValueError(f"BandPattern.{name} = {v} is not an int32")
            object.__setattr__(self, name, v)
        if np.asarray(self.value).dtype != np.asarray(self.other).dtype:
            raise ValueError("BandPattern value and other must have the same dtype")

    @property
    def dtype(self) -> np.dtype:
        return np.asarray(self.value).dtype

    @property
    def value_bits(self) -> int:
        return _scalar_bits(self.value)

    @property
    def other_bits(self) -> int:
        return _scalar_bits(self.other)

    @property
    def is_generator(self) -> bool:
        """True if the else-value is bitwise zero (+0): DIAGONAL_MATRIX1 without an input."""
        return self.other_bits == 0

    @property
    def inverted(self) -> bool:
        """Begin > End: `value` fills the diagonals outside [end, begin)."""
        return self.begin > self.end

    def use_mask(self, height: int | None = None, width: int | None = None) -> np.ndarray:
        """The [H, W] bool mask of cells holding `value` (default: the analysed H, W)."""
        return diagonal_use_mask(self.height if height is None else height,
                                 self.width if width is None else width, self.begin, self.end)

    def materialize(self, shape: Iterable[int] | None = None) -> np.ndarray:
        """Reference expansion: the array this pattern stands for, bit-exact (numpy, dense).

        `shape` defaults to (height, width); any shape of rank >= 2 applies the same
        Begin/End/value/other (the pattern's meaning at another size).
        """
        shape = (self.height, self.width) if shape is None else tuple(int(s) for s in shape)
        if len(shape) < 2:
            raise ValueError(f"materialize needs rank >= 2, got shape {shape}")
        u = np.dtype(f"u{self.dtype.itemsize}")
        use = diagonal_use_mask(shape[-2], shape[-1], self.begin, self.end)
        bits = np.where(use, u.type(self.value_bits), u.type(self.other_bits)).astype(u)
        return np.ascontiguousarray(np.broadcast_to(bits.view(self.dtype), shape))

    def _key(self) -> tuple[int, int, int, int, str, int, int]:
        return (self.begin, self.end, self.height, self.width, self.dtype.str, self.value_bits, self.other_bits)

    def __eq__(self, other: object) -> bool:
        """Bitwise: patterns with the same NaN value are equal; -0.0 and +0.0 differ."""
        if not isinstance(other, BandPattern):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


def two_valued_matrix(arr: np.ndarray | None) -> bool:
    """Exactly two values in a numeric array of at least 2 x 2 trailing sizes: what looks like a
    stored mask (its first 4096 elements rule most weights out without a full `np.unique`)."""
    return arr is not None and arr.ndim >= 2 and min(arr.shape[-2:]) >= 2 and arr.dtype.kind in "biuf" \
        and len(np.unique(arr.reshape(-1)[:4096])) <= 2 and len(np.unique(arr)) == 2


def index_vector(arr: np.ndarray | None) -> bool:
    """An integer run `a * i + b` (a != 0) of at least 2 along one axis, every other axis 1: a
    stored `arange`, what an exporter folds a Range of fixed sizes into (an index grid)."""
    if arr is None or arr.dtype.kind not in "iu" or not 2 <= arr.size <= 4096 or arr.size != max(arr.shape):
        return False
    d = np.diff(arr.reshape(-1).astype(np.int64))
    return bool(d[0] != 0 and (d == d[0]).all())


def analyze_band(array: npt.ArrayLike, *, block_rows: int | None = None) -> BandPattern | None:
    """The canonical `BandPattern` every [..., H, W] slice of `array` equals bit for bit, or None.

    None for: rank < 2, a zero-size dimension, a dtype DIAGONAL_MATRIX1 cannot carry (anything but
    bool, float16/32/64 and 8-64-bit ints; e.g. complex, object, str, bfloat16, float128), more than
    two distinct bit patterns, non-diagonal structure, or batch slices that differ.

    `block_rows`: rows compared per step (default: about 2**20 elements per block). Batch axes with
    stride 0 or size 1 are not re-read. The array is never copied whole (safe on np.memmap).
    """
    a = np.asarray(array)  # no copy for ndarrays and memmaps (a plain view)
    if a.ndim < 2 or 0 in a.shape or not _supported(a.dtype):
        return None
    h, w = (int(s) for s in a.shape[-2:])
    if h - 1 > -INT32_MIN or w > INT32_MAX:
        return None  # diagonal indices would not fit int32 (far beyond DML's 2**32 element limit)
    if block_rows is None:
        block_rows = max(1, DEFAULT_BLOCK_ELEMENTS // w)
    block_rows = max(1, int(block_rows))

    bits = a.view(_bits_dtype(a.dtype))
    u = np.dtype(f"u{a.dtype.itemsize}")
    first = bits[(0,) * (a.ndim - 2)]

    # A band changes value at most twice along any row: reject weights on the contiguous first
    # row, before reading down a column (which touches every page of a memory-mapped tensor).
    row0 = np.asarray(first[0, :])
    if np.count_nonzero(row0[1:] != row0[:-1]) > 2:
        return None

    # Diagonal signature: sig[i] holds diagonal d = i - (H-1), read from column 0 then row 0.
    sig = np.concatenate([np.asarray(first[:0:-1, 0]), np.asarray(first[0, :])]).astype(u)
    pattern = _pattern_from_signature(sig, h, w, a.dtype)
    if pattern is None:
        return None

    # Zero-copy Toeplitz view of the signature: row y is sig[H-1-y : H-1-y+W], i.e. d = x - y.
    expected = sliding_window_view(sig, w)[::-1]
    if not _verify(bits, expected, block_rows):
        return None
    return pattern


def _pattern_from_signature(sig: np.ndarray, h: int, w: int, dtype: np.dtype) -> BandPattern | None:
    distinct = np.unique(sig)
    if distinct.size > 2:
        return None
    lo_d = -(h - 1)  # the diagonal of sig[0]
    last = sig.size - 1

    def make(value_bits: int, other_bits: int, begin: int, end: int) -> BandPattern:
        return BandPattern(begin, end, _scalar_from_bits(value_bits, dtype),
                           _scalar_from_bits(other_bits, dtype), h, w)

    if distinct.size == 1:
        v = int(distinct[0])
        return make(0, 0, 0, 0) if v == 0 else make(v, 0, INT32_MIN, INT32_MAX)

    changes = np.flatnonzero(sig[1:] != sig[:-1])
    if changes.size > 2:
        return None
    a_bits, b_bits = int(distinct[0]), int(distinct[1])

    def run(v: int) -> tuple[int, int] | None:
        """(first, last) sig index of value v if its diagonals form one run."""
        idx = np.flatnonzero(sig == v)
        first, final = int(idx[0]), int(idx[-1])
        return (first, final) if final - first + 1 == idx.size else None

    if a_bits == 0 or b_bits == 0:
        value, other = (b_bits, a_bits) if a_bits == 0 else (a_bits, b_bits)
    else:
        runs = [v for v in (a_bits, b_bits) if run(v) is not None]
        if len(runs) == 2:  # one change along d: value is the upper (top-right) part
            value = int(sig[-1])
        else:
            value = runs[0]  # two changes: exactly one of the values is the middle run
        other = b_bits if value == a_bits else a_bits

    r = run(value)
    if r is not None:
        first, final = r
        begin = INT32_MIN if first == 0 else first + lo_d
        end = INT32_MAX if final == last else final + 1 + lo_d
        return make(value, other, begin, end)
    gap = run(other)  # value = prefix + suffix around one run of `other`
    assert gap is not None  # two bit patterns changing at most twice: one of them is a single run
    gap_first, gap_last = gap
    return make(value, other, gap_last + 1 + lo_d, gap_first + lo_d)


def _verify(bits: np.ndarray, expected: np.ndarray, block_rows: int) -> bool:
    """Every analysed slice of `bits` equals `expected` ([H, W]), compared block by block."""
    h = expected.shape[0]
    batch_shape = bits.shape[:-2]
    # Broadcast (stride-0) and size-1 batch axes repeat the same slice: look at index 0 only.
    keep = [n > 1 and s != 0 for n, s in zip(batch_shape, bits.strides[:-2])]
    view = bits[tuple(slice(None) if k else 0 for k in keep)]
    batch = view.shape[:-2]

    if h >= block_rows or not batch:
        for idx in np.ndindex(*batch):
            s = view[idx]
            for y0 in range(0, h, block_rows):
                if not np.array_equal(s[y0:y0 + block_rows], expected[y0:y0 + block_rows]):
                    return False
        return True
    # Small slices: compare several slices of the last batch axis per step.
    per_step = max(1, block_rows // h)
    for idx in np.ndindex(*batch[:-1]):
        s = view[idx]
        for j in range(0, batch[-1], per_step):
            if not (s[j:j + per_step] == expected).all():
                return False
    return True
