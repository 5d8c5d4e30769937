"""`split_of_concat`: tensors stacked by a Concat and split back along the same axis are the
tensors themselves.

Exporters stack masks of different bands along a batch axis and split them back per layer; no band
proof carries the stack, but each piece of `Split(Slice*(Concat(a, b)))` is `Slice*(a)` / `Slice*(b)`
bit for bit, an ordinary band for the other rules. Conditions: docs/internals.md, "passes/stacks.py".
"""
from __future__ import annotations

from typing import cast

import numpy as np

from dmlgraph.ir.graph import Graph, Node, OnnxNode, Value
from dmlgraph.passes.common import const_value, int_list, standin
from dmlgraph.rewrite import Context, Match, Replacement, Rule, detached

STANDARD = ("", "ai.onnx")


def _standard(n: Node | None, op_type: str) -> bool:
    return isinstance(n, OnnxNode) and n.domain in STANDARD and n.op_type == op_type


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _slice_axes(graph: Graph, n: OnnxNode, rank: int) -> list[int] | None:
    """The axes a Slice node cuts (None: not known from constants)."""
    if len(n.inputs) < 3:
        return None
    if len(n.inputs) > 3 and n.inputs[3] is not None:
        axes = const_value(graph, n.inputs[3])
        if axes is None:
            return None
        return [_axis(int(a), rank) for a in np.asarray(axes).reshape(-1)]
    starts = cast(Value, n.inputs[1])
    return list(range(len(starts.shape))) if starts.shape and isinstance(starts.shape[0], int) else None


def _split_sizes(graph: Graph, n: OnnxNode) -> list[int] | None:
    return int_list(graph, n, "split")


def _match(ctx: Context, node: Node) -> Match | None:
    graph = ctx.graph
    if not _standard(node, "Split"):
        return None
    split = cast(OnnxNode, node)
    x = cast(Value, split.inputs[0])
    if x.shape is None:
        return None
    rank = len(x.shape)
    axis = _axis(int(split.attr("axis", 0)), rank)
    slices: list[OnnxNode] = []
    v = x
    while _standard(v.producer, "Slice"):
        s = cast(OnnxNode, v.producer)
        axes = _slice_axes(graph, s, rank)
        if axes is None or axis in axes or len(v.uses) != 1:
            return None
        slices.append(s)
        v = cast(Value, s.inputs[0])
    concat = v.producer
    if not _standard(concat, "Concat") or len(v.uses) != 1 or \
            _axis(int(cast(OnnxNode, concat).attr("axis", 0)), rank) != axis:
        return None
    parts = [p for p in cast(OnnxNode, concat).inputs if p is not None]
    sizes = _split_sizes(graph, split)
    part_sizes = [p.shape[axis] if p.shape is not None and len(p.shape) == rank else None for p in parts]
    if sizes is None or len(sizes) != len(parts) or len(split.outputs) != len(parts) or \
            any(not isinstance(s, int) or s != t for s, t in zip(part_sizes, sizes)):
        return None
    return Match("split_of_concat", [split, *slices, cast(Node, concat)],
                 {"parts": parts, "slices": slices[::-1], "split": split})


def _rewrite(ctx: Context, m: Match) -> Replacement:
    split: OnnxNode = m.captures["split"]
    nodes: list[Node] = []
    replaces = []
    for k, (part, piece) in enumerate(zip(m.captures["parts"], split.outputs)):
        v = part
        for s in m.captures["slices"]:
            out = detached(f"{piece.name}__part{k}", part.elem_type)
            nodes.append(OnnxNode("", "Slice", [v, *s.inputs[1:]], [out], s.attributes))
            v = out
        new = standin(piece)
        nodes.append(OnnxNode("", "Identity", [v], [new]))
        replaces.append((piece, new))
    return Replacement(nodes=nodes, replaces=replaces, removes=list(m.nodes))


SPLIT_OF_CONCAT = Rule("split_of_concat", ("Split",), _match, _rewrite, exact="bit-exact",
                       description="Split(Slice*(Concat(a, b, ...))) back along the stacking axis -> "
                                   "Slice*(a), Slice*(b), ... (stacks of different bands)")
