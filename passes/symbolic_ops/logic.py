"""Comparisons (Less ... Equal) and logic (And, Or, Xor, Not, Where): an index grid compared with
another is a band, which is how a mask's diagonal shows.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from dmlgraph.ir.graph import OnnxNode
from dmlgraph.passes.symbolic import (
    BOOL,
    FLIP,
    INT64,
    AbstractValue,
    Affine,
    Analysis,
    Band,
    Dim,
    Elems,
    Lin,
    Opaque,
    Pieces,
    Unprovable,
    int_of,
    shape_of,
)
from dmlgraph.passes.symbolic_ops.arith import is_piecewise, piecewise, sub
from dmlgraph.passes.symbolic_ops.core import handles

_COMPARE = {"Less": "<", "LessOrEqual": "<=", "Greater": ">", "GreaterOrEqual": ">=", "Equal": "=="}
_NUMPY_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal}


@handles(*_COMPARE)
def _compare(an: Analysis, n: OnnxNode, ins: list) -> list:
    a, b = ins
    op = _COMPARE[n.op_type]
    if isinstance(a, Opaque) or isinstance(b, Opaque):
        raise Unprovable("a comparison of data")
    if isinstance(a, Pieces) or isinstance(b, Pieces):
        return [_compare_pieces(an, a, b, op)]
    ua, ub = an.uniform(a), an.uniform(b)
    # An integer grid against a fractional or infinite float constant: x < 2.5 is x < 3.
    for grid, const, flipped in ((a, ub, False), (b, ua, True)):
        if const is not None and const.dtype.kind == "f" and int_of(const) is None and \
                not is_piecewise(an, grid) and an.uniform(grid) is None:
            return [_compare_fraction(an, an.affine(grid, "the compared grid"), float(const),
                                      FLIP[op] if flipped else op)]
    if is_piecewise(an, a) or is_piecewise(an, b):
        return [piecewise(an, [a, b], _NUMPY_COMPARE[op], BOOL)]
    try:
        x, y = an.affine(a, "the left operand"), an.affine(b, "the right operand")
    except Unprovable:
        items = _compare_items(an, a, b, op)
        if items is None:
            raise
        return [items]
    diff = sub(an, x, y)
    assert isinstance(diff, Affine)
    return [an.compare(diff, op, "the comparison")]


def _items_at(an: Analysis, v: AbstractValue, shape: tuple[int, ...]) -> list | None:
    """v's elements broadcast to the static `shape`, for known elements or one value; else None."""
    dims = [d.const if isinstance(d, Lin) and d.is_const else d for d in shape_of(v)]
    vshape = tuple(d for d in dims if isinstance(d, int))
    try:
        if len(vshape) != len(dims) or np.broadcast_shapes(shape, vshape) != shape:
            return None
    except ValueError:  # (shapes that do not broadcast: not for this rule to say)
        return None
    if isinstance(v, Elems):
        pick = np.broadcast_to(np.arange(len(v.items)).reshape(vshape), shape).reshape(-1)
        return [v.items[k] for k in pick]
    u = an.uniform(v)
    return None if u is None else [u] * int(np.prod(shape, dtype=np.int64))


def _compare_items(an: Analysis, a: AbstractValue, b: AbstractValue, op: str) -> Elems | None:
    """Known elements compared item by item (TorchScript's `Equal(shape, -1)` before an Expand, the
    shape's sizes dims): each result decided at every size, else None (Unprovable stays)."""
    elems = a if isinstance(a, Elems) else b
    if not isinstance(elems, Elems):
        return None
    xs, ys = _items_at(an, a, elems.shape), _items_at(an, b, elems.shape)
    if xs is None or ys is None:
        return None
    out = []
    for x, y in zip(xs, ys):
        lx, ly = int_of(x), int_of(y)
        sign = None if lx is None or ly is None else an.sign(lx - ly)
        if sign is None:
            return None
        out.append(np.bool_(_NUMPY_COMPARE[op](sign, 0)))
    return Elems(BOOL, elems.shape, tuple(out))


def _where_items(an: Analysis, c: AbstractValue, x: AbstractValue, y: AbstractValue) -> Elems | None:
    """Where of a known condition between known elements (the shape TorchScript gives an Expand)."""
    if not isinstance(c, Elems):
        return None
    xs, ys = _items_at(an, x, c.shape), _items_at(an, y, c.shape)
    if xs is None or ys is None or not all(isinstance(k, (bool, np.bool_)) for k in c.items):
        return None
    dtype = _value_dtype(x, y)
    out = [p if k else q for k, p, q in zip(c.items, xs, ys)]
    if dtype.kind in "iu":  # (Elems holds integers as Lin)
        out = [int_of(v) for v in out]
        if any(v is None for v in out):
            return None
    return Elems(dtype, c.shape, tuple(out))


def _compare_pieces(an: Analysis, a: AbstractValue, b: AbstractValue, op: str) -> AbstractValue:
    """Piecewise grids compared piece by piece: each piece's comparison holds on its own diagonals."""
    if isinstance(b, Pieces):
        a, b, op = b, a, FLIP[op]
    assert isinstance(a, Pieces)
    if isinstance(b, Pieces):
        raise Unprovable("two piecewise index grids compared")
    other = an.affine(b, "the value compared with a piecewise grid")
    shape = an.broadcast(a.shape, other.shape)
    bands = [an.compare(_as_affine(sub(an, an.expand_affine(p, shape), an.expand_affine(other, shape))), op,
                        "a piece of a piecewise grid") for p in a.pieces]
    return _select_pieces(an, a.breaks, bands, shape)


def _select_pieces(an: Analysis, breaks: tuple[Lin, ...], bands: list[Band], shape: tuple[Dim, ...]) -> Band:
    """The band that is bands[k] on the k-th run of diagonals between `breaks`."""
    which = Band(INT64, shape, breaks, tuple(np.int64(k) for k in range(len(bands))))
    return an.merge([which, *bands], lambda k, *vals: vals[int(k)], BOOL, shape)

def _as_affine(v: AbstractValue) -> Affine:
    assert isinstance(v, Affine)
    return v


def _compare_fraction(an: Analysis, x: Affine, c: float, op: str) -> AbstractValue:
    """x OP c for integer-valued x and a constant c that is not an integer (or is +-inf, NaN)."""
    if math.isnan(c) or op == "==":
        return _uniform_bool(an, x.shape, False)  # NaN compares false; an integer never equals a fraction
    if math.isinf(c):
        below = c > 0  # x < +inf always; x < -inf never
        return _uniform_bool(an, x.shape, below if op in ("<", "<=") else not below)
    t = Lin.of(math.ceil(c))  # x < c <=> x < ceil(c); x > c <=> x >= ceil(c)
    new_op = "<" if op in ("<", "<=") else ">="
    diff = sub(an, x, Affine(x.dtype, x.shape, (0,) * len(x.shape), t))
    assert isinstance(diff, Affine)
    return an.compare(diff, new_op, "the comparison")


def _uniform_bool(an: Analysis, shape: tuple[Dim, ...], b: bool) -> Band:
    return Band(BOOL, shape, (), (np.bool_(b),))


@handles("And", "Or", "Xor")
def _logic(an: Analysis, n: OnnxNode, ins: list) -> list:
    fn = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}[n.op_type]
    return [piecewise(an, ins, fn, BOOL)]


@handles("Not")
def _not_op(an: Analysis, n: OnnxNode, ins: list) -> list:
    return [piecewise(an, ins, np.logical_not, BOOL)]


@handles("Where")
def _where(an: Analysis, n: OnnxNode, ins: list) -> list:
    c, x, y = ins
    uc = an.uniform(c)
    if uc is not None:
        pick = x if bool(uc) else y
        shape = an.broadcast(shape_of(c), shape_of(x), shape_of(y))
        if isinstance(pick, Affine):
            return [an.expand_affine(pick, shape)]
        return [an.band_at(pick, shape)]
    items = _where_items(an, c, x, y)
    if items is not None:
        return [items]
    return [piecewise(an, [c, x, y], lambda p, q, r: q if p else r, _value_dtype(x, y))]


def _value_dtype(x: AbstractValue, y: AbstractValue) -> np.dtype:
    return x.dtype
