"""`data_mask`: a comparison of an index grid with data is a mask that moves with tensor values.

A static cache's `arange(T) <= cache_position[:, None]`, Llama-4's chunks, lengths and packed
sequences: their diagonal depends on input values, which Begin/End (sizes) cannot follow. The rule
only declines them, naming the data they read, so the census lists them as declined, not missed;
it never rewrites anything. The forms: docs/internals.md, "passes/data_masks.py".
"""
from __future__ import annotations

from dmlgraph.ir.band import index_vector
from dmlgraph.ir.graph import Graph, Node, OnnxNode, Value
from dmlgraph.passes.common import const_value
from dmlgraph.passes.data_free import SHAPE_OPS, data_free_of
from dmlgraph.rewrite import Context, Match, Replacement, Rule

COMPARISONS = ("Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal")
GRID_SOURCES = {"Range", "CumSum", "EyeLike", "Trilu"}
ELEMENTWISE = {*COMPARISONS, "Add", "Sub", "Mul", "Div", "Mod", "Min", "Max"}  # every operand is an element
MAX_WALK = 256  # nodes visited to find where a value comes from


def _walk(v: Value) -> tuple[list[Node], list[Value]]:
    """The nodes above `v` (up to MAX_WALK, not through Shape/Size) and the graph inputs they read."""
    nodes: list[Node] = []
    inputs: list[Value] = []
    seen: set[int] = set()
    stack = [v]
    while stack and len(nodes) < MAX_WALK:
        x = stack.pop()
        p = x.producer
        if p is None:
            if x not in inputs:
                inputs.append(x)
            continue
        if p.id in seen:
            continue
        seen.add(p.id)
        nodes.append(p)
        if p.op_type not in SHAPE_OPS:
            stack.extend(i for i in p.inputs if i is not None)
    return nodes, inputs


def _has_grid(graph: Graph, v: Value) -> bool:
    """`v` is built over an index grid: a Range, CumSum, ... above it, or a stored arange (a Range
    of fixed sizes, folded) it is, or that arithmetic above it reads as elements."""
    def stored(x: Value | None) -> bool:
        return x is not None and index_vector(const_value(graph, x))

    nodes = _walk(v)[0]
    return stored(v) or any(n.op_type in GRID_SOURCES or (n.op_type in ELEMENTWISE and any(map(stored, n.inputs)))
                            for n in nodes)


def _match_data_mask(ctx: Context, node: Node) -> Match | None:
    graph = ctx.graph
    if not isinstance(node, OnnxNode) or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2 \
            or any(v is None for v in node.inputs):
        return None
    out = node.outputs[0]
    if out.shape is not None and len(out.shape) < 2:
        return None
    df = data_free_of(ctx)
    grid = data = None
    for v in node.inputs:
        assert v is not None
        if grid is None and _has_grid(graph, v):
            grid = v
        if data is None and not df.is_free(v):
            data = v
    if grid is None or data is None:
        return None
    read = [v.name for v in _walk(data)[1] if not graph.stored(v) or v.name in graph.overridable_inputs]
    source = f" (read from {', '.join(repr(r) for r in read[:3])})" if read else ""
    return Match("data_mask", [node], reason=(
        f"a data-dependent mask: it compares the index grid {grid.name!r} with {data.name!r}{source}{_form(node)}, "
        "so its diagonal moves with tensor values, and DIAGONAL_MATRIX1's Begin/End are sizes" if grid is not data else
        f"a data-dependent mask: it compares {grid.name!r} with {_other(node, grid).name!r}, index grids "
        f"built from tensor values{source}{_form(node)}, and DIAGONAL_MATRIX1's Begin/End are sizes"))


def _form(node: Node) -> str:
    """What a comparison of two data-built grids is, by the ops above it: an integer division is
    chunked attention (Llama-4's `(q - pad) // C == (k - pad) // C`, a block diagonal, which no
    shift makes a band), a CumSum alone sequence ids (packed sequences) or left padding."""
    ops = {n.op_type for v in node.inputs if v is not None for n in _walk(v)[0]}
    if ops & {"Div", "Mod"}:
        return " (chunked attention: an integer division of the positions, a block diagonal, no band)"
    if "CumSum" in ops:
        return " (packed sequences or left padding: positions from a CumSum)"
    return ""


def _other(node: Node, v: Value) -> Value:
    """The comparison's operand that is not `v` (`v` itself when both are)."""
    return next((x for x in node.inputs if x is not None and x is not v), v)


def _never(ctx: Context, m: Match) -> Replacement:
    raise AssertionError("data_mask only declines")  # (every match it returns carries a reason)


DATA_MASK = Rule("data_mask", COMPARISONS, _match_data_mask, _never, exact="bit-exact",
                 description="comparison of an index grid with data: a data-dependent mask, declined with the "
                             "data it reads (never rewritten)")
