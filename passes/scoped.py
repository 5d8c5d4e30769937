"""Masks in Loop and Scan bodies that are built from what changes per iteration: declined, with why.

`mask_subgraph` lowers masks computed from shapes and constants only. In a Loop or Scan body a
mask can also be an index computation (Range, comparisons, Where, ...) on the *value* of an
iteration number, a loop-carried count or a scan state: the same ops, but the pattern follows a
value that changes from one iteration to the next, which no generator sized from shapes can
reproduce. `varying_masks` finds those cones, so `inspect` lists them as declined instead of
passing over them in silence.
"""
from __future__ import annotations

from dmlgraph.ir.graph import Graph, Node, OnnxNode, Value
from dmlgraph.passes.data_free import INDEX_OPS, MASK_OPS, SHAPE_OPS
from dmlgraph.rewrite import Match

_INDEX_TYPES = {2, 3, 4, 5, 6, 7, 9, 12, 13}  # the integer ONNX element types, and bool


def _index_op(n: Node | None) -> bool:
    return isinstance(n, OnnxNode) and n.domain in ("", "ai.onnx") and n.op_type in INDEX_OPS


def _is_top(g: Graph, n: Node) -> bool:
    """An index node whose first output is a matrix and leaves the index computation."""
    v = n.outputs[0] if n.outputs else None
    if v is None or v.shape is None or len(v.shape) < 2:
        return False
    return g.is_graph_output(v) or any(not _index_op(c) for c in v.consumers)


def _cone(g: Graph, top: Node, inputs: set[str]) -> tuple[list[Node], list[Value]] | None:
    """The index computation behind `top` (back to shapes, constants and graph inputs, through the
    enclosing scopes' index nodes) and the inputs whose values it reads (an enclosing value that no
    index node of its scope computes is one); None when data other than those feeds it."""
    nodes, reads, seen, stack = [], [], set(), [top]
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen.add(n.id)
        if not _index_op(n):
            return None
        nodes.append(n)
        if n.op_type in SHAPE_OPS:
            continue  # (the shape of anything is fine)
        for v in n.inputs:
            if v is None:
                continue
            if v.name in inputs or (g.is_outer(v) and not _index_op(v.producer)):
                if v not in reads:
                    reads.append(v)
            elif v.producer is not None:
                stack.append(v.producer)
    nodes.sort(key=lambda n: n.added)
    return nodes, reads


def varying_masks(g: Graph, varying: dict[str, str]) -> list[Match]:
    """Declines for the masks of `g` (a Loop/Scan body, or a body inside one) whose cone reads the
    value of an input in `varying` (name -> what it is, e.g. "a loop-carried value") that holds
    indices (integers or bool, at most one axis)."""
    inputs = {v.name for v in g.inputs}
    found: list[Match] = []
    covered: set[int] = set()
    for n in list(g.nodes.values()):
        if n.id in covered or not _index_op(n) or n.op_type in SHAPE_OPS or not _is_top(g, n):
            continue
        cone = _cone(g, n, inputs)
        if cone is None:
            continue
        nodes, reads = cone
        culprits = [v for v in reads if v.name in varying and v.elem_type in _INDEX_TYPES
                    and (v.shape is None or len(v.shape) <= 1)]
        if not culprits or not any(x.op_type in MASK_OPS for x in nodes):
            continue
        covered.update(x.id for x in nodes)
        what = ", ".join(f"{varying[v.name]} {v.name!r}" for v in culprits)
        found.append(Match("mask_subgraph", nodes, reason=(
            f"it is computed from the value of {what}, which changes per iteration, not only from shapes "
            "and constants: no generator sized from shapes gives it")))
    return found
