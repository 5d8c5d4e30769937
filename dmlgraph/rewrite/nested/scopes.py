"""The scopes of a model and the one walk over them (`scopes`, through the body Graphs): the nodes
that hold If/Loop/Scan bodies, the names the bodies use, what changes per iteration, and how a match
made in a body is reported (its `scope` path, whether its DML node stayed in the written model).

Every other module of the nested lowering walks bodies through these, so they sit at the bottom.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import onnx

from dmlgraph.io.modelfile import iter_graphs
from dmlgraph.io.onnx_io import graphs_of
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


def subgraph_names(g: Graph) -> set[str]:
    """Every name used inside the bodies of `g`'s nodes, at any depth."""
    names: set[str] = set()
    for s in scopes(g, recursive=False):  # (`graph_names` reads the nested bodies' protos too, GRAPHS ones included)
        names |= graph_names(s.proto)
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


# ---- the scope walk --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scope:
    """One If/Loop/Scan body as a walk of the model meets it."""

    path: str  # as reports name it: `If_3/then_branch`, `Loop_1/body/If_2/else_branch`
    holder: OnnxNode
    index: int  # of its attribute in `holder.attributes`
    label: str  # the attribute's name; `name[j]` for the j-th body of a GRAPHS attribute
    graph: Graph | None  # the body Graph (None: a GRAPHS attribute's body, which no standard op has, stays a proto)
    proto: onnx.GraphProto  # the body as written (`Graph.source`)
    varying: dict[str, str]  # the enclosing values that change per iteration of an enclosing Loop/Scan


def body_path(prefix: str, holder: Node | onnx.NodeProto, label: str) -> str:
    """A body's path: its enclosing scope's (`prefix`, ending in '/', '' for the main graph), the
    holder's name (its op if unnamed) and the attribute."""
    return f"{prefix}{holder.name or holder.op_type}/{label}"


def scopes(g: Graph, prefix: str = "", varying: dict[str, str] | None = None,
           recursive: bool = True) -> Iterator[Scope]:
    """Every body of `g`'s holders in graph order, then attribute order, each followed by its own
    bodies (`recursive`), as onnx-ir's `RecursiveGraphIterator` walks subgraphs: through the body
    Graphs (`OnnxNode.bodies`), not the protos. `prefix`, `varying`: `g`'s own path and varying values."""
    for node in holder_nodes(g):
        for i, a in enumerate(node.attributes):
            if a.type == onnx.AttributeProto.GRAPH:
                body = node.bodies.get(a.name)
                found = [(a.name, body, a.g if body is None or body.source is None else body.source)]
            elif a.type == onnx.AttributeProto.GRAPHS:
                found = [(f"{a.name}[{j}]", None, b) for j, b in enumerate(a.graphs)]
            else:
                continue
            for label, graph, proto in found:
                s = Scope(body_path(prefix, node, label), node, i, label, graph, proto, varying or {})
                yield s
                if recursive and graph is not None:
                    inner = body_varying(node, a.name, proto, frozenset(graph.free_values()), s.varying)
                    yield from scopes(graph, s.path + "/", inner)


def body_varying(node: OnnxNode, attr: str, body: onnx.GraphProto, outer: frozenset[str],
                  outer_varying: dict[str, str]) -> dict[str, str]:
    """What changes per iteration in a body: its formal inputs if it is a Loop/Scan body, and what it
    reads of an enclosing body's (an If inside a Loop reading the loop-carried value)."""
    return {name: what for name, what in outer_varying.items() if name in outer} | _varying(node, attr, body)


def _varying(node: OnnxNode, attr: str, body: onnx.GraphProto) -> dict[str, str]:
    """The formal inputs of a Loop or Scan body, which change per iteration, each described."""
    if node.domain not in STANDARD or attr != "body":
        return {}
    names = [vi.name for vi in body.input]
    if node.op_type == "Loop" and len(names) >= 2:
        return {names[0]: "the iteration number", names[1]: "the loop condition"} | \
            {name: "a loop-carried value" for name in names[2:]}
    if node.op_type == "Scan":
        n_state = len(names) - node.attr("num_scan_inputs", 0)
        return {name: "a scan state value" if i < n_state else "a scanned slice" for i, name in enumerate(names)}
    return {}
