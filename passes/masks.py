"""Masks computed only from shapes become DIAGONAL_MATRIX1 generators.

`mask_subgraph`: a data-free value that is a band becomes one generator sized from the same shapes
at run time. At static shapes the subgraph is evaluated; with symbolic dims `symbolic` proves it for
every size, and what the proof cannot cover is declined with the reason. More: docs/internals.md, passes/masks.py.
"""
from __future__ import annotations

import math
from typing import cast

import numpy as np
import onnx
from onnx import helper

from dmlgraph.io.onnx_io import onnx_node_proto
from dmlgraph.io.shape_inference import infer_shapes
from dmlgraph.ir.band import BandPattern
from dmlgraph.ir.graph import DmlNode, Graph, Node, OnnxNode, Value
from dmlgraph.passes.common import const_value, lowering_reason, standin
from dmlgraph.passes.data_free import (
    INDEX_OPS,
    MASK_OPS,
    SHAPE_OPS,
    DataFree,
    ancestors,
    data_free_of,
    subgraph_target,
)
from dmlgraph.passes.generators import band_of, generator, is_plus_zero, pattern_bounds
from dmlgraph.passes.sizes import Made, SizeBuilder, constant, locate
from dmlgraph.passes.symbolic import (
    DIM_MAX,
    Analysis,
    Band,
    Lin,
    NotAMask,
    Opaque,
    SizedFill,
    Unprovable,
    render_dim,
    sized_fill,
)
from dmlgraph.passes.symbolic_ops import evaluate
from dmlgraph.passes.tails import tails_unproved
from dmlgraph.process import address_space_headroom
from dmlgraph.rewrite import Context, Match, Options, Replacement, Rule
from dmlgraph.runtime.onnx_runner import OnnxRunner, numpy_dtype


def _input_shape(v: Value) -> tuple[int | str, ...]:
    """The shape of an input feeding the subgraph: `_match_subgraph` declined any not fully known."""
    return cast("tuple[int | str, ...]", v.shape)


def _input_type(v: Value) -> int:
    """The element type of an input feeding the subgraph: `_too_big_to_evaluate` declined any unknown."""
    return cast(int, v.elem_type)


def _sample_shape(v: Value, dims: dict[str, int]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else dims[d] for d in _input_shape(v))


def _mask_model(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value,
                dims: dict[str, int]) -> onnx.ModelProto:
    """The subgraph as a model whose inputs have the sample's concrete shapes."""
    infos = [helper.make_tensor_value_info(v.name, _input_type(v), list(_sample_shape(v, dims))) for v in inputs]
    inits: list[onnx.TensorProto] = []
    for n in nodes:
        for v in n.inputs:
            if v is not None and graph.stored(v) and all(t.name != v.name for t in inits):
                inits.append(onnx.numpy_helper.from_array(np.asarray(const_value(graph, v)), v.name))
    # (a DmlNode in `nodes` has no ONNX form: onnx_node_proto raises AttributeError on it)
    g = helper.make_graph([onnx_node_proto(cast(OnnxNode, n)) for n in nodes], "mask", infos,
                          [helper.make_tensor_value_info(target.name, target.elem_type or 0, None)], inits)
    opsets = [helper.make_opsetid(d, v) for d, v in graph.info.opset_imports.items() if d in ("", "ai.onnx")]
    return helper.make_model(g, opset_imports=opsets, ir_version=graph.info.ir_version)


EVAL_HEADROOM = 4 << 30  # bytes of address space one mask evaluation may add


def value_digest(graph: Graph, v: Value) -> tuple:
    """Equal digests, equal constants. Inline raw data is hashed as stored (type, dims, bytes: no
    decoding); anything else as its decoded array."""
    import hashlib  # (here: loading OpenSSL costs a model with no stored mask to compare ~1% of its run)
    t = v.initializer
    if t is not None and v.array is None and t.HasField("raw_data") and v.name not in graph.overridable_inputs \
            and t.data_location != onnx.TensorProto.EXTERNAL:
        raw = t.raw_data  # (a small index constant is its own digest)
        return "raw", t.data_type, tuple(t.dims[:]), raw if len(raw) <= 64 else hashlib.sha256(raw).hexdigest()
    arr = np.asarray(const_value(graph, v))
    data = onnx.numpy_helper.from_array(arr).SerializeToString() if arr.dtype == object else arr.tobytes()
    return "array", arr.dtype.str, arr.shape, hashlib.sha256(data).hexdigest()


def _evaluate(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value,
              dims: dict[str, int]) -> np.ndarray:
    model = _mask_model(graph, nodes, inputs, target, dims)
    # Only the shapes of these inputs are read: zeros (calloc'd, pages untouched) stand in.
    feeds = {v.name: np.zeros(_sample_shape(v, dims), numpy_dtype(_input_type(v))) for v in inputs}
    with address_space_headroom(EVAL_HEADROOM):
        return np.asarray(OnnxRunner(model, threads=1).run(feeds)[0])


def _predicted_elements(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value,
                        dims: dict[str, int]) -> int | None:
    """The output's element count at `dims` by shape inference (None when it cannot tell)."""
    for vi in infer_shapes(_mask_model(graph, nodes, inputs, target, dims)).graph.output:
        dims_out = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims_out):
            return math.prod(d.dim_value for d in dims_out)
    return None


def cone_signature(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value, symbolic: list[str]) -> tuple:
    """Everything `_verdict` depends on, with value names replaced by positions (the target's
    inferred shape aside: it only says whether evaluating is affordable, the same for copies).

    Two copies of one mask subgraph (as exporters emit per layer) get the same signature, so the
    evaluations of one serve the other. It holds: each node's op type, domain, attributes (Constant
    values included) and, for each input, where it comes from (which node and output of the
    subgraph, which shape-read input, and for a stored constant a digest of its tensor); each
    shape-read input's type and sizes, a symbolic dim written as its rank in `symbolic` (the order
    in which `dim_sets` gives dims their sizes); the target's type and position; the opsets.
    """
    position = {n.id: i for i, n in enumerate(nodes)}
    input_index = {id(v): i for i, v in enumerate(inputs)}
    digests: dict[str, tuple] = {}

    def ref(v: Value | None) -> tuple | None:
        if v is None:
            return None
        p = v.producer
        made = (position[p.id], p.outputs.index(v)) if p is not None and p.id in position else None
        if graph.stored(v) and v.name not in digests:
            digests[v.name] = value_digest(graph, v)
        return made, input_index.get(id(v)), digests.get(v.name)

    node_part = tuple((n.op_type, n.domain, _node_attributes(n), tuple(ref(v) for v in n.inputs), len(n.outputs))
                      for n in nodes)
    input_part = tuple((v.elem_type, tuple(d if isinstance(d, int) else ("dim", d) for d in _input_shape(v)))
                       for v in inputs)
    opsets = tuple(sorted((d, v) for d, v in graph.info.opset_imports.items() if d in ("", "ai.onnx")))
    return node_part, input_part, (ref(target), target.elem_type or 0), opsets, graph.info.ir_version


def _node_attributes(n: Node) -> tuple:
    """What a node computes besides its inputs: an ONNX node's attributes, a DML node's fill."""
    if isinstance(n, DmlNode):
        return (n.kind, n.elem_type, np.asarray(n.value).tobytes(), n.begin, n.end, n.static_shape)
    assert isinstance(n, OnnxNode)
    return tuple(a.SerializeToString(deterministic=True) for a in n.attributes)


# A mask subgraph is proven by evaluating it, which materializes the mask (and onnxruntime's int64
# intermediates of the same size). A known output or input above MAX_EVAL_ELEMENTS is declined
# instead: a corrupt or absurd dim (70000, 2^40) must not make optimize allocate gigabytes.
# 8192 positions (a 64M-element mask) still evaluate.
MAX_EVAL_ELEMENTS = 8192 * 8192


def _too_big_to_evaluate(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value) -> str | None:
    """Why evaluating this static mask subgraph would allocate too much (None: evaluate it).

    The inputs fed and the output are bounded by MAX_EVAL_ELEMENTS: from the output's dims when
    they are known, else from shape inference. When neither can tell, the evaluation still runs
    under an address-space cap (`dmlgraph.process.address_space_headroom`).
    """
    if any(v.elem_type is None or any(isinstance(d, int) and d < 0 for d in _input_shape(v)) for v in inputs):
        return "an input feeding it has an unknown type or a negative dim"
    fed = sum(math.prod(cast("tuple[int, ...]", v.shape)) for v in inputs)  # static: no symbolic dim
    if fed > MAX_EVAL_ELEMENTS:
        return f"the tensors whose shapes feed it hold {fed} elements, too many to evaluate it"
    if target.shape is not None and all(isinstance(d, int) for d in target.shape):
        n = math.prod(cast("tuple[int, ...]", target.shape))
        if n > MAX_EVAL_ELEMENTS:
            return (f"its output {list(target.shape)} is too large to evaluate to prove it "
                    f"(limit {MAX_EVAL_ELEMENTS} elements)")
        return None
    predicted = _predicted_elements(graph, nodes, inputs, target, {})
    if predicted is not None and predicted > MAX_EVAL_ELEMENTS:
        return f"its output would hold {predicted} elements, too many to evaluate it (limit {MAX_EVAL_ELEMENTS})"
    return None  # size unknown: the evaluation runs under an address-space cap


def _stored_matrix(graph: Graph, v: Value | None) -> bool:
    """A stored constant of 2+ dims: an initializer, or a Constant node's output (how a local
    function or a body holds one)."""
    return v is not None and len(v.shape or ()) >= 2 and (
        (v.producer is None and graph.stored(v))
        or (isinstance(v.producer, OnnxNode) and v.producer.op_type == "Constant"))


def _reads_stored_matrix(graph: Graph, nodes: list[Node]) -> bool:
    """Some node of the subgraph reads a stored matrix (a mask buffer sliced or split)."""
    return any(_stored_matrix(graph, v) for n in nodes for v in n.inputs)


def _match_subgraph(ctx: Context, node: Node) -> Match | None:
    graph, options = ctx.graph, ctx.options
    if not isinstance(node, OnnxNode) or node.op_type in SHAPE_OPS or node.op_type == "Constant":
        return None
    df = data_free_of(ctx)
    if not node.outputs or not df.is_free(node.outputs[0]):
        return None
    target = subgraph_target(graph, node)
    if any(o.uses or graph.is_graph_output(o) for o in node.outputs if o is not target):
        return None  # (one part of a Split of many used): replacing the node would leave the others unmade
    # Only the frontier: where a data-free value meets data (or leaves the graph).
    if not graph.is_graph_output(target) and target.name not in graph.body_reads() and \
            all(c.outputs and df.is_free(c.outputs[0]) and isinstance(c, OnnxNode) for c in target.consumers):
        return None
    if target.shape is not None and len(target.shape) < 2:
        return None
    nodes, inputs = ancestors(target)
    if not (any(n.op_type in MASK_OPS or isinstance(n, DmlNode) for n in nodes) or
            _reads_stored_matrix(graph, nodes)):
        return None  # no mask-making op, lowered mask nor stored matrix: not a mask (weights, reshapes)
    m = Match("mask_subgraph", nodes)
    symbolic = sorted({d for v in inputs for d in (v.shape or ()) if isinstance(d, str)}, key=str)
    if any(v.shape is None or None in v.shape for v in inputs):
        m.reason = "an input feeding the mask has an unknown shape"
        return m
    # Copies of one subgraph (exporters emit one per layer) share a signature, and so a verdict.
    verdicts = ctx.analysis(Verdicts)
    signature = cone_signature(graph, nodes, inputs, target, symbolic)
    verdict = verdicts.get(signature)
    if verdict is None:
        verdict = verdicts[signature] = _verdict(graph, nodes, inputs, target, symbolic, df)
    if verdict[0] == "symbolic" and len(verdict) > 2:  # rows [-S:]: each reader must prove S = 0 harmless
        why = tails_unproved(ctx, target, verdict[1].shape, verdict[2], inputs)
        if why is not None:
            verdict = verdict[3]
            if verdict[0] == "decline":
                verdict = "decline", f"{verdict[1]}; {why}"
    if verdict[0] == "none":
        m.reason = _no_band_reason(graph, nodes, target)
        return m if m.reason else None
    if verdict[0] == "decline":
        m.reason = verdict[1]
        return m
    if verdict[0] == "symbolic":
        return _finish_sized(graph, m, target, verdict[1], inputs, options)
    if verdict[0] == "inner":
        pos, i, fill = verdict[1][0]
        inner = nodes[pos].outputs[i]
        inner_nodes, inner_inputs = ancestors(inner)
        return _finish_sized(graph, Match("mask_subgraph", inner_nodes), inner, fill, inner_inputs, options)
    _, p, sample, _ = verdict
    return _finish(graph, m, target, p, sample, None, options)


COMPARING_OPS = {"Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "Trilu", "EyeLike"}


def _makes_mask(n: Node) -> bool:
    """A comparison, Trilu or EyeLike over a matrix, or a mask lowered already."""
    return isinstance(n, DmlNode) or (n.op_type in COMPARING_OPS and (n.outputs[0].shape is None or
                                                                     len(n.outputs[0].shape) >= 2))


def _reads_stored_band(graph: Graph, nodes: list[Node]) -> bool:
    """Some node of the subgraph reads a stored band buffer (what the census counts as a mask)."""
    return any(_stored_matrix(graph, v) and (c := const_value(graph, v)) is not None
               and band_of(np.asarray(c)) is not None for n in nodes for v in n.inputs)


def _no_band_reason(graph: Graph, nodes: list[Node], target: Value) -> str | None:
    """Why a shape-only mask (a comparison, Trilu, EyeLike or stored band in its cone) is not lowered,
    so that `inspect` lists it as declined instead of passing over it; None for other shape-only
    values (rotary tables, position ids, sliced weights), which are no masks."""
    if not any(_makes_mask(n) for n in nodes) and not _reads_stored_band(graph, nodes):
        return None  # (a 1-D Equal is shape plumbing: TorchScript's "-1 means keep" of expand)
    outside = next((n for n in nodes if n.op_type not in INDEX_OPS), None)
    if outside is not None:
        return (f"its cone uses {outside.op_type} {outside.name!r}, which the size analysis does not cover, so no "
                "band can be proved for every size")
    return "it is not one band: one value everywhere, or not one diagonal fill"


class Verdicts(dict):
    """The run's verdict per mask-cone signature (a context analysis, `ctx.analysis(Verdicts)`):
    exporters emit one copy of a cone per layer, and the copies share a signature."""

    def __init__(self, graph: Graph):
        super().__init__()


def _verdict(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value, symbolic: list[str],
             df: DataFree, max_dim: int = DIM_MAX) -> tuple:
    """What the subgraph is: ("band", pattern, the evaluated array, None) at static sizes (evaluated
    exactly at the one size it has), ("symbolic", SizedBand) when its sizes vary (proved for every
    size by `dmlgraph.passes.symbolic`), ("decline", reason) or ("none",) (not a mask). Everything it reads
    is in the subgraph's `cone_signature`."""
    if symbolic or any(isinstance(n, DmlNode) for n in nodes):  # (a lowered node has no ONNX form to evaluate)
        verdict = symbolic_verdict(graph, nodes, inputs, target, max_dim)
        if df.index_only(target) or verdict[0] == "inner" or \
                (verdict[0] == "decline" and any(_makes_mask(n) for n in nodes)):
            return verdict
        return ("none",)  # data-free, not an index computation (weights reshaped by sizes...), no band inside
    too_big = _too_big_to_evaluate(graph, nodes, inputs, target)
    if too_big:
        return "decline", too_big
    try:
        sample = _evaluate(graph, nodes, inputs, target, {})
    except Exception as e:  # noqa: BLE001 - a subgraph that cannot run is not a mask we can prove
        if isinstance(e, MemoryError) or "alloc" in str(e).lower():
            return "decline", (f"evaluating it to prove the band needs more than {EVAL_HEADROOM >> 30} GiB "
                               "(a static dim of the inputs feeding it is too large)")
        return ("none",)
    sample.setflags(write=False)  # kept in the verdict, shared by every copy
    p = band_of(sample)
    if p is None:
        return ("none",)
    return "band", p, sample, None


INDEX_READERS = {"Gather": 1, "GatherND": 1, "GatherElements": 1, "ScatterND": 1, "ScatterElements": 1}


def _only_indices(v: Value) -> bool:
    """Every use of v's data is as the indices of a gather or scatter (its shape may be read too)."""
    data_uses = [(n, i) for n, i in v.uses if n.op_type not in SHAPE_OPS]
    return bool(data_uses) and all(INDEX_READERS.get(n.op_type) == i for n, i in data_uses)


def symbolic_verdict(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value, max_dim: int) -> tuple:
    """`_band_verdict`, taking rows [-S:] as [max(N - S, 0):] (`Analysis.tails`) where that makes the
    whole cone one band: ("symbolic", fill, tails, the verdict without), for its readers to prove."""
    tails: list = []
    verdict = _band_verdict(graph, nodes, inputs, target, max_dim, tails)
    if not tails:
        return verdict
    without = _band_verdict(graph, nodes, inputs, target, max_dim, None)
    return (*verdict, tuple(tails), without) if verdict[0] == "symbolic" else without


def _band_verdict(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value, max_dim: int,
                  tails: list | None) -> tuple:
    an = Analysis(max_dim)
    an.tails = tails
    env: dict = {}
    try:
        value = evaluate(an, nodes, inputs, target, lambda v: const_value(graph, v), env)
    except NotAMask:
        return _inner_bands(an, nodes, env) or ("none",)
    except Unprovable as e:
        if _only_indices(target):
            return _inner_bands(an, nodes, env) or ("none",)  # a padding lookup's positions, not a mask
        return _inner_bands(an, nodes, env) or ("decline", f"not proved a band at every size: {e}")
    if isinstance(value, Opaque) and value.why:
        if _only_indices(target):
            return _inner_bands(an, nodes, env) or ("none",)  # a padding lookup's positions, not a mask
        return _inner_bands(an, nodes, env) or ("decline", f"not proved a band at every size: {value.why}")
    if not isinstance(value, Band) or len(value.values) < 2 or len(value.shape) < 2:
        return _inner_bands(an, nodes, env) or ("none",)
    fill = sized_fill(value, an.derived)
    if isinstance(fill, str):
        return "decline", fill
    return "symbolic", fill


def _inner_bands(an: Analysis, nodes: list[Node], env: dict) -> tuple | None:
    """("inner", [(node position, output index, fill)]) for the bands inside a cone that is not one
    (T5 compares relative positions into a band, then buckets them): each band whose consumers stop
    being bands, so it is lowered on its own and the rest of the cone reads it."""
    found = []
    for pos, n in enumerate(nodes):
        if isinstance(n, DmlNode):
            continue  # lowered already
        for i, v in enumerate(n.outputs):
            b = env.get(v.name)
            if not isinstance(b, Band) or len(b.values) < 2 or len(b.shape) < 2:
                continue
            readers = [c for c in v.consumers if c in nodes]
            if readers and all(isinstance(env.get(c.outputs[0].name), Band) and
                               len(env[c.outputs[0].name].values) > 1 for c in readers):
                continue  # a step inside a bigger band
            fill = sized_fill(b, an.derived)
            if not isinstance(fill, str):
                found.append((pos, i, fill))
    return ("inner", found) if found else None


def _finish(graph: Graph, m: Match, target: Value, p: BandPattern, arr: np.ndarray, sources: list[tuple] | None,
            options: Options) -> Match:
    elem_type = target.elem_type or helper.np_dtype_to_tensor_dtype(arr.dtype)
    static = arr.shape if sources is None or all(s[0] == "const" for s in sources) else None
    begin, end = pattern_bounds(p)
    dml = DmlNode(f"{target.name}__gen", None, None, None, standin(target, elem_type), elem_type=elem_type, value=p.value,
                  begin=begin, end=end, static_shape=static)
    m.dml = dml
    m.captures.update(pattern=p, sources=sources if static is None else None)
    m.reason = lowering_reason(dml, tuple(arr.shape) if static else (None,) * arr.ndim, options)
    return m


def _finish_sized(graph: Graph, m: Match, target: Value, fill: SizedFill, inputs: list[Value],
                  options: Options) -> Match:
    elem_type = target.elem_type or helper.np_dtype_to_tensor_dtype(fill.dtype)
    if numpy_dtype(elem_type) != fill.dtype:
        m.reason = f"the proved mask is {fill.dtype} but the value is typed {numpy_dtype(elem_type)}"
        return m
    dims = [d.const if isinstance(d, Lin) and d.is_const else None for d in fill.shape]
    static = tuple(d for d in dims if d is not None) if None not in dims else None
    dml = DmlNode(f"{target.name}__gen", None, None, None, standin(target, elem_type), elem_type=elem_type,
                  value=fill.value, begin=fill.begin, end=fill.end, static_shape=static)
    m.dml = dml
    m.captures.update(fill=fill, inputs=inputs, bounds=fill.bound_text(str))
    derived = {n: e for n, e, _ in fill.derived}
    unread = sorted({s for e in fill.sizes() + list(derived.values()) for s, _ in e.terms
                     if s not in derived and locate(graph, inputs, s) is None})
    if unread:
        m.reason = f"its sizes use {', '.join(unread)}, which no input of the model has as a dim to read at run time"
        return m
    m.reason = lowering_reason(dml, static if static else (None,) * len(dims), options)
    return m


def _rewrite_subgraph(ctx: Context, m: Match) -> Replacement:
    graph = ctx.graph
    proto = m.dml
    assert proto is not None, "the match made its DmlNode"
    target = proto.outputs[0]
    fill: SizedFill | None = m.captures.get("fill")
    made = Made()
    old = graph.values[target.name]
    if fill is None:  # evaluated at its one static size
        target.shape = proto.static_shape  # (`target` is the match's detached stand-in, not the graph's value)
        node = generator(ctx, m.captures["pattern"], proto.elem_type, proto.name, target, None,
                         proto.static_shape, made)
    else:
        sizes = SizeBuilder(ctx, m.captures["inputs"], made, {n: (e, k) for n, e, k in fill.derived})
        shape = None if proto.static_shape is not None else sizes.vector(fill.shape, target.name, old)
        k = None if fill.shift.is_const else sizes.scalar(fill.shift, target.name)
        guard = sizes.guard(fill.sizes())  # (the dim-name claims the sizes rest on, checked when it runs)
        if guard is not None:
            k = guard if k is None else sizes.add(k, guard)
        # What we proved about the sizes beats what shape inference guessed (often unk__N names).
        target.shape = tuple(d.const if isinstance(d, Lin) and d.is_const else render_dim(d, str) for d in fill.shape)
        x = None if is_plus_zero(fill.other) else constant(
            ctx, f"{target.name}__else", np.asarray(fill.other, dtype=numpy_dtype(proto.elem_type)).reshape(()), made)
        node = DmlNode(proto.name, x, shape, k, target, elem_type=proto.elem_type, value=fill.value,
                       begin=fill.begin, end=fill.end, static_shape=proto.static_shape)
    return Replacement(nodes=[*made.nodes, node], initializers=made.initializers,
                       replaces=[(old, node.outputs[0])], removes=[cast(Node, old.producer)])  # (a node's output)


MASK_SUBGRAPH = Rule("mask_subgraph", ("*",), _match_subgraph, _rewrite_subgraph, exact="bit-exact",
                     candidates=lambda ctx: data_free_of(ctx).frontier(),
                     description="shape-only mask subgraph -> one DIAGONAL_MATRIX1 generator")
