"""Model-local functions: the input types their call sites agree on, the formal inputs the calls
compute alike (a prelude of copied caller nodes), the function as a typed Graph, and write-back
with the same signature.

A function is typed from every call, not one; what the calls disagree on is declined with why.
"""
from __future__ import annotations

import collections
import itertools
from typing import Iterable, Sequence, cast

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dmlgraph.errors import DmlgraphError
from dmlgraph.io.modelfile import iter_graphs
from dmlgraph.io.onnx_io import (
    DOMAIN,
    DOMAIN_VERSION,
    export_model,
    graphs_of,
    has_dml_nodes,
)
from dmlgraph.ir.graph import DmlNode, Graph, ModelInfo, OnnxNode, Value, free_names
from dmlgraph.rewrite.call_leaves import STANDARD, FunctionKey, call_key, proto_call_key
from dmlgraph.rewrite.nested.bodies import import_body
from dmlgraph.rewrite.nested.body_types import FreshDims, TypeSpec, fresh_like_dims, typed_value_info
from dmlgraph.rewrite.nested.enclosing import CONE_LIMIT, CONE_OPS, enclosing_constant, small_tensor
from dmlgraph.rewrite.nested.scopes import Kinds, Lazy, all_nodes, graph_names, subgraph_names
from dmlgraph.rewrite.nested.write_back import drop_items


def function_path(f: onnx.FunctionProto) -> str:
    return f"{f.domain}::{f.name}" + (f":{f.overload}" if f.overload else "")


def function_key(f: onnx.FunctionProto) -> FunctionKey:
    return f.domain, f.name, f.overload


class CallSites:
    """The input types each local function is called with, and why some calls have none."""

    def __init__(self, functions: list[onnx.FunctionProto], dims: FreshDims) -> None:
        self.keys = {function_key(f) for f in functions}
        self.dims = dims
        self.sites: dict[FunctionKey, list[list[TypeSpec | None]]] = {}
        self.reasons: dict[FunctionKey, str] = {}
        self.kinds: Kinds | None = None  # (census only) what a call's arguments are in its graph
        self.arg_kinds: dict[FunctionKey, list[list[str | None]]] = {}
        # per call: the caller's ONNX opset, each argument's `_argument_cones`, the leaves they read
        self.cones: dict[FunctionKey, list[tuple[int, list[Cone | None], list[Leaf]]]] = {}
        self.total: collections.Counter = collections.Counter()  # calls in the model (`call_leaves.count_calls`)

    def record(self, g: Graph, hints: dict[str, str] | None = None) -> None:
        if not self.keys:
            return
        kinds = Lazy(lambda: self.kinds(g, hints or {}) if self.kinds else {})
        for n in g.nodes.values():
            if n.__class__ is OnnxNode and n.domain not in STANDARD and call_key(n) in self.keys:
                self.sites.setdefault(call_key(n), []).append(
                    [(v.elem_type, v.shape) if v is not None and v.elem_type else None for v in n.inputs])
                if self.kinds:
                    self.arg_kinds.setdefault(call_key(n), []).append(
                        [None if v is None else kinds.get().get(v.name) for v in n.inputs])

    def hints(self, f: onnx.FunctionProto) -> dict[str, str]:
        """The function's inputs that every call passes the same kind of (a size, an index grid, a
        mask), for its census."""
        calls = self.arg_kinds.get(function_key(f), [])
        return {name: kind for i, name in enumerate(f.input) if calls
                and len({c[i] if i < len(c) else None for c in calls}) == 1 and (kind := calls[0][i]) is not None}

    def cones_of(self, traced: list[tuple[FunctionKey, int, list[Cone | None], list[Leaf]]]) -> None:
        for key, opset, cones, leaves in traced:
            self.cones.setdefault(key, []).append((opset, cones, leaves))

    def definitions(self, f: onnx.FunctionProto, opset: int) -> tuple[list[tuple[int, Cone]], list[Leaf]]:
        """The formal inputs every call computes alike from its other arguments and constants (the
        same cone, under the function's `opset`: its nodes are copied in), each with that cone,
        every one after those its cone reads; and the leaves the cones read (`call_leaves`): the
        same main-graph inputs at every call, each typed as all calls agree. A cone reading a leaf
        defines its formal only where every call of the model was traced and passes the same leaves."""
        made = self.cones.get(function_key(f), [])
        calls = [c for _, c, _ in made]
        if not calls or any(len(c) != len(f.input) for c in calls) or any(o != opset for o, _, _ in made):
            return [], []
        leaves = _agreed_leaves([ls for _, _, ls in made], self.dims) \
            if len(made) == self.total[function_key(f)] else None
        agreed = {i: c for i, c in enumerate(calls[0]) if c is not None and all(other[i] == c for other in calls)
                  and (leaves is not None or not _cone_leaves(c))}
        order: list[tuple[int, Cone]] = []
        while agreed:  # (a cone reading a formal that is defined after it, or in a cycle, defines nothing)
            ready = [i for i, c in agreed.items() if not (_cone_reads(c) & agreed.keys())]
            if not ready:
                break
            order += [(i, agreed.pop(i)) for i in ready]
        return order, leaves or []

    def untyped(self, proto: onnx.GraphProto, reason: str) -> None:
        for sub, _ in iter_graphs(proto):
            self.untyped_nodes(sub.node, reason)

    def untyped_nodes(self, nodes: Iterable[onnx.NodeProto], reason: str) -> None:
        for n in nodes:
            key = proto_call_key(n)
            if key in self.keys:
                self.reasons.setdefault(key, reason)
            for body in graphs_of(n.attribute):
                self.untyped(body, reason)

    def types(self, f: onnx.FunctionProto) -> list[TypeSpec] | str:
        """One type per input that every call agrees with: element types equal, a dim static where
        every call gives it the same size or name, else fresh (any size)."""
        key = function_key(f)
        if key in self.reasons:
            return self.reasons[key]
        calls = self.sites.get(key)
        if not calls:
            return "it is never called, so its input types are unknown"
        types: list[TypeSpec] = []
        for i, name in enumerate(f.input):
            given = [c[i] if i < len(c) else None for c in calls]
            specs = [s for s in given if s is not None]
            if len(specs) != len(given):
                return f"a call gives its input {name!r} no value of a known type"
            if len({s[0] for s in specs}) != 1:
                return f"its calls give input {name!r} different element types"
            shapes = [s[1] for s in specs if s[1] is not None]
            if len(shapes) != len(specs) or len({len(s) for s in shapes}) != 1:
                types.append((specs[0][0], None))
                continue
            types.append((specs[0][0], tuple(
                dims[0] if dims[0] is not None and all(d == dims[0] for d in dims) else self.dims.new()
                for dims in zip(*shapes))))
        return types


# A formal input as its call computes it: (how the formal is read: ("arg", j) another argument of the
# call, ("const", dtype, shape, bytes), ("node", k, output)), then the cone's nodes in order, each
# (op_type, its attributes' bytes, its inputs as such references, its number of outputs).
Cone = tuple[tuple, tuple]
Prelude = tuple[list[onnx.NodeProto], frozenset[str], frozenset[str]]  # nodes, the names they make, the formals
PRELUDE_PREFIX = "dmlgraph_call_"  # the names of a prelude's values (others' skipped)
Leaf = tuple[str, TypeSpec]  # a main-graph input a cone reads the Shape of, as a call's graph types it


def _agreed_leaves(calls: list[list[Leaf]], dims: FreshDims) -> list[Leaf] | None:
    """The leaves every call reads (the same names in the same order), each typed as they agree
    (None: they differ, or their element types do)."""
    first = calls[0]
    if any([name for name, _ in c] != [name for name, _ in first] for c in calls):
        return None
    merged: list[Leaf] = []
    for k, (name, _) in enumerate(first):
        specs = [c[k][1] for c in calls]
        shapes = [s for _, s in specs]
        if len({t for t, _ in specs}) != 1:
            return None
        if any(s is None for s in shapes) or len({len(s) for s in shapes if s is not None}) != 1:
            merged.append((name, (specs[0][0], None)))
            continue
        merged.append((name, (specs[0][0], tuple(
            ds[0] if ds[0] is not None and all(d == ds[0] for d in ds) else dims.new()
            for ds in zip(*cast(list[tuple], shapes))))))
    return merged


def _cone_leaves(c: Cone) -> set[int]:
    """The leaves a cone reads."""
    return {r[1] for n in c[1] for r in n[2] if r[0] == "leaf"}


class _Undefined(Exception):
    """An argument whose cone reads something else than the call's arguments and constants."""


def traced_calls(g: Graph, functions: list[onnx.FunctionProto], visible: frozenset[str] = frozenset()
            ) -> list[tuple[FunctionKey, int, list[Cone | None], list[Leaf]]]:
    """Each call of a local function in `g`: its key, `g`'s ONNX opset, its `_argument_cones` and
    their leaves (`visible`: the main-graph inputs a call here may pass). Taken before the rules run
    on `g` (the cones are the caller's own nodes, not what it lowered them to)."""
    if not functions:
        return []
    keys = {function_key(f) for f in functions}
    return [(call_key(n), g.info.opset_imports.get("", 0), *_argument_cones(g, n, visible)) for n in g.nodes.values()
            if n.__class__ is OnnxNode and n.domain not in STANDARD and call_key(n) in keys]


def _argument_cones(g: Graph, call: OnnxNode, visible: frozenset[str] = frozenset()
                    ) -> tuple[list[Cone | None], list[Leaf]]:
    """Each argument of `call` as a cone (`Cone`) over the call's other arguments and constants,
    through CONE_OPS (None: it reads a value that is not passed, or is one): a call passing `x` and
    `Gather(Shape(x), 2)` defines the second formal from the first. A value an argument is the
    Identity of counts as that argument (`Shape(x)` where `Identity(x)` is passed). The Shape of a
    `visible` input of `g` that is not passed reads a leaf (`call_leaves`): ("leaf", k), the k-th of
    the call's leaves (returned, in the order the cones first read them)."""
    args: dict[str, int] = {}
    for j, v in enumerate(call.inputs):
        x = v
        while x is not None and x.name not in args:
            args[x.name] = j
            p = x.producer
            x = p.inputs[0] if isinstance(p, OnnxNode) and p.op_type == "Identity" and p.domain in STANDARD \
                and p.inputs else None
    leaves: list[Leaf] = []
    cones = [None if v is None else _argument_cone(g, v, i, args, leaves, visible) for i, v in enumerate(call.inputs)]
    return cones, leaves


def _argument_cone(g: Graph, v: Value, i: int, args: dict[str, int], leaves: list[Leaf],
                   visible: frozenset[str]) -> Cone | None:
    nodes: list[tuple] = []
    index: dict[int, int] = {}
    kept = len(leaves)

    def leaf(x: Value | None) -> tuple | None:
        if x is None or x.name not in visible or x.name in args or x.producer is not None or not x.elem_type:
            return None
        names = [name for name, _ in leaves]
        if x.name not in names:
            leaves.append((x.name, (x.elem_type, x.shape)))
            names.append(x.name)
        return ("leaf", names.index(x.name))

    def ref(x: Value | None, top: bool = False) -> tuple:
        if x is None:
            return ("none",)
        j = args.get(x.name)
        if j is not None and not (top and j == i):
            if j == i:
                raise _Undefined  # (it reads itself)
            return ("arg", j)
        const = enclosing_constant(g, x)
        if const is not None:
            small = None if isinstance(const, DmlNode) else small_tensor(x.name, const)
            if small is None or small.data_type == TensorProto.STRING:
                raise _Undefined
            a = numpy_helper.to_array(small)
            return ("const", a.dtype.str, a.shape, a.tobytes())
        p = x.producer
        if p is None or p.__class__ is not OnnxNode or p.domain not in STANDARD or p.op_type not in CONE_OPS:
            raise _Undefined
        n = p
        if n.has_subgraph:
            raise _Undefined
        out = next(k for k, o in enumerate(n.outputs) if o is x)
        if n.id not in index:
            shape_of = n.op_type == "Shape" and n.inputs and leaf(n.inputs[0])
            inputs = (shape_of, *(ref(y) for y in n.inputs[1:])) if shape_of else tuple(ref(y) for y in n.inputs)
            attrs = tuple(sorted(a.SerializeToString(deterministic=True) for a in n.attributes))
            nodes.append((n.op_type, attrs, inputs, len(n.outputs)))
            index[n.id] = len(nodes) - 1
            if len(nodes) > CONE_LIMIT:
                raise _Undefined
        return ("node", index[n.id], out)
    try:
        top = ref(v, True)
    except _Undefined:
        del leaves[kept:]
        return None
    return top, tuple(nodes)


def _cone_reads(c: Cone) -> set[int]:
    """The formal inputs a cone reads."""
    refs = [c[0], *(r for n in c[1] for r in n[2])]
    return {r[1] for r in refs if r[0] == "arg"}


def call_prelude(f: onnx.FunctionProto, definitions: list[tuple[int, Cone]], leaves: Sequence[Leaf] = ()
             ) -> tuple[Prelude, list[tuple[str, TypeSpec, str]]]:
    """The nodes that compute the formal inputs the calls define (`CallSites.definitions`) from the
    other formals, constants and `leaves`, each formal under its own name, the rest under fresh ones
    (a node two cones share made once); and the new formals the leaves read become (fresh name,
    type, the calls' leaf)."""
    if not definitions:
        return ([], frozenset(), frozenset()), []
    taken = set(f.input) | set(f.output) | {vi.name for vi in f.value_info}
    for n in all_nodes(f.node):
        taken.update(n.input)
        taken.update(n.output)
        for body in graphs_of(n.attribute):
            taken |= graph_names(body)
    counter = itertools.count()

    def fresh() -> str:
        while (name := f"{PRELUDE_PREFIX}{next(counter)}") in taken:
            pass
        return name
    nodes: list[onnx.NodeProto] = []
    made: dict[tuple, list[str]] = {}
    added: dict[int, str] = {}

    def name_of(r: tuple, names: list[list[str]]) -> str:
        if r[0] == "none":
            return ""
        if r[0] == "arg":
            return f.input[r[1]]
        if r[0] == "leaf":
            if r[1] not in added:
                added[r[1]] = fresh()
            return added[r[1]]
        if r[0] == "node":
            return names[r[1]][r[2]]
        if r not in made:
            made[r] = [fresh()]
            nodes.append(_constant_node(r, made[r][0]))
        return made[r][0]
    for i, (top, entries) in definitions:
        formal = f.input[i]
        names: list[list[str]] = []
        for k, (op, attrs, inputs, n_out) in enumerate(entries):
            key = (op, attrs, tuple(name_of(r, names) for r in inputs), n_out)
            if key not in made:
                outs = [formal if top[0] == "node" and top[1:] == (k, o) else fresh() for o in range(n_out)]
                node = onnx.NodeProto(op_type=op, input=key[2], output=outs)
                node.attribute.extend(onnx.AttributeProto.FromString(a) for a in attrs)
                nodes.append(node)
                made[key] = outs
            names.append(made[key])
        if top[0] == "const":
            nodes.append(_constant_node(top, formal))
        elif top[0] == "arg" or name_of(top, names) != formal:
            nodes.append(onnx.NodeProto(op_type="Identity", input=[name_of(top, names)], output=[formal]))
    prelude = nodes, frozenset(o for n in nodes for o in n.output), frozenset(f.input[i] for i, _ in definitions)
    return prelude, [(name, leaves[k][1], leaves[k][0]) for k, name in sorted(added.items())]


def _constant_node(r: tuple, name: str) -> onnx.NodeProto:
    _, dtype, shape, data = r
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.frombuffer(data, np.dtype(dtype)).reshape(shape), name))


def _without_prelude(nodes: list[onnx.NodeProto], outputs: list[str], defined: frozenset[str]) -> list[onnx.NodeProto]:
    """`nodes` (in order) without those computing a formal input (`write_back_function`) and those
    no other node nor the outputs read then (the prelude's, and what a rewrite of a prelude value
    made: the Graph held no dead node before)."""
    live = set(outputs)
    kept: list[onnx.NodeProto] = []
    for n in reversed(nodes):
        if not any(o in live and o not in defined for o in n.output):
            continue
        if any(o in defined for o in n.output):  # (a node another node reads another output of)
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            for k, o in enumerate(copy.output):
                if o in defined:
                    copy.output[k] = _unused_name(o, nodes)
            n = copy
        kept.append(n)
        live.update(n.input)
        for body in graphs_of(n.attribute):
            live |= free_names(body)
    return kept[::-1]


def _unused_name(base: str, nodes: list[onnx.NodeProto]) -> str:
    names = {x for n in nodes for x in itertools.chain(n.input, n.output)}
    while (base := f"{base}_") in names:
        pass
    return base


def call_order(functions: list[onnx.FunctionProto]) -> list[int] | str:
    """Function indices, every caller before the functions it calls."""
    index = {function_key(f): i for i, f in enumerate(functions)}
    import networkx as nx  # only models with local functions need it (0.15 s to import)

    calls = nx.DiGraph()
    calls.add_nodes_from(range(len(functions)))
    for i, f in enumerate(functions):
        for n in all_nodes(f.node):
            j = index.get(proto_call_key(n))
            if j is not None:
                calls.add_edge(i, j)
    try:
        return list(nx.lexicographical_topological_sort(calls))
    except nx.NetworkXUnfeasible:
        return "the model's local functions call each other in a cycle, which ONNX does not allow"


def attribute_reason(f: onnx.FunctionProto) -> str | None:
    refs = sorted({a.ref_attr_name for n in all_nodes(f.node) for a in n.attribute if a.ref_attr_name})
    if refs:
        return f"its nodes take the caller's attributes ({', '.join(refs)}), which may differ per call"
    return None


def build_function(info: ModelInfo, f: onnx.FunctionProto, types: list[TypeSpec], dims: FreshDims,
                   prelude: Prelude = ([], frozenset(), frozenset()),
                   added: Sequence[tuple[str, TypeSpec, str]] = ()) -> Graph | str:
    """A function body as a Graph whose inputs have `types`; the formal inputs its calls define
    (`prelude`, `call_prelude`) are computed from the others (and the leaf formals `added`, inputs after
    them) instead of being inputs."""
    nodes, _, defined = prelude
    proto = onnx.GraphProto(name=f.name)
    proto.node.extend(nodes)
    proto.node.extend(f.node)
    proto.output.extend(onnx.ValueInfoProto(name=o) for o in f.output)
    proto.value_info.extend(f.value_info)
    opsets = dict(info.opset_imports) | {o.domain: o.version for o in f.opset_import}
    inputs = [typed_value_info(name, t) for name, t in zip(f.input, types) if name not in defined]
    g = import_body(info, proto, inputs + [typed_value_info(name, t) for name, t, _ in added], opsets)
    if not isinstance(g, str):
        g.reserved = subgraph_names(g)
    return g


def write_back_function(g: Graph, f: onnx.FunctionProto, defined: frozenset[str] = frozenset()) -> onnx.FunctionProto:
    """The lowered function: same signature; constants the rules made become Constant nodes (a
    function has no initializers). Where a prelude defined formal inputs (`defined`), what still
    computes one goes (the formal holds that value: its calls proved it), the prelude nodes the others
    read stay (they read only formals and constants), the rest goes."""
    exported = export_model(g, "dml").graph
    new = onnx.FunctionProto()
    new.CopyFrom(f)
    del new.node[:], new.output[:], new.value_info[:]
    nodes = [helper.make_node("Constant", [], [t.name], value=t) for t in exported.initializer]
    nodes += exported.node
    if defined:
        nodes = _without_prelude(nodes, [vi.name for vi in exported.output], defined)
        produced = {o for n in nodes for o in n.output}
        drop_items(exported.value_info, lambda vi: vi.name in defined or vi.name not in produced)
    new.node.extend(nodes)
    new.output.extend(vi.name for vi in exported.output)
    new.value_info.extend(exported.value_info)
    if has_dml_nodes(new.node) and all(o.domain != DOMAIN for o in new.opset_import):
        new.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    return new


def execution_function(parent: Graph, node: OnnxNode) -> Graph:
    """The function `node` calls, as a Graph typed by this call (the executor runs functions
    holding DML nodes)."""
    f = next((f for f in parent.info.functions if function_key(f) == call_key(node)), None)
    if f is None:
        raise DmlgraphError(f"node {node.name!r} calls {node.domain}::{node.op_type}, which the model does not define")
    dims = FreshDims(lambda: fresh_like_dims(parent))
    types = [(v.elem_type, dims.fill(v.shape)) if v is not None and v.elem_type else None for v in node.inputs]
    reason = attribute_reason(f) or (None if len(types) == len(f.input) and None not in types
                                      else "its inputs' types are unknown")
    g = reason or build_function(parent.info, f, cast(list[TypeSpec], types), dims)  # reason: no None in types
    if isinstance(g, str):
        raise DmlgraphError(f"cannot run function {function_path(f)} called by {node.name!r}: {g}")
    return g
