"""The scopes of a model: the nodes that hold If/Loop/Scan bodies, the names the bodies use, and how a
match made in a body is reported (its `scope` path, whether its DML node stayed in the written model).

Every other module of the nested lowering walks bodies through these, so they sit at the bottom.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import onnx

from dmlgraph.io.modelfile import iter_graphs
from dmlgraph.io.onnx_io import (
    graphs_of,
)
from dmlgraph.ir.graph import CONTROL_FLOW, DmlNode, Graph, Node, OnnxNode
from dmlgraph.rewrite import Match, PassResult
from dmlgraph.rewrite.call_leaves import STANDARD

Kinds = Callable[[Graph, dict[str, str]], dict[str, str]]  # (a graph, its own inputs' hints)
SCOPE, LOWERED = "scope", "lowered"  # the captures this module adds to the matches it reports


def qualified_name(m: Match, n: Node) -> str:
    """`n`'s name, prefixed with the path of the body it is in when the match is a nested one."""
    scope = m.captures.get(SCOPE)
    return f"{scope}/{n.name or n.op_type}" if scope else n.name


def in_lowered_graph(m: Match, g: Graph) -> bool:
    """Whether the DML node a match made is in the lowered model (its body's graph, if nested)."""
    if SCOPE in m.captures:
        return bool(m.captures.get(LOWERED))
    dml = m.dml
    return isinstance(dml, DmlNode) and dml.id in g.nodes


def nested_dml_nodes(result: PassResult) -> list[DmlNode]:
    """The DML nodes the nested lowerings put into bodies and functions (and that stayed there)."""
    return [m.dml for m in result.applied
            if m.captures.get(LOWERED) and isinstance(m.dml, DmlNode)]


def holder_nodes(g: Graph) -> list[OnnxNode]:
    """The nodes of `g` with graph-valued attributes, in graph order."""
    return [n for n in g.nodes.values() if n.__class__ is OnnxNode
            and (n.op_type in CONTROL_FLOW or n.domain not in STANDARD) and n.has_subgraph]


def subgraph_names(holders: list[OnnxNode]) -> set[str]:
    """Every name used inside the bodies of these nodes, at any depth."""
    names: set[str] = set()
    for n in holders:
        for body in graphs_of(n.attributes):
            names |= graph_names(body)
    return names


def graph_names(body: onnx.GraphProto) -> set[str]:
    """The names `body` and its own bodies read, define or take as inputs ('' left out)."""
    names: set[str] = set()
    for sub, _ in iter_graphs(body):
        if sub.input or sub.initializer:  # (an If branch has neither: no generators for them)
            names.update(vi.name for vi in sub.input)
            names.update(t.name for t in sub.initializer)
        for x in sub.node[:]:  # (`graph.free_names` says why [:])
            names.update(x.input[:])
            names.update(x.output[:])
    names.discard("")
    return names


class Lazy:
    """A value computed when first asked for."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make, self.done, self.value = make, False, None

    def get(self) -> Any:
        if not self.done:
            self.value, self.done = self.make(), True
        return self.value


def all_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """NodeProtos and the nodes of their bodies, at any depth."""
    for n in nodes:
        yield n
        for body in graphs_of(n.attribute):
            yield from all_nodes(body.node)
