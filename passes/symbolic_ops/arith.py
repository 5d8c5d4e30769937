"""Elementwise arithmetic (Add, Sub, Mul, Div, Min, Max, Neg, Abs, Sign, Clip): index grids stay
affine, bands and one-value tensors combine piece by piece.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from dmlgraph.ir.graph import OnnxNode
from dmlgraph.passes.symbolic import (
    AbstractValue,
    Affine,
    Analysis,
    Band,
    Clamp,
    Difference,
    Elems,
    Lin,
    Opaque,
    Pieces,
    Unprovable,
    as_lin,
    as_scalar,
    int_of,
    make_clamp,
    shape_of,
)
from dmlgraph.passes.symbolic_ops.core import attr, handles, lin_breaks, objs


def is_piecewise(an: Analysis, v: AbstractValue) -> bool:
    """Held as a band or a non-integer one-value tensor: combined piece by piece, not as an index grid."""
    if isinstance(v, Band):
        return len(v.values) > 1 or int_of(v.values[0]) is None or v.dtype.kind == "b"
    if isinstance(v, Elems):
        u = an.uniform(v)
        return u is not None and (int_of(u) is None or v.dtype.kind == "b")
    return False


def float_values(an: Analysis, vs: Sequence[AbstractValue]) -> bool:
    """Float operands each one value (or a band): computed as IEEE numbers, not as integers, so that
    a zero keeps its sign (-(0.0) is -0.0, 0.0 * -2 is -0.0) and a sum rounds as in the model."""
    return bool(vs) and all(v.dtype.kind == "f" and (isinstance(v, Band) or
                                                     (not isinstance(v, Pieces) and an.uniform(v) is not None))
                            for v in vs)


def float_piecewise(an: Analysis, vs: Sequence[AbstractValue], fn: Callable[..., object]) -> AbstractValue:
    """`piecewise` of `float_values` operands; one-element constants stay one (a Range bound, a step)."""
    elems = [v for v in vs if isinstance(v, Elems) and len(v.items) == 1]
    values = [an.uniform(v) for v in elems]
    if len(elems) == len(vs) and all(x is not None for x in values):
        shape = np.broadcast_shapes(*(v.shape for v in elems))
        with np.errstate(all="ignore"):
            value = as_scalar(fn(*values), vs[0].dtype)
        return Elems(vs[0].dtype, tuple(shape), (value,))
    return piecewise(an, vs, fn)


def piecewise(an: Analysis, vs: Sequence[AbstractValue], fn: Callable[..., object], dtype: np.dtype | None = None
               ) -> Band:
    shape = an.broadcast(*(shape_of(v) for v in vs))
    bands = [an.band_at(v, shape) for v in vs]
    out = dtype if dtype is not None else bands[0].dtype
    with np.errstate(all="ignore"):
        return an.merge(bands, fn, out, shape)



def map_pieces(an: Analysis, v: Pieces, fn: Callable[[Affine], AbstractValue]) -> Pieces:
    """fn (an affine map: negation, a constant added or multiplied, a cast) applied to each piece."""
    out = []
    for p in v.pieces:
        q = fn(p)
        if not isinstance(q, Affine):
            raise Unprovable("a piecewise grid mapped to something else")
        out.append(q)
    return Pieces(out[0].dtype, out[0].shape, v.breaks, tuple(out))


def _elems_op(an: Analysis, a: Elems, b: Elems, fn: Callable[[object, object], object], dtype: np.dtype) -> Elems:
    shape = np.broadcast_shapes(a.shape, b.shape)
    ia = np.broadcast_to(objs(a), shape)
    ib = np.broadcast_to(objs(b), shape)
    items = tuple(fn(x, y) for x, y in zip(ia.reshape(-1), ib.reshape(-1)))
    for x in items:
        if isinstance(x, Lin):
            lo, hi = an.bounds(x)
            if not an.fits(lo, hi, dtype):
                raise Unprovable(f"the result ranges over [{lo}, {hi}], which {dtype} does not hold")
    return Elems(dtype, tuple(shape), items)


def _lin_of(x: object) -> Lin:
    if isinstance(x, (Clamp, Difference)):
        return as_lin(x, "an operand")  # (raises, naming the clamp)
    y = int_of(x)
    if y is None:
        raise Unprovable("a non-integer value in integer arithmetic")
    return as_lin(y, "an operand")


def _add(an: Analysis, a: AbstractValue, b: AbstractValue) -> AbstractValue:
    if isinstance(a, Elems) and isinstance(b, Elems) and a.dtype.kind in "iu":
        return _elems_op(an, a, b, lambda x, y: _lin_of(x) + _lin_of(y), a.dtype)
    x, y = an.affine(a, "an operand"), an.affine(b, "an operand")
    shape = an.broadcast(x.shape, y.shape)
    x, y = an.expand_affine(x, shape), an.expand_affine(y, shape)
    return an.check_fits(Affine(x.dtype, shape, tuple(p + q for p, q in zip(x.coef, y.coef)), x.base + y.base),
                         "the sum")


def _neg(an: Analysis, a: AbstractValue) -> AbstractValue:
    if isinstance(a, Elems) and a.dtype.kind in "iu":
        items = tuple(-_lin_of(x) for x in a.items)
        for y in items:  # -INT_MIN wraps to INT_MIN
            lo, hi = an.bounds(y)
            if not an.fits(lo, hi, a.dtype):
                raise Unprovable(f"the negation ranges over [{lo}, {hi}], which {a.dtype} does not hold")
        return Elems(a.dtype, a.shape, items)
    x = an.affine(a, "the operand")
    return an.check_fits(Affine(x.dtype, x.shape, tuple(-c for c in x.coef), -x.base), "the negation")


def sub(an: Analysis, a: AbstractValue, b: AbstractValue) -> AbstractValue:
    if isinstance(a, Elems) and isinstance(b, Elems) and a.dtype.kind in "iu":
        return _elems_op(an, a, b, lambda x, y: _size_difference(an, x, y), a.dtype)
    return _add(an, a, _neg_unchecked(an, b))


def _size_difference(an: Analysis, x: object, y: object) -> Lin | Difference:
    """x - y for sizes: a Lin, or min(e, N) - min(s, N) with e >= s (a clamped slice's length)."""
    if isinstance(x, Clamp) and isinstance(y, Clamp) and (x.lo, x.hi) == (y.lo, y.hi) and \
            an.nonneg(x.inner - y.inner):
        return Difference(x, y)  # clamping is monotone: the difference stays >= 0
    return _lin_of(x) - _lin_of(y)


def _neg_unchecked(an: Analysis, b: AbstractValue) -> Affine:
    y = an.affine(b, "an operand")
    return Affine(y.dtype, y.shape, tuple(-c for c in y.coef), -y.base)


def _mul(an: Analysis, a: AbstractValue, b: AbstractValue) -> AbstractValue:
    if isinstance(a, Elems) and isinstance(b, Elems) and a.dtype.kind in "iu":
        def times(x: object, y: object) -> Lin:
            lx, ly = _lin_of(x), _lin_of(y)
            if lx.is_const:
                return ly.scale(lx.const)
            if ly.is_const:
                return lx.scale(ly.const)
            raise Unprovable("the product of two sizes is not affine")
        return _elems_op(an, a, b, times, a.dtype)
    x, y = an.affine(a, "an operand"), an.affine(b, "an operand")
    if not any(y.coef) and y.base.is_const:
        k, z = y.base.const, x
    elif not any(x.coef) and x.base.is_const:
        k, z = x.base.const, y
    else:
        raise Unprovable("a product of two index or size expressions is not affine")
    shape = an.broadcast(x.shape, y.shape)
    z = an.expand_affine(z, shape)
    return an.check_fits(Affine(x.dtype, shape, tuple(c * k for c in z.coef), z.base.scale(k)), "the product")


def _div(an: Analysis, a: AbstractValue, b: AbstractValue) -> AbstractValue:
    x, y = an.affine(a, "the dividend"), an.affine(b, "the divisor")
    if any(y.coef) or not y.base.is_const or y.base.const == 0:
        raise Unprovable("division by a value that is not a nonzero constant")
    k = y.base.const
    if any(c % k for c in x.coef):
        raise Unprovable("an index grid divided by a constant that does not divide it is not affine")
    base = x.base.divide(k)
    if base is None:
        if x.base.is_const and not any(x.coef):
            q = _trunc_div(x.base.const, k)
            if x.dtype.kind == "f":
                raise Unprovable("a float division with a fractional result")
            base = Lin.of(q)
        elif not any(x.coef) and x.dtype.kind in "iu" and k > 0 and an.nonneg(x.base):
            base = Lin.sym(an.floor_div(x.base, k))  # a size halved: a size of its own
        else:
            raise Unprovable(f"{x.base.render(str)} / {k} is not exact at every size")
    shape = an.broadcast(x.shape, y.shape)
    z = an.expand_affine(Affine(x.dtype, x.shape, tuple(c // k for c in x.coef), base), shape)
    return an.check_fits(z, "the quotient")


def _trunc_div(a: int, b: int) -> int:
    """ONNX's integer Div: the quotient truncated toward zero (Python's // floors), exactly."""
    return abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)


def _divide(x: Any, y: Any) -> Any:
    """Div of two values: integers truncate toward zero, exactly (a float64 quotient would round past 2^53)."""
    dtype = np.asarray(x).dtype
    if dtype.kind == "f":
        return x / y
    a, b = int(x), int(y)
    if b == 0:
        raise Unprovable("an integer division by zero")
    q = _trunc_div(a, b)
    if not np.iinfo(dtype).min <= q <= np.iinfo(dtype).max:
        raise Unprovable(f"an integer division whose quotient {q} overflows {dtype}")
    return dtype.type(q)


_NUMPY_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y, "Div": _divide,
    "Max": np.maximum, "Min": np.minimum,
}
_AFFINE_BINARY = {"Add": _add, "Sub": sub, "Mul": _mul, "Div": _div}


@handles("Add", "Sub", "Mul", "Div", "Min", "Max")
def _binary(an: Analysis, n: OnnxNode, ins: list) -> list:
    vs = [v for v in ins if v is not None]
    if any(isinstance(v, Opaque) for v in vs):
        raise Unprovable("arithmetic on data")
    if any(isinstance(v, Pieces) for v in vs):
        if len(vs) != 2 or n.op_type not in _AFFINE_BINARY or all(isinstance(v, Pieces) for v in vs):
            raise Unprovable(f"{n.op_type} of a piecewise index grid")
        fn = _AFFINE_BINARY[n.op_type]
        if isinstance(vs[0], Pieces):
            return [map_pieces(an, vs[0], lambda p: fn(an, p, vs[1]))]
        return [map_pieces(an, vs[1], lambda p: fn(an, vs[0], p))]
    if any(is_piecewise(an, v) for v in vs) or float_values(an, vs):
        np_fn = _NUMPY_BINARY[n.op_type]
        out = vs[0]
        for v in vs[1:]:
            out = float_piecewise(an, [out, v], np_fn)
        return [out]
    if n.op_type in ("Min", "Max"):
        out = vs[0]
        for v in vs[1:]:
            out = _min_max(an, out, v, n.op_type)
        return [out]
    return [_AFFINE_BINARY[n.op_type](an, vs[0], vs[1])]


def _min_max(an: Analysis, a: AbstractValue, b: AbstractValue, op: str) -> AbstractValue:
    if isinstance(a, Elems) and isinstance(b, Elems) and a.shape == b.shape == (1,) or \
            (isinstance(a, Elems) and isinstance(b, Elems) and len(a.items) == len(b.items) == 1):
        p, q = _lin_of(a.items[0]), _lin_of(b.items[0])
        s = an.sign(p - q)
        if s is None:
            # min/max of a size and a constant: a clamp, usable as a size
            if q.is_const and op == "Min":
                return Elems(a.dtype, np.broadcast_shapes(a.shape, b.shape), (make_clamp(p, None, q.const, an),))
            if p.is_const and op == "Min":
                return Elems(a.dtype, np.broadcast_shapes(a.shape, b.shape), (make_clamp(q, None, p.const, an),))
            if q.is_const and op == "Max":
                return Elems(a.dtype, np.broadcast_shapes(a.shape, b.shape), (make_clamp(p, q.const, None, an),))
            if p.is_const and op == "Max":
                return Elems(a.dtype, np.broadcast_shapes(a.shape, b.shape), (make_clamp(q, p.const, None, an),))
            raise Unprovable(f"{op} of two sizes whose order depends on the sizes")
        pick_a = (s <= 0) == (op == "Min")
        return Elems(a.dtype, np.broadcast_shapes(a.shape, b.shape), (a if pick_a else b).items)  # (3 and [[1]]: [[3]])
    x, y = an.affine(a, "an operand"), an.affine(b, "an operand")
    diff = sub(an, x, y)
    assert isinstance(diff, Affine)
    lo, hi = an.affine_bounds(diff)
    if lo >= 0 or hi <= 0:
        a_larger = lo >= 0
        pick = (y if a_larger else x) if op == "Min" else (x if a_larger else y)
        return an.expand_affine(pick, an.broadcast(x.shape, y.shape))
    # Their order changes along the diagonals: x on one side of the crossing, y on the other.
    shape = an.broadcast(x.shape, y.shape)
    below = an.compare(diff, "<", f"{op} of two index grids")  # where x < y
    if len(below.breaks) != 1:
        raise Unprovable(f"{op} of two index grids whose order varies other than along the diagonals")
    x, y = an.expand_affine(x, shape), an.expand_affine(y, shape)
    x_first = bool(below.values[0]) == (op == "Min")  # Min takes x where x < y
    breaks = lin_breaks(below, f"{op} of two index grids crossing at a clamped diagonal")
    return Pieces(x.dtype, shape, breaks, (x, y) if x_first else (y, x))


@handles("Neg")
def _neg_op(an: Analysis, n: OnnxNode, ins: list) -> list:
    if isinstance(ins[0], Pieces):
        return [map_pieces(an, ins[0], lambda p: _neg(an, p))]
    if is_piecewise(an, ins[0]) or float_values(an, ins[:1]):
        return [float_piecewise(an, [ins[0]], np.negative)]
    return [_neg(an, ins[0])]


@handles("Abs", "Sign")
def _abs_sign(an: Analysis, n: OnnxNode, ins: list) -> list:
    fn = np.abs if n.op_type == "Abs" else np.sign
    if is_piecewise(an, ins[0]) or isinstance(ins[0], Band) or float_values(an, ins[:1]):
        return [float_piecewise(an, [ins[0]], fn)]
    x = an.affine(ins[0], "the operand")
    lo, hi = an.affine_bounds(x)
    if lo >= 0:
        if n.op_type == "Abs":
            return [x]
        if lo > 0:
            return [Affine(x.dtype, x.shape, (0,) * len(x.shape), Lin.of(1))]
    if hi <= 0:
        if n.op_type == "Abs":
            return [_neg(an, x)]
        if hi < 0:
            return [Affine(x.dtype, x.shape, (0,) * len(x.shape), Lin.of(-1))]
    if n.op_type == "Abs":
        return [_min_max(an, x, _neg(an, x), "Max")]  # |x| = max(x, -x): two pieces when x is diagonal
    raise Unprovable("Sign of an index grid that changes sign")


@handles("Clip")
def _clip(an: Analysis, n: OnnxNode, ins: list) -> list:
    out = ins[0]
    lo = ins[1] if len(ins) > 1 else None
    hi = ins[2] if len(ins) > 2 else None
    if lo is None and attr(n, "min") is not None:
        lo = Elems(out.dtype, (), (np.asarray(attr(n, "min"), out.dtype)[()],))
    if hi is None and attr(n, "max") is not None:
        hi = Elems(out.dtype, (), (np.asarray(attr(n, "max"), out.dtype)[()],))
    for bound, op, fn in ((lo, "Max", _at_least), (hi, "Min", _at_most)):
        if bound is None:
            continue
        if out.dtype.kind == "f" and (is_piecewise(an, out) or is_piecewise(an, bound) or
                                      float_values(an, [out, bound])):
            out = float_piecewise(an, [out, bound], fn)  # (not Max/Min: those propagate a NaN, Clip does not)
        else:
            out = _binary(an, _with_op(n, op), [out, bound])[0]
    return [out]


# onnxruntime's Clip is std::min(std::max(x, lo), hi): a NaN bound clips nothing, and of two equal
# zeros it keeps x (numpy's maximum/minimum, as its Max/Min ops, return NaN and may pick the other zero)
def _at_least(x: Any, lo: Any) -> Any:
    return lo if x < lo else x


def _at_most(x: Any, hi: Any) -> Any:
    return hi if hi < x else x


def _with_op(n: OnnxNode, op: str) -> OnnxNode:
    return OnnxNode(n.name, op, [], [], domain=n.domain)
