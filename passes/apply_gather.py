"""The portable target's bit-exact selection, found again: optimizing a portable model once more
gives the same model.

The `onnx` target writes a float DIAGONAL_MATRIX1 as a GatherElements over [X, c] (Where would
change -0.0 and NaN payloads); when its index is made by a band generator this is
DIAGONAL_MATRIX1(X, Value c) again. The pattern: docs/internals.md, passes/apply_gather.py.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from dmlgraph.ir.graph import Dim, DmlNode, Graph, Node, OnnxNode, Value, produced_by
from dmlgraph.passes.apply import complement, off_region
from dmlgraph.passes.broadcast import keeps_matrix
from dmlgraph.passes.common import const_value, lowering_reason, replace_node, standin
from dmlgraph.rewrite import Context, Match, Replacement, Rule
from dmlgraph.runtime.onnx_runner import numpy_dtype


def _is_axis0(graph: Graph, v: Value | None) -> bool:
    arr = const_value(graph, v)
    return arr is not None and arr.size == 1 and int(np.asarray(arr).reshape(-1)[0]) == 0


def _unsqueezed0(graph: Graph, v: Value | None) -> Value | None:
    """x when v = Unsqueeze(x, [0])."""
    n = produced_by(v, "Unsqueeze")
    return n.input(0) if n is not None and _is_axis0(graph, n.input(1)) else None


def _index_band(graph: Graph, index: Value | None) -> tuple[DmlNode, tuple[Dim, ...] | None] | None:
    """(the band generator, the band's shape without the stacking axis) that the index is made of."""
    cast = produced_by(_unsqueezed0(graph, index), "Cast")
    if cast is not None and cast.attr("to") == TensorProto.INT64:
        expand = produced_by(cast.input(0), "Expand")
        band = expand.input(0) if expand is not None else None
        shape = band.shape if band is not None else None
    else:  # the whole shape-only chain already lowered: one int64 generator [1, ..., H, W]
        band = index
        shape = band.shape[1:] if band is not None and band.shape is not None else None
    d = band.producer if band is not None else None
    if not isinstance(d, DmlNode) or d.kind != "DiagonalMatrix1":
        return None
    return d, shape


def _match(ctx: Context, node: Node) -> Match | None:
    graph, options = ctx.graph, ctx.options
    if not isinstance(node, OnnxNode) or len(node.inputs) != 2 or not _is_axis0(graph, node.input(1)):
        return None
    gather = produced_by(node.input(0), "GatherElements")
    if gather is None or int(gather.attr("axis", 0)) != 0:
        return None
    concat = produced_by(gather.input(0), "Concat")
    if concat is None or len(concat.inputs) != 2 or int(concat.attr("axis", 0)) != 0:
        return None
    other, picked = (_unsqueezed0(graph, v) for v in concat.inputs)
    expand_value = produced_by(picked, "Expand")
    c = const_value(graph, expand_value.input(0)) if expand_value is not None else None
    found = _index_band(graph, gather.input(1))
    if other is None or c is None or c.size != 1 or found is None:
        return None
    band, band_shape = found
    outside = off_region(graph, band)
    if isinstance(outside, Value) or bool(np.asarray(band.value)) == bool(outside):
        return None  # the index must be a two-valued generator (0 and 1)
    out = node.outputs[0]
    expand_x = produced_by(other, "Expand")  # other = Expand(X, sizes): X, when it already has the output's matrix
    x_in = expand_x.input(0) if expand_x is not None else None
    x = x_in if x_in is not None and keeps_matrix(x_in.shape, band_shape) else other
    m = Match("mask_gather", [node])
    if out.elem_type is None or x.elem_type != out.elem_type or np.asarray(c).dtype != numpy_dtype(out.elem_type):
        m.reason = "the selected constant's type differs from the data's"
        return m
    if not keeps_matrix(x.shape, band_shape):
        m.reason = "cannot prove the data has the band's matrix"
        return m
    region = (band.begin, band.end) if bool(np.asarray(band.value)) else complement((band.begin, band.end))
    if region is None:
        return None
    value = np.asarray(c).reshape(())
    dml = DmlNode(node.name, x, None, band.inputs[2], standin(out), elem_type=out.elem_type,
                  value=value.dtype.type(value), begin=region[0], end=region[1])
    m.dml = dml
    m.reason = lowering_reason(dml, x.shape, options)
    return m


def _rewrite(ctx: Context, m: Match) -> Replacement:
    return replace_node(m.nodes[0], m.dml)


MASK_GATHER = Rule("mask_gather", ("Squeeze",), _match, _rewrite, exact="bit-exact",
                   description="the portable target's GatherElements selection of (X, c) by a band -> "
                   "DIAGONAL_MATRIX1(X, Value c)")
