"""onnx's shape inference of a graph with many If nodes, each If in a scope of its own: linear
where onnx's own is quadratic (each If copies the whole type map of the graph).

`scoped(model)` is the model to infer instead: each If becomes a call of a model-local function
holding only that If, so each branch is inferred against its own reads; it returns None where the
result could differ from onnx's. Why the types are the same, and the conditions: docs/internals.md, io/inference_scopes.py.
"""
from __future__ import annotations

import itertools

import onnx
from onnx import AttributeProto, helper
from onnx.onnx_cpp2py_export import shape_inference as _cpp

from dmlgraph.io.modelfile import check_model, copy_fields

DOMAIN = "dmlgraph.scope"
PREFIX = "__dmlgraph_scope_"
FRESH_DIM = "unk__"  # onnx's fresh symbols: unk__0, unk__1, ...
# onnx copies ~60 ns a value of the main graph for each If, the wrapping costs ~70 us an If:
# below these sizes the quadratic costs less (250 If nodes in a 500-node graph: 10 ms a pass as
# it is, 18 ms scoped; 500 in 1,000: 34 and 36 ms; 1,000 in 2,000: 121 and 74 ms).
MIN_IFS = 16
MIN_NODES = 2000
_BRANCHES = {"then_branch", "else_branch"}
_IF_OP_TYPE = b'"\x02If'  # NodeProto.op_type (field 4, length-delimited) == "If", as serialized


def full_check(model: onnx.ModelProto, data: bytes) -> None:
    """`onnx.checker.check_model(data, full_check=True)` (`data`: `model` serialized): the checker,
    then strict, type-checking shape inference, which raises on any error; that on the scoped model
    where there is one (it fails exactly when the model's does)."""
    s = scoped(model, data=data)
    if s is None:
        check_model(data, full_check=True)
        return
    check_model(data)
    _cpp.infer_shapes(s.model.SerializeToString(), True, True, False)


def strict_inference(model: onnx.ModelProto) -> None:
    """The second part of `full_check` alone (for a view of a model whose weights are left out)."""
    data = model.SerializeToString()
    s = scoped(model, data=data)
    _cpp.infer_shapes(s.model.SerializeToString() if s is not None else data, True, True, False)


class Scoped:
    """A model's scoped form (`model`) and what `bodies_model` needs: each If's outer reads and branches."""

    def __init__(self, model: onnx.ModelProto, ifs: list[tuple[list[str], list[onnx.GraphProto]]],
                 source: onnx.ModelProto) -> None:
        self.model, self.ifs, self.source = model, ifs, source

    def bodies_model(self, inferred: onnx.ModelProto) -> onnx.ModelProto:
        """The branches of every If as one graph, their outer reads its inputs, typed as `inferred`
        (the scoped model, inferred) types them; inferring it types each branch's values as inferring
        the whole model would."""
        types = _main_types(inferred.graph)
        m = onnx.ModelProto()
        copy_fields(m, self.source, skip="graph")
        g = m.graph
        g.name = "bodies"
        seen: set[str] = set()
        for reads, bodies in self.ifs:
            for name in reads:
                if name not in seen:
                    seen.add(name)
                    vi = g.input.add(name=name)
                    if name in types:
                        vi.type.CopyFrom(types[name])
            for b in bodies:
                g.node.extend(b.node)
                g.initializer.extend(b.initializer)
                g.sparse_initializer.extend(b.sparse_initializer)
                g.output.extend(b.output)
                g.value_info.extend(b.value_info)
        return m


def scoped(model: onnx.ModelProto, data: bytes | None = None, always: bool = False) -> Scoped | None:
    """`model` (weights left out: it is only inferred) with each main-graph If in a scope of its
    own, or None when its main graph has fewer than MIN_NODES nodes or MIN_IFS If nodes (unless
    `always`) or a condition of the module's docstring fails. `data`: `model` serialized, if at
    hand (a model whose bytes do not spell "If" that often is let go without a step per node)."""
    mg = model.graph
    least = 1 if always else MIN_IFS
    if not always and len(mg.node) < MIN_NODES or data is not None and data.count(_IF_OP_TYPE) < least:
        return None
    if model.ir_version < 4 or any(o.domain == DOMAIN for o in model.opset_import) or \
            any(f.domain == DOMAIN for f in model.functions):
        return None
    nodes = mg.node[:]  # (`graph.free_names` says why [:])
    holders = [bool(n.attribute) and any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in n.attribute[:])
               for n in nodes]
    if sum(holders) < least or \
            not all(_plain_if(n) for n, holder in zip(nodes, holders) if holder):
        return None
    main_names = set(itertools.chain((vi.name for vi in mg.input), (vi.name for vi in mg.output),
                                     (vi.name for vi in mg.value_info), (t.name for t in mg.initializer),
                                     (t.values.name for t in mg.sparse_initializer)))
    for n in nodes:
        main_names.update(n.input[:])
        main_names.update(n.output[:])
    available = {vi.name for vi in mg.input} | {t.name for t in mg.initializer}  # (sparse ones: not read by branches)
    body_names: set[str] = set()
    scoped_model = onnx.ModelProto()
    scoped_model.CopyFrom(model)
    calls = scoped_model.graph.node
    functions: dict[tuple[int, int], onnx.FunctionProto] = {}
    ifs = []
    fresh = data is None or FRESH_DIM.encode() in data  # (else no branch holds one: not looked for in each)
    for i, (n, holder) in enumerate(zip(nodes, holders)):
        if holder:
            call = calls[i]
            walked = _outer_reads([a.g for a in call.attribute[:]], main_names, body_names, available, fresh)
            if walked is None:
                return None
            reads, readers = walked
            ifs.append((reads, [a.g for a in n.attribute[:]]))
            _make_call(call, reads, readers, functions, model.opset_import)
        available.update(n.output[:])
    scoped_model.functions.extend(functions.values())
    scoped_model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return Scoped(scoped_model, ifs, model)


def _plain_if(n: onnx.NodeProto) -> bool:
    """An If of the standard domain: one named condition, named outputs, two branches of no inputs."""
    attributes = n.attribute[:]  # (`graph.free_names` says why [:])
    return n.op_type == "If" and n.domain in ("", "ai.onnx") and len(n.input) == 1 and n.input[0] != "" and \
        all(n.output[:]) and len(attributes) == 2 and {a.name for a in attributes} == _BRANCHES and \
        all(a.type == AttributeProto.GRAPH and not a.g.input for a in attributes)


def _outer_reads(bodies: list[onnx.GraphProto], main_names: set[str], body_names: set[str],
                 available: set[str], fresh: bool = True) -> tuple[list[str], list[onnx.NodeProto]] | None:
    """The outer names the branches read, in order, and their nodes; None when a condition fails
    (`body_names` collects what every branch so far defines; `fresh`: whether the model may hold
    `unk__` at all)."""
    if fresh and any(FRESH_DIM.encode() in b.SerializeToString() for b in bodies):  # (a dim, or any other string)
        return None
    defined: list[str] = []
    annotated: list[str] = []
    reads: list[str] = []
    nodes: list[onnx.NodeProto] = []
    stack = list(bodies)
    while stack:
        sub = stack.pop()
        if sub.input or sub.initializer or sub.sparse_initializer:  # (an If branch: none of them)
            defined += [vi.name for vi in sub.input] + [t.name for t in sub.initializer] + \
                [t.values.name for t in sub.sparse_initializer]
        annotated += [vi.name for vi in sub.output[:]] + [vi.name for vi in sub.value_info[:]]
        sub_nodes = sub.node[:]  # (`graph.free_names` says why [:])
        nodes += sub_nodes
        for x in sub_nodes:
            defined += x.output[:]
            reads += x.input[:]
            for a in x.attribute[:]:
                if a.ref_attr_name:
                    return None
                if a.type == AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
    mine = set(defined)
    mine.discard("")
    if len(mine) != len(defined) - defined.count("") or not mine.isdisjoint(main_names) or \
            not mine.isdisjoint(body_names) or not mine.issuperset(annotated) or \
            any(name.startswith(PREFIX) for name in itertools.chain(mine, reads)):
        return None
    body_names |= mine
    outer = list(dict.fromkeys(r for r in reads if r and r not in mine))
    return (outer, nodes) if all(r in available for r in outer) else None


def _make_call(n: onnx.NodeProto, reads: list[str], readers: list[onnx.NodeProto],
               functions: dict[tuple[int, int], onnx.FunctionProto], opsets: list[onnx.OperatorSetIdProto]) -> None:
    """Turn If `n` (the scoped model's copy) into a call of its function (added to `functions`),
    its branches' nodes (`readers`, at every depth) renamed to read the formals."""
    formals = {name: f"{PREFIX}u{i}" for i, name in enumerate(reads)}
    key = (len(reads), len(n.output))
    if key not in functions:
        outputs = [f"{PREFIX}o{i}" for i in range(len(n.output))]
        inner = helper.make_node("If", [f"{PREFIX}c"], outputs)
        inner.attribute.extend(AttributeProto(name=a, ref_attr_name=a, type=AttributeProto.GRAPH) for a in sorted(_BRANCHES))
        f = onnx.FunctionProto(name=f"If_{key[0]}_{key[1]}", domain=DOMAIN, input=[f"{PREFIX}c", *formals.values()],
                               output=outputs, attribute=sorted(_BRANCHES))
        f.node.append(inner)
        f.opset_import.extend(opsets)
        functions[key] = f
    n.op_type, n.domain = functions[key].name, DOMAIN
    n.input.extend(reads)
    for x in readers:
        names = x.input[:]
        if not formals.keys().isdisjoint(names):
            for i, name in enumerate(names):
                if name in formals:
                    x.input[i] = formals[name]


def _main_types(g: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    """The type the main graph's inference holds for each name: a graph output's over an input's
    over an annotation's (the order onnx enters them in, later entries replacing earlier ones), and
    an initializer's own where nothing is declared."""
    types: dict[str, onnx.TypeProto] = {}
    for t in g.initializer:
        tp = onnx.TypeProto()
        tp.tensor_type.elem_type = t.data_type
        tp.tensor_type.shape.SetInParent()
        for d in t.dims:
            tp.tensor_type.shape.dim.add(dim_value=d)
        types[t.name] = tp
    for vi in itertools.chain(g.value_info, g.input, g.output):
        if vi.HasField("type"):
            types[vi.name] = vi.type
    return types
