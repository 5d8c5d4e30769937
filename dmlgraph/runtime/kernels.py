"""numpy kernels for DIAGONAL_MATRIX1 and DIAGONAL_MATRIX (the spec's pseudocode, bit-exact).

A plan cached per (shape, dtype, Begin, End) writes one region as a base and the other as overlays,
templates or puts, so the common case costs about one copy; with numba, `kernels_compiled` takes
large outputs. `diagonal_matrix1_reference` is the plain form the tests use as an oracle.
The semantics, the fast path and its measurements: docs/internals.md, runtime/kernels.py.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import math
import operator
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Literal, NamedTuple, SupportsIndex, cast

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

from dmlgraph.errors import DmlgraphError

__all__ = [
    "diagonal_matrix1",
    "prepare_diagonal_matrix1",
    "diagonal_matrix1_reference",
    "diagonal_matrix",
    "diagonal_matrix_value",
]

TINY_ELEMENTS = 1024  # at most this many elements: the input and a put of Value, or a cached output
TINY_VALUES = 2  # tiny outputs without input cached per signature for this many Values
BLOCK_BYTES = 512 * 1024  # rows written per block (base then overlays, while in cache)
NARROW = 16  # overlays at most this many diagonals wide go through diagonal views
OVERLAY_ROWS = 256  # rows per overlay step: the ragged ends are skewed views of this many rows
MASK_ROWS = 8  # ragged ends of at most this many rows near a matrix edge use cached masks
SQUARE_BYTES = 1024 * 1024
MIN_BLOCK_ROWS = 32
TEMPLATE_BYTES = 8 * 1024 * 1024  # batched matrices up to this size use a cached template
TEMPLATE_CACHE_BYTES = 64 * 1024 * 1024
SMALL_TEMPLATE_BYTES = 512 * 1024  # any matrix up to this size uses a cached template
COMPILED_MIN_BYTES = 64 * 1024  # outputs from this size use the compiled kernel when numba is there
STREAM_MIN_BYTES = 16 * 1024 * 1024  # the compiled kernel writes outputs from this size past the cache
GENERATED_MIN_BYTES = 4 * 1024 * 1024  # outputs without an input from this size, with rows up to
GENERATED_MAX_ROW_BYTES = 16 * 1024  # this long: full-line streaming stores (see _compiled_call)

_DTYPES = frozenset(np.dtype(t) for t in (
    "float64", "float32", "float16", "int64", "int32", "int16", "int8",
    "uint64", "uint32", "uint16", "uint8", "bool"))


# --------------------------------------------------------------------------------------------
# plans (cached)


@dataclass(frozen=True)
class _Plan:
    height: int
    width: int
    value_intervals: tuple[tuple[int, int], ...]  # topX intervals [p, q), clipped to [-H, W]
    keep_intervals: tuple[tuple[int, int], ...]
    value_area: int  # elements per matrix written with Value
    keep_area: int
    rows_args: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)  # H, W, then two value intervals,
    # (W, W) if unused: the compiled kernel's arguments
    value_width: int = 0  # diagonals in the widest value interval


def _clip_bound(b: int, h: int, w: int) -> int:
    return min(max(b, -h), w)


def _interval_area(p: int, q: int, h: int, w: int) -> int:
    if q <= p:
        return 0
    y = np.arange(h, dtype=np.int64)
    lo = np.clip(p + y, 0, w)
    hi = np.clip(q + y, 0, w)
    return int(np.maximum(hi - lo, 0).sum())


@functools.lru_cache(maxsize=1024)
def _plan(h: int, w: int, begin: int, end: int) -> _Plan:
    lo_inf, hi_inf = -h, w  # topX spans [-(h-1), w-1]: these act as -inf / +inf
    b, e = _clip_bound(begin, h, w), _clip_bound(end, h, w)
    value: list[tuple[int, int]] | tuple[tuple[int, int], ...]
    keep: list[tuple[int, int]] | tuple[tuple[int, int], ...]
    if end >= begin:  # value on [begin, end)
        value = [(b, e)]
        keep = [(lo_inf, b), (e, hi_inf)]
    else:  # value outside [end, begin)
        value = [(lo_inf, e), (b, hi_inf)]
        keep = [(e, b)]
    value = tuple(iv for iv in value if _interval_area(*iv, h, w) > 0)
    keep = tuple(iv for iv in keep if _interval_area(*iv, h, w) > 0)
    va = sum(_interval_area(*iv, h, w) for iv in value)
    (p0, q0), (p1, q1) = list(value) + [(w, w)] * (2 - len(value))
    return _Plan(h, w, value, keep, va, h * w - va, (h, w, p0, q0, p1, q1),
                 max((q - p for p, q in value), default=0))


@functools.lru_cache(maxsize=1024)
def _tiny_index(shape: tuple[int, ...], begin: int, end: int) -> np.ndarray:
    """Flat C-order indices of every Value position in a tensor of `shape` (small tensors).

    Left writeable (it is never handed out): `ndarray.put` copies a read-only index array first,
    which made each put cost twice as much (0.39 against 0.2 us for 10 positions)."""
    h, w = shape[-2], shape[-1]
    y = np.arange(h).reshape(h, 1)
    x = np.arange(w).reshape(1, w)
    top = x - y
    use = (end >= begin) ^ (top >= begin) ^ (top < end)
    return np.flatnonzero(np.broadcast_to(use, shape))


@functools.lru_cache(maxsize=256)
def _mask(kind: str, rows: int, cols: int, width: int = 0) -> np.ndarray:
    """Block masks in unclipped coordinates (i = row in block, j = column from the window start).

    'left':  j >= i          (the ragged start of an interval; window starts at p + y0)
    'right': j <  i          (the ragged end;   window starts at q + y0)
    'band':  i <= j < i + width   (a whole interval narrower than the block is tall)
    """
    i = np.arange(rows).reshape(rows, 1)
    j = np.arange(cols).reshape(1, cols)
    if kind == "left":
        m = j >= i
    elif kind == "right":
        m = j < i
    else:
        m = (j >= i) & (j < i + width)
    m.setflags(write=False)
    return m


# --------------------------------------------------------------------------------------------
# low-level writers on 3-D (batch, H, W) views


def _uniform_byte(v: np.ndarray) -> int | None:
    """The byte value if every byte of scalar `v` is the same (0, -1, any uint8...), else None."""
    raw = v.tobytes()
    return raw[0] if raw.count(raw[0]) == len(raw) else None


class _Writer:
    """Writes constants or input blocks into a 3-D output view, using byte fills when possible."""

    def __init__(self, o3: np.ndarray, s3: np.ndarray | None, v: np.ndarray):
        self.o3 = o3
        # read only for the source "input", which a plan has only when s3 is not None
        self.s3 = cast(np.ndarray, s3)
        self.v = v
        self.zero = np.zeros((), o3.dtype)
        self.o8: np.ndarray | None = None
        if o3.strides[2] == o3.itemsize or o3.shape[2] == 1:
            try:
                self.o8 = o3.view(np.uint8)
            except ValueError:
                self.o8 = None
        self.vbyte = _uniform_byte(v)
        # skewed views (row stride + one column) are built straight on the memory of a
        # C-contiguous output; other outputs take the mask path for ragged ends
        self.skewable = o3.flags.c_contiguous
        sb, sh, sw = o3.strides
        self.skew_strides = (sb, sh + sw, sw)

    def const_for(self, source: str) -> np.generic:
        # a 0-d array indexed by () is its scalar (numpy's stubs say ndarray)
        return (self.v if source == "value" else self.zero)[()]  # type: ignore[return-value]

    def base(self, source: str, b0: int, b1: int, y0: int, y1: int) -> None:
        if source == "input":
            np.copyto(self.o3[b0:b1, y0:y1], self.s3[b0:b1, y0:y1])
            return
        byte = 0 if source == "zero" else self.vbyte
        if byte is not None and self.o8 is not None:
            self.o8[b0:b1, y0:y1].fill(byte)
        else:
            self.o3[b0:b1, y0:y1].fill(self.const_for(source))

    def rect(self, source: str, b0: int, b1: int, y0: int, y1: int, c0: int, c1: int) -> None:
        if c1 <= c0:
            return
        if source == "input":
            np.copyto(self.o3[b0:b1, y0:y1, c0:c1], self.s3[b0:b1, y0:y1, c0:c1])
            return
        byte = 0 if source == "zero" else self.vbyte
        if byte is not None and self.o8 is not None:
            isz = self.o3.itemsize
            self.o8[b0:b1, y0:y1, c0 * isz:c1 * isz].fill(byte)
        else:
            self.o3[b0:b1, y0:y1, c0:c1].fill(self.const_for(source))

    def masked(self, source: str, b0: int, b1: int, y0: int, y1: int, c0: int, mask: np.ndarray) -> None:
        """Write `mask` (rows x cols, window starting at unclipped column c0), clipped to [0, W)."""
        w = self.o3.shape[2]
        cols = mask.shape[1]
        lo, hi = max(c0, 0), min(c0 + cols, w)
        if hi <= lo:
            return
        m = mask[: y1 - y0, lo - c0: hi - c0]
        dst = self.o3[b0:b1, y0:y1, lo:hi]
        if source == "input":
            np.copyto(dst, self.s3[b0:b1, y0:y1, lo:hi], where=m)
        else:
            np.copyto(dst, self.const_for(source), where=m)

    def skew_fits(self, y0: int, y1: int, x0: int, width: int) -> bool:
        return x0 >= 0 and x0 + (y1 - 1 - y0) + width <= self.o3.shape[2]

    def skew(self, source: str, b0: int, b1: int, y0: int, y1: int, x0: int, width: int) -> bool:
        """Write columns [x0 + (y - y0), x0 + (y - y0) + width) of rows y in [y0, y1), if every
        one lies inside the row (then True; else nothing is written and False)."""
        w = self.o3.shape[2]
        if (source == "input" or not self.skewable or x0 < 0
                or x0 + (y1 - 1 - y0) + width > w):
            return False
        sb, sh, sw = self.o3.strides
        piece = np.ndarray((b1 - b0, y1 - y0, width), self.o3.dtype, self.o3,
                           b0 * sb + y0 * sh + x0 * sw, self.skew_strides)
        piece.fill(self.const_for(source))
        return True

    def diagonal(self, source: str, d: int) -> None:
        """Write diagonal x - y == d of every matrix."""
        _, h, w = self.o3.shape
        y0 = max(0, -d)
        n = min(h, w - d) - y0
        if n <= 0:
            return
        dst = _diag_view(self.o3, y0, d, n)
        if source == "input":
            np.copyto(dst, _diag_view(self.s3, y0, d, n))
        else:
            dst[...] = self.const_for(source)


def _diag_view(a3: np.ndarray, y0: int, d: int, n: int) -> np.ndarray:
    sb, sh, sw = a3.strides
    if a3.flags.c_contiguous:  # cheap: a view straight on the memory
        return np.ndarray((a3.shape[0], n), a3.dtype, a3, y0 * sh + (y0 + d) * sw, (sb, sh + sw))
    start = a3[:, y0:, y0 + d:]
    return as_strided(start, shape=(a3.shape[0], n), strides=(sb, sh + sw),
                      writeable=start.flags.writeable)


def _overlay_block(wr: _Writer, source: str, p: int, q: int, b0: int, b1: int, y0: int, y1: int) -> None:
    """Write topX in [p, q) for rows [y0, y1) of batches [b0, b1).

    The rectangle every row shares, plus the ragged ends as skewed views; where a skewed view
    would leave the matrix (near its edges) the rows are halved until it fits, and a few rows
    are left to small cached masks.
    """
    n = y1 - y0
    w = wr.o3.shape[2]
    if n == 1:
        wr.rect(source, b0, b1, y0, y1, max(p + y0, 0), min(q + y0, w))
        return
    if q + y1 - 1 <= 0 or p + y0 >= w:
        return  # the interval misses these rows
    split = wr.skewable and n > MASK_ROWS
    if q - p >= n - 1:
        left = p + y0 + n - 1 > 0  # the ragged start is inside the matrix
        right = q + y0 < w
        if split and ((left and not wr.skew_fits(y0, y1, p + y0, n - 1))
                      or (right and not wr.skew_fits(y0, y1, q + y0 - (n - 1), n - 1))):
            mid = y0 + n // 2
            _overlay_block(wr, source, p, q, b0, b1, y0, mid)
            _overlay_block(wr, source, p, q, b0, b1, mid, y1)
            return
        if left and not wr.skew(source, b0, b1, y0, y1, p + y0, n - 1):
            wr.masked(source, b0, b1, y0, y1, p + y0, _mask("left", n, n - 1))
        wr.rect(source, b0, b1, y0, y1, max(p + y0 + n - 1, 0), min(q + y0, w))
        if right and not wr.skew(source, b0, b1, y0, y1, q + y0 - (n - 1), n - 1):
            wr.masked(source, b0, b1, y0, y1, q + y0, _mask("right", n, n - 1))
    elif not wr.skew(source, b0, b1, y0, y1, p + y0, q - p):
        if split:
            mid = y0 + n // 2
            _overlay_block(wr, source, p, q, b0, b1, y0, mid)
            _overlay_block(wr, source, p, q, b0, b1, mid, y1)
            return
        wr.masked(source, b0, b1, y0, y1, p + y0, _mask("band", n, q - p + n - 1, q - p))


def _block_grid(b: int, h: int, w: int, itemsize: int) -> tuple[int, int]:
    """(batches, rows) per block: about BLOCK_BYTES of whole rows, every batch at once (so each
    numpy call covers all matrices) unless that leaves fewer than MIN_BLOCK_ROWS rows."""
    row_bytes = w * itemsize
    rows = min(h, max(MIN_BLOCK_ROWS, BLOCK_BYTES // (b * row_bytes)))
    return max(1, min(b, (4 * BLOCK_BYTES) // (rows * row_bytes))), rows


def _fill_all(wr: _Writer, source: str) -> None:
    """Write one source everywhere: one memset when possible (large memsets use streaming
    stores, faster than any blocked fill), blocked copies for the input (blocked copies stay in
    cache and beat one huge memcpy)."""
    o3 = wr.o3
    b, h, w = o3.shape
    if source != "input":
        byte = 0 if source == "zero" else wr.vbyte
        if byte is not None and wr.o8 is not None and o3.flags.c_contiguous:
            wr.o8.fill(byte)
        else:
            o3.fill(wr.const_for(source))
        return
    bc, rc = _block_grid(b, h, w, o3.itemsize)
    for b0 in range(0, b, bc):
        for y0 in range(0, h, rc):
            wr.base(source, b0, min(b, b0 + bc), y0, min(h, y0 + rc))


def _compiled() -> ModuleType | None:
    """numba's row kernels (the `dmlgraph.runtime.kernels_compiled` module), or None when numba is not
    installed or DMLGRAPH_KERNEL=numpy asks for the numpy path. Imported on first use only."""
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = False
        if os.environ.get("DMLGRAPH_KERNEL", "") != "numpy":
            try:
                _COMPILED = importlib.import_module("dmlgraph.runtime.kernels_compiled")
            except ImportError:
                pass
    return _COMPILED or None


_COMPILED: ModuleType | Literal[False] | None = None  # None: not looked up yet; False: unavailable; else the compiled module


def compiled_available() -> bool:
    """Whether large two-region outputs go through the compiled (numba) kernel."""
    return _compiled() is not None


@contextlib.contextmanager
def numpy_only() -> Iterator[None]:
    """Within the block, use the numpy path only (benchmarks and tests compare both paths)."""
    global _COMPILED
    saved = _COMPILED
    _COMPILED = False
    try:
        yield
    finally:
        _COMPILED = saved


def _compiled_for(plan: _Plan, nbytes: int) -> ModuleType | None:
    """The compiled kernel if it should write this output (see `_wants_compiled`)."""
    return _compiled() if _wants_compiled(plan, nbytes) else None


def _wants_compiled(plan: _Plan, nbytes: int) -> bool:
    """Two regions and at least COMPILED_MIN_BYTES (below, numpy's template calls cost less than
    the kernel's call)."""
    return nbytes >= COMPILED_MIN_BYTES and bool(plan.value_intervals) and bool(plan.keep_intervals)


def _run_compiled(compiled: ModuleType, o3: np.ndarray, s3: np.ndarray | None, v: np.ndarray, plan: _Plan) -> bool:
    """Write the whole output with the compiled row kernel; False (nothing written) when the
    layouts do not fit it: the output must be C-contiguous, the input C-contiguous or one
    C-contiguous matrix broadcast over the batch."""
    if not o3.flags.c_contiguous:
        return False
    if s3 is None or s3.flags.c_contiguous:
        pass
    elif s3.strides[0] == 0 and s3[0].flags.c_contiguous:
        s3 = s3[0]
    else:
        return False
    call = _compiled_call(plan, o3.size, o3.itemsize, None if s3 is None else s3.size)
    _call_compiled(compiled, call, o3.ravel().view(np.uint8), _NO_INPUT if s3 is None else s3.ravel().view(np.uint8), v)
    return True


def _call_compiled(compiled: ModuleType, call: tuple[str, np.ndarray], o8: np.ndarray, s8: np.ndarray,
                   v: np.ndarray) -> None:
    """The compiled kernel `call` names (see `_compiled_call`) on the bytes of the output and input
    (written out again in `diagonal_matrix1`, where a Python call is a good share of a 256x256 one)."""
    getattr(compiled, call[0])(o8, s8, _FROM_BYTES(v.tobytes(), "little", signed=True), call[1])


def _compiled_call(plan: _Plan, size: int, itemsize: int, s_size: int | None) -> tuple[str, np.ndarray]:
    """(kernel, its int64 parameters) for an output of `size` elements (an input of `s_size`, or
    None); one parameter array because numba's dispatcher costs ~100 ns per argument.

    `rows` writes each row span by span, with non-temporal stores for outputs of at least
    STREAM_MIN_BYTES (measured 1.2-1.9x the plain stores' speed on 16-128 MiB triangles and
    identities: the output is not read before it is written); but for a Value only a few
    diagonals wide, the input (or, unless streaming, zeros) goes first with one call per matrix
    (per block of rows for zeros, see `rows`), and the Value spans on top. Outputs without an
    input from GENERATED_MIN_BYTES (a narrow Value: from STREAM_MIN_BYTES) with rows of at most
    GENERATED_MAX_ROW_BYTES, where a memset's start-up per span is a large share of a row, go
    to `generated`, unless they are a batch of small matrices (there `rows` copies the first
    one from cache): 8x1024x1024 and 4096x4096 uint8 triangles measured 0.67-0.77x ->
    0.81-0.90x a memset of the output, 4096x4096 uint8 identities 0.73-0.85x -> 0.78-0.87x.
    """
    area = plan.height * plan.width
    nbytes = size * itemsize
    batch = size // area
    narrow = plan.value_width <= NARROW
    stream = nbytes >= STREAM_MIN_BYTES
    if (s_size is None and nbytes >= GENERATED_MIN_BYTES and (stream or not narrow)
            and plan.width * itemsize <= GENERATED_MAX_ROW_BYTES and (batch == 1 or area * itemsize > SMALL_TEMPLATE_BYTES)):
        return "generated", np.array((itemsize, batch, *plan.rows_args), np.int64)
    base = narrow and not (stream and s_size is None)
    s_batch = area * itemsize if s_size == size else 0
    return "rows", np.array((itemsize, s_batch, batch, *plan.rows_args, base, stream), np.int64)


_NO_INPUT = np.empty(0, np.uint8)  # "no input" for the compiled kernel
_BYTE = np.dtype(np.uint8)  # (np.frombuffer given the dtype object: ~0.1 us less than given the type)
_FROM_BYTES = int.from_bytes  # (looking the classmethod up costs ~0.06 us a call)


def run_fast_path(o3: np.ndarray, s3: np.ndarray | None, v: np.ndarray, plan: _Plan) -> None:
    """The fast path on (batch, H, W) views."""
    b, h, w = o3.shape
    value_iv, keep_iv = plan.value_intervals, plan.keep_intervals
    compiled = _compiled_for(plan, o3.nbytes)
    if compiled is not None and _run_compiled(compiled, o3, s3, v, plan):
        return
    if (value_iv and keep_iv and h * w * o3.itemsize <= SMALL_TEMPLATE_BYTES
            and o3.strides[2] == o3.itemsize):
        _run_templates(o3, s3, v, plan)  # small matrices: one or two calls beat any splitting
        return
    keep_source = "input" if s3 is not None else "zero"
    wr = _Writer(o3, s3, v)
    if not value_iv or not keep_iv:
        _fill_all(wr, keep_source if not value_iv else "value")
        return

    # The base is the source written over whole rows; the overlay intervals are written on top.
    # Narrow overlays (a few diagonals) cost nothing on top of a full base, so the region they
    # leave is the base. Otherwise: with an input, the input is the base (Value is a cheap fill
    # on top); without, the larger region, preferring one that memsets.
    if all(q - p <= NARROW for p, q in keep_iv):
        value_base = True
    elif all(q - p <= NARROW for p, q in value_iv) or s3 is not None:
        value_base = False
    else:
        value_base = plan.value_area > plan.keep_area
        if value_base and wr.vbyte is None and plan.keep_area * 4 > plan.value_area:
            value_base = False
    if value_base:
        base_source, overlay_source, overlays = "value", keep_source, keep_iv
    else:
        base_source, overlay_source, overlays = keep_source, "value", value_iv
    narrow = [iv for iv in overlays if iv[1] - iv[0] <= NARROW]
    wide = [iv for iv in overlays if iv[1] - iv[0] > NARROW]

    if not wide:
        _fill_all(wr, base_source)
    elif b >= 2 and h * w * o3.itemsize <= TEMPLATE_BYTES and o3.strides[2] == o3.itemsize:
        _run_templates(o3, s3, v, plan)
    else:
        # blocks of whole rows (~BLOCK_BYTES): base over the block, then the overlays in steps
        # of at most OVERLAY_ROWS rows while the block is still in cache
        bc, rc = _block_grid(b, h, w, o3.itemsize)
        sub = min(OVERLAY_ROWS, rc)
        for b0 in range(0, b, bc):
            b1 = min(b, b0 + bc)
            for y0 in range(0, h, rc):
                y1 = min(h, y0 + rc)
                wr.base(base_source, b0, b1, y0, y1)
                for p, q in wide:
                    if q + y1 - 1 <= 0 or p + y0 >= w:
                        continue  # the interval misses these rows
                    for s0 in range(y0, y1, sub):
                        _overlay_block(wr, overlay_source, p, q, b0, b1, s0, min(y1, s0 + sub))
    for p, q in narrow:
        for d in range(max(p, -(h - 1)), min(q, w)):
            wr.diagonal(overlay_source, d)


_TEMPLATES: dict[tuple[_Plan, str, bytes], tuple[np.ndarray, np.ndarray | None]] = {}
_TEMPLATES_LOCK = threading.Lock()  # (eviction walks the dict: two threads adding at once broke it)


def _templates(plan: _Plan, v: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(keep bits, value bits) H x W matrices as unsigned ints: out = (in & keep) | value."""
    u = np.dtype(f"u{v.itemsize}")
    key = (plan, v.dtype.str, v.tobytes())
    hit = _TEMPLATES.get(key)
    if hit is None:
        h, w = plan.height, plan.width
        top = np.arange(w, dtype=np.int64)[None, :] - np.arange(h, dtype=np.int64)[:, None]
        use = np.zeros((h, w), bool)
        for p, q in plan.value_intervals:
            use |= (top >= p) & (top < q)
        keep = np.where(use, u.type(0), np.iinfo(u).max).astype(u)
        vbits = v.reshape(1).view(u)[0]
        value = np.where(use, vbits, u.type(0)).astype(u) if vbits else None
        hit = (keep, value)
        with _TEMPLATES_LOCK:
            while _TEMPLATES and sum(k.nbytes for k, _ in _TEMPLATES.values()) > TEMPLATE_CACHE_BYTES:
                _TEMPLATES.pop(next(iter(_TEMPLATES)))
            _TEMPLATES[key] = hit
    return hit


def _run_templates(o3: np.ndarray, s3: np.ndarray | None, v: np.ndarray, plan: _Plan) -> None:
    """Many matrices with two wide regions: one cached H x W template, reused from cache for
    every matrix. Bitwise on same-size unsigned views, so exact for every type and value."""
    keep, value = _templates(plan, v)
    u = keep.dtype
    _apply_templates(o3.view(u), None if s3 is None else s3.view(u), keep, value,
                     max(1, BLOCK_BYTES // keep.nbytes))


def _apply_templates(ou: np.ndarray, su: np.ndarray | None, keep: np.ndarray, value: np.ndarray | None,
                     step: int) -> None:
    """ou = (su & keep) | value on (batch, H, W) unsigned views, `step` matrices at a time (the
    templates broadcast along the batch, or are as big as it); no source: value, or zeros."""
    if su is None:
        np.copyto(ou, value if value is not None else keep.dtype.type(0))
        return
    for b0 in range(0, ou.shape[0], step):
        ob = ou[b0:b0 + step]
        np.bitwise_and(su[b0:b0 + step], keep, out=ob)
        if value is not None:
            np.bitwise_or(ob, value, out=ob)


# --------------------------------------------------------------------------------------------
# public API


def _check_dtype(dtype: np.dtype) -> None:
    if dtype not in _DTYPES:
        raise DmlgraphError(f"dtype {dtype} is not a DIAGONAL_MATRIX1 type (float64/32/16, "
                            "int64/32/16/8, uint64/32/16/8, or bool as uint8)")


def _as3d(a: np.ndarray) -> np.ndarray | None:
    """A (batch, H, W) view of `a` without copying, or None if its leading axes cannot collapse."""
    if a.ndim == 3:
        return a
    if a.ndim == 2:
        return a[None]
    if a.flags.c_contiguous:  # a plain reshape is a view here, and far cheaper than as_strided
        return a.reshape((-1,) + a.shape[-2:])
    shape, strides = a.shape, a.strides
    lead = [(n, s) for n, s in zip(shape[:-2], strides[:-2]) if n != 1]
    for (_n0, s0), (n1, s1) in zip(lead, lead[1:]):
        if s0 != s1 * n1:
            return None
    batch = math.prod(shape[:-2])
    bstride = lead[-1][1] if lead else 0
    return as_strided(a, shape=(batch,) + shape[-2:], strides=(bstride,) + strides[-2:],
                      writeable=a.flags.writeable)


class _Signature(NamedTuple):
    """What a call needs that depends only on (shape, dtype, begin, end), validated once."""
    shape: tuple[int, ...]
    dtype: np.dtype
    size: int
    plan: _Plan
    tiny: np.ndarray | None  # flat Value positions, for outputs of at most TINY_ELEMENTS
    # the whole output without an input per Value's bytes (tiny outputs; a few Values each)
    generated: dict[bytes, np.ndarray]
    # the compiled kernel's call (or None: not for it) per (input given, the settings it depends on),
    # made on first use
    calls: dict[tuple[bool, int, int, int, int, int, int], tuple[str, np.ndarray] | None]


@functools.lru_cache(maxsize=1024)
def _signature(shape: tuple[int, ...], dtype: npt.DTypeLike, begin: int, end: int) -> _Signature:
    dt = np.dtype(dtype)
    _check_dtype(dt)
    shape = tuple(operator.index(d) for d in shape)
    if len(shape) < 2:
        raise DmlgraphError(f"DIAGONAL_MATRIX1 needs at least 2 dimensions, got shape {shape}")
    size = math.prod(shape)
    tiny = _tiny_index(shape, begin, end) if 0 < size <= TINY_ELEMENTS else None
    return _Signature(shape, dt, size, _plan(shape[-2], shape[-1], begin, end), tiny, generated={}, calls={})


_SEEN: dict[tuple[tuple[int, ...], npt.DTypeLike, int, int], _Signature] = {}
SEEN_SIGNATURES = 1024


def _seen_signature(shape: Iterable[int], dtype: npt.DTypeLike, begin: SupportsIndex, end: SupportsIndex) -> _Signature:
    """`_signature` of a call's arguments as given, remembered in `_SEEN` when they are a tuple and
    ints (a dict lookup costs less than operator.index twice and the lru_cache's call)."""
    b, e = operator.index(begin), operator.index(end)
    try:
        sig = _signature(shape if type(shape) is tuple else tuple(shape), dtype, b, e)  # type: ignore[arg-type]
    except TypeError:  # an unhashable dtype spec
        return _signature(tuple(shape), np.dtype(dtype), b, e)
    if type(shape) is tuple and type(begin) is int and type(end) is int:
        if len(_SEEN) >= SEEN_SIGNATURES:
            _SEEN.clear()
        _SEEN[shape, dtype, begin, end] = sig
    return sig


def diagonal_matrix1(shape: Iterable[int], dtype: npt.DTypeLike, value: npt.ArrayLike, begin: SupportsIndex,
                     end: SupportsIndex, input: npt.ArrayLike | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """DIAGONAL_MATRIX1 on numpy arrays (see the module docstring for the semantics).

    shape: output sizes (rank >= 2; leading axes are batch). dtype: one of the 11 DML types, or
    bool (carried as uint8). value: cast like ``np.array(value, dtype)`` (-0.0, NaN payloads and
    infinities kept). begin/end: Python ints (INT32_MIN/MAX included). input: optional array
    broadcastable to `shape` (zero-stride views welcome). out: optional preallocated array of that
    shape and dtype, may be non-contiguous; it is returned.
    """
    # Per-call Python costs microseconds here (a call on a small tensor is mostly overhead):
    # what depends only on the signature is cached, a 0-d Value of the right dtype that owns its
    # element is used as is (a view could be of `out`, which is written before Value is read).
    try:  # (1.0 == 1 and np.int64(1) == 1: the types are checked, operator.index refuses floats)
        sig = _SEEN[shape, dtype, begin, end]  # type: ignore[index]
        if type(begin) is not int or type(end) is not int:
            raise KeyError
    except (KeyError, TypeError):
        sig = _seen_signature(shape, dtype, begin, end)
    shape, dtype = sig.shape, sig.dtype
    if out is None:
        out = np.empty(shape, dtype)
    elif out.shape != shape or (out.dtype is not dtype and out.dtype != dtype):
        raise DmlgraphError(f"out has shape {out.shape} and dtype {out.dtype}; expected {shape} and {dtype}")
    if type(value) is np.ndarray and value.dtype is dtype and value.ndim == 0 and value.base is None:
        v = value
    else:
        v = np.array(value, dtype)
        if v.ndim:
            if v.size != 1:
                raise DmlgraphError(f"Value must be one element; got an array of shape {v.shape}")
            v = v.reshape(())
    if input is not None and (type(input) is not np.ndarray or input.shape != shape
                              or input.dtype is not dtype):
        input = np.asarray(input)
        if input.dtype != dtype:
            input = input.astype(dtype)
        input = np.broadcast_to(input, shape)
    tiny = sig.tiny
    if tiny is not None and sig.size <= TINY_ELEMENTS:  # (a signature outlives a change of the setting)
        if input is None:
            t = sig.generated.get(v.tobytes())
            if t is None and len(sig.generated) < TINY_VALUES:
                t = _tiny_template(sig, v)
            if t is not None:
                out[...] = t
            else:  # (a Value past the cached ones: a template made for one call costs more)
                out.fill(0)
                if len(tiny):
                    out.put(tiny, v)
        else:
            out[...] = input
            if len(tiny):
                out.put(tiny, v)
        return out
    # straight to the compiled kernel, its parameters made once per signature
    key = (input is None, COMPILED_MIN_BYTES, STREAM_MIN_BYTES, GENERATED_MIN_BYTES, GENERATED_MAX_ROW_BYTES,
           SMALL_TEMPLATE_BYTES, NARROW)
    try:
        call = sig.calls[key]
    except KeyError:
        call = sig.calls[key] = (_compiled_call(sig.plan, sig.size, dtype.itemsize, None if input is None else sig.size)
                                 if _wants_compiled(sig.plan, sig.size * dtype.itemsize) else None)
    if call is not None and (compiled := _COMPILED or _compiled()) is not None:
        try:  # the bytes of C-contiguous arrays; other layouts raise, and take the paths below
            o8 = np.frombuffer(out, _BYTE)
            s8 = _NO_INPUT if input is None else np.frombuffer(input, _BYTE)
        except ValueError:
            pass
        else:
            if not o8.flags.writeable:  # (numpy refuses to write a read-only array; the kernel would)
                raise DmlgraphError("out is read-only", hint="pass a writeable array, or none")
            getattr(compiled, call[0])(o8, s8, _FROM_BYTES(v.tobytes(), "little", signed=True), call[1])
            return out
    if sig.size == 0:
        return out
    if dtype == np.bool_:
        o, s, vv = out.view(np.uint8), None if input is None else input.view(np.uint8), v.view(np.uint8)
    else:
        o, s, vv = out, input, v
    o3 = _as3d(o)
    s3 = None if s is None else _as3d(s)
    if o3 is not None and (s is None or s3 is not None):
        run_fast_path(o3, s3, vv, sig.plan)
    else:  # leading axes that cannot be collapsed into one batch axis: one matrix at a time
        for idx in np.ndindex(*shape[:-2]):
            run_fast_path(o[idx][None], None if s is None else s[idx][None], vv, sig.plan)
    return out


def _tiny_template(sig: _Signature, v: np.ndarray) -> np.ndarray:
    """A tiny output without input (zeros, Value where `sig.tiny` says), kept for each of the
    first TINY_VALUES Values of a signature: one copy instead of a fill and a scatter."""
    raw = v.tobytes()
    t = sig.generated.get(raw)
    if t is None:
        t = np.zeros(sig.shape, sig.dtype)
        t.put(cast(np.ndarray, sig.tiny), v)
        if len(sig.generated) < TINY_VALUES:
            t.setflags(write=False)
            sig.generated[raw] = t
    return t


def prepare_diagonal_matrix1(shape: Iterable[int], dtype: npt.DTypeLike, value: npt.ArrayLike,
                             begin: SupportsIndex, end: SupportsIndex,
                             input_shape: Iterable[int] | None = None) -> Callable[..., np.ndarray]:
    """`diagonal_matrix1` with everything that depends only on its arguments done once.

    Returns ``run(input=None) -> new array``, equal bit for bit to
    ``diagonal_matrix1(shape, dtype, value, begin, end, input=input)`` for every input: the
    prepared paths (tiny tensors: a cached flat index; small matrices: the cached templates)
    take a C-contiguous ndarray of `input_shape` (default `shape`; another shape must broadcast
    to `shape`, like a padding row applied to every row of a mask) and `dtype`, or no input;
    anything else goes through `diagonal_matrix1` itself. For an executor that runs one node at
    one shape many times.
    """
    shape = tuple(operator.index(s) for s in shape)
    begin = operator.index(begin)
    end = operator.index(end)
    sig = _signature(shape, np.dtype(dtype), begin, end)  # (checks the type and the rank)
    if any(d < 0 for d in shape):
        raise DmlgraphError(f"DIAGONAL_MATRIX1 shape {list(shape)} has a negative size")
    in_shape = shape if input_shape is None else tuple(operator.index(s) for s in input_shape)
    try:
        broadcasts = in_shape == shape or np.broadcast_shapes(in_shape, shape) == shape
    except ValueError:
        broadcasts = False
    if not broadcasts:
        raise DmlgraphError(f"input shape {list(in_shape)} does not broadcast to {list(shape)}")
    dtype, size, plan = sig.dtype, sig.size, sig.plan
    v = np.array(value, dtype)

    def generic(input: npt.ArrayLike | None = None) -> np.ndarray:
        return diagonal_matrix1(shape, dtype, value, begin, end, input=input)

    h, w = shape[-2], shape[-1]
    if size == 0:
        return generic
    if sig.tiny is not None and size <= TINY_ELEMENTS:
        idx, generated = sig.tiny, _tiny_template(sig, v)

        def run_tiny(input: npt.ArrayLike | None = None) -> np.ndarray:
            if input is None:
                return generated.copy()
            if type(input) is not np.ndarray or input.shape != in_shape or input.dtype != dtype:
                return generic(input)
            out = np.empty(shape, dtype)
            out[...] = input  # (broadcasts it)
            out.put(idx, v)
            return out
        return run_tiny
    vv = v.view(np.uint8) if dtype == np.bool_ else v
    if not (plan.value_intervals and plan.keep_intervals and h * w * dtype.itemsize <= SMALL_TEMPLATE_BYTES):
        return generic  # one region everywhere, or big matrices: the block writers (planning is cheap there)
    if _compiled_for(plan, size * dtype.itemsize) is not None:
        return generic  # the compiled kernel beats the templates here (see run_fast_path)
    keep, value_bits = _templates(plan, vv)
    u = keep.dtype
    b3 = (size // (h * w), h, w)
    step = max(1, BLOCK_BYTES // keep.nbytes)
    if in_shape != shape:
        if b3[0] > step:
            return generic  # (the blocked template loop wants inputs of the output's shape)

        def run_broadcast(input: npt.ArrayLike | None = None) -> np.ndarray:
            if input is not None and (type(input) is not np.ndarray or input.shape != in_shape
                                      or input.dtype != dtype):
                return generic(input)
            out = np.empty(shape, dtype)
            _apply_templates(out.view(u)[None], None if input is None else input.view(u)[None], keep,
                             value_bits, 1)  # one step: the input and the templates broadcast
            return out
        return run_broadcast
    if 1 < b3[0] <= step:
        # the whole batch in one block: templates as big as the output (numpy's loops over
        # same-shape operands run about twice as fast as over one broadcast along the batch)
        keep = np.ascontiguousarray(np.broadcast_to(keep, b3))
        value_bits = None if value_bits is None else np.ascontiguousarray(np.broadcast_to(value_bits, b3))

    def run_templates(input: npt.ArrayLike | None = None) -> np.ndarray:
        if input is not None and (type(input) is not np.ndarray or input.shape != shape or input.dtype != dtype
                                  or not input.flags.c_contiguous):
            return generic(input)
        out = np.empty(shape, dtype)
        _apply_templates(out.view(u).reshape(b3), None if input is None else input.view(u).reshape(b3),
                         keep, value_bits, step)
        return out
    return run_templates


def diagonal_matrix1_reference(shape: Iterable[int], dtype: npt.DTypeLike, value: npt.ArrayLike, begin: int, end: int,
                               input: npt.ArrayLike | None = None) -> np.ndarray:
    """The plain vectorized form of the pseudocode: np.where over an index grid."""
    shape = tuple(shape)
    dtype = np.dtype(dtype)
    h, w = shape[-2], shape[-1]
    top = np.arange(w, dtype=np.int64)[None, :] - np.arange(h, dtype=np.int64)[:, None]
    use = (end >= begin) ^ (top >= begin) ^ (top < end)
    other = np.zeros(shape, dtype) if input is None else np.broadcast_to(np.asarray(input, dtype), shape)
    return np.where(use, np.array(value, dtype), other).astype(dtype, copy=False)


def diagonal_matrix_value(value: float, dtype: npt.DTypeLike) -> np.ndarray:
    """DIAGONAL_MATRIX's Value (a 32-bit FLOAT) as a scalar of `dtype`: integers truncate toward 0."""
    dtype = np.dtype(dtype)
    f = np.float32(value)
    if dtype.kind == "f":
        return np.array(f, dtype)
    if not np.isfinite(f):
        raise DmlgraphError(f"DIAGONAL_MATRIX Value {value!r} has no {dtype} equivalent")
    t = math.trunc(float(f))
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    if info is not None and not info.min <= t <= info.max:
        raise DmlgraphError(f"DIAGONAL_MATRIX Value {value!r} truncates to {t}, outside {dtype} "
                            f"({info.min}..{info.max})")
    return np.array(t, dtype)


def diagonal_matrix(shape: Iterable[int], dtype: npt.DTypeLike, offset: SupportsIndex, value: float = 1.0,
                    out: np.ndarray | None = None) -> np.ndarray:
    """DIAGONAL_MATRIX: out = value if y + offset == x else 0.

    `value` is a FLOAT (rounded to float32 as DML carries it); integer outputs truncate it toward
    zero (10.6 -> 10, -10.6 -> -10). Same as DIAGONAL_MATRIX1 with Begin=offset, End=offset+1.
    """
    dtype = np.dtype(dtype)
    offset = operator.index(offset)
    return diagonal_matrix1(shape, dtype, diagonal_matrix_value(value, dtype), offset, offset + 1,
                            out=out)
