"""What a body reads of its enclosing graphs: constants it borrows (initializers, Constant tensors,
static DML generators) and the cones of index, shape and mask nodes copied in front of it.

A body's proof then sees `Shape(x)` or a Range grid where it would otherwise see an input of unknown
content; write-back drops the copies again (the enclosing graph still computes them).
"""
from __future__ import annotations

import math
from typing import cast

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from dmlgraph.io.onnx_io import (
    dml_node_proto,
    onnx_node_proto,
)
from dmlgraph.ir.graph import DmlNode, Graph, Node, OnnxNode, Value
from dmlgraph.rewrite.call_leaves import STANDARD
from dmlgraph.rewrite.nested.body_types import FRESH_PREFIX
from dmlgraph.rewrite.nested.scopes import graph_names


def enclosing_dims(shape: tuple | None) -> tuple | None:
    """An enclosing value's shape for a body's model: its dim names kept, but not the `unk__N` of the
    enclosing graph's inference (the body's own inference numbers its own)."""
    if shape is None:
        return None
    return tuple(None if isinstance(d, str) and d.startswith("unk__") and FRESH_PREFIX not in d else d for d in shape)


# The enclosing nodes a body's proof may see: index and shape arithmetic, comparisons, masks (as
# `passes.data_free.INDEX_OPS`), and the band generators the enclosing graph's lowering made.
CONE_OPS = {"Shape", "Size", "Constant", "ConstantOfShape", "Identity", "Range", "Gather", "Slice", "Squeeze",
            "Unsqueeze", "Reshape", "Concat", "Expand", "Cast", "CastLike", "Add", "Sub", "Neg", "Abs", "Min",
            "Max", "Mul", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "And", "Or", "Not", "Xor",
            "Where", "Trilu", "EyeLike", "Transpose", "CumSum", "Tile", "Sign", "Clip", "Flatten", "Div", "Split",
            "GatherND"}


CONE_LIMIT = 96  # nodes copied into one body: a mask's cone, not a model


def outer_cones(parent: Graph, proto: onnx.GraphProto, outer: list[str],
                 varying: dict[str, str]) -> tuple[list[onnx.NodeProto], list[str]]:
    """The enclosing nodes that compute what a body reads (its sizes, index grids, masks), as a
    prelude of the body, and the enclosing values the body with that prelude reads. A body's proof
    and census then see where an outer value comes from (`Shape(x)`, a Range grid, a band) instead
    of an input of unknown content; `write_back` drops the copies again (the enclosing graph still
    computes them). A copy follows the edges back through CONE_OPS and stops at constants, graph
    inputs, values that change per iteration (`varying`: they stay inputs, and `varying_masks`
    declines what reads them), and any other op."""
    chosen: dict[int, Node] = {}
    for name in outer:
        v = parent.values.get(name)
        if v is None or enclosing_constant(parent, v) is not None:
            continue
        cone = _cone(parent, v, varying, chosen)
        if cone is not None and len(chosen) + len(cone) <= CONE_LIMIT:
            chosen.update(cone)
    if not chosen:
        return [], outer
    order: list[Node] = []  # (depth first from the reads: producers before consumers)
    done: set[int] = set()

    def visit(n: Node) -> None:
        done.add(n.id)
        for x in n.inputs:
            p = x.producer if x is not None else None
            if p is not None and p.id in chosen and p.id not in done:
                visit(p)
        order.append(n)
    for n in chosen.values():
        if n.id not in done:
            visit(n)
    copied = {v.name for n in order for v in n.outputs}
    own = graph_names(proto) - set(outer)
    if copied & own or any(not v.name for n in order for v in n.outputs):
        return [], outer
    reads = set(outer) - copied
    for n in order:
        reads.update(x.name for x in n.inputs if x is not None and x.name not in copied)
    nodes = [dml_node_proto(n) if isinstance(n, DmlNode) else onnx_node_proto(cast(OnnxNode, n)) for n in order]
    if reads & own:
        return [], outer
    return nodes, sorted(reads)


def _cone(parent: Graph, v: Value, varying: dict[str, str], chosen: dict[int, Node]) -> dict[int, Node] | None:
    """The copyable nodes behind `v` not in `chosen` yet (None: more than CONE_LIMIT)."""
    found: dict[int, Node] = {}
    stack = [v]
    while stack:
        x = stack.pop()
        p = x.producer
        if p is None or p.id in found or p.id in chosen or x.name in varying or enclosing_constant(parent, x) is not None:
            continue
        if isinstance(p, OnnxNode):
            if p.__class__ is not OnnxNode or p.domain not in STANDARD or p.op_type not in CONE_OPS \
                    or p.has_subgraph:
                continue
        elif not isinstance(p, DmlNode) or p.operands[0] is not None and enclosing_constant(parent, p.operands[0]) is None:
            # (a band generator, its X none or a constant: not an application)
            continue
        found[p.id] = p
        if len(found) > CONE_LIMIT:
            return None
        stack.extend(i for i in p.inputs if i is not None)
    return found


class EnclosingNames:
    """The names a body must not define: its own nested bodies' (`own`) and every name of the
    enclosing graph, looked up there when asked rather than copied (a copy per body made a graph
    of many If nodes quadratic: 2,000 bodies spent 0.5 s copying the outer names)."""

    def __init__(self, parent: Graph, own: set[str]):
        self.parent = parent
        self.own = own

    def __contains__(self, name: object) -> bool:
        return name in self.own or name in self.parent.values or name in self.parent.reserved

    def __ior__(self, names: set[str]) -> "EnclosingNames":
        self.own |= names
        return self

    def encloses(self, name: str) -> bool:
        """Whether an enclosing scope has a value of that name (what a body's new name must not shadow)."""
        if name in self.parent.values:
            return True
        outer = self.parent.reserved
        return isinstance(outer, EnclosingNames) and outer.encloses(name)


def enclosing_constant(g: Graph, v: Value) -> Value | np.ndarray | DmlNode | None:
    """An enclosing constant: the initializer (shared, not copied), a Constant node's tensor, or a
    DML generator of static sizes (a stored mask the enclosing graph lowered: the body gets a copy,
    so its rules can fuse it with what applies it there)."""
    g = g.owner(v.name) or g  # (the scope that defines it)
    if v.name in g.initializers and v.name not in g.overridable_inputs:
        return g.initializers[v.name]
    p = v.producer
    if isinstance(p, DmlNode) and all(x is None for x in p.inputs) and p.static_shape is not None:
        return p
    if isinstance(p, OnnxNode) and p.op_type == "Constant" and p.domain in STANDARD:
        for a in p.attributes:
            if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                return numpy_helper.to_array(a.t)
    return None


SMALL_CONSTANT = 4096  # elements: an index constant (an axis, a k, a size), not weights


def small_tensor(name: str, const: Value | np.ndarray | DmlNode) -> onnx.TensorProto | None:
    """An enclosing constant small enough to copy into the model shape inference sees (whose
    Unsqueeze axes or Reshape sizes it then reads), as a TensorProto; None for anything else."""
    if isinstance(const, np.ndarray):
        return numpy_helper.from_array(const, name) if const.size <= SMALL_CONSTANT else None
    if isinstance(const, Value) and const.shape is not None and all(isinstance(d, int) for d in const.shape) \
            and math.prod(cast(tuple[int, ...], const.shape)) <= SMALL_CONSTANT:
        if const.array is not None:
            return numpy_helper.from_array(np.asarray(const.array), name)
        if const.initializer is not None and const.initializer.data_location != TensorProto.EXTERNAL:
            return const.initializer
    return None


def borrow(g: Graph, v: Value, const: Value | np.ndarray | DmlNode) -> None:
    """Make `v` (an extra input, or a copied small constant) the enclosing constant itself in the
    body (`write_back` leaves it out again)."""
    g.inputs = [x for x in g.inputs if x is not v]
    if isinstance(const, DmlNode):
        copy = DmlNode(const.name, None, None, None, v, elem_type=const.elem_type, value=const.value,
                       begin=const.begin, end=const.end, static_shape=const.static_shape, exact=const.exact,
                       kind=const.kind)
        copy.rule = const.rule
        v.elem_type, v.shape = const.outputs[0].elem_type, const.static_shape
        g.add_node(copy)
        return
    if isinstance(const, Value):
        v.initializer, v.array, v.base_dir = const.initializer, const.array, const.base_dir
        v.elem_type, v.shape = const.elem_type, const.shape
    else:
        v.initializer, v.array, v.shape = None, const, tuple(const.shape)
    g.initializers[v.name] = v
