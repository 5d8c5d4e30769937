"""Masks that are constants, or computed only from shapes, become DIAGONAL_MATRIX1 generators.

`stored_mask`: an initializer or Constant whose every [..., H, W] slice is one band pattern
(band analysis decides, exactly) becomes a generator; the constant leaves the model. Two-valued
masks {a, b} with b != 0 keep b as a one-element input broadcast by zero strides.

`mask_subgraph`: a value that depends on the graph inputs only through their shapes ("data-free":
Shape/Size of inputs, constants, and ops on those) and is a band becomes one generator whose output
sizes are read from the same shapes at run time. With static shapes the subgraph is simply
evaluated. With symbolic dims it is evaluated at several sizes, and the rewrite is sound for every
size because:
  * only index ops are allowed (INDEX_OPS: Range, comparisons, Add/Sub/Mul by constants, Where,
    Trilu, shape plumbing...), so each output element is a boolean/selection function of linear
    inequalities in (y, x, sizes) with the subgraph's integer constants;
  * such a function is the same band at every size larger than every threshold those constants
    set, so we evaluate at sizes above 2 * C + 2 (C = the largest integer constant, capped at
    MAX_THRESHOLD) and at small sizes (1, 2, 3), and require the *same* pattern to reproduce every
    sample bit-exactly;
  * each output dim must be a constant or one input dim, identified across samples that give every
    symbolic dim a different size.
A subgraph outside that class, or whose constants are too large to sample, is declined with the
reason, never guessed.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

from dmlgraph import kernels
from dmlgraph.band import BandPattern, analyze_band, diagonal_use_mask
from dmlgraph.dtypes import INT32_MAX, INT32_MIN, bitwise_equal
from dmlgraph.graph import DmlNode, Graph, Node, OnnxNode, Value
from dmlgraph.modelfile import RAW_ITEMSIZE
from dmlgraph.onnx_io import dml_node_proto, onnx_node_proto
from dmlgraph.ops import bind_range
from dmlgraph.rewrite import Match, Options, Rule
from dmlgraph.runtime import OnnxRunner, numpy_dtype
from dmlgraph.shape_inference import infer_shapes
from passes.common import const_value, lowering_reason

SHAPE_OPS = {"Shape", "Size"}
INDEX_OPS = SHAPE_OPS | {
    "Constant", "ConstantOfShape", "Identity", "Range", "Gather", "Slice", "Squeeze", "Unsqueeze",
    "Reshape", "Concat", "Expand", "Cast", "CastLike", "Add", "Sub", "Neg", "Abs", "Min", "Max", "Mul",
    "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "And", "Or", "Not", "Xor", "Where",
    "Trilu", "EyeLike", "Transpose", "CumSum", "Tile", "Sign", "Clip", "Flatten",
}
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                    "Bernoulli"}
MAX_THRESHOLD = 512  # the largest integer constant we sample past (a 1k x 1k mask)
SMALL_SIZES = (1, 2, 3)


# ---- band pattern -> DmlNode ----------------------------------------------------------------------
def _bounds(p: BandPattern) -> tuple[int | None, int | None]:
    return (None if p.begin == INT32_MIN else p.begin), (None if p.end == INT32_MAX else p.end)


def _is_zero(v) -> bool:
    """+0 only: the generator writes +0.0, so a -0.0 'else' value needs an input."""
    a = np.asarray(v)
    return bool(a == 0) and not (a.dtype.kind == "f" and np.signbit(a))


def generator(graph: Graph, p: BandPattern, elem_type: int, name: str, output: Value,
              shape: Value | None, static_shape) -> DmlNode:
    """The DmlNode producing pattern `p`; a nonzero 'else' value becomes a scalar input."""
    x = None
    if not _is_zero(p.other):
        x = _constant(graph, f"{output.name}__else", np.asarray(p.other, dtype=numpy_dtype(elem_type)).reshape(()))
    begin, end = _bounds(p)
    return DmlNode(name, x, shape, None, output, elem_type=elem_type, value=p.value, begin=begin, end=end,
                   static_shape=static_shape)


def band_of(arr: np.ndarray) -> BandPattern | None:
    """A band with both parts present: a constant tensor is not diagonal-structured."""
    if arr.ndim < 2 or arr.size == 0 or arr.dtype.kind not in "biuf":
        return None
    p = analyze_band(arr)
    if p is None:
        return None
    h, w = arr.shape[-2:]
    b, e = bind_range(*_bounds(p), 0, h, w)
    use = diagonal_use_mask(h, w, b, e)
    return p if use.any() and not use.all() else None


def _node_bytes(node: DmlNode) -> int:
    return len(dml_node_proto(node).SerializeToString())


# ---- stored masks ----------------------------------------------------------------------------------
def _match_stored(graph: Graph, item, options: Options) -> Match | None:
    if isinstance(item, Value):
        value = item
        if item.shape is None or len(item.shape) < 2 or item.elem_type in (None, TensorProto.STRING):
            return None
        m = Match("stored_mask", [], initializers=[item.name])
    else:
        if item.domain not in ("", "ai.onnx") or not item.outputs:
            return None
        value = item.outputs[0]
        m = Match("stored_mask", [item])
    if graph.is_graph_output(value) and not value.uses:
        return None  # a constant output is data, not a mask; keep it as is
    if isinstance(item, Value) and _first_row_varies(item):
        return None  # (most initializers are weights: turned away before they are decoded)
    arr = const_value(graph, value)
    if arr is None or arr.ndim < 2:
        return None
    p = band_of(np.asarray(arr))
    if p is None:
        return None
    elem_type = value.elem_type or helper.np_dtype_to_tensor_dtype(arr.dtype)
    dml = DmlNode(f"{value.name}__gen", None, None, None, value, elem_type=elem_type, value=p.value,
                  begin=_bounds(p)[0], end=_bounds(p)[1], static_shape=arr.shape)
    m.captures.update(dml=dml, pattern=p, nbytes=int(arr.nbytes))
    m.reason = lowering_reason(dml, arr.shape, options)
    threshold = options.min_mask_bytes if options.min_mask_bytes is not None else _node_bytes(dml)
    if m.reason is None and arr.nbytes <= threshold:
        m.reason = f"the constant ({arr.nbytes} bytes) is not bigger than the node replacing it ({threshold} bytes)"
    return m


def _first_row_varies(v: Value, head: int = 16) -> bool:
    """True when the first row of an inline initializer's first matrix changes value more than
    twice in its first `head` elements, read from its raw bytes: no band does that (`analyze_band`
    makes the same test, bit for bit, after decoding)."""
    t = v.initializer
    size = RAW_ITEMSIZE.get(t.data_type) if t is not None and v.array is None else None
    if size is None or not t.HasField("raw_data") or t.data_location == TensorProto.EXTERNAL:
        return False
    n = min(v.shape[-1], head)
    row = t.raw_data[:n * size]
    if len(row) < n * size:
        return False  # (load_model refuses short data; left to the full read)
    items = [row[i:i + size] for i in range(0, n * size, size)]
    return sum(a != b for a, b in zip(items, items[1:])) > 2


def _rewrite_stored(graph: Graph, m: Match, options: Options) -> list[Node]:
    proto: DmlNode = m.captures["dml"]
    value = proto.outputs[0]
    if m.initializers:
        del graph.initializers[value.name]
        value.initializer = value.array = None
    else:
        graph.remove_node(m.nodes[0])
    node = generator(graph, m.captures["pattern"], proto.elem_type, proto.name, value, None, proto.static_shape)
    graph.add_node(node)
    m.captures["dml"] = node
    return [node]


STORED_MASK = Rule("stored_mask", ("Initializer", "Constant"), _match_stored, _rewrite_stored,
                   exact="bit-exact", phase=1,
                   description="constant band mask -> DIAGONAL_MATRIX1 generator (the constant leaves the model)")


# ---- mask-building subgraphs --------------------------------------------------------------------
MASK_OPS = {"Range", "Trilu", "EyeLike", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "Where",
            "ConstantOfShape", "CumSum", "And", "Or", "Not", "Xor"}
SMALL_CONSTANT = 4096  # elements: a constant vector of sizes/indices, not data


def _eligible(n: Node) -> bool:
    """A node whose outputs can be data-free: a deterministic standard ONNX op without subgraphs."""
    return isinstance(n, OnnxNode) and n.domain in ("", "ai.onnx") and n.op_type not in NONDETERMINISTIC \
        and not n.has_subgraph


class DataFree:
    """Which values depend on graph inputs only through their shapes.

    A value is free when it is an initializer, or the output of an eligible node that is a Shape/Size
    or whose inputs are all free. `index_only` marks free values computed by INDEX_OPS from small
    constants, shapes, and stored constants that are themselves bands (slicing a band keeps it a band
    function of the indices).

    Built by one walk over the nodes, then kept exact by `update`, which replays the graph's
    change log: the outputs of every node added, removed or rewired since are recomputed from their
    current producer, and their consumers are revisited while statuses change. On a DAG that reaches
    the one consistent assignment, the one a fresh walk computes (the tests compare the two), at a
    cost proportional to the change instead of the graph.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.status: dict[str, bool] = {}  # a free node output -> whether it is index_only
        self._constants: dict[str, bool] = {}  # an initializer -> whether it is index_only
        # One walk in insertion order (for an imported graph, its file order: a dependency order);
        # a node read before its producer was visited is settled afterwards, as `update` does.
        visited: set[int] = set()
        late: list[Value] = []
        for n in graph.nodes.values():
            visited.add(n.id)
            for v in n.outputs:
                self._recompute(v)
            for x in n.inputs:
                if x is not None and x.producer is not None and x.producer.id not in visited:
                    late.extend(n.outputs)
                    break
        self.seen = len(graph.changes)
        self._settle(late)

    def is_free(self, v: Value) -> bool:
        g = self.graph
        return v.name in self.status or (v.name in g.initializers and v.name not in g.overridable_inputs)

    def index_only(self, v: Value) -> bool:
        if v.name in self.status:
            return self.status[v.name]
        return v.name in self.graph.initializers and self._index_constant(v)

    def _index_constant(self, v: Value) -> bool:
        if v.name not in self._constants:  # checked once per initializer
            if v.shape is not None and math.prod(v.shape) <= SMALL_CONSTANT and v.name not in self.graph.overridable_inputs:
                self._constants[v.name] = True  # small: no need to read it
            else:
                arr = const_value(self.graph, v)
                self._constants[v.name] = arr is not None and (arr.size <= SMALL_CONSTANT or band_of(arr) is not None)
        return self._constants[v.name]

    def _recompute(self, v: Value) -> bool:
        """Set `v`'s status from its producer and its inputs' statuses; True if it changed."""
        p, g, status = v.producer, self.graph, self.status
        new = None  # not free
        if p is not None and p.id in g.nodes:
            if p.op_type in SHAPE_OPS:
                new = True if _eligible(p) else None
            else:  # (the hottest loop of the analysis: is_free inlined, cheapest test first)
                for x in p.inputs:
                    if x is not None and x.name not in status and \
                            (x.name not in g.initializers or x.name in g.overridable_inputs):
                        break
                else:
                    if _eligible(p):
                        new = p.op_type in INDEX_OPS and all(x is None or self.index_only(x) for x in p.inputs)
        old = status.get(v.name)
        if new == old:
            return False
        if new is None:
            del status[v.name]
        else:
            status[v.name] = new
        return True

    def frontier(self) -> list[Node]:
        """Nodes whose first output is free and meets data (a consumer that is not a free ONNX
        node, or a graph output), in graph order: the only nodes `_match_subgraph` looks further at."""
        g, status = self.graph, self.status
        found = []
        for name in status:
            v = g.values.get(name)
            p = v.producer if v is not None else None
            if p is None or p.id not in g.nodes or not p.outputs or p.outputs[0] is not v:
                continue
            if g.is_graph_output(v) or not all(c.outputs and self.is_free(c.outputs[0]) and isinstance(c, OnnxNode)
                                               for c in v.consumers):
                found.append(p)
        found.sort(key=lambda n: n.added)
        return found

    def update(self) -> None:
        """Catch up with the graph's changes since the last call."""
        changes = self.graph.changes
        if len(changes) == self.seen:
            return
        work = [v for n in changes[self.seen:] for v in n.outputs]
        self.seen = len(changes)
        self._settle(work)

    def _settle(self, work: list[Value]) -> None:
        """Recompute `work`, and the consumers of every value whose status changes, to a fixed point."""
        while work:
            v = work.pop()
            if self._recompute(v):
                work.extend(o for c in v.consumers for o in c.outputs)


def _data_free(graph: Graph) -> DataFree:
    """The graph's DataFree, built once and updated from the change log on each call."""
    df = getattr(graph, "_data_free", None)  # kept with the graph: small, and updated in place
    if df is None:
        df = graph._data_free = DataFree(graph)
    df.update()
    return df


def _ancestors(value: Value) -> tuple[list[Node], list[Value]]:
    """The nodes computing `value` back to Shape/Size nodes, and the values whose shapes those read."""
    nodes, inputs, seen, stack = [], [], set(), [value.producer]
    while stack:
        n = stack.pop()
        if n is None or n.id in seen:
            continue
        seen.add(n.id)
        nodes.append(n)
        for v in n.inputs:
            if v is None:
                continue
            if n.op_type in SHAPE_OPS:
                if v not in inputs:
                    inputs.append(v)
            elif v.producer is not None:
                stack.append(v.producer)
    nodes.sort(key=lambda n: n.id)
    return nodes, inputs


def _max_small_int(arr: np.ndarray | None) -> int:
    """The largest |value| of a small integer constant below 2^31 (larger ones mean 'to the end')."""
    if arr is None or arr.dtype.kind not in "iu" or not arr.size or arr.size > SMALL_CONSTANT:
        return 0
    if arr.size <= 16:  # the usual index constant: plain ints beat five numpy calls
        return max((m for m in map(abs, arr.reshape(-1).tolist()) if m < 2**31), default=0)
    return int(np.abs(arr[np.abs(arr.astype(np.float64)) < 2**31].astype(np.int64)).max(initial=0))


def _int_constants(graph: Graph, nodes: list[Node]) -> int:
    """The largest |integer constant| a subgraph uses: the thresholds the samples must pass.

    A slice of a stored band of size N also clamps at N; samples above N then give sizes that are
    not the input's, and the match is declined. So a lowered slice is proven for every size up to
    N, every size the original model can run at.
    """
    biggest = 0
    cache = graph.scratch.setdefault("max_small_ints", {})  # per initializer (its proto: replaced = stale)
    for n in nodes:
        for v in n.inputs:
            if v is not None and v.producer is None:
                hit = cache.get(v.name)
                if hit is None or hit[0] is not v.initializer:
                    hit = cache[v.name] = (v.initializer, _max_small_int(const_value(graph, v)))
                biggest = max(biggest, hit[1])
        if isinstance(n, OnnxNode):
            for a in n.attributes:
                if a.type == onnx.AttributeProto.INT and abs(a.i) < 2**31:
                    biggest = max(biggest, abs(a.i))
                elif a.type == onnx.AttributeProto.TENSOR:
                    biggest = max(biggest, _max_small_int(onnx.numpy_helper.to_array(a.t)))
    return biggest


def _sample_shape(v: Value, dims: dict[str, int]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else dims[d] for d in v.shape)


def _mask_model(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value,
                dims: dict[str, int]) -> onnx.ModelProto:
    """The subgraph as a model whose inputs have the sample's concrete shapes."""
    infos = [helper.make_tensor_value_info(v.name, v.elem_type, list(_sample_shape(v, dims))) for v in inputs]
    inits = []
    for n in nodes:
        for v in n.inputs:
            if v is not None and v.name in graph.initializers and all(t.name != v.name for t in inits):
                inits.append(onnx.numpy_helper.from_array(np.asarray(const_value(graph, v)), v.name))
    g = helper.make_graph([onnx_node_proto(n) for n in nodes], "mask", infos,
                          [helper.make_tensor_value_info(target.name, target.elem_type or 0, None)], inits)
    opsets = [helper.make_opsetid(d, v) for d, v in graph.info.opset_imports.items() if d in ("", "ai.onnx")]
    return helper.make_model(g, opset_imports=opsets, ir_version=graph.info.ir_version)


EVAL_HEADROOM = 4 << 30  # bytes of address space one mask evaluation may add


@contextlib.contextmanager
def _address_space_headroom(extra: int):
    """Cap the process's address space at its current size + `extra` (Linux; elsewhere no cap).

    Evaluating a subgraph whose sizes shape inference could not bound (a corrupt 2^40 dim, or a
    static side we cannot see) then fails with an allocation error instead of exhausting memory.
    """
    try:
        import resource
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = current + extra
    for cap in (soft, hard):  # never raise a limit the user set
        if cap != resource.RLIM_INFINITY:
            limit = min(limit, cap)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _digest(graph: Graph, v: Value) -> tuple:
    """Equal digests, equal constants. Inline raw data is hashed as stored (type, dims, bytes: no
    decoding); anything else as its decoded array."""
    t = v.initializer
    if t is not None and v.array is None and t.HasField("raw_data") and v.name not in graph.overridable_inputs \
            and t.data_location != onnx.TensorProto.EXTERNAL:
        raw = t.raw_data  # (a small index constant is its own digest)
        return "raw", t.data_type, tuple(t.dims), raw if len(raw) <= 64 else hashlib.sha256(raw).hexdigest()
    arr = np.asarray(const_value(graph, v))
    data = onnx.numpy_helper.from_array(arr).SerializeToString() if arr.dtype == object else arr.tobytes()
    return "array", arr.dtype.str, arr.shape, hashlib.sha256(data).hexdigest()


def _evaluate(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value,
              dims: dict[str, int]) -> np.ndarray:
    model = _mask_model(graph, nodes, inputs, target, dims)
    # Only the shapes of these inputs are read: zeros (calloc'd, pages untouched) stand in.
    feeds = {v.name: np.zeros(_sample_shape(v, dims), numpy_dtype(v.elem_type)) for v in inputs}
    with _address_space_headroom(EVAL_HEADROOM):
        return np.asarray(OnnxRunner(model, threads=1).run(feeds)[0])


def _predicted_elements(graph: Graph, nodes, inputs, target, dims) -> int | None:
    """The output's element count at `dims` by shape inference (None when it cannot tell)."""
    for vi in infer_shapes(_mask_model(graph, nodes, inputs, target, dims)).graph.output:
        dims_out = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims_out):
            return math.prod(d.dim_value for d in dims_out)
    return None


def _signature(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value, symbolic: list[str]) -> tuple:
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

    def ref(v: Value | None):
        if v is None:
            return None
        p = v.producer
        made = (position[p.id], p.outputs.index(v)) if p is not None and p.id in position else None
        if v.name in graph.initializers and v.name not in digests:
            digests[v.name] = _digest(graph, v)
        return made, input_index.get(id(v)), digests.get(v.name)

    node_part = tuple((n.op_type, n.domain, tuple(a.SerializeToString(deterministic=True) for a in n.attributes),
                       tuple(ref(v) for v in n.inputs), len(n.outputs)) for n in nodes)
    input_part = tuple((v.elem_type, tuple(d if isinstance(d, int) else ("dim", symbolic.index(d)) for d in v.shape))
                       for v in inputs)
    opsets = tuple(sorted((d, v) for d, v in graph.info.opset_imports.items() if d in ("", "ai.onnx")))
    return node_part, input_part, (ref(target), target.elem_type or 0), opsets, graph.info.ir_version


def _same_pattern_everywhere(p: BandPattern, samples: list[np.ndarray]) -> bool:
    begin, end = _bounds(p)
    for arr in samples:
        if arr.ndim < 2 or arr.dtype != np.asarray(p.value).dtype:
            return False
        if 0 in arr.shape:
            continue
        h, w = arr.shape[-2:]
        b, e = bind_range(begin, end, 0, h, w)
        other = np.broadcast_to(np.asarray(p.other, arr.dtype), arr.shape)
        expected = kernels.diagonal_matrix1(arr.shape, arr.dtype, p.value, b, e, input=other)
        if not bitwise_equal(expected, arr):
            return False
    return True


def _dim_sources(samples, dim_sets, inputs) -> list | None:
    """Each output dim as ('const', n) or ('dim', input, axis), consistent across all samples."""
    rank = samples[0].ndim
    if any(s.ndim != rank for s in samples):
        return None
    sources = []
    for axis in range(rank):
        sizes = [s.shape[axis] for s in samples]
        if len(set(sizes)) == 1 and all(sizes[0] != d for dims in dim_sets for d in dims.values()):
            sources.append(("const", sizes[0]))
            continue
        found = None
        for v in inputs:
            for ax, d in enumerate(v.shape):
                got = [d if isinstance(d, int) else dims[d] for dims in dim_sets]
                if got == sizes:
                    found = ("dim", v, ax)
                    break
            if found:
                break
        if found is None:
            if len(set(sizes)) == 1:
                found = ("const", sizes[0])
            else:
                return None
        sources.append(found)
    return sources


# A mask subgraph is proven by evaluating it, which materializes the mask (and onnxruntime's int64
# intermediates of the same size). A known output or input above MAX_EVAL_ELEMENTS is declined
# instead: a corrupt or absurd dim (70000, 2^40) must not make optimize allocate gigabytes.
# 8192 positions (a 64M-element mask) still evaluate.
MAX_EVAL_ELEMENTS = 8192 * 8192


def _too_big_to_evaluate(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value,
                         largest: dict[str, int]) -> str | None:
    """Why evaluating this mask subgraph would allocate too much (None: evaluate it).

    The inputs fed and the output are bounded by MAX_EVAL_ELEMENTS: from the output's dims when
    they are static or sampled, else from shape inference at the largest sample. When neither can
    tell, the evaluation still runs under an address-space cap (`_address_space_headroom`).
    """
    if any(v.elem_type is None or any(isinstance(d, int) and d < 0 for d in v.shape) for v in inputs):
        return "an input feeding it has an unknown type or a negative dim"
    fed = sum(math.prod(_sample_shape(v, largest)) for v in inputs)
    if fed > MAX_EVAL_ELEMENTS:
        return f"the tensors whose shapes feed it hold {fed} elements, too many to evaluate it"
    if target.shape is not None and all(isinstance(d, int) or d in largest for d in target.shape):
        n = math.prod(d if isinstance(d, int) else largest[d] for d in target.shape)
        if n > MAX_EVAL_ELEMENTS:
            return (f"its output {list(target.shape)} is too large to evaluate to prove it "
                    f"(limit {MAX_EVAL_ELEMENTS} elements)")
        return None
    n = _predicted_elements(graph, nodes, inputs, target, largest)
    if n is not None and n > MAX_EVAL_ELEMENTS:
        return f"its output would hold {n} elements, too many to evaluate it (limit {MAX_EVAL_ELEMENTS})"
    return None  # size unknown: the evaluation runs under an address-space cap


def _match_subgraph(graph: Graph, node: Node, options: Options) -> Match | None:
    if not isinstance(node, OnnxNode) or node.op_type in SHAPE_OPS or node.op_type == "Constant":
        return None
    df = _data_free(graph)
    if not node.outputs or not df.is_free(node.outputs[0]):
        return None
    target = node.outputs[0]
    if any(o.uses or graph.is_graph_output(o) for o in node.outputs[1:]):
        return None  # (a Split's first part): replacing the node would leave its other outputs unmade
    # Only the frontier: where a data-free value meets data (or leaves the graph).
    if not graph.is_graph_output(target) and all(c.outputs and df.is_free(c.outputs[0]) and
                                                 isinstance(c, OnnxNode) for c in target.consumers):
        return None
    if target.shape is not None and len(target.shape) < 2:
        return None
    nodes, inputs = _ancestors(target)
    if any(isinstance(n, DmlNode) for n in nodes) or not any(n.op_type in MASK_OPS for n in nodes):
        return None  # already lowered, or no mask-making op: not worth evaluating (weights, reshapes)
    m = Match("mask_subgraph", nodes)
    symbolic = sorted({d for v in inputs for d in (v.shape or ()) if not isinstance(d, int)}, key=str)
    if any(v.shape is None or None in v.shape for v in inputs):
        m.reason = "an input feeding the mask has an unknown shape"
        return m
    # Copies of one subgraph (exporters emit one per layer) share a signature, and so a verdict.
    verdicts = graph.scratch.setdefault("mask_verdicts", {})
    signature = _signature(graph, nodes, inputs, target, symbolic)
    verdict = verdicts.get(signature)
    if verdict is None:
        verdict = verdicts[signature] = _verdict(graph, nodes, inputs, target, symbolic, df)
    if verdict[0] == "none":
        return None
    if verdict[0] == "decline":
        m.reason = verdict[1]
        return m
    _, p, sample, positions = verdict
    sources = None if positions is None else \
        [s if s[0] == "const" else ("dim", inputs[s[1]], s[2]) for s in positions]
    return _finish(graph, m, target, p, sample, sources, options)


def _verdict(graph: Graph, nodes: list[Node], inputs: list[Value], target: Value, symbolic: list[str],
             df: DataFree) -> tuple:
    """What evaluating the subgraph proves: ("band", pattern, the last sample, output dim sources
    with inputs as positions in `inputs`, None when the shape is static), ("decline", reason) or
    ("none",) (not a mask). Everything it reads is in the subgraph's `_signature`."""
    c = _int_constants(graph, nodes) if symbolic else 0
    if c > MAX_THRESHOLD:
        return "decline", f"its integer constants (up to {c}) are too large to verify the band at every size"
    big = 2 * c + 3
    dim_sets = [{d: size + i for i, d in enumerate(symbolic)} for size in SMALL_SIZES]
    dim_sets += [{d: big + 2 * i for i, d in enumerate(symbolic)}, {d: big + 1 + 3 * i for i, d in enumerate(symbolic)}]
    too_big = _too_big_to_evaluate(graph, nodes, inputs, target, dim_sets[-1])
    if too_big:
        return "decline", too_big
    if symbolic and not df.index_only(target):
        return ("none",)  # data-free but not an index computation: cannot prove it for every size
    try:
        samples = [_evaluate(graph, nodes, inputs, target, dims) for dims in (dim_sets if symbolic else [{}])]
    except Exception as e:  # noqa: BLE001 - a subgraph that cannot run at some size is not a mask we can prove
        if isinstance(e, MemoryError) or "alloc" in str(e).lower():
            return "decline", (f"evaluating it to prove the band needs more than {EVAL_HEADROOM >> 30} GiB "
                               "(a static dim of the inputs feeding it is too large)")
        return ("none",)
    samples[-1].setflags(write=False)  # kept in the verdict, shared by every copy
    p = band_of(samples[-1])
    if p is None:
        return ("none",)
    if not symbolic:
        return "band", p, samples[0], None
    if not _same_pattern_everywhere(p, samples):
        return "decline", "a band at some sizes but not at all sizes tried"
    sources = _dim_sources(samples, dim_sets, inputs)
    if sources is None:
        return "decline", "its output sizes are not the input's dims or constants"
    return "band", p, samples[-1], [s if s[0] == "const" else ("dim", inputs.index(s[1]), s[2]) for s in sources]


def _finish(graph, m, target, p, arr, sources, options) -> Match:
    elem_type = target.elem_type or helper.np_dtype_to_tensor_dtype(arr.dtype)
    static = arr.shape if sources is None or all(s[0] == "const" for s in sources) else None
    begin, end = _bounds(p)
    dml = DmlNode(f"{target.name}__gen", None, None, None, target, elem_type=elem_type, value=p.value,
                  begin=begin, end=end, static_shape=static)
    m.captures.update(dml=dml, pattern=p, sources=sources if static is None else None)
    m.reason = lowering_reason(dml, tuple(arr.shape) if static else (None,) * arr.ndim, options)
    return m


def _constant(graph: Graph, name: str, arr: np.ndarray) -> Value:
    """The initializer `name` if it already holds exactly `arr`, else a new one."""
    found = graph.scratch.setdefault("constants", {})  # each rewrite asks again for the same few
    key = (name, arr.dtype.str, arr.shape, arr.tobytes())
    hit = found.get(key)
    if hit is not None:
        v, tensor, array = hit
        if graph.initializers.get(v.name) is v and v.initializer is tensor and v.array is array:
            return v  # (still that initializer, holding what it held)
    v = graph.initializers.get(name)
    if v is None or v.name in graph.overridable_inputs:
        v = graph.add_initializer(graph.fresh_value(name), arr)
    else:
        old = const_value(graph, v)
        if old is None or not bitwise_equal(np.asarray(old), arr):
            v = graph.add_initializer(graph.fresh_value(name), arr)
    found[key] = (v, v.initializer, v.array)
    return v


_PLUMBING_OPS = ("Shape", "Gather", "Concat")


def _plumbing_key(op_type: str, inputs, attributes) -> tuple:
    """attributes: AttributeProtos, or (name, int) pairs."""
    return op_type, tuple(id(v) for v in inputs), tuple(a if isinstance(a, tuple) else (a.name, a.i) for a in attributes)


def _existing(graph: Graph, op_type: str, inputs: list[Value], axis: int | None) -> Value | None:
    """The output of a node already computing op_type(inputs) (axis attribute as given), if any.

    Reusing it keeps shared size plumbing shared, and makes optimizing a portable export again
    reproduce the same graph instead of a renamed copy. The lookup is a hash of the graph's size
    plumbing, built once per optimizer run (scanning the input's consumers instead is quadratic
    when thousands of blocks read the same input's shape).
    """
    index = graph.scratch.get("size_plumbing")
    if index is None:
        index = graph.scratch["size_plumbing"] = {}
        for n in graph.nodes.values():
            if _plumbing(n):
                index.setdefault(_plumbing_key(n.op_type, n.inputs, n.attributes), n)
    key = _plumbing_key(op_type, inputs, () if axis is None else (("axis", axis),))
    n = index.get(key)
    if n is None:
        return None
    # (A node's op type and attributes never change after it is made: its inputs may.)
    if n.id not in graph.nodes or n.inputs != inputs:
        # Removed or rewired (replace_uses) since it was indexed; a live twin may remain.
        n = next((c for c in inputs[0].consumers if _computes(graph, c, inputs, key)), None)
        if n is None:
            del index[key]
            return None
        index[key] = n
    return n.outputs[0]


def _computes(graph: Graph, n: Node, inputs: list[Value], key: tuple) -> bool:
    return n.id in graph.nodes and _plumbing(n) and n.inputs == inputs \
        and _plumbing_key(n.op_type, n.inputs, n.attributes) == key


def _plumbing(n: Node) -> bool:
    return isinstance(n, OnnxNode) and n.op_type in _PLUMBING_OPS and n.domain in ("", "ai.onnx") \
        and len(n.outputs) == 1 and None not in n.inputs


def _shape_value(graph: Graph, sources, hint: str) -> tuple[Value, list[Node]]:
    """ONNX nodes computing the output sizes at run time from the inputs' shapes (reusing any the
    graph already has)."""
    # The copies of one mask ask for the same sizes: the nodes found or made for them are kept,
    # and reused while each is alive and reads what it read then (the inputs keep ids unique).
    done = graph.scratch.setdefault("shape_values", {})
    key = tuple(s if s[0] == "const" else ("dim", id(s[1]), s[2]) for s in sources)
    hit = done.get(key)
    if hit is not None and all(n.id in graph.nodes and n.inputs == ins for n, ins in hit[1]):
        return hit[0], []
    new, parts, chain = [], [], []

    def node(op_type, inputs, name_hint, axis=None, shape=None) -> Value:
        out = _existing(graph, op_type, inputs, axis)
        if out is None:
            out = graph.fresh_value(name_hint, TensorProto.INT64, shape)
            attrs = [] if axis is None else [helper.make_attribute("axis", axis)]
            made = graph.add_node(OnnxNode(out.name, op_type, inputs, [out], attrs))  # named by what it makes
            graph.scratch["size_plumbing"][_plumbing_key(op_type, inputs, attrs)] = made
            new.append(made)
        chain.append((out.producer, list(out.producer.inputs)))
        return out

    for src in sources:
        if src[0] == "const":
            parts.append(_constant(graph, f"dmlgraph__size{src[1]}", np.array([src[1]], np.int64)))
            continue
        _, inp, axis = src
        shape = node("Shape", [inp], f"{inp.name}__shape", shape=(len(inp.shape),))
        idx = _constant(graph, f"dmlgraph__axis{axis}", np.array([axis], np.int64))
        parts.append(node("Gather", [shape, idx], f"{inp.name}__dim{axis}", axis=0, shape=(1,)))
    out = node("Concat", parts, f"{hint}__sizes", axis=0, shape=(len(parts),))
    done[key] = (out, chain)
    return out, new


def _rewrite_subgraph(graph: Graph, m: Match, options: Options) -> list[Node]:
    proto: DmlNode = m.captures["dml"]
    target = proto.outputs[0]
    shape, new = None, []
    if m.captures.get("sources"):
        shape, new = _shape_value(graph, m.captures["sources"], target.name)
        # What we proved about the sizes beats what shape inference guessed (often unk__N names).
        target.shape = tuple(s[1] if s[0] == "const" else s[1].shape[s[2]] for s in m.captures["sources"])
    elif proto.static_shape is not None:
        target.shape = proto.static_shape
    graph.remove_node(target.producer)
    node = generator(graph, m.captures["pattern"], proto.elem_type, proto.name, target, shape, proto.static_shape)
    graph.add_node(node)
    m.captures["dml"] = node
    return [node] + new


MASK_SUBGRAPH = Rule("mask_subgraph", ("*",), _match_subgraph, _rewrite_subgraph, exact="bit-exact", phase=0,
                     candidates=lambda graph: _data_free(graph).frontier(),
                     description="shape-only mask subgraph -> one DIAGONAL_MATRIX1 generator")
