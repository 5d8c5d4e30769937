"""Rows [-S:] of a mask, taken as [max(N - S, 0):]: exact where S >= 1. At S = 0 ONNX keeps all N
rows where the lowered mask has none, so the mask alone is no band at every size; its readers carry
the proof. Each must be an elementwise op broadcasting it against another operand whose axis there
is S itself: at S = 0 that axis is then empty in the original's output (or onnxruntime fails) as in
the lowered one's. Proof: docs/masks.md, "Rows [-S:] applied to data of S rows".
"""
from __future__ import annotations

from typing import Sequence

from dmlgraph.ir.graph import OnnxNode, Value
from dmlgraph.passes.apply import AxisDims, claimed_names
from dmlgraph.passes.sizes import claims
from dmlgraph.passes.symbolic import Dim, Lin
from dmlgraph.rewrite import Context

# ops whose output element is a function of the broadcast operands' elements at the same index
ELEMENTWISE = frozenset({"Where", "And", "Or", "Xor", "Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less",
                         "LessOrEqual", "Greater", "GreaterOrEqual"})


def tails_unproved(ctx: Context, target: Value, shape: tuple[Dim, ...], tails: Sequence[tuple[Lin, Dim, Lin]],
                   inputs: Sequence[Value]) -> str | None:
    """Why the readers of `target` (a mask with rows [-S:] per `tails`, of proved `shape`) do not
    prove S = 0 harmless; None when they do."""
    graph = ctx.graph
    if graph.is_graph_output(target) or target.name in graph.body_reads() or not target.uses:
        return f"{target.name!r} is read as it is (a graph output or a body's read), not applied to data of S rows"
    for s, length, _ in tails:
        if len(s.terms) != 1 or s.terms[0][1] != 1 or s.const:
            return f"the rows [-({s.render(str)}):] count back by an expression, not by one size"
        sym = s.terms[0][0]
        axes = [j - len(shape) for j, d in enumerate(shape) if d == length]
        if not axes:
            return f"the rows [-{sym}:] are no axis of the mask any more"
        for node, i in target.uses:
            if not (isinstance(node, OnnxNode) and node.domain in ("", "ai.onnx") and node.op_type in ELEMENTWISE
                    and len(node.outputs) == 1):
                return f"{node.op_type} {node.name!r} reads the mask [-{sym}:] as it is (no elementwise application)"
            if not any(_has_size(ctx, v, axes, sym, inputs) for j, v in enumerate(node.inputs) if j != i and v is not None
                       and v is not target):
                return (f"no operand of {node.op_type} {node.name!r} has {sym} rows where the mask has [-{sym}:] "
                        f"(at {sym} = 0 ONNX keeps the whole axis: only data of {sym} rows makes that empty)")
    return None


def _has_size(ctx: Context, v: Value, axes: list[int], sym: str, inputs: Sequence[Value]) -> bool:
    """v's dim at each of `axes` (from the end) is the size `sym` at run time: named so by inference
    and, where inputs share the name (a claim), traced to an input axis the lowered mask reads or
    checks (`SizeBuilder.guard`), never to another input that only shares the name."""
    shape = v.shape
    if shape is None or len(shape) < max(-a for a in axes) or any(shape[a] != sym for a in axes):
        return False
    if sym not in claimed_names(ctx.graph):
        return True
    per_axis = ctx.analysis(AxisDims).shapes()
    if not per_axis:
        return True  # (a body: its formal inputs' dims are sizes of their own)
    own = per_axis.get(v.name)
    read = {f"{sym}@{u.name}:{a}" for u, a in claims(ctx.graph, inputs, sym)}
    return own is not None and len(own) == len(shape) and all(own[a] in read for a in axes)
