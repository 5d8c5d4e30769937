"""The portable (standard ONNX) form of a DIAGONAL_MATRIX1: the fewest standard ops, Trilu first.

`Trilu` is DIAGONAL_MATRIX1 in standard ONNX (one DML_OPERATOR_DIAGONAL_MATRIX1 on onnxruntime's DML
provider, `triangular` in WebNN), so each lowered node is written as the first form that is bit-exact
for its type: Trilus of X, Trilus of a ones tensor (`EyeLike` for one diagonal), `Where(band, Value,
X)` for a fill on data; where none is, `build` returns None and the caller writes the spec's
pseudocode. The forms, which onnxruntime kernels keep which bits, and the mask part / whole site
count: docs/portable.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dmlgraph.io.dim_keys import Key, entry_keys, small_constant
from dmlgraph.ir.graph import DmlNode, Graph, OnnxNode, Value, produced_by
from dmlgraph.ir.opset import SHAPE_BOUNDS

INT64_MAX = 2**63 - 1
BOUND = 2**62  # |topX| < 2^62 for any tensor: a static bound past it means "unbounded" (no overflow at +-1)
K_CLIP = 2**40  # a run-time k clipped to this keeps k + bound inside int64 (a shape is far below it)

# onnxruntime's CPU kernels (checked by tests/test_portable.py)
TRILU_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64,
               TensorProto.BOOL}
WHERE_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT8, TensorProto.INT32, TensorProto.INT64,
               TensorProto.UINT8, TensorProto.UINT32}
EYELIKE_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT64}
_INT_VIA_INT64 = {TensorProto.INT8, TensorProto.INT16, TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32,
                  TensorProto.UINT64}
_SIZE_OPS = {"Shape", "Gather", "Concat", "Reshape", "Add", "Sub", "Mul", "Neg", "Min", "Max", "Div", "Squeeze",
             "Unsqueeze", "Slice", "Identity", "Size", "Cast"}

Interval = tuple[int | None, int | None]  # [lo, hi) of topX; None = unbounded

# What a site's portable nodes are, as `inspect` and the optimize summary count them (issue 25):
# the *mask part* is the nodes computing the band (ones / Expand / Trilus / EyeLike / their join,
# and a Trilu of the data itself); the *application* is the one select at the end that puts the
# band onto the data, where the original model had a select of its own (Where / And / Or, or a
# mask_arith site's Add); the *whole site* is both. Size plumbing (Shape, Slice, k's Add/Clip: the
# int64 sizes) and constants count in neither. A form with no separate select (a Trilu of X) is
# all mask part.
MASK, APPLY, SIZE, CONST = "mask", "apply", "size", "const"


class Names(Protocol):
    def fresh(self, hint: str) -> str: ...


class Emitter:
    """The nodes and constants of one portable node (committed by the caller only on success).

    Constants become initializers shared across the export when `shared` is given (a dict of
    (dtype, shape, bytes) -> name; no node each), else Constant nodes (in a body). Each node has a
    role (`MASK`, `APPLY`, `SIZE`, `CONST`): what `counts` reports per site."""

    def __init__(self, names: Names, prefix: str, shared: dict[tuple, str] | None) -> None:
        self.names, self.prefix, self.shared = names, prefix, shared
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._local: dict[tuple, str] = {}
        self.roles: list[str] = []  # one per node
        # The form changes bits of the data (else: bit-exact): X in Where's true branch turns a -0.0
        # into +0.0; Trilu and Where on float16 change NaN payloads (a NaN stays a NaN of its sign).
        self.inexact = False
        # Sizes vectors whose dims the written model declares (`declared_tail`), and the value_info
        # of the tensors made from them: `declare` is set where the caller writes value_info.
        self.declare = False
        self.sized: dict[str, tuple] = {}
        self.opset = SHAPE_BOUNDS  # the model's default-domain opset (`build` sets it)
        self.value_info: list[onnx.ValueInfoProto] = []

    def const(self, name: str, arr: Any) -> str:
        a = np.asarray(arr)
        key = (a.dtype.str, a.shape, a.tobytes())
        hit = self._local.get(key) or (self.shared.get(key) if self.shared is not None else None)
        if hit is not None:
            return hit
        if self.shared is not None:
            fresh = self.names.fresh(f"dmlgraph__{name}")
            self.initializers.append(numpy_helper.from_array(a, fresh))
        else:
            fresh = self.names.fresh(f"{self.prefix}_{name}")
            self.nodes.append(helper.make_node("Constant", [], [fresh], value=numpy_helper.from_array(a, fresh)))
            self.roles.append(CONST)
        self._local[key] = fresh
        return fresh

    def op(self, op_type: str, ins: list[str], name: str, role: str = MASK, **attrs: Any) -> str:
        fresh = self.names.fresh(f"{self.prefix}_{name}")
        self.nodes.append(helper.make_node(op_type, ins, [fresh], **attrs))
        self.roles.append(role)
        if op_type == "ConstantOfShape" and ins[0] in self.sized:
            self.value_info.append(helper.make_tensor_value_info(fresh, attrs["value"].data_type, self.sized[ins[0]]))
        return fresh

    def counts(self) -> tuple[int, int]:
        """(mask part, whole site): see `MASK`."""
        mask = self.roles.count(MASK)
        return mask, mask + self.roles.count(APPLY)

    def commit(self) -> None:
        if self.shared is not None:
            for t in self.initializers:
                a = numpy_helper.to_array(t)
                self.shared.setdefault((a.dtype.str, a.shape, a.tobytes()), t.name)


def _same(a: tuple | None, b: tuple | None) -> bool:
    """Shape inference proved these shapes equal (each dim the same int or the same name)."""
    return a is not None and b is not None and len(a) == len(b) and all(x is not None and x == y for x, y in zip(a, b))


def _bits_zero(v: np.ndarray) -> bool:
    return v.tobytes() == np.zeros((), v.dtype).tobytes()


def _is_nan(v: np.ndarray) -> bool:
    return v.dtype.kind == "f" and bool(np.isnan(v))


def _neg_zero(v: np.ndarray) -> bool:
    return v.dtype.kind == "f" and bool(v == 0) and bool(np.signbit(v))


def region(begin: int | None, end: int | None) -> list[Interval] | None:
    """The diagonals holding Value as intervals (None: all or nothing, left to the general form)."""
    if begin is None and end is None:
        return None
    if begin is None or end is None:
        return [(begin, end)]
    if end == begin:
        return None
    return [(begin, end)] if end > begin else [(None, end), (begin, None)]


def complement(r: list[Interval]) -> list[Interval]:
    if len(r) == 2:
        return [(r[0][1], r[1][0])]
    lo, hi = r[0]
    if lo is None:
        return [(hi, None)]
    if hi is None:
        return [(None, lo)]
    return [(None, lo), (hi, None)]


def _matrix_part(g: Graph | None, vec: Value | None) -> str | None:
    """A sizes vector built as Concat(lead, [H, W]): the [H, W] value (no Slice needed)."""
    p = produced_by(vec, "Concat")
    last = p.inputs[-1] if p is not None and p.inputs else None
    if g is None or last is None or _length(g, last) != 2:
        return None
    whole = produced_by(last, "Slice")  # a Slice keeping all of a 2-vector (build_matrix_of's): that vector
    if whole is not None and _length(g, whole.inputs[0]) == 2:
        return whole.inputs[0].name  # type: ignore[union-attr]
    return last.name


def _kept_anyway(g: Graph | None, v: Value) -> bool:
    """`v` is written whether or not a node reads it as its `matrix`: a constant, a graph input, or
    a value something else reads (reading it costs no node; Shape(X) would cost one)."""
    if g is None:
        return False
    if v.name in g.initializers or v.producer is None or g.is_graph_output(v):
        return True
    return any(not (isinstance(n, DmlNode) and i == 3) for n, i in v.uses)


def _lead_of(g: Graph | None, vec: Value | None, x: Value, n: int, depth: int = 0) -> bool:
    """The first `n` entries of the sizes vector `vec` are provably X's first `n` sizes: Shape(X),
    a Concat or a Slice from 0 keeping them, or `build_broadcast`'s `Where(Equal(p, 1), q, p)` of
    Shape(X) and an operand padded to X's rank with constant ones."""
    if g is None or vec is None or depth > 8:
        return False
    if n == 0:
        return True
    shape = produced_by(vec, "Shape")
    if shape is not None:  # (from the start, to the end or at least n entries: `build_guarded`'s lead)
        end = shape.attr("end", None)
        return shape.inputs[0] is x and shape.attr("start", 0) == 0 and (end is None or 0 <= end and n <= end)
    cat = produced_by(vec, "Concat")
    if cat is not None and cat.inputs and (_length(g, cat.inputs[0]) or 0) >= n:
        return _lead_of(g, cat.inputs[0], x, n, depth + 1)
    sl = produced_by(vec, "Slice")
    if sl is not None and len(sl.inputs) >= 3:
        start = small_constant(g, sl.inputs[1])
        if start is not None and start.size == 1 and int(start.reshape(-1)[0]) == 0 and len(sl.inputs) == 3:
            stop = small_constant(g, sl.inputs[2])
            if stop is not None and stop.size == 1 and (int(stop.reshape(-1)[0]) >= n or (_length(g, vec) or 0) >= n):
                return _lead_of(g, sl.inputs[0], x, n, depth + 1)
        return False
    where = produced_by(vec, "Where")
    if where is not None:
        cond, a, b = where.inputs
        eq = produced_by(cond, "Equal")
        if eq is None or eq.inputs[0] is not b or small_constant(g, eq.inputs[1]) is None \
                or small_constant(g, eq.inputs[1]).reshape(-1).tolist() != [1]:  # type: ignore[union-attr]
            return False
        # (either order: where X's size is 1 the ones give 1 too)
        return (_lead_of(g, a, x, n, depth + 1) and _ones_prefix(g, b, n)) \
            or (_lead_of(g, b, x, n, depth + 1) and _ones_prefix(g, a, n))
    return False


def _expand_to(g: Graph | None, vec: Value | None, t: Value) -> Value | None:
    """An operand q of the sizes `vec` = `Where(Equal(p, 1), q, p)` (the rules' broadcast of two
    sizes vectors, either order) such that `Expand(t, q)` is `Expand(t, vec)`: on every axis p's
    entry is t's own size there (Expand broadcasts t with q anyway), a constant 1, or provably q's
    entry (`entry_keys`). The model's own q then costs no node, and p's plumbing dies."""
    where = produced_by(vec, "Where")
    eq = produced_by(where.inputs[0], "Equal") if where is not None else None
    t_rank = None if t.shape is None else len(t.shape)
    if g is None or where is None or eq is None or t_rank is None:
        return None
    one = small_constant(g, eq.inputs[1])
    if one is None or one.reshape(-1).tolist() != [1]:
        return None
    _, a, b = where.inputs
    if eq.inputs[0] is not b or a is None or b is None:
        return None
    ka, kb = entry_keys(g, a), entry_keys(g, b)
    if ka is None or kb is None or len(ka) != len(kb) or len(ka) < t_rank:
        return None
    rank = len(ka)

    def covered(mine: list[Key | None], other: list[Key | None]) -> bool:
        for d, (m, o) in enumerate(zip(mine, other)):
            own = ("dim", t.name, d - (rank - t_rank))
            if not (m is not None and (m == own or m == ("c", 1) or m == o)):
                return False
        return True

    if covered(kb, ka):
        return a
    return b if covered(ka, kb) else None


def _length(g: Graph, vec: Value | None) -> int | None:
    """The length of a 1-D sizes vector: inferred, or a Slice's of one whose length is known."""
    if vec is None:
        return None
    if vec.shape is not None and len(vec.shape) == 1 and isinstance(vec.shape[0], int):
        return vec.shape[0]
    sl = produced_by(vec, "Slice")
    if sl is None or len(sl.inputs) != 3:
        return None
    base = _length(g, sl.inputs[0])
    start, stop = small_constant(g, sl.inputs[1]), small_constant(g, sl.inputs[2])
    if base is None or start is None or stop is None or start.size != 1 or stop.size != 1:
        return None
    return len(range(base)[slice(int(start.reshape(-1)[0]), int(stop.reshape(-1)[0]))])


def _ones_prefix(g: Graph, vec: Value | None, n: int) -> bool:
    arr = small_constant(g, vec)
    if arr is not None:
        return arr.size >= n and bool(np.all(arr.reshape(-1)[:n] == 1))
    cat = produced_by(vec, "Concat")
    if cat is None or not cat.inputs:
        return False
    first = small_constant(g, cat.inputs[0])
    return first is not None and first.size >= n and bool(np.all(first.reshape(-1)[:n] == 1))


def declared_tail(g: Graph | None, x: Value) -> tuple | None:
    """x's last two dims as the written main graph declares them (an input, an output, or value_info
    kept from the source), where each is a size or a name no two graph input axes share.

    A band `ConstantOfShape(Shape(x, start=-2))` has these dims by construction; onnxruntime's
    inference cannot see through the Shape, so without them its planner cannot prove that an Add
    of x and the band has x's size, and runs it out of place (one more buffer the size of x:
    docs/benchmarks.md, branch `peakmem`). Declaring them adds no claim: they are x's own."""
    if g is None or g.parent is not None or x.shape is None or len(x.shape) < 2 or not x.elem_type:
        return None
    declared = any(v is x for v in g.inputs) or g.is_graph_output(x) or (
        x.name in g.value_info_names and x.producer is not None and x.producer.id in g.nodes)
    tail = tuple(x.shape[-2:])
    if not declared or any(d is None or isinstance(d, str) and d.startswith("unk__") for d in tail):
        return None
    axes = [d for v in g.inputs if v.shape is not None for d in v.shape if isinstance(d, str)]
    return None if any(isinstance(d, str) and axes.count(d) > 1 for d in tail) else tail


def from_shapes(g: Graph | None, v: Value | None, depth: int = 0) -> bool:
    """`v` is computed only from tensor sizes and small constants by a few integer ops, so it is far
    inside int64 (a bound plus it cannot overflow)."""
    if g is None or v is None or depth > 24:
        return False
    arr = small_constant(g, v)
    if arr is not None:
        return arr.dtype.kind in "iu" and bool(np.all(np.abs(arr.astype(np.float64)) <= 2**31))
    p = v.producer
    if not isinstance(p, OnnxNode) or p.domain not in ("", "ai.onnx") or p.op_type not in _SIZE_OPS:
        return False
    if p.op_type in ("Shape", "Size"):
        return True
    if p.op_type == "Mul":  # sizes times small constants only (a product of two sizes can be large)
        consts = [small_constant(g, x) for x in p.inputs]
        if sum(c is None for c in consts) > 1:
            return False
    data = p.inputs[:1] if p.op_type in ("Gather", "Reshape", "Slice", "Squeeze", "Unsqueeze", "Cast") else p.inputs
    return all(x is not None and from_shapes(g, x, depth + 1) for x in data)


class _Node:
    """One DML node being written: its operands and the helpers every form shares."""

    def __init__(self, g: Graph | None, n: DmlNode, em: Emitter) -> None:
        self.g, self.n, self.em = g, n, em
        self.x, self.shape, self.k = n.operands
        self.out = n.outputs[0]
        self.dt = helper.tensor_dtype_to_np_dtype(n.elem_type)
        self.value = np.array(n.value, dtype=self.dt)
        self._k: dict[int, str] = {}
        self._kc: str | None = None
        self._shape_vec: str | None = None

    # ---- sizes -----------------------------------------------------------------------------
    def out_dims(self) -> tuple | None:
        """The output's dims as proved. A graph output's shape is the model's declaration, which
        it may break at some size (onnxruntime does not check it): there the node's own operands
        say what they can (X's shape, or y's for sizes `Shape(y)`; else the rank alone)."""
        if self.n.static_shape is not None:
            return self.n.static_shape
        if self.g is None or not self.g.is_graph_output(self.out):
            return self.out.shape
        if self.shape is None:
            return None if self.x is None else self.x.shape
        y = _whole_shape_of(self.shape)
        if y is not None:
            return y.shape
        n = self.shape.shape
        return None if n is None or len(n) != 1 or not isinstance(n[0], int) else (None,) * n[0]

    def x_is_full(self) -> bool:
        """X already has the output's shape (no broadcast needed for a Trilu of it)."""
        if self.x is None:
            return False
        if self.shape is None and self.n.static_shape is None:
            return True
        return _same(self.x.shape, self.out_dims())

    def shape_vec(self) -> str | None:
        if self._shape_vec is None:
            if self.shape is not None:
                self._shape_vec = self.shape.name
            elif self.n.static_shape is not None:
                self._shape_vec = self.em.const("shape", np.array(self.n.static_shape, np.int64))
            elif self.x is not None:
                self._shape_vec = self.em.op("Shape", [self.x.name], "shape", role=SIZE)
        return self._shape_vec

    def full_x(self) -> str:
        assert self.x is not None
        if self.x_is_full():
            return self.x.name
        return self.em.op("Expand", [self.x.name, self.expand_vec(self.x)], "input")

    def expand_vec(self, t: Value) -> str:
        """The sizes to `Expand` t to the output's shape: the node's sizes, or the model's own
        operand of their broadcast where Expand's own broadcast with t gives the rest (`_expand_to`)."""
        vec = self.shape_vec()
        assert vec is not None
        plain = _expand_to(self.g, self.shape, t) if self.shape is not None and vec == self.shape.name else None
        return plain.name if plain is not None else vec

    def data(self) -> str:
        """X as an operand of the select with the band (`band`): the select broadcasts it. A claimed
        node's band has its mask's sizes, not the node's: X then takes the node's sizes first."""
        assert self.x is not None
        if self.n.claimed and self.shape is not None:
            return self.full_x()
        return self.x.name

    def band_vec(self) -> str:
        """The band's sizes: the matrix's [H, W] when broadcasting X with it provably gives the
        output's shape, else the output's sizes (X broadcasts into them: the DML node's own rule)."""
        if self.n.claimed and self.n.matrix is not None:
            return self.n.matrix.name  # (a claimed node's band is its mask's, always: its definition)
        if self.bcast_ok():
            return self.matrix_vec()
        vec = self.shape_vec()
        assert vec is not None
        return vec

    def matrix_vec(self) -> str:
        """The output's last two sizes [H, W] (a band's ones tensor: broadcast by what reads it)."""
        dims = self.out_dims()
        if dims is not None and len(dims) >= 2 and all(isinstance(d, int) for d in dims[-2:]):
            return self.em.const("hw", np.array(dims[-2:], np.int64))
        # The applied mask's own sizes (broadcast with X as the model did): free where the model
        # keeps them anyway; else cheaper than Shape(X) only when the node reads sizes of its own
        # (`build_guarded`'s: its Concat then dies with the DML node).
        hint = self.n.matrix
        if hint is not None and (self.shape is not None or _kept_anyway(self.g, hint)):
            return hint.name
        if self.shape is None and self.n.static_shape is None and self.x is not None:
            hw = self.em.op("Shape", [self.x.name], "hw", role=SIZE, start=-2) if self.em.opset >= SHAPE_BOUNDS \
                else self._last_two()  # (Shape's start is opset 15's)
            declared = declared_tail(self.g, self.x) if self.em.declare else None
            if declared is not None:
                self.em.sized[hw] = declared
            return hw
        tail = _matrix_part(self.g, self.shape)
        return tail if tail is not None else self._last_two()

    def _last_two(self) -> str:
        """The node's sizes sliced to their last two, [H, W]."""
        vec = self.shape_vec()
        assert vec is not None
        return self.em.op("Slice", [vec, self.em.const("m2", np.array([-2], np.int64)),
                                    self.em.const("int64_max", np.array([INT64_MAX], np.int64))], "hw", role=SIZE)

    def bcast_ok(self, other_rank: int = 2) -> bool:
        """Broadcasting X with a [H, W] operand gives the output's shape (proved by inference, or by
        the sizes being X's leading sizes and a matrix X broadcasts into)."""
        if self.x_is_full():
            return True
        if self.x is None or self.x.shape is None:
            return False
        dims = self.out_dims()
        xs = tuple(self.x.shape)
        if self.shape is not None and self.shape.shape == (len(xs),) and len(xs) >= 2 \
                and _lead_of(self.g, self.shape, self.x, len(xs) - 2):
            return True  # (the node's X broadcasts into its sizes: so its matrix into [H, W])
        if dims is None or len(dims) < 2 or len(dims) != max(len(xs), 2) or any(b is None for b in dims[-2:]):
            return False
        xs = (1,) * (len(dims) - len(xs)) + xs
        lead = all(a is not None and a == b for a, b in zip(xs[:-2], dims[:-2]))  # only X has these axes
        return lead and all(a == 1 or (a is not None and a == b) for a, b in zip(xs[-2:], dims[-2:]))

    # ---- k -------------------------------------------------------------------------------------
    def kval(self, c: int) -> str:
        """An int64 scalar: c plus the run-time k (if any)."""
        c = max(-BOUND, min(BOUND, c))
        if c in self._k:
            return self._k[c]
        if self.k is None:
            name = self.em.const(f"k{c}" if c >= 0 else f"k_neg{-c}", np.array(c, np.int64))
        elif c == 0:
            name = self.k.name
        else:
            k = self.k.name
            if not from_shapes(self.g, self.k):
                if self._kc is None:
                    self._kc = self.em.op("Clip", [k, self.em.const("kmin", np.array(-K_CLIP, np.int64)),
                                                   self.em.const("kmax", np.array(K_CLIP, np.int64))], "kc",
                                          role=SIZE)
                k = self._kc
            name = self.em.op("Add", [k, self.em.const(f"k{c}" if c >= 0 else f"k_neg{-c}",
                                                      np.array(c, np.int64))], f"k{c}", role=SIZE)
        self._k[c] = name
        return name

    def keep(self, t: str, iv: Interval, name: str) -> str:
        """`t` on the diagonals [lo, hi), 0 elsewhere: a Trilu per finite end."""
        lo, hi = iv
        if lo is not None:
            t = self.em.op("Trilu", [t, *self.k_input(lo)], f"{name}_triu", upper=1)
        if hi is not None:
            t = self.em.op("Trilu", [t, *self.k_input(hi - 1)], f"{name}_tril", upper=0)
        return t

    def k_input(self, c: int) -> list[str]:
        """Trilu's k input: none for a static 0 (its default)."""
        return [] if self.k is None and c == 0 else [self.kval(c)]

    def band(self, r: list[Interval]) -> str | None:
        """A bool tensor of the band's sizes (`band_vec`), true on the diagonals `r`: a Trilu of a
        ones tensor per finite end, and the `Or` of two such for two intervals. (Not a `Not` of the
        complement: onnxruntime rewrites Where(Not(c), a, b) as Where(c, b, a), which would move X
        into the true branch, where a -0.0 is lost.)"""
        ones = self.em.op("ConstantOfShape", [self.band_vec()], "ones",
                          value=numpy_helper.from_array(np.array([True])))
        if len(r) == 1:
            return self.keep(ones, r[0], "band")
        return self.em.op("Or", [self.keep(ones, r[0], "band_lo"), self.keep(ones, r[1], "band_hi")], "band")


def build(g: Graph | None, n: DmlNode, em: Emitter, opset: int, exact_only: bool = False) -> str | None:
    """Emit the Trilu-first form of `n` into `em`; its output name, or None (no exact form here:
    nothing emitted is used). Without `exact_only`, a float fill outside a window puts X in Where's
    true branch (3 mask nodes, not 4), which turns a -0.0 of X into +0.0, and float16 data takes the
    float32 forms, whose Trilu and Where change its NaN payloads: `em.inexact` says so."""
    if opset < 14 or n.kind not in ("DiagonalMatrix1", "DiagonalMatrix"):
        return None
    r = region(n.begin, n.end)
    if r is None:
        return None
    em.opset = opset
    s = _Node(g, n, em)
    et = n.elem_type
    if s.x is None:
        return _generator(s, r)
    fold = None if n.claimed else _padding_where(s, r)  # (these forms band X's own matrix, not its mask's)
    if fold is not None:
        return fold
    half = et == TensorProto.FLOAT16 and not exact_only  # (exact but for NaN payloads)
    if _bits_zero(s.value) and et in TRILU_TYPES and (et != TensorProto.FLOAT16 or half) and not n.claimed:
        keep = complement(r)
        if len(keep) == 1:
            em.inexact = half
            return s.keep(s.full_x(), keep[0], "keep")
        if et == TensorProto.BOOL or et in (TensorProto.INT32, TensorProto.INT64):
            x = s.full_x()
            a, b = s.keep(x, keep[0], "lo"), s.keep(x, keep[1], "hi")
            return em.op("Or" if et == TensorProto.BOOL else "Add", [a, b], "keep")
    # The band [H, W] where inference proves X broadcast with it is the output, else of the output's
    # sizes; the select broadcasts X either way (no copy of X).
    if et == TensorProto.BOOL:
        band = s.band(r if s.value else complement(r))
        return None if band is None else em.op("Or" if s.value else "And", [s.data(), band], "sel", role=APPLY)
    if et not in WHERE_TYPES and not half:
        return None
    arith = _arithmetic(s, r)
    if arith is not None:
        return arith
    if _neg_zero(s.value) or _is_nan(s.value):
        return None  # (Value sits in Where's true branch, which drops a -0.0)
    em.inexact = half
    if len(r) == 2 and (s.dt.kind != "f" or not exact_only):  # X in Where's true branch (exact for integers)
        em.inexact = s.dt.kind == "f"
        band = s.band(complement(r))
        return None if band is None else em.op("Where", [band, s.data(), em.const("value", s.value)], "sel",
                                               role=APPLY)
    band = s.band(r)
    return None if band is None else em.op("Where", [band, em.const("value", s.value), s.data()], "sel", role=APPLY)


def _arithmetic(s: _Node, r: list[Interval]) -> str | None:
    """A `mask_arith` node written as the arithmetic it replaced, which is its stated exactness
    (equal where X is finite, and under the lowest float while |X| < 2^103): X + a band of Value
    (0 elsewhere). onnxruntime runs an Add with a broadcast operand faster than a Where (1.5x at a
    1024-token prefill). Only where X is the data the model added, not a constant the rule folded (an
    Add of two biases): X + 0 turns a -0.0 of X into +0.0, which an exact node must keep, and a
    constant X the fill does not absorb (x + finfo.min folded to finfo.min beside -inf) is no
    data the node's condition is about (-inf + finfo.min is -inf where the node holds finfo.min)."""
    if s.n.rule != "mask_arith" or s.n.exact or _constant(s.g, s.x) or s.dt.kind != "f" \
            or s.n.elem_type == TensorProto.FLOAT16 or s.n.elem_type not in TRILU_TYPES:
        return None
    em, v = s.em, s.value
    if len(r) != 1 or not (bool(np.isinf(v)) or bool(v == np.finfo(s.dt).min)):
        return None  # (a Value 0 is already one Trilu of X)
    full = em.op("ConstantOfShape", [s.band_vec()], "fill", value=numpy_helper.from_array(np.array([v], s.dt)))
    return em.op("Add", [s.data(), s.keep(full, r[0], "band")], "sel", role=APPLY)


def _constant(g: Graph | None, v: Value | None) -> bool:
    """`v` is a constant (in a body, where `g` is None: any stored array or Constant node)."""
    if v is None or g is not None:
        return small_constant(g, v) is not None
    p = v.producer
    return v.array is not None or v.initializer is not None or \
        isinstance(p, OnnxNode) and p.op_type == "Constant" and p.domain in ("", "ai.onnx")


def _generator(s: _Node, r: list[Interval]) -> str | None:
    em, et, v = s.em, s.n.elem_type, s.value
    dims = s.out_dims()
    if len(r) == 1 and r[0][0] is not None and r[0][1] == r[0][0] + 1 and s.k is None and dims is not None \
            and len(dims) == 2 and et in EYELIKE_TYPES and bool(v == 1) and abs(r[0][0]) < BOUND:
        src = _shape_of(s.g, s.shape)
        like = src.name if src is not None else em.op("ConstantOfShape", [_vec(s)], "like")  # (float zeros)
        own = src.elem_type if src is not None else TensorProto.FLOAT
        # (EyeLike's defaults go unwritten: k 0, and dtype where it is the input's type)
        attrs: dict[str, Any] = {"k": int(r[0][0])} if r[0][0] else {}
        if et != own:
            attrs["dtype"] = et
        return em.op("EyeLike", [like], "eye", **attrs)
    base = et
    if et == TensorProto.FLOAT16 and _is_nan(v):
        return None  # (float16 Trilu rewrites NaN payloads)
    if et not in TRILU_TYPES:
        if et not in _INT_VIA_INT64 or int(v) > INT64_MAX:
            return None
        base = TensorProto.INT64
    bdt = helper.tensor_dtype_to_np_dtype(base)
    full = em.op("ConstantOfShape", [_vec(s)], "full", value=numpy_helper.from_array(np.array([v], bdt)))
    if len(r) == 1:
        out = s.keep(full, r[0], "gen")
    else:
        if base != TensorProto.BOOL and bdt.kind == "f" and (_is_nan(v) or _neg_zero(v)):
            return None  # v + 0 is v for every other float
        a, b = s.keep(full, r[0], "lo"), s.keep(full, r[1], "hi")
        out = em.op("Or" if base == TensorProto.BOOL else "Add", [a, b], "gen")
    return out if base == et else em.op("Cast", [out], "gen_cast", to=et)


def _vec(s: _Node) -> str:
    vec = s.shape_vec()
    assert vec is not None, "a generator has a shape input or a static shape (import checks)"
    return vec


def _whole_shape_of(shape: Value | None) -> Value | None:
    """y when `shape` is Shape(y), all of it (no start or end)."""
    p = produced_by(shape, "Shape")
    return None if p is None or any(a.name in ("start", "end") for a in p.attributes) else p.inputs[0]


def _shape_of(g: Graph | None, shape: Value | None) -> Value | None:
    """y when `shape` is Shape(y) of a 2-D y whose type EyeLike reads (EyeLike(y) needs no ones tensor)."""
    y = _whole_shape_of(shape) if g is not None else None
    if y is None or y.shape is None or len(y.shape) != 2 or y.elem_type not in EYELIKE_TYPES:
        return None
    return y


def _padding_where(s: _Node, r: list[Interval]) -> str | None:
    """X = Where(P, a, b) (read by this node only) and Value b: the output is Where(P and the kept
    diagonals, a, b), so `Where(Trilu(P), a, b)`: P's Where dies (the padding rules' form)."""
    g, x = s.g, s.x
    if g is None or x is None or len(x.uses) != 1 or g.is_graph_output(x):
        return None
    p = x.producer
    if not isinstance(p, OnnxNode) or p.op_type != "Where" or p.domain not in ("", "ai.onnx"):
        return None
    cond, a_v, b_v = p.inputs
    if cond is None or cond.elem_type != TensorProto.BOOL or cond.shape is None or x.shape is None:
        return None
    a, b = small_constant(g, a_v), small_constant(g, b_v)
    if a is None or b is None or a.size != 1 or b.size != 1 or a.dtype != s.dt or b.dtype != s.dt:
        return None
    if b.reshape(()).tobytes() != s.value.tobytes():
        return None
    if s.dt.kind == "f" and (_neg_zero(a.reshape(())) or _is_nan(a.reshape(())) or _is_nan(b.reshape(()))):
        return None  # (Where's true branch drops a -0.0; float16 NaNs change)
    if s.n.elem_type not in WHERE_TYPES | {TensorProto.FLOAT16}:  # (a and b pass no data bits: float16 exact)
        return None
    keep = complement(r)
    if len(keep) != 1:
        return None
    # P broadcast to the output (Trilu needs the matrix), unless it already has the output's shape.
    if s.shape is None and s.n.static_shape is None:
        if a.ndim > len(cond.shape) or b.ndim > len(cond.shape):
            return None
        cond_name = cond.name  # (the output is X, shaped like P: a and b are one element each)
    elif _same(cond.shape, s.out_dims()):
        cond_name = cond.name
    else:
        cond_name = s.em.op("Expand", [cond.name, s.expand_vec(cond)], "padding")
    kept = s.keep(cond_name, keep[0], "padding_keep")
    # (The fills as this export's own constants: optimizing the output again names them the same.)
    return s.em.op("Where", [kept, s.em.const("fill_a", a.reshape(())), s.em.const("fill_b", b.reshape(()))], "sel",
                   role=APPLY)  # (it replaces the model's own Where(P, a, b))


ONE_OPERATOR = ("one Trilu", "one EyeLike")  # what onnxruntime's DML provider runs as one DIAGONAL_MATRIX1


def form(nodes: Sequence[onnx.NodeProto] | None, rank: int | None) -> str:
    """What a DML node's portable form is, as `inspect` and the optimize summary count it: one
    Trilu / EyeLike (one DIAGONAL_MATRIX1 / DIAGONAL_MATRIX on onnxruntime's DML provider,
    `triangular` in WebNN), or what keeps it from being one. `nodes` None: the spec's pseudocode."""
    if nodes is None:
        return ("the spec's pseudocode: no bit-exact Trilu form for this type or fill (float16 data, a -0.0 "
                "or NaN fill, or a type onnxruntime's Trilu lacks)")
    ops = [n.op_type for n in nodes]
    triangles = ops.count("Trilu") + ops.count("EyeLike")
    selects = sum(ops.count(op) for op in ("Where", "And", "Or"))
    if triangles == 1 and selects == 0:
        what = "one Trilu" if "Trilu" in ops else "one EyeLike"
    elif triangles >= 2:
        what = "two Trilus (a band bounded on both sides)"
    else:
        what = "Trilu and a select (a fill value on data)"
    if rank is not None and rank > 4:
        what += f"; rank {rank}: onnxruntime's DML provider runs Trilu up to rank 4"
    return what
