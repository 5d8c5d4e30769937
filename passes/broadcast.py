"""Output sizes of a rewritten mask application, as a plan (at match time) and ONNX nodes (at rewrite).

A DIAGONAL_MATRIX1 that replaces `And(P, band)` or `Where(band, X, c)` must have the output shape of
the node it replaces: the numpy broadcast of its operands' shapes, which may be larger than its input
(a padding mask [B, 1, 1, T] and a band [1, 1, S, T] give [B, 1, S, T]). The DML node takes those
sizes as its run-time `shape` input. They are computed without reading any mask: from a generator's
own size input or static shape, from a ConstantOfShape's shape operand, or from `Shape(x)` of data
that stays in the graph anyway, and broadcast pairwise by `Where(Equal(a, 1), b, a)` (exact for every
pair that broadcasts: a dim of 1 takes the other side, including 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from dmlgraph.graph import Dim, DmlNode, Graph, Node, OnnxNode, Value
from passes.common import const_value


@dataclass(frozen=True)
class ShapeSource:
    """Where one operand's sizes come from: a static tuple, a 1-D int64 value, or Shape(of)."""

    rank: int
    static: tuple[int, ...] | None = None
    vector: Value | None = None  # a 1-D int64 value holding the sizes
    of: Value | None = None      # a value whose Shape() gives the sizes


def shape_source(graph: Graph, v: Value) -> ShapeSource | None:
    """How to get `v`'s sizes at run time without keeping a mask alive (None: its rank is unknown)."""
    if v.shape is None:
        return None
    rank = len(v.shape)
    if v.static_shape is not None:
        return ShapeSource(rank, static=v.static_shape)
    p = v.producer
    if isinstance(p, DmlNode):
        if p.inputs[1] is not None:
            return ShapeSource(rank, vector=p.inputs[1])
        if p.static_shape is not None:
            return ShapeSource(rank, static=p.static_shape)
        x = p.inputs[0]
        return None if x is None else shape_source(graph, x)
    if isinstance(p, OnnxNode) and p.domain in ("", "ai.onnx"):
        if p.op_type == "ConstantOfShape":
            s = p.inputs[0]
            arr = const_value(graph, s)
            return ShapeSource(rank, static=tuple(int(d) for d in arr)) if arr is not None \
                else ShapeSource(rank, vector=s)
        if p.op_type == "Expand":  # Expand of a one-element constant: the target sizes, padded
            c, t = p.inputs[0], p.inputs[1]
            arr = const_value(graph, c)
            if arr is not None and arr.size == 1 and t.shape is not None and t.shape == (rank,) and arr.ndim <= rank:
                return ShapeSource(rank, vector=t)
    return ShapeSource(rank, of=v)


def same_dims(a: tuple[Dim, ...] | None, b: tuple[Dim, ...] | None) -> bool:
    """Shape inference proved these shapes equal: same length, every dim the same int or name.

    An `unk__N` name counts: shape inference invents one per unknown dim and copies it only where it
    proved the dims equal, and every shape of one graph comes from one inference run (rules copy
    names, they never invent them).
    """
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x is not None and x == y for x, y in zip(a, b))


def keeps_matrix(operand: tuple[Dim, ...] | None, band: tuple[Dim, ...] | None) -> bool:
    """Broadcasting `operand` against the band cannot change the band's last two dims: each of the
    operand's is absent, a static 1, or provably the band's."""
    if operand is None or band is None or len(band) < 2:
        return False
    tail = (None,) * max(0, 2 - len(operand)) + tuple(operand[-2:])
    return all(o == 1 or (o is not None and o == b) or i < 2 - len(operand)
               for i, (o, b) in enumerate(zip(tail, band[-2:])))


def build_matrix_of(graph: Graph, sizes: Value, band: ShapeSource, hint: str) -> tuple[Value, list[Node]]:
    """`sizes` with its last two entries replaced by the band's (leading dims broadcast, matrix the
    band's): the output sizes of an application whose data could not be proved to keep the band's
    matrix. Data that would widen it then fails to broadcast into these sizes when the node runs:
    an error, never a different mask."""
    new: list[Node] = []

    def add(op_type: str, inputs: list[Value], name: str, **attrs) -> Value:
        out = graph.fresh_value(f"{hint}__{name}", TensorProto.INT64)
        new.append(graph.add_node(OnnxNode(out.name, op_type, inputs, [out],
                                           [helper.make_attribute(k, v) for k, v in attrs.items()])))
        return out

    def constant(arr) -> Value:
        return graph.add_initializer(graph.fresh_value(f"{hint}__c"), np.asarray(arr, np.int64))

    lead = add("Slice", [sizes, constant([0]), constant([-2])], "lead")
    if band.static is not None:
        tail = constant(list(band.static[-2:]))
    else:
        vec = band.vector if band.vector is not None else add("Shape", [band.of], "band_shape")
        tail = add("Slice", [vec, constant([-2]), constant([band.rank])], "matrix")
    out = add("Concat", [lead, tail], "sizes", axis=0)
    out.shape = sizes.shape
    return out, new


def broadcast_dims(shapes: list[tuple[Dim, ...]]) -> tuple[Dim, ...] | None:
    """The broadcast of inferred shapes where inference can tell it (unknown dims where it cannot)."""
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        out.append(dims.pop() if len(dims) == 1 else (1 if not dims else None))
    return tuple(out)


def needed(sources: list[ShapeSource]) -> list[ShapeSource]:
    """The sources that can change the broadcast: a static all-ones shape no longer than another
    operand's rank never does."""
    rank = max(s.rank for s in sources)
    keep = [s for s in sources if not (s.static is not None and all(d == 1 for d in s.static) and s.rank <= rank)]
    return keep or sources[:1]


def static_broadcast(sources: list[ShapeSource]) -> tuple[int, ...] | None:
    """numpy's broadcast of the sources when every one is static (None otherwise)."""
    if any(s.static is None for s in sources):
        return None
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*(s.static for s in sources)))
    except ValueError:
        return None


def build_broadcast(graph: Graph, sources: list[ShapeSource], hint: str) -> tuple[Value, list[Node]]:
    """ONNX nodes computing the broadcast of `sources` (1-D int64), and the nodes added."""
    new: list[Node] = []

    def add(op_type: str, inputs: list[Value], name: str, **attrs) -> Value:
        out = graph.fresh_value(f"{hint}__{name}", TensorProto.INT64)
        node = OnnxNode(out.name, op_type, inputs, [out], [helper.make_attribute(k, v) for k, v in attrs.items()])
        new.append(graph.add_node(node))
        return out

    def constant(arr: np.ndarray, name: str) -> Value:
        return graph.add_initializer(graph.fresh_value(f"{hint}__{name}"), arr)

    rank = max(s.rank for s in sources)
    vectors: list[Value] = []
    for s in sources:
        if s.static is not None:
            v = constant(np.array((1,) * (rank - s.rank) + s.static, np.int64), "sizes")
        else:
            v = s.vector if s.vector is not None else add("Shape", [s.of], "shape")
            if s.rank < rank:
                v = add("Concat", [constant(np.ones(rank - s.rank, np.int64), "ones"), v], "padded", axis=0)
        if v.shape is None:
            v.shape = (rank,)
        vectors.append(v)
    out = vectors[0]
    if len(vectors) > 1:
        one = constant(np.array(1, np.int64), "one")
        for v in vectors[1:]:
            is_one = add("Equal", [out, one], "is_one")
            is_one.elem_type = TensorProto.BOOL
            out = add("Where", [is_one, v, out], "sizes")
            out.shape = (rank,)
    return out, new
