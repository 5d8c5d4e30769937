"""The ops that make index grids and bands from sizes: Range, CumSum, Trilu and EyeLike."""
from __future__ import annotations

import numpy as np

from dmlgraph.ir.graph import OnnxNode
from dmlgraph.passes.symbolic import (
    BOOL,
    Affine,
    Analysis,
    Band,
    Lin,
    Unprovable,
    as_lin,
    int_of,
    make_clamp,
    shape_of,
)
from dmlgraph.passes.symbolic_ops.core import attr, axis_index, const_ints, dtype_of, handles, scalar_lin


@handles("Range")
def _range(an: Analysis, n: OnnxNode, ins: list) -> list:
    start, limit, delta = (scalar_lin(an, v, w) for v, w in zip(ins, ("start", "limit", "delta")))
    if not delta.is_const or delta.const == 0:
        raise Unprovable("the step is not a nonzero constant")
    step = delta.const
    span = limit - start if step > 0 else start - limit
    size = span.divide(abs(step)) if abs(step) > 1 else span
    if size is None:
        if not span.is_const:
            raise Unprovable("the length ceil((limit - start) / step) is not exact at every size")
        size = Lin.of(-(-span.const // abs(step)))
    dim = make_clamp(size, 0, None, an)
    return [an.check_fits(Affine(ins[0].dtype, (dim,), (step,), start), "the range")]


@handles("CumSum")
def _cumsum(an: Analysis, n: OnnxNode, ins: list) -> list:
    x = ins[0]
    shape = shape_of(x)
    axis = const_ints(an, ins[1], "the axis")[0]
    axis = axis_index(axis, len(shape))
    u = an.uniform(x)
    c = int_of(u) if u is not None else None
    if c is None or not c.is_const:
        raise Unprovable("a cumulative sum of anything but one integer value repeated is not affine")
    k = c.const
    exclusive, reverse = int(attr(n, "exclusive", 0)), int(attr(n, "reverse", 0))
    coef = [0] * len(shape)
    if not reverse:  # element t = k * (t + 1), or k * t when exclusive
        coef[axis] = k
        base = Lin.of(0 if exclusive else k)
    else:  # k * (n - t), or k * (n - 1 - t)
        coef[axis] = -k
        base = as_lin(shape[axis], "the summed axis").scale(k) - (k if exclusive else 0)
    return [an.check_fits(Affine(x.dtype, shape, tuple(coef), base), "the cumulative sum")]


@handles("Trilu")
def _trilu(an: Analysis, n: OnnxNode, ins: list) -> list:
    x = ins[0]
    shape = shape_of(x)
    if len(shape) < 2:
        raise Unprovable("Trilu of fewer than 2 dims")
    k = scalar_lin(an, ins[1], "k") if len(ins) > 1 and ins[1] is not None else Lin.of(0)
    upper = int(attr(n, "upper", 1))
    keep = Band(BOOL, shape, (k,), (np.bool_(False), np.bool_(True))) if upper else \
        Band(BOOL, shape, (k + 1,), (np.bool_(True), np.bool_(False)))
    zero = np.zeros((), x.dtype)[()]
    data = an.band_at(x, shape)
    return [an.merge([keep, data], lambda p, q: q if p else zero, x.dtype, shape)]


@handles("EyeLike")
def _eyelike(an: Analysis, n: OnnxNode, ins: list) -> list:
    shape = shape_of(ins[0])
    if len(shape) != 2:
        raise Unprovable("EyeLike of a tensor that is not 2-D")
    dt = attr(n, "dtype")
    dtype = ins[0].dtype if dt is None else dtype_of(int(dt))
    k = Lin.of(int(attr(n, "k", 0)))
    zero, one = np.zeros((), dtype)[()], np.ones((), dtype)[()]
    return [Band(dtype, shape, (k, k + 1), (zero, one, zero))]
