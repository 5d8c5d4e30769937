"""Semantics-preserving mutations of an ONNX model: the rewrites a different exporter version, a
post-processing tool or a hand edit makes without changing what the model computes.

Each mutation is a pure, seeded function `(ModelProto, seed) -> ModelProto` (the input is never
modified); `MUTATIONS` names them. A mutation that finds nothing to change returns a model equal
to its input; one that cannot apply raises `NotApplicable`. `models/scripts/mutate_report.py`
checks every mutant against the original in onnxruntime (bit-identical outputs) before using it;
`tests/test_mutations.py` runs a handful on two corpus models.

Names: onnx scopes are nested (a body reads its outer graphs' values by name), so every walk here
goes through If/Loop/Scan bodies; model-local functions have their own scope and are left alone
except where a mutation says otherwise.
"""
from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

MutationFn = Callable[[onnx.ModelProto, int], onnx.ModelProto]


class NotApplicable(Exception):
    """The mutation has nothing to act on in this model (or onnx cannot do it, e.g. an opset)."""


# ---------------------------------------------------------------------------------------------
# walking graphs

def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def all_graphs(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`g` and every body under it, outer first."""
    yield g
    for n in g.node:
        for sg in subgraphs(n):
            yield from all_graphs(sg)


def free_names(g: onnx.GraphProto) -> set[str]:
    """Names a graph reads that it does not define (outer-scope captures of a body)."""
    defined = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    used: set[str] = set()
    for n in g.node:
        used.update(n.input)
        for sg in subgraphs(n):
            used |= free_names(sg)
        defined.update(n.output)
    used.update(o.name for o in g.output)
    return used - defined


def node_reads(n: onnx.NodeProto) -> set[str]:
    """What a node reads: its inputs and what its bodies capture."""
    r = {x for x in n.input if x}
    for sg in subgraphs(n):
        r |= free_names(sg)
    return r


def _rename_uses(g: onnx.GraphProto, old: str, new: str) -> None:
    """Every read of `old` in `g` and its bodies (bodies that define `old` themselves excepted)."""
    for n in g.node:
        for i, x in enumerate(n.input):
            if x == old:
                n.input[i] = new
        for sg in subgraphs(n):
            if old not in {i.name for i in sg.input} | {i.name for i in sg.initializer} | \
                    {o for m in sg.node for o in m.output}:
                _rename_uses(sg, old, new)


def _opset(m: onnx.ModelProto) -> int:
    return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)


def _types(m: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Value types of the main graph as onnx's shape inference sees them (best effort)."""
    try:
        inf = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:  # noqa: BLE001 (contrib ops, big models: whatever the model carries)
        inf = m
    out: dict[str, onnx.TypeProto] = {}
    for v in list(inf.graph.value_info) + list(inf.graph.input) + list(inf.graph.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
            out[v.name] = v.type
    for i in inf.graph.initializer:
        out[i.name] = helper.make_tensor_type_proto(i.data_type, list(i.dims))
    return out


def _elem_only(t: onnx.TypeProto) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(t.tensor_type.elem_type, None)


def _with_shape(t: onnx.TypeProto) -> onnx.TypeProto:
    """A graph output's type: onnx's checker wants a shape field (its dims may be unknown)."""
    t = copy.deepcopy(t)
    if not t.tensor_type.HasField("shape"):
        t.tensor_type.shape.SetInParent()
    return t


# ---------------------------------------------------------------------------------------------
# renames

def _namer(style: str, rng: random.Random) -> Callable[[str], str]:
    used: set[str] = set()

    def fresh(old: str) -> str:
        while True:
            k = rng.randrange(10 ** 6)
            if style == "random":
                name = f"v{k:x}"
            elif style == "long":
                name = "/model/layers.0/self_attn/" + "very_long_segment_" * 12 + f"{k}/output_0"
            elif style == "unicode":
                name = f"ᚠ値_{k}_ß∂ø/ü:{old[-6:]}"
            elif style == "prefix":  # dmlgraph's own prefixes, and names that are each other's suffixes
                name = rng.choice(["dmlgraph__", "__dm_", "_dm", "dmlgraph__band_", "__dm_mask_", "_dm_"]) + \
                    rng.choice(["", "0", "1", "_0", "band", "mask_0", str(k % 7)]) + ("_1" * rng.randrange(3))
            else:
                raise ValueError(style)
            if name in used:  # the prefix style's few names: each other's suffixes after the first
                name = f"{name}_{len(used)}"
            if name not in used:
                used.add(name)
                return name

    return fresh


def rename(m: onnx.ModelProto, seed: int, style: str = "random") -> onnx.ModelProto:
    """Every value name that is not a main-graph input or output, and every node name, in the main
    graph and its bodies (one map: a body reads outer names), initializers and value_info alike."""
    m = copy.deepcopy(m)
    rng = random.Random(seed)
    fresh = _namer(style, rng)
    keep = {i.name for i in m.graph.input} | {o.name for o in m.graph.output} | {""}
    names: dict[str, str] = {}
    for g in all_graphs(m.graph):
        for v in [i.name for i in g.input] + [i.name for i in g.initializer] + \
                [o for n in g.node for o in n.output] + [o.name for o in g.output]:
            if v not in keep and v not in names:
                names[v] = fresh(v)
    for g in all_graphs(m.graph):
        for n in g.node:
            n.input[:] = [names.get(x, x) for x in n.input]
            n.output[:] = [names.get(x, x) for x in n.output]
            n.name = fresh(n.name or n.op_type)
        for coll in (g.input, g.output, g.value_info):
            for v in coll:
                v.name = names.get(v.name, v.name)
        for t in g.initializer:
            t.name = names.get(t.name, t.name)
    return m


# ---------------------------------------------------------------------------------------------
# constants

def initializers_to_constants(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Every initializer (not also a graph input) of every graph becomes a Constant node at the
    front of its graph (TorchScript's form); `seed` unused."""
    m = copy.deepcopy(m)
    for g in all_graphs(m.graph):
        inputs = {i.name for i in g.input}
        moved = [t for t in g.initializer if t.name not in inputs]
        if not moved:
            continue
        consts = [helper.make_node("Constant", [], [t.name], name=f"{t.name}__const", value=t) for t in moved]
        keep = [t for t in g.initializer if t.name in inputs]
        del g.initializer[:]
        g.initializer.extend(keep)
        nodes = list(g.node)
        del g.node[:]
        g.node.extend(consts + nodes)
    return m


def constants_to_initializers(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Every Constant node holding a `value` tensor, in every graph, becomes an initializer of its
    graph (the dynamo exporter's form); `seed` unused."""
    m = copy.deepcopy(m)
    for g in all_graphs(m.graph):
        nodes = []
        for n in g.node:
            a = n.attribute[0] if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and \
                len(n.attribute) == 1 else None
            if a is not None and a.name == "value" and a.t.data_location != onnx.TensorProto.EXTERNAL:
                t = copy.deepcopy(a.t)
                t.name = n.output[0]
                g.initializer.append(t)
            else:
                nodes.append(n)
        del g.node[:]
        g.node.extend(nodes)
    return m


def constant_attribute_forms(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Constant nodes (every graph; initializers first made Constants) whose value is a scalar or
    1-D int64 / float32 tensor written as value_int / value_ints / value_float / value_floats."""
    m = initializers_to_constants(m, seed)
    for g in all_graphs(m.graph):
        for n in g.node:
            if n.op_type != "Constant" or len(n.attribute) != 1 or n.attribute[0].name != "value":
                continue
            t = n.attribute[0].t
            if t.data_location == onnx.TensorProto.EXTERNAL or len(t.dims) > 1:
                continue
            a = numpy_helper.to_array(t)
            if a.ndim == 1 and a.size == 0:
                continue  # value_ints=[] is an empty attribute list, which onnx reads as unset
            if a.dtype == np.int64:
                attr = helper.make_attribute("value_int" if a.ndim == 0 else "value_ints",
                                             int(a) if a.ndim == 0 else [int(x) for x in a])
            elif a.dtype == np.float32 and a.ndim == 0 and np.isfinite(a) and float(np.float32(float(a))) == float(a):
                attr = helper.make_attribute("value_float", float(a))
            elif a.dtype == np.float32 and a.ndim == 1 and a.size and np.isfinite(a).all():
                attr = helper.make_attribute("value_floats", [float(x) for x in a])
            else:
                continue
            del n.attribute[:]
            n.attribute.append(attr)
    return m


def _tensor_key(t: onnx.TensorProto) -> tuple:
    return (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes())


def duplicate_shared_constants(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Each initializer of the main graph read by more than one node gets one copy per reader."""
    m = copy.deepcopy(m)
    g = m.graph
    inits = {t.name: t for t in g.initializer if t.name not in {i.name for i in g.input}}
    outs = {o.name for o in g.output}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in g.node:
        for k, x in enumerate(n.input):
            if x in inits:
                readers.setdefault(x, []).append((n, k))
    for name, uses in readers.items():
        if len(uses) < 2 or name in outs or inits[name].data_location == onnx.TensorProto.EXTERNAL:
            continue
        for j, (n, k) in enumerate(uses[1:], 1):
            t = copy.deepcopy(inits[name])
            t.name = f"{name}__copy{j}"
            g.initializer.append(t)
            n.input[k] = t.name
    return m


def merge_duplicate_constants(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Initializers of the main graph with equal dtype, shape and bytes become one (the first)."""
    m = copy.deepcopy(m)
    g = m.graph
    protected = {i.name for i in g.input} | {o.name for o in g.output}
    first: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    for t in g.initializer:
        if t.name in protected or t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        k = _tensor_key(t)
        if k in first:
            alias[t.name] = first[k]
        else:
            first[k] = t.name
    if not alias:
        return m
    kept = [t for t in g.initializer if t.name not in alias]
    del g.initializer[:]
    g.initializer.extend(kept)
    for old, new in alias.items():
        _rename_uses(g, old, new)
    kept_vi = [v for v in g.value_info if v.name not in alias]
    del g.value_info[:]
    g.value_info.extend(kept_vi)
    return m


# ---------------------------------------------------------------------------------------------
# Identity, order

PREPACKED = {"MatMul", "Gemm", "Conv", "ConvTranspose", "MatMulInteger", "QLinearMatMul", "MatMulNBits",
             "DynamicQuantizeMatMul", "Attention", "GroupQueryAttention", "MultiHeadAttention", "LSTM", "GRU", "RNN"}


def insert_identities(m: onnx.ModelProto, seed: int, fraction: float = 0.3) -> onnx.ModelProto:
    """An Identity on a random `fraction` of the edges (a node input) of every graph, bodies
    included, and one before a main-graph output."""
    m = copy.deepcopy(m)
    rng = random.Random(seed)
    count = 0
    for g in all_graphs(m.graph):
        nodes = []
        for n in g.node:
            for k, x in enumerate(n.input):
                if k and n.op_type in PREPACKED:
                    continue  # a weight behind an Identity is not prepacked: onnxruntime rounds differently
                if x and rng.random() < fraction:
                    count += 1
                    y = f"{x}__id{count}"
                    nodes.append(helper.make_node("Identity", [x], [y], name=f"mut_identity_{count}"))
                    n.input[k] = y
            nodes.append(n)
        del g.node[:]
        g.node.extend(nodes)
    g = m.graph
    produced = {o: n for n in g.node for o in n.output}
    outs = [o for o in g.output if o.name in produced]
    if outs:
        o = rng.choice(outs).name
        node = produced[o]
        y = f"{o}__pre_output"
        node.output[list(node.output).index(o)] = y
        _rename_uses(g, o, y)
        g.node.append(helper.make_node("Identity", [y], [o], name="mut_identity_output"))
        for v in g.value_info:
            if v.name == o:
                v.name = y
    return m


def remove_identities(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Every Identity whose output is not a graph output, in every graph, bypassed and removed."""
    m = copy.deepcopy(m)
    for g in all_graphs(m.graph):
        outs = {o.name for o in g.output}
        for n in [n for n in g.node if n.op_type == "Identity" and n.domain in ("", "ai.onnx")]:
            if n.output[0] in outs or not n.input[0]:
                continue
            g.node.remove(n)
            _rename_uses(g, n.output[0], n.input[0])
            kept = [v for v in g.value_info if v.name != n.output[0]]
            del g.value_info[:]
            g.value_info.extend(kept)
    return m


def shuffle_nodes(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Every graph's nodes (bodies too) in a random topological order."""
    m = copy.deepcopy(m)
    rng = random.Random(seed)
    for g in all_graphs(m.graph):
        nodes = list(g.node)
        producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
        deps = [{producer[x] for x in node_reads(n) if x in producer} for n in nodes]
        users: list[list[int]] = [[] for _ in nodes]
        for i, d in enumerate(deps):
            for j in d:
                users[j].append(i)
        missing = [len(d) for d in deps]
        ready = [i for i, k in enumerate(missing) if k == 0]
        order = []
        while ready:
            i = ready.pop(rng.randrange(len(ready)))
            order.append(i)
            for u in users[i]:
                missing[u] -= 1
                if missing[u] == 0:
                    ready.append(u)
        if len(order) != len(nodes):
            raise NotApplicable("the graph's nodes are not in any topological order (a cycle)")
        del g.node[:]
        g.node.extend(nodes[i] for i in order)
    return m


# ---------------------------------------------------------------------------------------------
# opset, value_info, dims

def convert_opset(m: onnx.ModelProto, seed: int, target: int | None = None) -> onnx.ModelProto:
    """onnx.version_converter to `target` (else one of 14..22 other than the model's, by seed)."""
    here = _opset(m)
    if target is None:
        target = random.Random(seed).choice([v for v in range(14, 23) if v != here])
    if target == here:
        raise NotApplicable(f"already opset {here}")
    try:
        out = onnx.version_converter.convert_version(m, target)
    except Exception as e:
        raise NotApplicable(f"onnx.version_converter to {target}: {str(e).splitlines()[0][:200]}") from e
    if out.ir_version > m.ir_version:
        out.ir_version = m.ir_version
    return out


def strip_value_info(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """No value_info in any graph (main and bodies)."""
    m = copy.deepcopy(m)
    for g in all_graphs(m.graph):
        del g.value_info[:]
    return m


def _inferred(m: onnx.ModelProto) -> onnx.ModelProto:
    """The model with onnx's inferred value_info where it has none (as onnxsim leaves it)."""
    if len(m.graph.value_info):
        return copy.deepcopy(m)
    try:
        return onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception as e:
        raise NotApplicable(f"no value_info and onnx cannot infer it: {str(e)[:100]}") from e


def _vi_dims(m: onnx.ModelProto) -> Iterator[onnx.TensorShapeProto.Dimension]:
    for g in all_graphs(m.graph):
        for v in g.value_info:
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
                yield from v.type.tensor_type.shape.dim


def rename_dims(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Every dim_param of the internal values' value_info renamed (one map; inputs keep theirs)."""
    m = _inferred(m)
    rng = random.Random(seed)
    names: dict[str, str] = {}
    for d in _vi_dims(m):
        if d.dim_param:
            d.dim_param = names.setdefault(d.dim_param, f"mut_dim_{rng.randrange(10 ** 6)}")
    return m


def unknown_dims(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Half the internal values' dims (by seed) made unknown (neither value nor param)."""
    m = _inferred(m)
    rng = random.Random(seed)
    for d in _vi_dims(m):
        if rng.random() < 0.5:
            d.Clear()
    return m


def symbolic_dims(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Every static dim of the internal values' value_info made a fresh dim_param."""
    m = _inferred(m)
    k = 0
    for d in _vi_dims(m):
        if d.HasField("dim_value"):
            k += 1
            d.dim_param = f"mut_static_{k}"
    return m


# ---------------------------------------------------------------------------------------------
# regions, outputs, extras

MASK_OPS = {"Trilu", "Where", "And", "Or", "Not", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal",
            "EyeLike", "Range", "Expand", "Add", "Mul", "Cast", "Unsqueeze", "ConstantOfShape", "Sub"}


def _pick(g: onnx.GraphProto, rng: random.Random, prefer: tuple[str, ...]) -> int:
    """Index of a main-graph node: one named in `prefer` (a rewrite's nodes), else a mask-like op."""
    idx = [i for i, n in enumerate(g.node) if n.name and n.name in prefer]
    idx = idx or [i for i, n in enumerate(g.node) if n.op_type in MASK_OPS and not list(subgraphs(n))]
    if not idx:
        raise NotApplicable("no mask-like node in the main graph")
    return rng.choice(idx)


def expose_intermediate(m: onnx.ModelProto, seed: int, prefer: tuple[str, ...] = ()) -> onnx.ModelProto:
    """A mask intermediate (an output of a node in `prefer`, else of a mask-like op) made an extra
    graph output, typed by onnx's shape inference."""
    m = copy.deepcopy(m)
    rng = random.Random(seed)
    types = _types(m)
    outs = {o.name for o in m.graph.output} | {i.name for i in m.graph.input}
    cands = [i for i, n in enumerate(m.graph.node) if n.name in prefer and n.output[0] in types
             and n.output[0] not in outs] or \
        [i for i, n in enumerate(m.graph.node) if n.op_type in MASK_OPS and n.output and n.output[0] in types
         and n.output[0] not in outs]
    if not cands:
        raise NotApplicable("no typed mask-like value to expose")
    v = m.graph.node[rng.choice(cands)].output[0]
    m.graph.output.append(helper.make_value_info(v, _with_shape(types[v])))
    return m


def _region(m: onnx.ModelProto, seed: int, prefer: tuple[str, ...], size: int) -> tuple[int, int, set[str], list[str]]:
    """A run of main-graph nodes [a, b) around a mask node: the values it reads from outside
    (graph inputs, initializers, earlier nodes) and those read after it or by the graph's outputs."""
    g = m.graph
    rng = random.Random(seed)
    i = _pick(g, rng, prefer)
    a, b = max(0, i - rng.randrange(size)), min(len(g.node), i + 1 + rng.randrange(size))
    inside = g.node[a:b]
    made = {o for n in inside for o in n.output if o}
    reads = set().union(*(node_reads(n) for n in inside)) - made
    later = set().union(*(node_reads(n) for n in g.node[b:]), {o.name for o in g.output})
    outs = [o for n in inside for o in n.output if o in later]
    if not outs:
        raise NotApplicable("the region's values are not used after it")
    return a, b, reads, outs


def wrap_in_if(m: onnx.ModelProto, seed: int, prefer: tuple[str, ...] = ()) -> onnx.ModelProto:
    """A run of main-graph nodes around a mask node moved into both branches of If(Constant true)
    (the else branch a copy under other names); the If's outputs keep the values' names."""
    m = copy.deepcopy(m)
    types = _types(m)
    a, b, _, outs = _region(m, seed, prefer, 4)
    if any(o not in types for o in outs):
        raise NotApplicable("a value leaving the region has no type")
    if any(list(subgraphs(n)) for n in m.graph.node[a:b]):
        raise NotApplicable("a region with a body (its captures would need renaming)")
    g = m.graph
    region = list(g.node[a:b])

    def branch(tag: str) -> onnx.GraphProto:
        body = onnx.GraphProto(name=f"mut_if_{tag}")
        made = {o for n in region for o in n.output if o}
        for n in region:
            c = copy.deepcopy(n)
            c.input[:] = [f"{x}__{tag}" if x in made else x for x in c.input]
            c.output[:] = [f"{x}__{tag}" if x else x for x in c.output]
            c.name = f"{n.name}__{tag}" if n.name else ""
            body.node.append(c)
        body.output.extend(helper.make_value_info(f"{o}__{tag}", _elem_only(types[o])) for o in outs)
        return body

    cond = f"mut_if_cond_{seed}"
    new = [helper.make_node("Constant", [], [cond], name=cond, value=numpy_helper.from_array(np.array(True))),
           helper.make_node("If", [cond], outs, name=f"mut_if_{seed}", then_branch=branch("then"),
                            else_branch=branch("else"))]
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(nodes[:a] + new + nodes[b:])
    return m


def wrap_in_function(m: onnx.ModelProto, seed: int, prefer: tuple[str, ...] = ()) -> onnx.ModelProto:
    """A run of main-graph nodes around a mask node made a model-local function called once."""
    m = copy.deepcopy(m)
    a, b, reads, outs = _region(m, seed, prefer, 4)
    g = m.graph
    region = list(g.node[a:b])
    if any(list(subgraphs(n)) for n in region):
        raise NotApplicable("a region with a body (its captures would need the function's inputs)")
    ins = sorted(reads)
    domain = "mutate.local"
    fn = helper.make_function(domain, f"region_{seed}", ins, outs, copy.deepcopy(region),
                              [o for o in m.opset_import if o.domain != domain])
    m.functions.append(fn)
    if all(o.domain != domain for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid(domain, 1))
    call = helper.make_node(fn.name, ins, outs, name=f"mut_call_{seed}", domain=domain)
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(nodes[:a] + [call] + nodes[b:])
    made = {o for n in region for o in n.output}
    kept = [v for v in g.value_info if v.name not in made or v.name in outs]
    del g.value_info[:]
    g.value_info.extend(kept)
    return m


def add_unused(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """An unused node (Shape of a random value, its output read by nothing) and an extra graph
    output (an Identity of a graph input)."""
    m = copy.deepcopy(m)
    rng = random.Random(seed)
    g = m.graph
    vals = [o for n in g.node for o in n.output if o] + [i.name for i in g.input]
    if not vals or not g.input:
        raise NotApplicable("no values")
    g.node.append(helper.make_node("Shape", [rng.choice(vals)], ["mut_unused_shape"], name="mut_unused"))
    x = rng.choice(list(g.input))
    g.node.append(helper.make_node("Identity", [x.name], ["mut_extra_output"], name="mut_extra"))
    g.output.append(helper.make_value_info("mut_extra_output", copy.deepcopy(x.type)))
    return m


MUTATIONS: dict[str, MutationFn] = {
    "rename_random": lambda m, s: rename(m, s, "random"),
    "rename_long": lambda m, s: rename(m, s, "long"),
    "rename_unicode": lambda m, s: rename(m, s, "unicode"),
    "rename_prefix": lambda m, s: rename(m, s, "prefix"),
    "init_to_constant": initializers_to_constants,
    "constant_to_init": constants_to_initializers,
    "constant_forms": constant_attribute_forms,
    "identity_insert": insert_identities,
    "identity_remove": remove_identities,
    "shuffle": shuffle_nodes,
    "opset": convert_opset,
    "value_info_strip": strip_value_info,
    "dims_renamed": rename_dims,
    "dims_unknown": unknown_dims,
    "dims_symbolic": symbolic_dims,
    "expose_mask": expose_intermediate,
    "wrap_if": wrap_in_if,
    "wrap_function": wrap_in_function,
    "add_unused": add_unused,
    "constants_duplicated": duplicate_shared_constants,
    "constants_merged": merge_duplicate_constants,
}
# mutations that take the names of a rewrite's nodes (the mask cone) to aim at
AIMED = {"expose_mask": expose_intermediate, "wrap_if": wrap_in_if, "wrap_function": wrap_in_function}
