"""Cast and CastLike: a cast is exact only when every value it can take fits the new type, at every
size.
"""
from __future__ import annotations

import numpy as np

from dmlgraph.ir.graph import OnnxNode
from dmlgraph.passes.symbolic import (
    AbstractValue,
    Affine,
    Analysis,
    Band,
    Elems,
    Lin,
    Opaque,
    Pieces,
    Unprovable,
    as_scalar,
)
from dmlgraph.passes.symbolic_ops.arith import map_pieces, sub
from dmlgraph.passes.symbolic_ops.core import attr, dtype_of, handles


def _cast_scalar(x: object, dtype: np.dtype) -> object:
    if isinstance(x, Lin):
        return x
    src = np.asarray(x)
    if src.dtype.kind == "f" and dtype.kind in "iub" and dtype.kind != "b":
        if not np.isfinite(src) or not (np.iinfo(dtype).min <= float(src) <= np.iinfo(dtype).max):
            raise Unprovable(f"casting {src} to {dtype} is undefined")
    return as_scalar(x, dtype)


def cast(an: Analysis, v: AbstractValue, dtype: np.dtype) -> AbstractValue:
    if isinstance(v, Pieces) and dtype.kind in "iuf":
        return map_pieces(an, v, lambda p: cast(an, p, dtype))
    if isinstance(v, Opaque):
        return Opaque(dtype, v.shape, v.why)
    if isinstance(v, Band):
        values = tuple(_cast_scalar(x, dtype) for x in v.values)
        return Analysis.simplify(Band(dtype, v.shape, v.breaks, values))
    if isinstance(v, Elems):
        items: list[object] = []
        for x in v.items:
            if isinstance(x, Lin):
                if dtype.kind == "b":
                    s = an.sign(x)
                    if s is None:
                        raise Unprovable("a size cast to bool: whether it is 0 depends on the sizes")
                    items.append(np.bool_(s != 0))
                    continue
                lo, hi = an.bounds(x)
                if not an.fits(lo, hi, dtype):
                    raise Unprovable(f"casting a value in [{lo}, {hi}] to {dtype} is not exact at every size")
                items.append(x)
            else:
                y = _cast_scalar(x, dtype)
                items.append(Lin.of(int(y)) if dtype.kind in "iu" else y)  # type: ignore[call-overload]
        return Elems(dtype, v.shape, tuple(items))
    assert isinstance(v, Affine)
    if dtype.kind == "b":
        zero = Affine(v.dtype, v.shape, (0,) * len(v.shape), Lin.of(0))
        diff = sub(an, v, zero)
        assert isinstance(diff, Affine)  # (the difference of two grids)
        eq = an.compare(diff, "==", "the cast to bool")
        return _not(eq)
    return an.check_fits(Affine(dtype, v.shape, v.coef, v.base), "the cast value")


def _not(v: AbstractValue) -> AbstractValue:
    if isinstance(v, Band):
        return Band(v.dtype, v.shape, v.breaks, tuple(np.logical_not(x) for x in v.values))
    assert isinstance(v, Affine)
    return Affine(v.dtype, v.shape, v.coef, Lin.of(1 - v.base.const))


@handles("Cast")
def _cast(an: Analysis, n: OnnxNode, ins: list) -> list:
    return [cast(an, ins[0], dtype_of(int(attr(n, "to"))))]


@handles("CastLike")
def _cast_like(an: Analysis, n: OnnxNode, ins: list) -> list:
    target = ins[1]
    return [cast(an, ins[0], target.dtype)]
