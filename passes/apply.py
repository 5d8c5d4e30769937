"""Masks applied to data become one DIAGONAL_MATRIX1 with that data as its input.

An elementwise f(D, ...) of a DIAGONAL_MATRIX1 D computes f(Value, ...) on D's region and f(x, ...)
elsewhere; when one part is a constant the node is one DIAGONAL_MATRIX1. Each op family says what
its parts reduce to (`Where` here, `apply_bool`, `apply_arith`) and whether they are bit-exact;
`chain` fuses nested fills. The algebra and the shape condition: docs/internals.md, passes/apply.py.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Union, cast

import numpy as np
import onnx

from dmlgraph.io import shape_inference
from dmlgraph.ir.dtypes import bitwise_equal
from dmlgraph.ir.graph import Dim, DmlNode, Graph, Node, OnnxNode, Value, copied
from dmlgraph.passes.broadcast import (
    Built,
    ShapeSource,
    broadcast_dims,
    build_broadcast,
    build_guarded,
    build_matrix_of,
    fits_into,
    keeps_matrix,
    matrix_dims,
    needed,
    same_dims,
    shape_source,
    static_broadcast,
    vector_dims,
)
from dmlgraph.passes.common import (
    const_value,
    from_constants,
    lowering_reason,
    reads_input_values,
    replace_node,
    standin,
)
from dmlgraph.rewrite import Context, Match, Options, Replacement, Rule
from dmlgraph.runtime.onnx_runner import numpy_dtype

INF = math.inf
Region = tuple[Union[int, None], Union[int, None]]


# ---- regions: sets of diagonals as (begin, end) with None = unbounded --------------------------
def _pieces(begin: int | None, end: int | None) -> list[tuple[float, float]]:
    lo, hi = (-INF if begin is None else begin), (INF if end is None else end)
    if begin is not None and end is not None and begin > end:
        return [(-INF, end), (begin, INF)]  # inverted: outside [end, begin)
    return [(lo, hi)] if lo < hi else []


def _from_pieces(pieces: Iterable[tuple[float, float]]) -> Region | None:
    merged: list[list[float]] = []
    for lo, hi in sorted(p for p in pieces if p[0] < p[1]):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])

    def b(x: float) -> int | None:
        return None if math.isinf(x) else int(x)
    if not merged:
        return 0, 0  # the empty region
    if len(merged) == 1:
        return b(merged[0][0]), b(merged[0][1])
    if len(merged) == 2 and merged[0][0] == -INF and merged[1][1] == INF:
        return int(merged[1][0]), int(merged[0][1])  # inverted
    return None


def union(r1: Region, r2: Region) -> Region | None:
    return _from_pieces(_pieces(*r1) + _pieces(*r2))


def complement(r: Region) -> Region | None:
    cuts = [-INF]
    for lo, hi in _pieces(*r):
        cuts += [lo, hi]
    cuts.append(INF)
    return _from_pieces([(cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2)])


# ---- operands and parts ---------------------------------------------------------------------------
Operand = Union[np.ndarray, Value]  # a 0-d constant (every element of the operand), or a value
MAX_UNIFORM_CHECK = 1 << 20  # elements of a stored constant read to see whether it is one value


def uniform_constant(graph: Graph, v: Value | None) -> np.ndarray | None:
    """The one value every element of `v` provably holds (0-d, bits kept), else None.

    A constant whose elements are bitwise equal, `ConstantOfShape(any shape)`, and `Expand` of such
    a value qualify: shape-only fills like `ConstantOfShape(Shape(X))`.
    """
    v = copied(v)
    if v is None:
        return None
    if graph.stored(v) and v.shape is not None and math.prod(cast("tuple[int, ...]", v.shape)) > MAX_UNIFORM_CHECK:
        return None  # a weight, not a fill: treated as data (still correct, just not simplified)
    arr = const_value(graph, v)
    if arr is not None:
        arr = np.asarray(arr)
        if arr.size == 0 or arr.dtype.kind not in "biuf":
            return None
        first = arr.reshape(-1)[:1].reshape(())
        if arr.size == 1:  # (a scalar: the common case, and trivially one value)
            return first.copy()
        return first.copy() if bitwise_equal(np.broadcast_to(first, arr.shape), arr) else None
    p = v.producer
    if not isinstance(p, OnnxNode) or p.domain not in ("", "ai.onnx"):
        return None
    if p.op_type == "ConstantOfShape":
        t = p.attr("value")
        return np.zeros((), np.float32) if t is None else onnx.numpy_helper.to_array(t).reshape(-1)[:1].reshape(())
    if p.op_type == "Expand":
        return uniform_constant(graph, p.inputs[0])
    return None


@dataclass
class Part:
    """What the node computes on one side of the band: a constant, an operand as is, or a new node."""

    const: np.ndarray | None = None
    value: Value | None = None
    op: tuple[str, list[Operand]] | None = None  # a new ONNX node of the replaced node's op type
    exact: bool = True
    why: str = ""  # why it is not exact, where the rule's own exactness does not say

    @property
    def is_const(self) -> bool:
        return self.const is not None


Evaluator = Callable[[OnnxNode, list[Operand], np.dtype], Union[Part, str]]


def _operand(graph: Graph, v: Value | None) -> Operand | None:
    u = uniform_constant(graph, v)
    return u if u is not None else v


def band_operands(graph: Graph, node: OnnxNode, band_inputs: tuple[int, ...]) -> list[int]:
    """Positions among `band_inputs` whose value a DIAGONAL_MATRIX1 node makes (through Identity
    nodes a tool put after it: `copied`)."""
    return [i for i in band_inputs if isinstance(v := copied(node.input(i)), Value)
            and isinstance(p := v.producer, DmlNode) and p.kind == "DiagonalMatrix1"]


def _band(node: Node, i: int) -> DmlNode:
    """The DIAGONAL_MATRIX1 node making input `i` (one of `band_operands`)."""
    return cast(DmlNode, cast(Value, copied(node.inputs[i])).producer)


def off_region(graph: Graph, d: DmlNode) -> Operand:
    """D's elements off its region: its input (a one-element constant as a 0-d array), else 0."""
    x = d.inputs[0]
    if x is None:
        return np.zeros((), numpy_dtype(d.elem_type))
    # One value everywhere (a one-element constant, ConstantOfShape, Expand of a scalar): that value,
    # so Where(D, X, c) off the region is X itself, never a new Where that could touch X's bits.
    u = uniform_constant(graph, x)
    return u if u is not None else x


@dataclass
class Plan:
    """The replacement a match decided on; `build` makes it (the only graph edits)."""

    node: OnnxNode
    band: DmlNode
    value: np.ndarray
    region: Region
    x: Part
    exact: bool
    shape: list[ShapeSource] | None = None  # run-time sizes to broadcast (None: x or static carries them)
    static_shape: tuple[int, ...] | None = None
    guarded: bool = False  # the matrix is the band's by construction, not by proof (see plan_application)
    matrix: ShapeSource | None = None  # the band's sizes, when guarded
    sizes: Value | None = None  # the output sizes as they are (an absorbed Expand's target)
    hint: Value | None = None  # the band's sizes as the model has them (`band_matrix`)
    claimed: bool = False  # the proof took a claimed dim name (`claimed_names`): the node reads `hint`


def plan_application(graph: Graph, node: OnnxNode, d_index: int, evaluate: Evaluator, rule: str, exactness: str,
                     options: Options, output_is_mask: bool = True, axes: AxisDims | None = None) -> Match | None:
    """The Match replacing `node`, whose input `d_index` a DIAGONAL_MATRIX1 makes (None: not an
    application: both parts are data and the output is data too, e.g. `Add(X, eye)`)."""
    d_value, out = cast(Value, node.inputs[d_index]), node.outputs[0]
    d = _band(node, d_index)
    m = Match(rule, [node])
    if out.elem_type is None:
        m.reason = "the output type is unknown"
        return m
    dtype = numpy_dtype(out.elem_type)
    chosen = _choose_parts(graph, node, d_index, evaluate, dtype)
    if isinstance(chosen, str) or chosen is None:
        if chosen is None and not output_is_mask:
            return None
        m.reason = chosen or (f"neither the band's region nor the rest of {node.op_type} {node.name!r} is one "
                              "constant (both depend on the data)")
        return m
    value, x, region = chosen
    exact = x.exact and value[1]
    if region is None:
        m.reason = "the region is not one diagonal interval"
        return m
    if not exact and options.exact_only:
        m.reason = f"not bit-exact ({x.why or exactness}); --exact is on"
        return m
    if out.shape is None or len(out.shape) < 2 or d_value.shape is None or len(d_value.shape) < 2:
        m.reason = f"the rank of {node.op_type} {node.name!r} or of its band is unknown"
        return m
    plan = Plan(node, d, np.asarray(value[0], dtype).reshape(()), region, x, exact)
    m.reason = _plan_sizes(graph, plan, d_index, axes)
    if m.reason:
        return m
    preview = DmlNode(node.name, None if x.const is not None and _is_plus_zero(x.const) else Value("pending"), None,
                      d.inputs[2], standin(out), elem_type=out.elem_type, value=dtype.type(plan.value),
                      begin=region[0], end=region[1], exact=exact)
    plan.hint = plan.hint or band_matrix(graph, d, len(out.shape))
    if plan.claimed and plan.hint is None:
        m.reason = (f"the proof that {node.op_type} {node.name!r} keeps the band's matrix takes a claimed dim "
                    "name, and the band's sizes are no value of the model to check it by")
        return m
    m.captures["plan"], m.dml = plan, preview
    m.reason = lowering_reason(preview, out.shape, options)
    return m


def _choose_parts(graph: Graph, node: OnnxNode, d_index: int, evaluate: Evaluator, dtype: np.dtype,
                  band: tuple[DmlNode, Operand] | None = None
                  ) -> tuple[tuple[np.ndarray, bool], Part, Region | None] | str | None:
    """((Value, exact), the input Part, region) when one of the node's two parts is one constant;
    a reason string when a part cannot be evaluated; None when both parts are data.

    Another operand that is a DIAGONAL_MATRIX1 over the same region (or its complement), with the
    same shift and matrix, read by this node only, is split the same way and absorbed: a blend of a
    0/1 mask `w * b + c * (1 - b)` is `Add` of two such bands (GPT-1's attention), one node in all.
    `band`: the node input `d_index` is about to be, and its elements off the region (`absorbed`).
    """
    d, d_outside = band if band is not None else (_band(node, d_index), None)
    operands = cast("list[Operand]", [_operand(graph, v) for v in node.inputs])  # (the ops' inputs are required)
    ins = [np.asarray(d.value) if i == d_index else o for i, o in enumerate(operands)]
    outs = [(off_region(graph, d) if d_outside is None else d_outside) if i == d_index else o
            for i, o in enumerate(operands)]
    absorbed_exact = True
    for j, o in aligned_bands(graph, node, d_index, d):
        inside_j, outside_j = np.asarray(o.value), off_region(graph, o)
        ins[j], outs[j] = (inside_j, outside_j) if (o.begin, o.end) == (d.begin, d.end) else (outside_j, inside_j)
        absorbed_exact = absorbed_exact and o.exact
    inside = evaluate(node, ins, dtype)
    outside = evaluate(node, outs, dtype)
    if isinstance(inside, str):
        return inside
    if isinstance(outside, str):
        return outside
    if inside.const is not None:
        return (inside.const, inside.exact and absorbed_exact), outside, (d.begin, d.end)
    if outside.const is not None:
        return (outside.const, outside.exact and absorbed_exact), inside, complement((d.begin, d.end))
    return None


def aligned_bands(graph: Graph, node: OnnxNode, d_index: int, d: DmlNode | None = None) -> list[tuple[int, DmlNode]]:
    """The other operands of `node` that a DIAGONAL_MATRIX1 makes over band `d_index`'s region or
    its complement, with its shift and matrix, and that nothing else reads: (position, node)."""
    d = _band(node, d_index) if d is None else d
    d_shape = cast(Value, node.inputs[d_index]).shape
    found = []
    for j in band_operands(graph, node, tuple(range(len(node.inputs)))):
        v = cast(Value, node.inputs[j])
        o = _band(node, j)
        if j == d_index or o.inputs[2] is not d.inputs[2] or len(v.uses) != 1 or len(o.outputs[0].uses) != 1 \
                or graph.is_graph_output(v):
            continue
        if d_shape is None or v.shape is None or len(d_shape) < 2 or len(v.shape) < 2 \
                or not same_dims(v.shape[-2:], d_shape[-2:]):
            continue
        if (o.begin, o.end) == (d.begin, d.end) or (o.begin, o.end) == complement((d.begin, d.end)):
            found.append((j, o))
    return found


def _plan_sizes(graph: Graph, plan: Plan, d_index: int, axes: AxisDims | None = None) -> str | None:
    """Decide the output sizes of `plan` (static, carried by the input, or built at run time) and
    check the band's matrix is the output's; the reason when it cannot be proved."""
    node, out, x = plan.node, plan.node.outputs[0], plan.x
    d_value = cast(Value, node.inputs[d_index])
    # (plan_application checked both ranks)
    out_shape, d_shape = cast("tuple[Dim, ...]", out.shape), cast("tuple[Dim, ...]", d_value.shape)
    others = [v for i, v in enumerate(node.inputs) if v is not None and i != d_index]
    band = matrix_dims(graph, d_value)
    plan.claimed = plan.band.claimed or _claims(graph, node, d_index, band, axes)
    if plan.claimed:  # (the band's sizes as the model has them, else its whole sizes: both what it computed)
        plan.hint = band_matrix(graph, plan.band, len(out_shape)) or plan.band.inputs[1]
    if _absorb_expand(graph, plan, d_index, band):
        return None
    if not same_dims(out_shape[-2:], d_shape[-2:]) and not all(keeps_matrix(v.shape, band) for v in others):
        # Not proved by shape inference. Data flowing into the new node's input is checked when it
        # runs (the node takes the band's matrix; wider data fails to broadcast); the rest must be
        # proved, and so must a matrix side of 1 (a band row or column repeated is the data's shape).
        into_x = _part_values(x)
        unproved = [v for v in others if (v not in into_x or 1 in (band or (1,))) and not keeps_matrix(v.shape, band)]
        if unproved:
            return (f"cannot prove {node.op_type} {node.name!r} keeps the band's matrix: operand "
                    f"{unproved[0].name!r} {list(unproved[0].shape or ['?'])} may widen {list(d_shape[-2:])}")
        plan.guarded = True
        plan.claimed = plan.band.claimed  # (the sizes are the band's by construction)
    x_shape = _part_shape(x)
    if not plan.guarded and x_shape is not None and (
            same_dims(x_shape, out.shape) or all(fits_into(v.shape, x_shape) for v in node.inputs if v is not None)):
        return None  # the input carries the sizes
    if not plan.guarded and out.static_shape is not None:
        plan.static_shape = out.static_shape
        return None
    # A claimed band's sizes are the node's `matrix`, broadcast in when it runs: the rest is the data's.
    own = plan.claimed and not plan.guarded and plan.hint is not None and plan.hint is plan.band.inputs[1] \
        and any(v is not None and v.shape for i, v in enumerate(node.inputs) if i != d_index)
    found = [shape_source(graph, v) for i, v in enumerate(node.inputs) if v is not None and not (own and i == d_index)]
    sources = [s for s in found if s is not None]
    if len(sources) != len(found):
        return f"an operand of {node.op_type} {node.name!r} has an unknown rank"
    if own and len(sources) == 1 and sources[0].of is not None and sources[0].of is x.value:
        return None  # (the node's output is its input broadcast with the mask's own sizes, as the model's)
    sources = needed(sources)
    static = static_broadcast(sources)
    if static is not None and plan.guarded and not _static_matrix(static, d_value):
        return (f"{node.op_type} {node.name!r} broadcasts the band's matrix {list(d_shape[-2:])} to "
                f"{list(static[-2:])}: a band repeated along an axis is no band")
    if static is not None:
        plan.static_shape = static
    else:
        plan.shape = sources
        plan.matrix = shape_source(graph, d_value) if plan.guarded else None
    return None


def claimed_names(graph: Graph) -> frozenset[str]:
    """Dim names declared on two or more of the graph's inputs (a sum's terms each): a user's claim
    that those sizes are one, which inputs may break where onnxruntime still runs the model (a
    decode step's one row against a cache's length; issue 26). A name inference invented, or one
    input declares (a square [B, S, S] too: not checked here, docs/limits.md), is taken as a proof."""
    seen: Counter[str] = Counter()
    for v in graph.rule_inputs:
        seen.update({t for d in v.shape or () if isinstance(d, str) for t in d.split(" + ")})
    return frozenset(n for n, c in seen.items() if c > 1)


def _other_axis(a: object, b: object) -> bool:
    """Two dims that per-axis inference names after different input axes (not a 1, not invented)."""
    named = [isinstance(d, str) and "@" in d and not d.startswith("unk__") for d in (a, b)]
    return all(named) and a != b


class AxisDims:
    """The graph's values' shapes inferred with each claimed input axis a size of its own
    (`shape_inference.axis_shapes`), made on first use: one more inference, only for a model whose
    band dims name a claimed size. Empty where the graph has no source model (a body, whose formal
    inputs `nested` types with fresh dims)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._shapes: dict[str, tuple | None] | None = None

    def shapes(self) -> dict[str, tuple | None]:
        if self._shapes is None:
            src = None if self.graph.parent is not None else self.graph.info.source  # (a body: see above)
            names = claimed_names(self.graph)
            self._shapes = {} if src is None or not names else shape_inference.axis_shapes(src, names)
        return self._shapes


def _claims(graph: Graph, node: OnnxNode, d_index: int, dims: tuple | None, axes: AxisDims | None) -> bool:
    """The proof that `node`'s output keeps the band's matrix leans on a claimed dim name: the band's
    dims name a claimed size and, with each claimed input axis a size of its own, the output's last
    two dims or another operand's are another input axis's. (Where that inference cannot name a
    dim, a Concat's sum, the proof's names are trusted as before: docs/limits.md.)"""
    names = claimed_names(graph) if dims is not None and any(isinstance(d, str) for d in dims) else frozenset()
    if not any(isinstance(d, str) and any(t in names for t in d.split(" + ")) for d in dims or ()):
        return False
    shapes = axes.shapes() if axes is not None else {}
    if not shapes:
        return False  # (a body: its formal inputs' dims are sizes of its own, its source no model)
    saved = {v: v.shape for v in graph.values.values()}
    try:  # (the rules' checks, run over the per-axis shapes; a value a rule made has none)
        for v in saved:
            if not graph.stored(v):
                v.shape = shapes.get(v.name)
        band = matrix_dims(graph, cast(Value, node.inputs[d_index]))
        out = node.outputs[0].shape
        if band is None:
            return True
        shapes_seen = [out] + [v.shape for i, v in enumerate(node.inputs) if v is not None and i != d_index]
        return any(_other_axis(a, b) for s in shapes_seen if s is not None and len(s) >= 2 for a, b in zip(s[-2:], band))
    finally:
        for v, shape in saved.items():
            v.shape = shape


def _absorb_expand(graph: Graph, plan: Plan, d_index: int, band: tuple | None) -> bool:
    """Input data that is `Expand(x0, t)` to the whole output: the node reads x0 with sizes t.

    Taken when t's entries provably hold the output: its last two are the band's matrix and every
    other operand fits into t. x0 itself broadcasts into t when it ran through the Expand, unless
    it widened t (a 1 in t against a larger dim of x0): then x0 fails to broadcast when the node
    runs, an error rather than a different result. This is also what the portable target writes
    for an input with run-time sizes, so optimizing its output again reaches the same graph.
    """
    x, node = plan.x, plan.node
    p = x.value.producer if x.value is not None else None
    if not (isinstance(p, OnnxNode) and p.op_type == "Expand" and p.domain in ("", "ai.onnx")):
        return False
    t = p.inputs[1]
    t_dims = vector_dims(graph, t)
    if t_dims is None or len(t_dims) != len(cast("tuple[Dim, ...]", node.outputs[0].shape)) or not keeps_matrix(t_dims, band) \
            or len(t_dims) < 2 or tuple(t_dims[-2:]) != tuple(band or ()):
        return False
    x0 = cast(Value, p.inputs[0])  # (Expand's input is required)
    if x0.shape is not None and any(isinstance(a, int) and a > 1 and b == 1 for a, b in
                                    zip(reversed(x0.shape), reversed(t_dims))):
        return False
    if not all(fits_into(v.shape, tuple(t_dims)) for i, v in enumerate(node.inputs)
               if v is not None and v is not x.value):
        return False
    plan.x, plan.sizes = Part(value=x0, exact=x.exact), t
    return True


def _is_plus_zero(c: np.ndarray) -> bool:
    return bool(c == 0) and not (c.dtype.kind == "f" and np.signbit(c))


def _part_values(p: Part) -> list[Value]:
    if p.value is not None:
        return [p.value]
    return [o for o in p.op[1] if isinstance(o, Value)] if p.op is not None else []


def _static_matrix(static: tuple[int, ...], band: Value) -> bool:
    return band.shape is not None and tuple(band.shape[-2:]) == tuple(static[-2:])


def _part_shape(p: Part) -> tuple | None:
    """The input's inferred shape (a new node's: the broadcast of its operands')."""
    if p.value is not None:
        return p.value.shape
    if p.op is not None:
        found = [o.shape for o in p.op[1] if isinstance(o, Value)]
        shapes = [s for s in found if s is not None]
        if len(shapes) != len(found) or not shapes:
            return None
        return broadcast_dims(shapes)
    return None


def build(plan: Plan, ctx: Context | None = None) -> Replacement:
    """The planned DIAGONAL_MATRIX1 in place of the node (with the helper nodes its input and
    sizes need), as a Replacement: nothing here touches the graph."""
    node, out, x = plan.node, plan.node.outputs[0], plan.x
    built, hint = Built(), out.name
    xv: Value | None
    if x.const is not None:
        xv = None if _is_plus_zero(x.const) else \
            built.constant(f"{hint}__else", np.asarray(x.const, plan.value.dtype).reshape(()))
    elif x.value is not None:
        xv = x.value
    else:
        op_type, operands = cast("tuple[str, list[Operand]]", x.op)  # (neither a constant nor a value: a new node)
        ins = [o if isinstance(o, Value) else built.constant(f"{hint}__c", np.asarray(o)) for o in operands]
        xv = built.node(op_type, ins, f"{hint}__input", out.elem_type, _part_shape(x), attributes=node.attributes)
    shape = plan.sizes
    if plan.shape is not None:
        guarded = None if plan.matrix is None or ctx is None else \
            build_guarded(plan.shape, plan.matrix, hint, built, ctx.graph)
        if guarded is not None:
            shape = guarded
        else:
            shape = build_broadcast(plan.shape, hint, built, ctx)
            if plan.matrix is not None:
                shape = build_matrix_of(shape, plan.matrix, hint, built)
    dml = DmlNode(node.name, xv, shape, plan.band.inputs[2], standin(out, out.elem_type),
                  elem_type=cast(int, out.elem_type), value=plan.value.dtype.type(plan.value), begin=plan.region[0],
                  end=plan.region[1], static_shape=plan.static_shape, exact=plan.exact, matrix=plan.hint,
                  claimed=plan.claimed)
    r = replace_node(node, dml, *built.nodes)
    r.initializers = built.initializers
    return r


def band_matrix(graph: Graph, d: DmlNode, rank: int) -> Value | None:
    """The sizes of the band `d` makes as a value of the model, for the portable export: its sizes
    input when that is [H, W] or ones then [H, W], at most `rank` long. A band of those sizes
    broadcast with the data is what the model computed, and reading them costs no Shape node
    where the model keeps them anyway (`io.portable`)."""
    if d.matrix is not None:
        return d.matrix
    shape = d.inputs[1]
    if d.static_shape is not None or shape is None or shape.shape is None or len(shape.shape) != 1:
        return None
    n = shape.shape[0]
    return shape if isinstance(n, int) and 2 <= n <= rank and _leading_ones(graph, shape, n - 2) else None


def _leading_ones(graph: Graph, vec: Value, n: int) -> bool:
    """The first `n` entries of the 1-D `vec` are constant ones (a constant, or a Concat led by them)."""
    if n == 0:
        return True
    arr = const_value(graph, vec)
    if arr is not None:
        return arr.size >= n and bool(np.all(np.asarray(arr).reshape(-1)[:n] == 1))
    p = vec.producer
    if not (isinstance(p, OnnxNode) and p.op_type == "Concat" and p.domain in ("", "ai.onnx")):
        return False
    for part in p.inputs:
        arr = const_value(graph, part)
        if arr is None:
            return False
        ones = np.asarray(arr).reshape(-1)
        if not bool(np.all(ones[:n] == 1)):
            return False
        n -= ones.size
        if n <= 0:
            return True
    return False


# rule name -> (op types, band inputs, evaluator) of every application rule (`absorbed`)
APPLICATIONS: dict[str, tuple[tuple[str, ...], tuple[int, ...], Evaluator]] = {}


def absorbed(graph: Graph, v: Value, band: DmlNode, outside: Operand, options: Options) -> str | None:
    """Whether every reader of `v`, a mask about to become `band` (with `outside` off its region),
    is an application to data that takes it into one DIAGONAL_MATRIX1 (`Where(v, X, c)`,
    `And(padding, v)`, ...): then the band never runs as a node of its own. Returns the applications' op types, or None.

    What is checked is what `plan_application` checks of the values alone (one part one constant,
    one interval, exactness under --exact, known ranks); the sizes are checked when it runs, and a
    band it then declines stays a generator node (correct, only not smaller)."""
    uses = graph.uses_here(v)
    if graph.is_graph_output(v) or not uses:
        return None
    ops = []
    for node, i in uses:
        if not isinstance(node, OnnxNode) or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
            return None
        out = node.outputs[0]
        entry = next((e for e in APPLICATIONS.values() if node.op_type in e[0] and i in e[1]), None)
        if entry is None or out.elem_type is None or out.shape is None or len(out.shape) < 2:
            return None
        chosen = _choose_parts(graph, node, i, entry[2], numpy_dtype(out.elem_type), (band, outside))
        if chosen is None or isinstance(chosen, str) or chosen[2] is None:
            return None
        (_, value_exact), x, _ = chosen
        if x.is_const or (options.exact_only and not (value_exact and x.exact)):
            return None  # (a constant input part: a band again, e.g. a Cast, not a band applied to data)
        ops.append(node.op_type)
    return "/".join(dict.fromkeys(ops))


def application_rule(name: str, op_types: tuple[str, ...], band_inputs: tuple[int, ...], evaluate: Evaluator,
                     exact: str, description: str, output_is_mask: bool = True, two_valued: bool = False,
                     check: Callable[[Graph, Plan], str | None] | None = None, data_only: bool = False) -> Rule:
    """An application rule (the fourth phase) applying `evaluate` to each op of `op_types` that reads a band at `band_inputs`.

    `output_is_mask`: the op's output is itself a mask (And, Not, Cast), so a band it cannot take is
    declined with the reason; an application whose output is data (Where, Add) that is no mask
    application at all (`X + eye`) is simply not matched. `two_valued`: only bands without a data
    input (a generator: two values), for rewrites that would otherwise move per-use work onto a mask
    computed once (each layer's `Add(scores, mask)` of a padded mask stays one Add of the shared mask).
    `check`: why the first plan found breaks the rule's stated exactness for every input (the node is
    then declined with that reason), else None. `data_only`: only bands whose input reads the values of a
    graph input (a band of sizes alone is part of a shape-only cone: `mask_subgraph` lowers it whole
    or declines it with why)."""
    APPLICATIONS[name] = (op_types, band_inputs, evaluate)

    def match(ctx: Context, node: Node) -> Match | None:
        graph, options = ctx.graph, ctx.options
        if not isinstance(node, OnnxNode) or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
            return None
        declined = None
        for i in band_operands(graph, node, band_inputs):
            d = _band(node, i)
            if data_only and (d.inputs[0] is None or not reads_input_values(graph, d.inputs[0])):
                continue
            if two_valued and isinstance(off_region(graph, d), Value):
                if any(not from_constants(graph, v) for j, v in enumerate(node.inputs) if j != i and v is not None):
                    continue  # (data applied to a data-holding mask: not a mask any more, nothing to say)
                declined = declined or Match(name, [node], reason=(
                    f"its band {cast(Value, node.inputs[i]).name!r} holds data (its input X, a padding say): folding "
                    f"{node.op_type} {node.name!r} into it would compute per use what the model computes once"))
                continue
            m = plan_application(graph, node, i, evaluate, name, exact, options, output_is_mask,
                                 ctx.analysis(AxisDims))
            if m is not None and not m.declined:
                reason = check(graph, m.captures["plan"]) if check is not None else None
                return m if reason is None else Match(name, [node], reason=reason)
            declined = declined or m
        return declined

    def rewrite(ctx: Context, m: Match) -> Replacement:
        return build(m.captures["plan"], ctx)

    return Rule(name, op_types, match, rewrite, exact=exact, description=description)


# ---- Where ------------------------------------------------------------------------------------------
def evaluate_where(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str:
    """Where(c, A, B) with the condition one constant is A or B as they are: bit-exact."""
    cond, a, b = operands
    if isinstance(cond, np.ndarray):
        chosen = a if bool(cond) else b
        if isinstance(chosen, np.ndarray):
            if chosen.dtype != dtype:
                return f"Where {node.name!r}: a branch of type {chosen.dtype} in an output of type {dtype}"
            return Part(const=chosen)
        return Part(value=chosen)
    if dtype.kind == "f" and isinstance(cond, Value) and isinstance(cond.producer, OnnxNode) \
            and cond.producer.op_type == "Not" and cond.producer.domain in ("", "ai.onnx"):
        # onnxruntime's optimizer rewrites Where(Not(q), a, b) as Where(q, b, a), and its Where
        # kernel turns a -0.0 of the true branch into +0.0: the new Where's sign bits would then
        # depend on the session's options, where the replaced node's did not.
        return Part(op=("Where", operands), exact=False,
                    why="its Where reads a Not, which onnxruntime's optimizer folds, moving a -0.0 of the data "
                        "into the branch its kernel clears")
    return Part(op=("Where", operands))


MASK_WHERE = application_rule(
    "mask_where", ("Where",), (0,), evaluate_where, "bit-exact",
    "Where(band, X, c) / Where(band, c, X), c any one-valued constant -> DIAGONAL_MATRIX1(X, Value c)",
    output_is_mask=False)


# ---- chain --------------------------------------------------------------------------------------
def _match_chain(ctx: Context, node: Node) -> Match | None:
    graph = ctx.graph
    if not isinstance(node, DmlNode) or node.kind != "DiagonalMatrix1":
        return None
    inner = node.inputs[0].producer if node.inputs[0] is not None else None
    if not isinstance(inner, DmlNode) or inner.kind != "DiagonalMatrix1" or inner.inputs[0] is None:
        return None
    if len(inner.outputs[0].uses) != 1 or graph.is_graph_output(inner.outputs[0]) or inner.id not in graph.nodes:
        return None  # (read by others, or an enclosing scope's: it stays)
    if node.inputs[1] is not None or node.static_shape is not None or inner.inputs[1] is not None \
            or inner.static_shape is not None or inner.inputs[2] is not node.inputs[2]:
        return None
    if (node.claimed or inner.claimed) and node.matrix is not inner.matrix:
        return None  # (each reads its own mask's sizes)
    if not bitwise_equal(np.asarray(node.value), np.asarray(inner.value)):
        return None
    region = union((inner.begin, inner.end), (node.begin, node.end))
    if region is None:
        return None
    dml = DmlNode(node.name, inner.inputs[0], None, node.inputs[2], standin(node.outputs[0]), elem_type=node.elem_type,
                  value=node.value, begin=region[0], end=region[1], exact=node.exact and inner.exact,
                  matrix=node.matrix if node.claimed or inner.claimed else None, claimed=node.claimed or inner.claimed)
    return Match("chain", [inner, node], dml=dml)


def _rewrite_chain(ctx: Context, m: Match) -> Replacement:
    inner, outer = m.nodes
    r = replace_node(outer, m.dml)
    r.removes.append(inner)  # (read only by `outer`: the match checked)
    return r


CHAIN = Rule("chain", ("DiagonalMatrix1",), _match_chain, _rewrite_chain, exact="bit-exact",
             description="DIAGONAL_MATRIX1 of a DIAGONAL_MATRIX1 with the same value -> one node (region union)")
