"""A band pattern (found in an array) as the DIAGONAL_MATRIX1 node that generates it."""
from __future__ import annotations

import numpy as np

from dmlgraph.io.onnx_io import dml_node_proto
from dmlgraph.ir.band import BandPattern, analyze_band, diagonal_use_mask
from dmlgraph.ir.dtypes import INT32_MAX, INT32_MIN
from dmlgraph.ir.graph import DmlNode, Graph, Value
from dmlgraph.ir.ops import bind_range
from dmlgraph.passes.sizes import Made, constant
from dmlgraph.rewrite import Context
from dmlgraph.runtime.onnx_runner import numpy_dtype


def pattern_bounds(p: BandPattern) -> tuple[int | None, int | None]:
    return (None if p.begin == INT32_MIN else p.begin), (None if p.end == INT32_MAX else p.end)


def is_plus_zero(v: object) -> bool:
    """+0 only: the generator writes +0.0, so a -0.0 'else' value needs an input."""
    a = np.asarray(v)
    return bool(a == 0) and not (a.dtype.kind == "f" and np.signbit(a))


def generator(ctx: Context, p: BandPattern, elem_type: int, name: str, output: Value,
              shape: Value | None, static_shape: tuple[int, ...] | None, made: Made) -> DmlNode:
    """The DmlNode producing pattern `p` into `output` (detached); a nonzero 'else' value becomes a
    scalar input (a constant the graph holds, or one added to `made`)."""
    x = None
    if not is_plus_zero(p.other):
        x = constant(ctx, f"{output.name}__else", np.asarray(p.other, dtype=numpy_dtype(elem_type)).reshape(()),
                     made)
    begin, end = pattern_bounds(p)
    return DmlNode(name, x, shape, None, output, elem_type=elem_type, value=p.value, begin=begin, end=end,
                   static_shape=static_shape)


def band_of(arr: np.ndarray) -> BandPattern | None:
    """A band with both parts present: a constant tensor is not diagonal-structured."""
    if arr.ndim < 2 or arr.size == 0 or arr.dtype.kind not in "biuf":
        return None
    p = analyze_band(arr)
    if p is None:
        return None
    h, w = arr.shape[-2:]
    b, e = bind_range(*pattern_bounds(p), 0, h, w)
    use = diagonal_use_mask(h, w, b, e)
    return p if use.any() and not use.all() else None


def node_bytes(g: Graph, node: DmlNode) -> int:
    """`node`'s size as written: its names' included (so `g` notes that a decision read them)."""
    g.sized_names = True
    return len(dml_node_proto(node).SerializeToString())
