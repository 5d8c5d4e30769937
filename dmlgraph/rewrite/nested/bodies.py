"""A body as a typed, flat Graph of its own: its spec (formal inputs, enclosing reads as extra inputs
or borrowed constants), imported alone or with its siblings as one model (one shape inference for
many small bodies). It types the body Graph the rules run on (and the executor runs,
`execution_body`); `body_reuse` lowers a repeated body's template as such a copy.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Iterator, cast

import numpy as np
import onnx
from onnx import helper

from dmlgraph.errors import DmlgraphError
from dmlgraph.io.onnx_io import (
    DOMAIN,
    DOMAIN_VERSION,
    build_graph,
    import_model,
)
from dmlgraph.io.shape_inference import CHILD_MIN_NODES, PendingShapes, ValueType, whole_value_types
from dmlgraph.ir.graph import DmlNode, Graph, ModelInfo, Node, OnnxNode, Value, free_names, rewire_body
from dmlgraph.rewrite.nested.body_types import FreshDims, formal_types, fresh_like_dims, typed_value_info
from dmlgraph.rewrite.nested.enclosing import (
    EnclosingNames,
    borrow,
    enclosing_constant,
    enclosing_dims,
    outer_cones,
    small_tensor,
)
from dmlgraph.rewrite.nested.scopes import graph_names, subgraph_names


@dataclass
class Body:
    """A body as a standalone Graph: its formal inputs, then extra inputs for the enclosing values it
    reads (`outer`; the enclosing constants among them are constants of the body instead)."""

    graph: Graph
    outer: frozenset[str]
    copied: frozenset[str] = frozenset()  # values of enclosing cones copied in (`outer_cones`)


@dataclass
class BodySpec:
    """What a body's model is made of: its GraphProto, the inputs (formal ones, then the enclosing
    values it reads), the small enclosing constants shape inference reads, every enclosing constant."""

    proto: onnx.GraphProto
    inputs: list[onnx.ValueInfoProto]
    constants: list[onnx.TensorProto]
    borrowed: dict[str, Value | np.ndarray | DmlNode]
    outer: frozenset[str]
    copied: frozenset[str] = frozenset()


def body_spec(parent: Graph, node: OnnxNode, attr: str, proto: onnx.GraphProto, dims: FreshDims,
               varying: dict[str, str] | None = None) -> BodySpec | str:
    """(`varying`: given when the enclosing cones are copied in, the enclosing values that change per
    iteration, where a copy stops; the executor runs bodies as they are.)"""
    formal = formal_types(parent, node, attr, proto, dims)
    if isinstance(formal, str):
        return formal
    inputs = [typed_value_info(vi.name, t) for vi, t in zip(proto.input[:], formal)]  # (`graph.free_names` says why [:])
    outer = sorted(free_names(proto))
    prelude, reads = outer_cones(parent, proto, outer, varying) if varying is not None else ([], outer)
    # The enclosing graph's inputs first, in its order: where two inputs name a dim alike (a claim, not
    # a proof), a size is read from the first input that has it, as in the enclosing graph itself.
    rank = {v.name: i for i, v in enumerate(parent.inputs)}
    reads = sorted(reads, key=lambda name: (rank.get(name, len(rank)), name))
    borrowed: dict[str, Value | np.ndarray | DmlNode] = {}
    constants: list[onnx.TensorProto] = []  # small enclosing constants, which shape inference reads
    for name in reads:
        v = parent.find(name)
        if v is None:
            return f"it reads {name!r}, which no enclosing scope defines"
        if not v.elem_type:
            return f"the enclosing value {name!r} it reads has no known tensor type"
        const = enclosing_constant(parent, v)
        if const is not None:
            borrowed[name] = const
            small = small_tensor(name, const)
            if small is not None:
                constants.append(small)
                continue
        inputs.append(typed_value_info(name, (v.elem_type, dims.fill(v.shape))))
    if not prelude:
        return BodySpec(proto, inputs, constants, borrowed, frozenset(outer))
    copied = frozenset(o for n in prelude for o in n.output)
    full = onnx.GraphProto()
    full.CopyFrom(proto)
    del full.node[:]
    full.node.extend(prelude)
    full.node.extend(proto.node)
    for name in sorted(copied):  # (as the enclosing graph knows them: the inference of a DML node's sizes may not)
        v = cast(Value, parent.find(name))
        if v.elem_type:
            full.value_info.append(typed_value_info(name, (v.elem_type, enclosing_dims(v.shape))))
    return BodySpec(full, inputs, constants, borrowed, frozenset(outer) | frozenset(reads) | copied, copied)


def finish_body(parent: Graph, spec: BodySpec, g: Graph) -> Body:
    for name, const in spec.borrowed.items():
        borrow(g, g.values[name], const)
    g.reserved = EnclosingNames(parent, subgraph_names(g))
    return Body(g, spec.outer, spec.copied)


def build_body(parent: Graph, node: OnnxNode, attr: str, proto: onnx.GraphProto, dims: FreshDims) -> Body | str:
    """The body of `node`'s `attr` as a Graph (or why it cannot be one)."""
    return next(build_bodies(parent, [(node, attr, proto)], dims))


def build_bodies(parent: Graph, bodies: list[tuple[OnnxNode, str, onnx.GraphProto]],
                 dims: FreshDims) -> Iterator[Body | str]:
    """`build_body` of each (node, attribute, body) of `parent`, in order."""
    return built_bodies(parent, [body_spec(parent, node, attr, proto, dims) for node, attr, proto in bodies])


def built_bodies(parent: Graph, specs: list[BodySpec | str]) -> Iterator[Body | str]:
    """The body of each spec (or why it has none), in order: imported together where they can
    share one model (`import_together`), else each when it is asked for (one large body in memory
    at a time)."""
    ready = [s for s in specs if isinstance(s, BodySpec)]
    together = import_together(parent.info, ready) if len(ready) > 1 else None
    made = iter(together or ())
    for s in specs:
        if isinstance(s, str):
            yield s
            continue
        yield finish_body(parent, s, next(made)) if together else build_alone(parent, s)


def build_alone(parent: Graph, s: BodySpec) -> Body | str:
    """One body imported alone."""
    g = import_body(parent.info, s.proto, s.inputs, parent.info.opset_imports, s.constants)
    return g if isinstance(g, str) else finish_body(parent, s, g)


def _model(info: ModelInfo, opsets: dict[str, int], name: str, specs: list[BodySpec]) -> onnx.ModelProto:
    """One model holding these bodies with their inputs and constants (an input or constant an
    earlier body has too is not repeated: the enclosing values they share)."""
    model = onnx.ModelProto(ir_version=info.ir_version)
    mg = model.graph
    mg.name = name
    inputs: set[str] = set()
    initializers: set[str] = set()
    for s in specs:
        mg.input.extend(vi for vi in s.inputs if vi.name not in inputs)
        mine = list(itertools.chain(s.proto.initializer, s.constants))
        mg.initializer.extend(t for t in mine if t.name not in initializers)
        inputs.update(vi.name for vi in s.inputs)
        initializers.update(t.name for t in mine)
        mg.output.extend(s.proto.output)
        mg.node.extend(s.proto.node)
        mg.value_info.extend(s.proto.value_info)
    opsets = opsets | {DOMAIN: DOMAIN_VERSION}  # (a lowered body's DML nodes: their schemas type them)
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in sorted(opsets.items()))
    model.functions.extend(info.functions)
    return model


def import_body(info: ModelInfo, proto: onnx.GraphProto, inputs: list[onnx.ValueInfoProto],
            opsets: dict[str, int], constants: list[onnx.TensorProto] | None = None) -> Graph | str:
    """A model whose graph is `proto` with these inputs and extra constants, imported (shape
    inference included)."""
    model = _model(info, opsets, proto.name or "body", [BodySpec(proto, inputs, constants or [], {}, frozenset())])
    try:
        g = import_model(model, info.base_dir)
    except DmlgraphError as e:
        return f"it cannot be read as a graph of its own ({e})"
    g.info.source = None  # (a body's formal inputs are typed from its holder: no user declared them)
    return g


class _Inferred(PendingShapes):
    """Shapes inferred already, where the import asks for them."""

    def __init__(self, types: list[ValueType]) -> None:
        super().__init__(onnx.ModelProto())
        self.types = types

    def value_types(self) -> list[ValueType]:
        return self.types


def import_together(info: ModelInfo, specs: list[BodySpec]) -> list[Graph] | None:
    """The bodies of one graph imported as one model, then split into one Graph each, as `import_body`
    makes them: one shape inference and one import instead of one per body (2,500 If nodes with a
    one-node branch each spent half their lowering importing 5,000 models). None when they cannot
    share a model (a name two of them define, or one defines and another reads; an output or an
    annotation naming an enclosing value; an unnamed output), when its inference may differ from
    each body's own (an error, a value over the data-propagation limit), or when a body is large
    enough that its own import infers in a child, under a deadline: each is imported alone."""
    owner: dict[str, int] = {}
    for i, s in enumerate(specs):
        if len(s.proto.node) >= CHILD_MIN_NODES or any(not o for n in s.proto.node for o in n.output) \
                or any(o.name in s.outer for o in s.proto.output) or any(vi.name in s.outer for vi in s.proto.value_info):
            return None
        for name in _names(s.proto) - s.outer:
            if owner.setdefault(name, i) != i:
                return None
    if any(name in owner for s in specs for name in s.outer):
        return None
    model = _model(info, info.opset_imports, "bodies", specs)
    types = whole_value_types(model)
    if types is None:
        return None
    whole = Graph(ModelInfo(ir_version=model.ir_version, opset_imports={o.domain or "": o.version for o in model.opset_import},
                            functions=list(model.functions), base_dir=info.base_dir))  # (as `import_model`)
    try:
        build_graph(whole, model, _Inferred(types), info.base_dir)
    except DmlgraphError:
        return None
    nodes = iter(list(whole.nodes.values()))  # (one per NodeProto, in order)
    return [_split(whole, s, [next(nodes) for _ in s.proto.node]) for s in specs]


def _names(proto: onnx.GraphProto) -> set[str]:
    """Every name a body and its own bodies use."""
    names = graph_names(proto) | {o.name for o in proto.output} | {vi.name for vi in proto.value_info}
    names.discard("")
    return names


def _split(whole: Graph, s: BodySpec, nodes: list[Node]) -> Graph:
    """Body `s`'s Graph out of `whole`: its nodes and values, and a copy of each enclosing value it
    reads (so that the uses of one are its own), in the order `import_body` would make them."""
    g = Graph(replace(whole.info, graph_name=s.proto.name or "body", functions=list(whole.info.functions), source=None))
    values = g.values
    initializers = [t.name for t in itertools.chain(s.proto.initializer, s.constants)]
    names = initializers + [vi.name for vi in s.inputs]
    for n in nodes:
        names += [v.name for v in itertools.chain(n.inputs, n.outputs) if v is not None]
    names += [o.name for o in s.proto.output] + [vi.name for vi in s.proto.value_info]
    for name in names:
        if name not in values:
            v = whole.values[name]
            if name in s.outer and name not in s.copied:
                copy = Value(name, v.elem_type, v.shape)
                copy.initializer, copy.array, copy.base_dir = v.initializer, v.array, v.base_dir
                v = copy
            values[name] = v
    for n in nodes:
        n.inputs = [None if v is None else values[v.name] for v in n.inputs]
        for b in n.bodies.values() if n.__class__ is OnnxNode else ():  # (what its bodies read: the same)
            for name, x in b.free_values().items():
                if values.get(name, x) is not x:
                    rewire_body(b, x, values[name])
        g.add_node(n)
    g.initializers = {name: values[name] for name in initializers}
    g.inputs = [values[vi.name] for vi in s.inputs if vi.name not in g.initializers]
    g.overridable_inputs = [vi.name for vi in s.inputs if vi.name in g.initializers]
    g.outputs = [values[o.name] for o in s.proto.output]
    g.value_info_names = dict.fromkeys(vi.name for vi in s.proto.value_info)
    return g


def execution_body(parent: Graph, node: OnnxNode, attr: str) -> Graph:
    """`node`'s body Graph under `attr`, its values typed as a lowering types them (the executor
    runs bodies holding DML nodes: a zero-trip Loop's outputs take the body's types)."""
    body = node.bodies.get(attr)
    if body is None or body.source is None:
        raise DmlgraphError(f"cannot run the {attr} of {node.op_type} node {node.name!r}: it is not a body")
    proto = body.source
    typed = build_body(parent, node, attr, proto, FreshDims(lambda: fresh_like_dims(parent, [proto])))
    if isinstance(typed, str):
        raise DmlgraphError(f"cannot run the {attr} of {node.op_type} node {node.name!r}: {typed}")
    for name, v in body.values.items():
        t = typed.graph.values.get(name)
        if t is not None and t.elem_type:
            v.elem_type, v.shape = t.elem_type, t.shape
    return body
