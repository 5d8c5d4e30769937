"""The DIAGONAL_MATRIX1 row kernel compiled with numba (the optional `dmlgraph[fast]` extra).

Why a compiled kernel: row y of a matrix is at most five contiguous spans (keep, value, keep,
value, keep) bounded by diagonals, so the output can be written once, span by span, reading the
input only where it is kept. numpy pays a call per span (microseconds per row), so the numpy
path in `dmlgraph.kernels` writes a base and then overlays; this kernel writes every span with
one memcpy or memset (glibc's: `rep movsb` / `rep stosb` for long spans, which measured up to
1.5x faster than a vectorized loop on batched triangles). It moves bytes (every DML type,
float16 and bool included, is moved as bits), so it is bit-exact by construction, and one
compiled version serves every type.

Importing this module imports numba (about 0.3 s) and, on the first call, loads `rows` from
numba's on-disk cache (compiled once per machine, a few seconds; `cache=True`).
`dmlgraph.kernels` imports it lazily, only for tensors large enough to benefit, and falls back
to its numpy path when numba is absent.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["rows"]


def _memcpy_typer(typingctx: Any, o: Any, oi: Any, s: Any, si: Any, n: Any) -> Any:
    """o[oi : oi + n] = s[si : si + n] on 1-D uint8 arrays, as one llvm.memcpy (glibc's memcpy)."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        dst = builder.gep(context.make_array(sig.args[0])(context, builder, args[0]).data, [args[1]])
        src = builder.gep(context.make_array(sig.args[2])(context, builder, args[2]).data, [args[3]])
        cgutils.raw_memcpy(builder, dst, src, args[4], 1)
        return context.get_dummy_value()
    return types.void(o, oi, s, si, n), codegen


def _memset_typer(typingctx: Any, o: Any, oi: Any, n: Any, byte: Any) -> Any:
    """o[oi : oi + n] = byte on a 1-D uint8 array, as one llvm.memset (glibc's memset)."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        dst = builder.gep(context.make_array(sig.args[0])(context, builder, args[0]).data, [args[1]])
        cgutils.memset(builder, dst, args[2], builder.trunc(args[3], cgutils.int8_t))
        return context.get_dummy_value()
    return types.void(o, oi, n, byte), codegen


_memcpy: Any = intrinsic(_memcpy_typer)
_memset: Any = intrinsic(_memset_typer)


@njit(cache=True, nogil=True)
def rows(o: np.ndarray, s: np.ndarray, s_batch: int, vbytes: bytes, batch: int, h: int, w: int,
         p0: int, q0: int, p1: int, q1: int, base_rows: int) -> None:
    """Write `batch` h x w matrices of len(vbytes)-byte elements into the flat C-order bytes `o`.

    Value (its bytes: `vbytes`) goes on topX = x - y in [p0, q0) and [p1, q1) (sorted,
    disjoint, clipped to [-h, w]; an unused interval is (w, w)); elsewhere the input `s` (flat
    bytes; matrix i starts at byte i * s_batch, 0 = one matrix broadcast over the batch), or
    zeros when `s` is empty.

    base_rows == 0: every row is written span by span, each byte once. base_rows > 0: blocks
    of base_rows whole rows get the input (or zeros) with one call, then the Value spans while
    the block is in cache -- fewer, longer calls, for short rows or a narrow Value region.
    """
    isz = len(vbytes)
    rb = w * isz
    byte = int(vbytes[0])
    for k in range(isz):
        if vbytes[k] != vbytes[0]:
            byte = -1
    vrow = np.empty(rb if byte < 0 else 0, np.uint8)
    for k in range(vrow.size):
        vrow[k] = vbytes[k % isz]
    for b in range(batch):
        for y0 in range(0, h, max(base_rows, 1)):
            y1 = min(h, y0 + base_rows) if base_rows else y0 + 1
            if base_rows:  # the input (or zeros) on the whole block
                n = (y1 - y0) * rb
                if s.size:
                    _memcpy(o, (b * h + y0) * rb, s, b * s_batch + y0 * rb, n)
                else:
                    _memset(o, (b * h + y0) * rb, n, 0)
            for y in range(y0, y1):
                oi = (b * h + y) * rb
                si = b * s_batch + y * rb
                a0 = min(max(p0 + y, 0), w) * isz
                e0 = min(max(q0 + y, 0), w) * isz
                a1 = min(max(p1 + y, 0), w) * isz
                e1 = min(max(q1 + y, 0), w) * isz
                if not base_rows:  # the input (or zeros) on the three keep spans
                    for a, e in ((0, a0), (e0, a1), (e1, rb)):
                        if e > a:
                            if s.size:
                                _memcpy(o, oi + a, s, si + a, e - a)
                            else:
                                _memset(o, oi + a, e - a, 0)
                for a, e in ((a0, e0), (a1, e1)):  # Value: a memset if its bytes are all `byte`
                    if e > a:
                        if byte >= 0:
                            _memset(o, oi + a, e - a, byte)
                        else:
                            _memcpy(o, oi + a, vrow, a, e - a)
