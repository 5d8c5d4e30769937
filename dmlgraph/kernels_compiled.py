"""The DIAGONAL_MATRIX1 row kernel compiled with numba (the optional `dmlgraph[fast]` extra).

Why a compiled kernel: row y of a matrix is at most five contiguous spans (keep, value, keep,
value, keep) bounded by diagonals, so the output can be written once, span by span, reading the
input only where it is kept. numpy pays a call per span (microseconds per row), so the numpy
path in `dmlgraph.kernels` writes a base and then overlays; this kernel writes every element
once at memory speed. It works on unsigned-integer views of the same width (every DML type,
float16 and bool included, is moved as bits), so it is bit-exact by construction.

Importing this module imports numba (about 0.3 s) and, on the first call per element width,
loads the function from numba's on-disk cache (compiled once per machine, about 1-2 s per
width; `cache=True`). `dmlgraph.kernels` imports it lazily, only for tensors large enough to
benefit, and falls back to its numpy path when numba is absent.
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

__all__ = ["rows", "copy_then_fill"]


@njit(cache=True, nogil=True)
def _copy(o: np.ndarray, s: np.ndarray, ob: int, sb: int, a: int, b: int) -> None:
    """o[ob + a : ob + b] = s[sb + a : sb + b]; unsigned indices let LLVM vectorize the loop."""
    if b > a:
        n = uint64(b - a)
        oa = uint64(ob + a)
        sa = uint64(sb + a)
        for i in range(n):
            o[oa + i] = s[sa + i]


@njit(cache=True, nogil=True)
def _fill(o: np.ndarray, ob: int, a: int, b: int, v: np.unsignedinteger) -> None:
    """o[ob + a : ob + b] = v (LLVM turns byte-uniform fills into memset)."""
    if b > a:
        n = uint64(b - a)
        oa = uint64(ob + a)
        for i in range(n):
            o[oa + i] = v


@njit(cache=True, nogil=True)
def rows(o: np.ndarray, s: np.ndarray, s_batch: int, v: np.unsignedinteger, batch: int, h: int, w: int,
         p0: int, q0: int, p1: int, q1: int) -> None:
    """Write `batch` h x w matrices into the flat C-order array `o`.

    Value goes on topX = x - y in [p0, q0) and [p1, q1) (sorted, disjoint, clipped to [-h, w];
    an unused interval is (w, w)); elsewhere the input `s` (flat; matrix i starts at
    i * s_batch, 0 = one matrix broadcast over the batch), or zeros when `s` is empty.
    """
    has_input = s.size > 0
    z = o.dtype.type(0)
    for b in range(batch):
        for y in range(h):
            ob = (b * h + y) * w
            sb = b * s_batch + y * w
            a0 = min(max(p0 + y, 0), w)
            e0 = min(max(q0 + y, 0), w)
            a1 = min(max(p1 + y, 0), w)
            e1 = min(max(q1 + y, 0), w)
            if has_input:
                _copy(o, s, ob, sb, 0, a0)
                _fill(o, ob, a0, e0, v)
                _copy(o, s, ob, sb, e0, a1)
                _fill(o, ob, a1, e1, v)
                _copy(o, s, ob, sb, e1, w)
            else:
                _fill(o, ob, 0, a0, z)
                _fill(o, ob, a0, e0, v)
                _fill(o, ob, e0, a1, z)
                _fill(o, ob, a1, e1, v)
                _fill(o, ob, e1, w, z)


@njit(cache=True, nogil=True)
def copy_then_fill(o: np.ndarray, s: np.ndarray, v: np.unsignedinteger, batch: int, h: int, w: int,
                   p0: int, q0: int, p1: int, q1: int) -> None:
    """`rows` for short rows with a same-shape input: one flat copy of everything, then the value
    spans. Short spans pay a vector loop's prologue and remainder each; one long copy does not,
    and the rows are still in cache when the value is written over them."""
    n = uint64(batch * h * w)
    for i in range(n):
        o[i] = s[i]
    for b in range(batch):
        for y in range(h):
            ob = (b * h + y) * w
            a0 = min(max(p0 + y, 0), w)
            e0 = min(max(q0 + y, 0), w)
            a1 = min(max(p1 + y, 0), w)
            e1 = min(max(q1 + y, 0), w)
            _fill(o, ob, a0, e0, v)
            _fill(o, ob, a1, e1, v)
