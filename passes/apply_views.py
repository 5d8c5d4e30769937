"""Batch-axis views of a band: `Identity`, `Expand`, `Unsqueeze` and `Reshape` of a DIAGONAL_MATRIX1 output are
that node at the new shape; a Slice or Transpose of one is that node over the viewed input, its
region moved (passes/band_views.py).

DIAGONAL_MATRIX1 fills by the last two axes only, so changing the batch axes gives the same node
with other sizes (bit-exact); an Expand, Unsqueeze or Reshape that touches the matrix is declined
(docs/internals.md, passes/apply_views.py).
"""
from __future__ import annotations

from typing import Any, cast

import numpy as np

from dmlgraph.io.dim_keys import DimKeys
from dmlgraph.ir.graph import Dim, DmlNode, Graph, Node, OnnxNode, Value, copied
from dmlgraph.passes.apply import band_operands
from dmlgraph.passes.band_views import build_slice, build_transpose, match_slice, match_transpose, one_line
from dmlgraph.passes.broadcast import (
    Built,
    ShapeSource,
    build_broadcast,
    keeps_matrix,
    matrix_dims,
    same_dims,
    shape_source,
    static_broadcast,
    vector_dims,
)
from dmlgraph.passes.common import const_value, int_list, lowering_reason, replace_node, standin
from dmlgraph.rewrite import Context, Match, Options, Replacement, Rule


def _axes(graph: Graph, node: OnnxNode) -> list[int] | None:
    return int_list(graph, node, "axes")


def _identity_view(m: Match, node: OnnxNode, d: DmlNode, options: Options) -> Match | None:
    """A tool's Identity on the band: the band itself, under the Identity's name; None where other
    nodes read the band too (a copy would compute it twice: the Identity's readers see through it)."""
    if any(u is not node for u in d.outputs[0].consumers):
        return None
    d_value, out = cast(Value, node.inputs[0]), node.outputs[0]
    m.captures["plan"] = {"x": d.inputs[0], "same": True, "static": d.static_shape}
    m.dml = preview = DmlNode(node.name, d.inputs[0], None, d.inputs[2], standin(out), elem_type=d.elem_type,
                              value=d.value, begin=d.begin, end=d.end, exact=d.exact)
    m.reason = lowering_reason(preview, out.shape or d_value.shape, options)
    return m


def _match_view(ctx: Context, node: Node) -> Match | None:
    graph, options = ctx.graph, ctx.options
    if not isinstance(node, OnnxNode) or node.domain not in ("", "ai.onnx") or not band_operands(graph, node, (0,)):
        return None
    d_value, out = cast(Value, node.inputs[0]), node.outputs[0]
    d = cast(DmlNode, cast(Value, copied(d_value)).producer)  # (band_operands checked)
    m = Match("mask_view", [node])
    if node.op_type == "Identity":
        return _identity_view(m, node, d, options)
    band = matrix_dims(graph, d_value)
    target_dims = vector_dims(graph, node.inputs[1]) if node.op_type in ("Expand", "Reshape") else []
    if node.op_type == "Transpose":
        perm, rank = node.attr("perm", None), len(d_value.shape or ())
        if perm is not None and list(perm) == list(range(rank)):
            return None  # (the identity: nothing to lower or say)
    if node.op_type == "Slice" and d.inputs[0] is None and d.inputs[2] is None:
        axis = one_line(graph, node, len(d_value.shape or ()))
        if axis is not None:  # (exact itself, but read broadcast it repeats one line: docs/masks.md)
            m.reason = (f"Slice {node.name!r} keeps at most one {('row', 'column')[axis]} of a band of shapes only "
                        "(min(N, 1)), which a reader broadcasts: a line repeated is no band")
            return m
    if node.op_type in ("Slice", "Transpose"):
        why, view = (match_slice if node.op_type == "Slice" else match_transpose)(graph, node, d, d_value)
        if why is not None:
            m.reason = why
            return m
        m.captures["plan"] = view
        m.dml = preview = DmlNode(node.name, d.inputs[0], None, d.inputs[2], standin(out), elem_type=d.elem_type,
                                  value=d.value, begin=d.begin, end=d.end, exact=d.exact)
        m.reason = lowering_reason(preview, out.shape, options)
        return m
    if node.op_type == "Reshape" and d.claimed:
        m.reason = f"Reshape {node.name!r} of a band applied by a claimed dim name (its mask's sizes keep their rank)"
        return m
    if node.op_type == "Reshape":
        return _match_reshape(graph, node, d, band, target_dims, m, options)
    by_keys = _expand_by_keys(graph, node) if node.op_type == "Expand" else None
    same, to_target, kept = by_keys == "same", by_keys == "target", by_keys is not None
    if out.shape is None or d_value.shape is None or len(out.shape) < 2 or \
            not (kept or same_dims(out.shape[-2:], d_value.shape[-2:]) or keeps_matrix(target_dims, band)):
        m.reason = (f"cannot prove {node.op_type} {node.name!r} keeps the band's matrix (output's last two dims "
                    f"{list(out.shape or ())[-2:]}, band's {list(band or ())})")
        return m
    source = shape_source(graph, d_value)
    if node.op_type == "Expand":
        t = cast(Value, node.inputs[1])  # (Expand's shape input is required)
        t_arr = const_value(graph, t)
        if t_arr is not None:
            target = ShapeSource(len(t_arr), static=tuple(int(s) for s in t_arr))
        elif t.shape is not None and len(t.shape) == 1 and isinstance(t.shape[0], int):
            target = ShapeSource(t.shape[0], vector=t)
        else:
            m.reason = f"the target shape of Expand {node.name!r} has an unknown length"
            return m
        plan: dict[str, Any] = {"x": d.inputs[0], "unsqueeze": None, "sources": [source, target], "same": same,
                                "to_target": to_target}
    else:
        axes = _axes(graph, node)
        rank = len(out.shape)
        if axes is None:
            m.reason = f"the axes of Unsqueeze {node.name!r} are not constant"
            return m
        axes = sorted(a % rank for a in axes)
        if any(a >= rank - 2 for a in axes):
            m.reason = f"Unsqueeze {node.name!r} adds an axis among the last two: the matrix changes"
            return m
        x = d.inputs[0]
        if x is not None and x.shape is None:
            m.reason = f"the input of the band feeding Unsqueeze {node.name!r} has an unknown shape"
            return m
        plan = {"x": x, "unsqueeze": axes, "sources": [source]}
    if source is None:
        m.reason = f"the band feeding {node.op_type} {node.name!r} has an unknown rank"
        return m
    plan["static"] = out.static_shape
    m.captures["plan"] = plan
    m.dml = preview = DmlNode(node.name, d.inputs[0], None, d.inputs[2], standin(out), elem_type=d.elem_type,
                                          value=d.value, begin=d.begin, end=d.end, exact=d.exact)
    m.reason = lowering_reason(preview, out.shape, options)
    return m


def _expand_by_keys(graph: Graph, node: OnnxNode) -> str | None:
    """What the Expand's output is, by `DimKeys` (sizes traced to the reads that make them, never
    dim names): "same", the band as it is (the target is, axis by axis, the band's own size or a
    1: Optimum's `[batch, 1, q, k]` from a computed shape); "target", the band at exactly the
    target's sizes (the target ends in the band's own last two sizes and each batch size of the
    band is a 1 or the target's: `mask[None, None].expand(batch, 1, q, k)`, whose output inference
    names `unk__`); None when neither is proved."""
    keys = DimKeys(graph)
    band = keys.dims(node.inputs[0])
    target = keys.entries(node.inputs[1])
    if band is None or target is None:
        return None
    if len(target) <= len(band) and \
            all(t is not None and (t == ("c", 1) or t == b) for t, b in zip(target, band[len(band) - len(target):])):
        return "same"
    if len(band) < 2 or len(target) < len(band) or None in target:
        return None
    pairs = list(zip(target[::-1], band[::-1]))
    return "target" if all(t == b for t, b in pairs[:2]) and all(b in (t, ("c", 1)) for t, b in pairs[2:]) else None


def _match_reshape(graph: Graph, node: OnnxNode, d: DmlNode, band: tuple | None, target: list | None, m: Match,
                   options: Options) -> Match:
    """Reshape regrouping the batch axes of a band: the same node at the target sizes, its input
    (when it has data) reshaped alike. The target must keep the band's matrix as its last two entries and hold no 0 or
    -1 (whose meaning needs the element count); a band with data would need its input reshaped
    too, which a broadcast input cannot always be."""
    x = d.inputs[0]
    d_value = cast(Value, node.inputs[0])
    d_shape = d_value.shape
    reshape_x = x is not None and not (x.shape is not None and all(s == 1 for s in x.shape))
    if reshape_x and x is not None and (x.shape is None or d_shape is None or len(x.shape) != len(d_shape)
                      or not same_dims(x.shape[:-2], d_shape[:-2])):
        m.reason = (f"Reshape {node.name!r} of a band whose input {x.name!r} {list(x.shape or ['?'])} is broadcast "
                    "along batch axes: the input cannot take the same reshape")
        return m
    if target is None or len(target) < 2 or band is None or None in band or \
            any(t is None or (isinstance(t, int) and t <= 0) for t in target) or \
            (node.attr("allowzero", 0) == 0 and any(not isinstance(t, int) for t in target)
             and len(target) != len(d_value.shape or ())) or \
            tuple(target[-2:]) != tuple(band):
        m.reason = (f"cannot prove Reshape {node.name!r} only regroups the band's batch axes (target "
                    f"{target}, band matrix {list(band or ())})")
        return m
    static = tuple(target) if all(isinstance(t, int) for t in target) else None
    m.captures["plan"] = {"reshape": node.inputs[1], "static": static, "reshape_x": reshape_x,
                          "lead": len(target) - 2}
    m.dml = preview = DmlNode(node.name, x, None, d.inputs[2], standin(node.outputs[0]), elem_type=d.elem_type,
                                          value=d.value, begin=d.begin, end=d.end, exact=d.exact)
    m.reason = lowering_reason(preview, node.outputs[0].shape or (None,) * len(target), options)
    return m


def _rewrite_view(ctx: Context, m: Match) -> Replacement:
    graph = ctx.graph
    node = cast(OnnxNode, m.nodes[0])
    d_value = cast(Value, node.inputs[0])
    d = cast(DmlNode, cast(Value, copied(d_value)).producer)
    plan, out = m.captures["plan"], node.outputs[0]
    built, x, shape = Built(), d.inputs[0], None
    if "view" in plan:
        return _rewrite_band_view(ctx, node, d, plan)
    static = plan["static"]
    if "reshape" in plan:
        if plan["reshape_x"]:
            x = _reshaped_input(graph, cast(Value, x), plan["reshape"], plan["lead"], out.name, built)
        shape = None if static else plan["reshape"]
    elif plan.get("same"):  # (the band's own sizes: the target's plumbing can die)
        shape, static = d.inputs[1], d.static_shape
    elif plan.get("to_target"):  # (the Expand's own sizes: no broadcast to compute)
        shape = None if static else node.inputs[1]
    else:
        sources = plan["sources"]
        if plan["unsqueeze"] is not None:
            x = _unsqueezed_input(x, len(cast("tuple[Dim, ...]", d_value.shape)), plan["unsqueeze"], out.name, built)
            sources = [_unsqueezed_source(sources[0], plan["unsqueeze"], out.name, built)]
        if static is None:
            static = static_broadcast(sources)
        if static is None and not (x is not None and same_dims(x.shape, out.shape)):
            shape = build_broadcast(sources, out.name, built, ctx)
    dml = DmlNode(node.name, x, shape, d.inputs[2], standin(out, d.elem_type), elem_type=d.elem_type,
                  value=d.value, begin=d.begin, end=d.end, static_shape=static, exact=d.exact,
                  matrix=d.matrix if d.claimed else None, claimed=d.claimed)  # (a view adds batch axes only)
    r = replace_node(node, dml, *built.nodes)
    r.initializers = built.initializers
    return r


def _rewrite_band_view(ctx: Context, node: OnnxNode, d: DmlNode, plan: dict[str, Any]) -> Replacement:
    """Slice / Transpose of the band: the node over the viewed input, its region moved (band_views)."""
    built, out = Built(), node.outputs[0]
    x, sizes, k, begin, end, matrix = (build_slice if plan["view"] == "slice" else build_transpose)(
        ctx.graph, node, d, plan, out.name, built)
    static = out.static_shape if sizes is None else None
    dml = DmlNode(node.name, x, sizes, k, standin(out, d.elem_type), elem_type=d.elem_type, value=d.value,
                  begin=begin, end=end, static_shape=static, exact=d.exact, matrix=matrix, claimed=matrix is not None)
    r = replace_node(node, dml, *built.nodes)
    r.initializers = built.initializers
    return r


def _reshaped_input(graph: Graph, x: Value, target: Value, lead: int, hint: str, built: Built) -> Value:
    """x (with the band's batch axes) regrouped like the band: the target's batch sizes, then x's own
    last two dims (a broadcast 1 stays a 1)."""
    x_shape = cast("tuple[Dim, ...]", x.shape)  # (the match declined an input of unknown shape)
    batch = built.node("Slice", [target, built.constant(f"{hint}__c", np.array([0])),
                                 built.constant(f"{hint}__c", np.array([lead]))], f"{hint}__batch", shape=(lead,))
    xs = built.node("Shape", [x], f"{hint}__xshape", shape=(len(x_shape),))
    mat = built.node("Slice", [xs, built.constant(f"{hint}__c", np.array([-2])),
                               built.constant(f"{hint}__c", np.array([len(x_shape)]))], f"{hint}__xmatrix", shape=(2,))
    sizes = built.node("Concat", [batch, mat], f"{hint}__xsizes", shape=(lead + 2,), axis=0)
    dims = vector_dims(graph, target)
    shape = tuple((dims[:lead] if dims is not None else [None] * lead) + list(x_shape[-2:]))
    return built.node("Reshape", [x, sizes], f"{hint}__input", x.elem_type, shape)


def _unsqueezed_input(x: Value | None, band_rank: int, axes: list[int], hint: str, built: Built) -> Value | None:
    """x aligned to the band's rank, then unsqueezed like the band (a one-element x broadcasts as is)."""
    if x is None:
        return x
    shape = x.shape
    assert shape is not None, "the match declines an input of unknown shape"
    if all(d == 1 for d in shape) and len(shape) <= band_rank:
        return x
    lead = band_rank - len(shape)
    if lead:  # right-align x to the band first
        pad = built.constant(f"{hint}__pad_axes", np.arange(lead, dtype=np.int64))
        shape = (1,) * lead + tuple(shape)
        x = built.node("Unsqueeze", [x, pad], f"{hint}__aligned", x.elem_type, shape)
    dims = list(shape)
    for a in axes:
        dims.insert(a, 1)
    ax = built.constant(f"{hint}__axes", np.array(axes, np.int64))
    return built.node("Unsqueeze", [x, ax], f"{hint}__input", x.elem_type, tuple(dims))


def _unsqueezed_source(s: ShapeSource, axes: list[int], hint: str, built: Built) -> ShapeSource:
    """The band's sizes with 1s inserted at `axes` (of the output)."""
    rank = s.rank + len(axes)
    if s.static is not None:
        dims = list(s.static)
        for a in axes:
            dims.insert(a, 1)
        return ShapeSource(rank, static=tuple(dims))
    vec = s.vector if s.vector is not None else built.node("Shape", [s.of], f"{hint}__band_shape", shape=(s.rank,))
    # Output axis a is a 1; the others take the band's dims in order.
    pieces, taken, start = [], 0, 0
    for a in axes + [rank]:
        count = a - start  # band dims before this inserted axis
        if count:
            lo = built.constant(f"{hint}__lo", np.array([taken], np.int64))
            hi = built.constant(f"{hint}__hi", np.array([taken + count], np.int64))
            pieces.append(built.node("Slice", [vec, lo, hi], f"{hint}__dims", shape=(count,)))
            taken += count
        if a < rank:
            pieces.append(built.constant(f"{hint}__one", np.array([1], np.int64)))
        start = a + 1
    return ShapeSource(rank, vector=built.node("Concat", pieces, f"{hint}__sizes", shape=(rank,), axis=0))


MASK_VIEW = Rule("mask_view", ("Expand", "Unsqueeze", "Reshape", "Transpose", "Slice", "Identity"), _match_view,
                 _rewrite_view, exact="bit-exact",
                 description="Identity / Expand / Unsqueeze / Reshape of a DIAGONAL_MATRIX1 on its batch axes -> that "
                                      "node at the new shape; Slice (steps 1) / Transpose of one -> that node over the "
                                      "viewed input, its region moved")
