"""The DIAGONAL_MATRIX1 row kernel compiled with numba (the optional `dmlgraph[fast]` extra).

Each row is at most five contiguous spans, written once with memcpy/memset where numpy pays a call
per span; bytes move as bits, so it is exact for every type. `dmlgraph.runtime.kernels` imports it
lazily for large tensors and falls back to numpy without numba. Measurements and import costs:
docs/internals.md, runtime/kernels_compiled.py.
"""
from __future__ import annotations

import platform
from typing import Any

import llvmlite.ir as ir  # type: ignore[import-untyped]  # numba's own dependency, no stubs
import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["generated", "rows"]


def _data(context: Any, builder: Any, sig: Any, args: Any, i: int, at: int | None = None) -> Any:
    """A pointer to the data of the 1-D uint8 array argument `i`, plus the offset argument `at`."""
    data = context.make_array(sig.args[i])(context, builder, args[i]).data
    return data if at is None else builder.gep(data, [args[at]])


def _store_line(builder: Any, value: Any, at: Any) -> None:
    """One non-temporal store of a 64-byte line to the aligned byte pointer `at`."""
    store = builder.store(value, builder.bitcast(at, _LINE.as_pointer()), align=64)
    store.set_metadata("nontemporal", builder.module.add_metadata([ir.IntType(32)(1)]))


def _out_of_line(module: Any, name: str, params: list[Any]) -> tuple[Any, Any]:
    """An internal, never-inlined void function of this module (the one already made, or a new
    one with an IRBuilder at its entry): its loop inlined into the row loop measured 2x slower
    on the rows that never take it."""
    fn = module.globals.get(name)
    if fn is not None:
        return fn, None
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), name)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    return fn, ir.IRBuilder(fn.append_basic_block())


def _memcpy_typer(typingctx: Any, o: Any, oi: Any, s: Any, si: Any, n: Any) -> Any:
    """o[oi : oi + n] = s[si : si + n] on 1-D uint8 arrays, as one llvm.memcpy (glibc's memcpy)."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        cgutils.raw_memcpy(builder, _data(context, builder, sig, args, 0, 1), _data(context, builder, sig, args, 2, 3),
                           args[4], 1)
        return context.get_dummy_value()
    return types.void(o, oi, s, si, n), codegen


def _memset_typer(typingctx: Any, o: Any, oi: Any, n: Any, byte: Any) -> Any:
    """o[oi : oi + n] = byte on a 1-D uint8 array, as one llvm.memset (glibc's memset)."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        cgutils.memset(builder, _data(context, builder, sig, args, 0, 1), args[2], builder.trunc(args[3], cgutils.int8_t))
        return context.get_dummy_value()
    return types.void(o, oi, n, byte), codegen


def _stream_typer(typingctx: Any, o: Any, oi: Any, s: Any, si: Any, n: Any) -> Any:
    """`_memcpy` with non-temporal 64-byte stores (the ragged ends: plain memcpy). A store that
    bypasses the cache does not read the line first: for outputs far larger than the cache,
    writing costs one memory transfer instead of two (what glibc's memcpy does for huge copies)."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        builder.call(_stream_function(builder.module),
                     [_data(context, builder, sig, args, 0, 1), _data(context, builder, sig, args, 2, 3), args[4]])
        return context.get_dummy_value()
    return types.void(o, oi, s, si, n), codegen


def _stream_function(module: Any) -> Any:
    """The LLVM function behind `_stream` (out of line)."""
    i64 = ir.IntType(64)
    fn, builder = _out_of_line(module, "dmlgraph_stream_copy", [cgutils.voidptr_t, cgutils.voidptr_t, i64])
    if builder is None:
        return fn
    dst, src, n = fn.args
    head = builder.and_(builder.neg(builder.ptrtoint(dst, i64)), i64(63))  # up to a 64-byte line
    head = builder.select(builder.icmp_unsigned("<", n, head), n, head)
    cgutils.raw_memcpy(builder, dst, src, head, 1)
    dst, src, rest = builder.gep(dst, [head]), builder.gep(src, [head]), builder.sub(n, head)
    lines = builder.lshr(rest, i64(6))
    with cgutils.for_range(builder, lines) as loop:
        off = builder.shl(loop.index, i64(6))
        _store_line(builder, builder.load(builder.bitcast(builder.gep(src, [off]), _LINE.as_pointer()), align=1),
                    builder.gep(dst, [off]))
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


def _line_typer(typingctx: Any, acc: Any, a: Any, e: Any, src: Any, si: Any) -> Any:
    """acc[a:e] = src[si + a : si + e] on 64-byte uint8 arrays (0 <= a <= e <= 64) with one
    vector blend: a line is assembled in registers and cache before one full store writes it."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        line = _LINE.as_pointer()
        accp = builder.bitcast(_data(context, builder, sig, args, 0), line)
        value = builder.load(builder.bitcast(_data(context, builder, sig, args, 3, 4), line), align=1)
        lo = builder.trunc(args[1], cgutils.int8_t)
        inside = builder.icmp_unsigned("<", builder.sub(_IOTA, _splat(builder, lo)),
                                       _splat(builder, builder.sub(builder.trunc(args[2], cgutils.int8_t), lo)))
        builder.store(builder.select(inside, value, builder.load(accp, align=1)), accp, align=1)
        return context.get_dummy_value()
    return types.void(acc, a, e, src, si), codegen


def _splat(builder: Any, byte: Any) -> Any:
    one = builder.insert_element(ir.Constant(_LINE, ir.Undefined), byte, ir.IntType(32)(0))
    return builder.shuffle_vector(one, ir.Constant(_LINE, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), 64), [0] * 64))


def _lines_typer(typingctx: Any, o: Any, oi: Any, n: Any, src: Any, si: Any) -> Any:
    """Store src[si : si + 64] into the n 64-byte lines from o[oi] (aligned: o's address + oi is a
    multiple of 64), each with one non-temporal full-line store."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        builder.call(_lines_function(builder.module),
                     [_data(context, builder, sig, args, 0, 1), args[2], _data(context, builder, sig, args, 3, 4)])
        return context.get_dummy_value()
    return types.void(o, oi, n, src, si), codegen


def _lines_function(module: Any) -> Any:
    """The loop behind `_lines` (out of line)."""
    i64 = ir.IntType(64)
    fn, builder = _out_of_line(module, "dmlgraph_stream_lines", [cgutils.voidptr_t, i64, cgutils.voidptr_t])
    if builder is None:
        return fn
    dst, n, src = fn.args
    value = builder.load(builder.bitcast(src, _LINE.as_pointer()), align=1)
    with cgutils.for_range(builder, n) as loop:
        _store_line(builder, value, builder.gep(dst, [builder.shl(loop.index, i64(6))]))
    builder.ret_void()
    return fn


def _line_store_typer(typingctx: Any, o: Any, oi: Any, src: Any) -> Any:
    """`_lines` for one line from src[0:64], inline (a call per row measured ~10 ns)."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        value = builder.load(builder.bitcast(_data(context, builder, sig, args, 2), _LINE.as_pointer()), align=1)
        _store_line(builder, value, _data(context, builder, sig, args, 0, 1))
        return context.get_dummy_value()
    return types.void(o, oi, src), codegen


def _misalignment_typer(typingctx: Any, o: Any) -> Any:
    """The address of o's data modulo 64."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.and_(builder.ptrtoint(_data(context, builder, sig, args, 0), ir.IntType(64)), ir.IntType(64)(63))
    return types.int64(o), codegen


_LINE = ir.VectorType(ir.IntType(8), 64)
_IOTA = ir.Constant(_LINE, list(range(64)))


ZERO_BLOCK_BYTES = 16 * 1024  # `rows` zeroes this much at a time under a narrow Value (see there)
COPY_MAX_BYTES = 512 * 1024  # `rows` writes zero-based matrices up to this size at once, and copies the first
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def _element_typer(typingctx: Any, o: Any, oi: Any, s: Any, n: Any) -> Any:
    """o[oi : oi + n] = s[0 : n] for n in (1, 2, 4, 8): one plain store (a memcpy call costs more)."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        dst, src = _data(context, builder, sig, args, 0, 1), _data(context, builder, sig, args, 2)
        done = builder.append_basic_block("element.done")
        switch = builder.switch(args[3], done)
        for size in (1, 2, 4, 8):
            block = builder.append_basic_block(f"element.{size}")
            switch.add_case(args[3].type(size), block)
            builder.position_at_end(block)
            ptr = ir.IntType(8 * size).as_pointer()
            builder.store(builder.load(builder.bitcast(src, ptr), align=1), builder.bitcast(dst, ptr), align=1)
            builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()
    return types.void(o, oi, s, n), codegen


def _diagonal_typer(typingctx: Any, o: Any, oi: Any, y0: Any, y1: Any, p: Any, q: Any, w: Any, rb: Any, isz: Any,
                    s: Any) -> Any:
    """Value (s[0 : isz], isz in 1, 2, 4, 8) on diagonal x - y == p of rows [y0, y1) of the matrix
    at o[oi:] (rows of rb bytes, w elements) when q == p + 1 (q <= p: nothing), one element
    after the other; out of line (see there), which leaves `rows`' own code as it was."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        builder.call(_diagonal_function(builder.module),
                     [_data(context, builder, sig, args, 0, 1), *args[2:9], _data(context, builder, sig, args, 9)])
        return context.get_dummy_value()
    return types.void(o, oi, y0, y1, p, q, w, rb, isz, s), codegen


def _diagonal_function(module: Any) -> Any:
    """The loops behind `_diagonal` (one per element size)."""
    i64 = ir.IntType(64)
    fn, builder = _out_of_line(module, "dmlgraph_diagonal", [cgutils.voidptr_t, *[i64] * 7, cgutils.voidptr_t])
    if builder is None:
        return fn
    dst, y0, y1, d, q, w, rb, isz, src = fn.args
    ya = builder.select(builder.icmp_signed(">", y0, builder.neg(d)), y0, builder.neg(d))
    yb = builder.select(builder.icmp_signed("<", y1, builder.sub(w, d)), y1, builder.sub(w, d))
    done = builder.append_basic_block("done")
    start = builder.append_basic_block("start")
    builder.cbranch(builder.and_(builder.icmp_signed(">", q, d), builder.icmp_signed("<", ya, yb)), start, done)
    builder.position_at_end(start)
    dst = builder.gep(dst, [builder.add(builder.mul(ya, rb), builder.mul(builder.add(ya, d), isz))])
    step, n = builder.add(rb, isz), builder.sub(yb, ya)
    switch = builder.switch(isz, done)
    for size in (1, 2, 4, 8):
        block = builder.append_basic_block(f"size{size}")
        switch.add_case(i64(size), block)
        builder.position_at_end(block)
        ptr = ir.IntType(8 * size).as_pointer()
        value = builder.load(builder.bitcast(src, ptr), align=1)
        with cgutils.for_range(builder, n) as loop:
            builder.store(value, builder.bitcast(builder.gep(dst, [builder.mul(loop.index, step)]), ptr), align=1)
        builder.branch(done)
    builder.position_at_end(done)
    builder.ret_void()
    return fn


_memcpy: Any = intrinsic(_memcpy_typer)
_diagonal: Any = intrinsic(_diagonal_typer)
_element: Any = intrinsic(_element_typer)
_memset: Any = intrinsic(_memset_typer)
_stream: Any = intrinsic(_stream_typer)
_sfence: Any = intrinsic(_sfence_typer)
_line: Any = intrinsic(_line_typer)
_lines: Any = intrinsic(_lines_typer)
_line_store: Any = intrinsic(_line_store_typer)
_misalignment: Any = intrinsic(_misalignment_typer)


@njit(cache=True, nogil=True)
def rows(o: np.ndarray, s: np.ndarray, value: int, params: np.ndarray) -> None:
    """Write `batch` h x w matrices of isz-byte elements into the flat C-order bytes `o`;
    params = (isz, s_batch, batch, h, w, p0, q0, p1, q1, base, stream) as int64, `value` the
    element's bits as an int (byte k of the element: (value >> 8k) & 0xFF). Few and cheap arguments: numba's dispatcher
    costs ~100 ns per argument (a bytes object ~400 ns), a good share of a call on a 256x256 matrix.

    Value goes on topX = x - y in [p0, q0) and [p1, q1) (sorted,
    disjoint, clipped to [-h, w]; an unused interval is (w, w)); elsewhere the input `s` (flat
    bytes; matrix i starts at byte i * s_batch, 0 = one matrix broadcast over the batch), or
    zeros when `s` is empty.

    base False: every row is written span by span, each byte once. base True (for a Value a
    few diagonals wide): each matrix gets the input (or zeros) with one call, then the Value
    spans; zeros for a matrix larger than COPY_MAX_BYTES with shorter rows than ZERO_BLOCK_BYTES
    go block by block (ZERO_BLOCK_BYTES of rows, then their Values while in cache: the 8x1024x1024 uint8 identity 0.85-0.89x one
    memset of the output, where a memset per matrix then its Values, or copies of the first
    matrix, measured 0.67-0.8x). When every matrix is the same (no input, or one broadcast),
    the first is copied (zero-based: up to COPY_MAX_BYTES, larger ones are cheaper to write
    again). A Value on one diagonal over a base (identities) is written along the diagonal
    rather than row by row (`_diagonal`): the kernel on eye 256x256 1.06-1.15x (float32, int64)
    to 1.2-1.6x (float16, uint8) as fast; bands of 16 diagonals measured 0.7-0.96x that way, so
    wider Values keep the rows. stream: write with non-temporal stores (outputs far larger than
    the cache).
    """
    isz, s_batch, batch, h, w = params[0], params[1], params[2], params[3], params[4]
    p0, q0, p1, q1 = params[5], params[6], params[7], params[8]
    base, stream = params[9] != 0, params[10] != 0
    rb = w * isz
    mb = h * rb
    byte = value & 0xFF  # >= 0: every byte of Value is this one (a memset), else -1
    for k in range(isz):
        if (value >> (8 * k)) & 0xFF != byte:
            byte = -1
    # one allocation (each costs ~0.2 us, a good share of a call on a 256x256 matrix): a row of
    # Values (one Value when it is a memset and nothing streams), filled by doubling, then a
    # row of zeros when streaming
    nv = rb if byte < 0 or stream else isz
    vrow = np.zeros(nv + (rb if stream else 0), np.uint8)
    for k in range(isz):
        vrow[k] = (value >> (8 * k)) & 0xFF
    filled = isz
    while filled < nv:
        n = min(filled, nv - filled)
        _memcpy(vrow, filled, vrow, 0, n)
        filled += n
    zero_blocks = base and not s.size and mb > COPY_MAX_BYTES and rb < ZERO_BLOCK_BYTES
    diagonals = base and not stream and q0 - p0 <= 1 and q1 - p1 <= 1  # (see the docstring)
    block = ZERO_BLOCK_BYTES // rb if zero_blocks else h  # rows written at a time
    for b in range(batch):
        if b and s_batch == 0 and not zero_blocks:  # the same matrix again
            if stream:
                _stream(o, b * mb, o, 0, mb)
            else:
                _memcpy(o, b * mb, o, 0, mb)
            continue
        for y0 in range(0, h, block):
            y1 = min(h, y0 + block)
            if base:  # the input or zeros with one call, then the Values while in cache
                if s.size:
                    _memcpy(o, b * mb + y0 * rb, s, b * s_batch + y0 * rb, (y1 - y0) * rb)
                else:
                    _memset(o, b * mb + y0 * rb, (y1 - y0) * rb, 0)
            if diagonals:
                _diagonal(o, b * mb, y0, y1, p0, q0, w, rb, isz, vrow)
                _diagonal(o, b * mb, y0, y1, p1, q1, w, rb, isz, vrow)
                continue
            for y in range(y0, y1):
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
                                _stream(o, oi + a, vrow, nv, e - a)
                            else:
                                _memset(o, oi + a, e - a, 0)
                for a, e in ((a0, e0), (a1, e1)):  # Value: a memset when its bytes are all `byte`
                    if e > a:
                        if stream:
                            _stream(o, oi + a, vrow, 0, e - a)
                        elif e - a == isz:
                            _element(o, oi + a, vrow, isz)
                        elif byte >= 0:
                            _memset(o, oi + a, e - a, byte)
                        else:
                            _memcpy(o, oi + a, vrow, 0, e - a)
    if stream:
        _sfence()


@njit(cache=True, nogil=True)
def generated(o: np.ndarray, s: np.ndarray, value: int, params: np.ndarray) -> None:
    """`rows` without an input (`s` is empty): Value on topX in [p0, q0) and [p1, q1), zeros
    elsewhere; params = (isz, batch, h, w, p0, q0, p1, q1).

    The output is written as a sequence of aligned 64-byte lines, each with one non-temporal
    full-line store: the runs of zeros or Values between two boundaries in a loop,
    a line holding boundaries (rows' ends included) assembled in `acc` first. On 8-16 MiB uint8
    identities and triangles, against one memset of the whole output: a memset per span (two per
    row) 0.66-0.8x (each pays `rep stosb`'s start-up, and two calls share a line); one memset per
    block of rows then the Values in cache, or a copy per row from a pattern, 0.75-0.87x; this
    0.81-1.0x streamed (0.7x with plain stores, which read each line before writing it).
    """
    isz, batch, h, w = params[0], params[1], params[2], params[3]
    p0, q0, p1, q1 = params[4], params[5], params[6], params[7]
    rb = w * isz
    mis = _misalignment(o)
    pattern = np.zeros(128, np.uint8)  # a line of zeros, then a line of Values (by address)
    for k in range(64):
        pattern[64 + k] = (value >> (8 * ((k - mis) % isz))) & 0xFF
    acc = np.empty(64, np.uint8)
    cur = -mis  # the line being assembled starts here (flat offset; o[cur] is 64-byte aligned)
    pos = 0  # acc holds bytes [cur, pos)
    for b in range(batch):
        for y in range(h):
            oi = (b * h + y) * rb
            a0 = oi + min(max(p0 + y, 0), w) * isz
            e0 = oi + min(max(q0 + y, 0), w) * isz
            a1 = oi + min(max(p1 + y, 0), w) * isz
            e1 = oi + min(max(q1 + y, 0), w) * isz
            for e, si in ((a0, 0), (e0, 64), (a1, 0), (e1, 64), (oi + rb, 0)):  # runs up to e of si's line
                if e <= pos:
                    continue
                if e < cur + 64:
                    _line(acc, pos - cur, e - cur, pattern, si)
                else:
                    _line(acc, pos - cur, 64, pattern, si)
                    if cur < 0:  # the first line starts before o
                        _memcpy(o, 0, acc, -cur, 64 + cur)
                    else:
                        _line_store(o, cur, acc)
                    cur += 64
                    n = (e - cur) >> 6
                    if n:
                        _lines(o, cur, n, pattern, si)
                        cur += n << 6
                    if e > cur:
                        _line(acc, 0, e - cur, pattern, si)
                pos = e
    if pos > max(cur, 0):
        _memcpy(o, max(cur, 0), acc, max(-cur, 0), pos - max(cur, 0))
    _sfence()
