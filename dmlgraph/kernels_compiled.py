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

import platform
from typing import Any

import llvmlite.ir as ir  # type: ignore[import-untyped]  # numba's own dependency, no stubs
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


def _stream_typer(typingctx: Any, o: Any, oi: Any, s: Any, si: Any, n: Any) -> Any:
    """`_memcpy` with non-temporal 64-byte stores (the ragged ends: plain memcpy). A store that
    bypasses the cache does not read the line first: for outputs far larger than the cache,
    writing costs one memory transfer instead of two (what glibc's memcpy does for huge copies)."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        dst = builder.gep(context.make_array(sig.args[0])(context, builder, args[0]).data, [args[1]])
        src = builder.gep(context.make_array(sig.args[2])(context, builder, args[2]).data, [args[3]])
        builder.call(_stream_function(builder.module), [dst, src, args[4]])
        return context.get_dummy_value()
    return types.void(o, oi, s, si, n), codegen


def _stream_function(module: Any) -> Any:
    """The LLVM function behind `_stream`, kept out of line: its loop inlined into the row loop
    measured 2x slower on the rows that never stream."""
    fn = module.globals.get("dmlgraph_stream_copy")
    if fn is not None:
        return fn
    i64 = ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, cgutils.voidptr_t, i64]),
                     "dmlgraph_stream_copy")
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    builder = ir.IRBuilder(fn.append_basic_block())
    dst, src, n = fn.args
    head = builder.and_(builder.neg(builder.ptrtoint(dst, i64)), i64(63))  # up to a 64-byte line
    head = builder.select(builder.icmp_unsigned("<", n, head), n, head)
    cgutils.raw_memcpy(builder, dst, src, head, 1)
    dst, src, rest = builder.gep(dst, [head]), builder.gep(src, [head]), builder.sub(n, head)
    lines = builder.lshr(rest, i64(6))
    line = ir.VectorType(ir.IntType(8), 64).as_pointer()
    nontemporal = module.add_metadata([ir.IntType(32)(1)])
    with cgutils.for_range(builder, lines) as loop:
        off = builder.shl(loop.index, i64(6))
        value = builder.load(builder.bitcast(builder.gep(src, [off]), line), align=1)
        store = builder.store(value, builder.bitcast(builder.gep(dst, [off]), line), align=64)
        store.set_metadata("nontemporal", nontemporal)
    done = builder.shl(lines, i64(6))
    cgutils.raw_memcpy(builder, builder.gep(dst, [done]), builder.gep(src, [done]), builder.sub(rest, done), 1)
    builder.ret_void()
    return fn


def _sfence_typer(typingctx: Any) -> Any:
    """Order the non-temporal stores before whatever follows (they are weakly ordered): `sfence`
    on x86 (LLVM may lower a plain fence there to a locked instruction, which is not documented to
    order them), LLVM's portable `fence seq_cst` elsewhere (ARM: `dmb`)."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        if _X86:
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.sfence"), [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


_memcpy: Any = intrinsic(_memcpy_typer)
_memset: Any = intrinsic(_memset_typer)
_stream: Any = intrinsic(_stream_typer)
_sfence: Any = intrinsic(_sfence_typer)


@njit(cache=True, nogil=True)
def rows(o: np.ndarray, s: np.ndarray, s_batch: int, vbytes: bytes, batch: int, h: int, w: int,
         p0: int, q0: int, p1: int, q1: int, base: bool, stream: bool) -> None:
    """Write `batch` h x w matrices of len(vbytes)-byte elements into the flat C-order bytes `o`.

    Value (its bytes: `vbytes`) goes on topX = x - y in [p0, q0) and [p1, q1) (sorted,
    disjoint, clipped to [-h, w]; an unused interval is (w, w)); elsewhere the input `s` (flat
    bytes; matrix i starts at byte i * s_batch, 0 = one matrix broadcast over the batch), or
    zeros when `s` is empty.

    base False: every row is written span by span, each byte once. base True (for a Value a
    few diagonals wide): each matrix gets the input (or zeros) with one call, then the Value
    spans. When every matrix is the same (no input, or one broadcast), the first is copied.
    stream: write with non-temporal stores (outputs far larger than the cache).
    """
    isz = len(vbytes)
    rb = w * isz
    mb = h * rb
    byte = int(vbytes[0])  # >= 0: every byte of Value is this one (a memset), else -1
    for k in range(isz):
        if vbytes[k] != vbytes[0]:
            byte = -1
    vrow = np.empty(rb if byte < 0 or stream else 0, np.uint8)  # a row of Values, filled by doubling
    for k in range(min(isz, vrow.size)):
        vrow[k] = vbytes[k]
    filled = isz
    while filled < vrow.size:
        n = min(filled, vrow.size - filled)
        _memcpy(vrow, filled, vrow, 0, n)
        filled += n
    zrow = np.zeros(rb if stream else 0, np.uint8)
    for b in range(batch):
        if b and s_batch == 0:
            if stream:
                _stream(o, b * mb, o, 0, mb)
            else:
                _memcpy(o, b * mb, o, 0, mb)
            continue
        if base:  # one call per matrix (glibc streams a huge one; a small one stays in cache)
            if s.size:
                _memcpy(o, b * mb, s, b * s_batch, mb)
            else:
                _memset(o, b * mb, mb, 0)
        for y in range(h):
            oi = b * mb + y * rb
            si = b * s_batch + y * rb
            a0 = min(max(p0 + y, 0), w) * isz
            e0 = min(max(q0 + y, 0), w) * isz
            a1 = min(max(p1 + y, 0), w) * isz
            e1 = min(max(q1 + y, 0), w) * isz
            if not base:  # the input (or zeros) on the three keep spans
                for a, e in ((0, a0), (e0, a1), (e1, rb)):
                    if e > a:
                        if s.size and stream:
                            _stream(o, oi + a, s, si + a, e - a)
                        elif s.size:
                            _memcpy(o, oi + a, s, si + a, e - a)
                        elif stream:
                            _stream(o, oi + a, zrow, 0, e - a)
                        else:
                            _memset(o, oi + a, e - a, 0)
            for a, e in ((a0, e0), (a1, e1)):  # Value: a memset when its bytes are all `byte`
                if e > a:
                    if stream:
                        _stream(o, oi + a, vrow, 0, e - a)
                    elif byte >= 0:
                        _memset(o, oi + a, e - a, byte)
                    else:
                        _memcpy(o, oi + a, vrow, 0, e - a)
    if stream:
        _sfence()
