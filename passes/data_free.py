"""Which values depend on the graph inputs only through their shapes: the cones a mask can be built in."""
from __future__ import annotations

import math

from dmlgraph.ir.graph import DmlNode, Graph, Node, OnnxNode, Value
from dmlgraph.passes.common import const_value
from dmlgraph.passes.generators import band_of
from dmlgraph.rewrite import Context

SHAPE_OPS = {"Shape", "Size"}
INDEX_OPS = SHAPE_OPS | {
    "Constant", "ConstantOfShape", "Identity", "Range", "Gather", "Slice", "Squeeze", "Unsqueeze",
    "Reshape", "Concat", "Expand", "Cast", "CastLike", "Add", "Sub", "Neg", "Abs", "Min", "Max", "Mul",
    "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "And", "Or", "Not", "Xor", "Where",
    "Trilu", "EyeLike", "Transpose", "CumSum", "Tile", "Sign", "Clip", "Flatten", "Div", "Split",
    "DiagonalMatrix1", "GatherND",
}
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                    "Bernoulli"}
MASK_OPS = {"Range", "Trilu", "EyeLike", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "Where",
            "ConstantOfShape", "CumSum", "And", "Or", "Not", "Xor"}
SMALL_CONSTANT = 4096  # elements: a constant vector of sizes/indices, not data
OUTER_LIMIT = 256  # enclosing nodes one body's analysis follows (a mask's cone, not a model)


def _eligible(n: Node) -> bool:
    """A node whose outputs can be data-free: a deterministic standard ONNX op without subgraphs, or a
    mask lowered already (a band inside a bigger shape-only cone: the cone stays analysable)."""
    if isinstance(n, DmlNode):
        return n.kind == "DiagonalMatrix1"
    return isinstance(n, OnnxNode) and n.domain in ("", "ai.onnx") and n.op_type not in NONDETERMINISTIC \
        and not n.has_subgraph


class DataFree:
    """Which values depend on graph inputs only through their shapes.

    A value is free when it is an initializer, or the output of an eligible node that is a Shape/Size
    or whose inputs are all free. `index_only` marks free values computed by INDEX_OPS from small
    constants, shapes, and stored constants that are themselves bands (slicing a band keeps it a band
    function of the indices).

    Built by one walk over the nodes, then kept exact by `update`, which replays the graph's
    change log: the outputs of every node added, removed or rewired since are recomputed from their
    current producer, and their consumers are revisited while statuses change. On a DAG that reaches
    the one consistent assignment, the one a fresh walk computes (the tests compare the two), at a
    cost proportional to the change instead of the graph.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.status: dict[str, bool] = {}  # a free node output -> whether it is index_only
        self._constants: dict[str, bool] = {}  # an initializer -> whether it is index_only
        # One walk in insertion order (for an imported graph, its file order: a dependency order);
        # a node read before its producer was visited is settled afterwards, as `update` does.
        visited: set[int] = set()
        late: list[Value] = []
        status = self.status
        for n in graph.nodes.values():
            visited.add(n.id)
            new = self._node_status(n)
            if new is not None:  # (all of a node's outputs share its status)
                for v in n.outputs:
                    status[v.name] = new
            for x in n.inputs:
                if x is not None and x.producer is not None and x.producer.id not in visited:
                    late.extend(n.outputs)
                    break
        self.seen = len(graph.changes)
        self._settle(late)
        if graph.parent is not None:  # (a body: what it reads of its scopes, as they compute it)
            self._enclosing(graph)

    def _enclosing(self, graph: Graph) -> None:
        """A body: give the enclosing values it reads their status in their own scope, following
        their producers there (at most OUTER_LIMIT nodes; past that, not free), then settle the
        body's nodes that read them."""
        found: dict[str, bool] = {}
        budget = OUTER_LIMIT

        def visit(v: Value) -> bool | None:  # (as `_node_status`: None when not free, else index_only)
            nonlocal budget
            if graph.stored(v):
                return self._index_constant(v)
            if v.name in found:
                return found[v.name]
            p = v.producer
            if p is None or budget <= 0:
                return None
            budget -= 1
            if p.op_type in SHAPE_OPS:
                new: bool | None = True if _eligible(p) else None
            else:
                parts = [visit(x) for x in p.inputs if x is not None]
                new = None if None in parts or not _eligible(p) else p.op_type in INDEX_OPS and all(parts)
            if new is not None:
                found[v.name] = new
            return new
        for v in graph.free_values().values():
            visit(v)
        if found:
            self.status.update(found)
            self._settle([o for n in graph.nodes.values() for o in n.outputs])

    def is_free(self, v: Value) -> bool:
        g = self.graph
        return v.name in self.status or (g.stored(v) and v.name not in g.overridable_inputs)

    def index_only(self, v: Value) -> bool:
        if v.name in self.status:
            return self.status[v.name]
        return self.graph.stored(v) and self._index_constant(v)

    def _index_constant(self, v: Value) -> bool:
        if v.name not in self._constants:  # checked once per initializer
            static = v.static_shape
            if static is not None and math.prod(static) <= SMALL_CONSTANT and v.name not in self.graph.overridable_inputs:
                self._constants[v.name] = True  # small: no need to read it
            else:
                arr = const_value(self.graph, v)
                self._constants[v.name] = arr is not None and (arr.size <= SMALL_CONSTANT or band_of(arr) is not None)
        return self._constants[v.name]

    def _node_status(self, p: Node) -> bool | None:
        """The status of the outputs of `p`, a node of the graph, from its inputs' statuses: None
        when not free, else whether index_only."""
        if p.op_type in SHAPE_OPS:
            return True if _eligible(p) else None
        g, status = self.graph, self.status
        for x in p.inputs:  # (the hottest loop of the analysis: is_free inlined, cheapest test first)
            if x is not None and x.name not in status and ((x.name not in g.initializers and (
                    g.parent is None or not g.stored(x))) or x.name in g.overridable_inputs):
                return None
        if not _eligible(p):
            return None
        return p.op_type in INDEX_OPS and all(x is None or self.index_only(x) for x in p.inputs)

    def _recompute(self, v: Value) -> bool:
        """Set `v`'s status from its producer and its inputs' statuses; True if it changed."""
        p, status = v.producer, self.status
        new = self._node_status(p) if p is not None and p.id in self.graph.nodes else None
        old = status.get(v.name)
        if new == old:
            return False
        if new is None:
            del status[v.name]
        else:
            status[v.name] = new
        return True

    def frontier(self) -> list[Node]:
        """Nodes whose first output is free and meets data (a consumer that is not a free ONNX
        node, a graph output, or a read by an If/Loop/Scan body), in graph order: the only nodes
        `_match_subgraph` looks further at."""
        g, status = self.graph, self.status
        found = []
        read_by_bodies = g.body_reads()
        outputs = {id(o) for o in g.outputs}
        for name in status:
            v = g.values.get(name)
            p = v.producer if v is not None else None
            if p is None or p.id not in g.nodes or not p.outputs or subgraph_target(g, p) is not v:
                continue
            if id(v) in outputs or name in read_by_bodies or \
                    not all(c.outputs and self.is_free(c.outputs[0]) and isinstance(c, OnnxNode) for c, _ in v.uses):
                found.append(p)
        found.sort(key=lambda n: n.added)
        return found

    def update(self) -> None:
        """Catch up with the graph's changes since the last call."""
        changes = self.graph.changes
        if len(changes) == self.seen:
            return
        work = [v for n in changes[self.seen:] for v in n.outputs]
        self.seen = len(changes)
        self._settle(work)

    def _settle(self, work: list[Value]) -> None:
        """Recompute `work`, and the consumers of every value whose status changes, to a fixed point."""
        while work:
            v = work.pop()
            if self._recompute(v):
                work.extend(o for c in v.consumers for o in c.outputs)


def subgraph_target(g: Graph, p: Node) -> Value:
    """The output of `p` a mask subgraph ends in: its first, or the one output read when only one is
    (a Split of a stack of masks whose later piece is the one used)."""
    if len(p.outputs) > 1:
        used = [o for o in p.outputs if o.uses or g.is_graph_output(o)]
        if len(used) == 1:
            return used[0]
    return p.outputs[0]


def data_free_of(ctx: Context) -> DataFree:
    """The run's DataFree, built once and updated from the graph's change log on each call."""
    df = ctx.analysis(DataFree)
    df.update()
    return df


def ancestors(value: Value) -> tuple[list[Node], list[Value]]:
    """The nodes computing `value` back to Shape/Size nodes, and the values whose shapes those read."""
    nodes, inputs, seen, stack = [], [], set(), [value.producer]
    while stack:
        n = stack.pop()
        if n is None or n.id in seen:
            continue
        seen.add(n.id)
        nodes.append(n)
        for v in n.inputs:
            if v is None:
                continue
            if n.op_type in SHAPE_OPS:
                if v not in inputs:
                    inputs.append(v)
            elif v.producer is not None:
                stack.append(v.producer)
    nodes.sort(key=lambda n: n.id)
    return nodes, inputs
