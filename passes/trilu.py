"""Trilu -> DIAGONAL_MATRIX1(input x, Value 0): bit-exact.

upper=1 keeps x - y >= k: zero where topX < k   -> Begin unbounded (INT32_MIN), End k.
upper=0 keeps x - y <= k: zero where topX > k   -> Begin k + 1, End unbounded (INT32_MAX).
A constant k is folded in (any int64: bounds are clamped to the matrix only when bound, never
wrapped); a run-time k stays an input that shifts the bounded end when the node is bound.
"""
from __future__ import annotations

from dmlgraph.ir.graph import DmlNode, Node, OnnxNode
from dmlgraph.ir.ops import clamp_bound
from dmlgraph.passes.common import const_value, lowering_reason, replace_node, standin, zero_of
from dmlgraph.rewrite import Context, Match, Replacement, Rule


def _match(ctx: Context, node: Node) -> Match | None:
    graph, options = ctx.graph, ctx.options
    if not isinstance(node, OnnxNode) or node.domain not in ("", "ai.onnx"):
        return None
    x, k_in = node.input(0), node.input(1)
    m = Match("trilu", [node])
    if x is None:
        m.reason = "it has no input"
        return m
    upper = int(node.attr("upper", 1))
    k, k_value = 0, None
    if k_in is not None:
        kc = const_value(graph, k_in)
        if kc is None:
            k_value = k_in
        elif kc.size != 1 or kc.dtype.kind not in "iu":  # (np.issubdtype(dtype, np.integer), without its cost)
            m.reason = f"k is not an integer scalar (shape {list(kc.shape)}, {kc.dtype})"
            return m
        else:
            k = int(kc.item())
    if x.elem_type is None:
        m.reason = "the input type is unknown"
        return m
    begin, end = (None, clamp_bound(k)) if upper else (clamp_bound(k + 1), None)
    dml = DmlNode(node.name, x, None, k_value, standin(node.outputs[0], x.elem_type), elem_type=x.elem_type,
                  value=zero_of(x.elem_type), begin=begin, end=end)
    m.reason = lowering_reason(dml, x.shape, options)
    m.dml = dml
    return m


def _rewrite(ctx: Context, m: Match) -> Replacement:
    return replace_node(m.nodes[0], m.dml)


RULE = Rule("trilu", ("Trilu",), _match, _rewrite, exact="bit-exact",
            description="Trilu(x, k, upper) -> DIAGONAL_MATRIX1(x, Value 0)")
