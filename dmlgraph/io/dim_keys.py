"""Sizes as structural keys, traced back through the ops that carry sizes (no dim names).

`entry_keys` says what a sizes *vector's* entries are; `DimKeys` what a *tensor's* sizes are, so
that `Shape(Sub(Unsqueeze(Range(n)), ...))` and `Concat(Gather(Shape(x), 1), ...)` are seen to hold
the same sizes when both come from the same reads: a generator can then take the model's own sizes
vector instead of building one (`SizeBuilder.vector`). Every key is a true statement about the
run-time size (an op either determines it or the run fails), so equal keys are equal sizes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from onnx import TensorProto, numpy_helper

from dmlgraph.ir.graph import CONSTANT_DTYPES, DmlNode, Graph, OnnxNode, Value, constant_attribute_value, copied, produced_by


# ---- what a sizes vector's entries provably are -----------------------------------------------------
def small_constant(g: Graph | None, v: Value | None) -> np.ndarray | None:
    """A small constant's value (an initializer the model cannot override, or a Constant node;
    seen through Identity, `copied`)."""
    v = copied(v)
    if g is None or v is None:
        return None
    if v.name in g.initializers and v.name not in g.overridable_inputs:
        if v.array is not None:
            return np.asarray(v.array)
        t = v.initializer
        if t is not None and not t.external_data and np.prod(t.dims) <= 16:
            return numpy_helper.to_array(t)
        return None
    p = v.producer
    if isinstance(p, OnnxNode) and p.op_type == "Constant" and p.domain in ("", "ai.onnx"):
        for a in p.attributes:
            count = np.prod(a.t.dims) if a.name == "value" else len(a.ints) + len(a.floats)
            if a.name in ("value", *CONSTANT_DTYPES) and count <= 16:  # (value_int(s) too: onnxsim's, dynamo's)
                return constant_attribute_value(a)
    return None


Key = tuple  # ("c", n): the constant n (or an inferred static size); ("dim", value name, axis): that
#               value's size there; ("add" / "mul", k1, k2)
_VIEW_OPS = ("Unsqueeze", "Squeeze", "Identity")


def entry_keys(g: Graph | None, v: Value | None, depth: int = 0,
               dims: Callable[[Value], list[Key] | None] | None = None) -> list[Key | None] | None:
    """The entries of a 1-D (or scalar) int64 sizes value as structural keys: equal keys are equal
    sizes at run time, because they read the same value's size on the same axis (or are the same
    constant, or sums of such). Dim names are never compared (two graph inputs may declare one
    name for sizes nobody checks). None: not even the length is known; an entry None: not known.
    `dims`: a value's sizes as keys traced further back (`dim_keys.DimKeys`), for a Shape's."""
    if g is None or v is None or depth > 24:
        return None
    arr = small_constant(g, v)
    if arr is not None:
        return [("c", int(d)) for d in arr.reshape(-1)] if arr.dtype.kind in "iu" and arr.ndim <= 1 else None
    p = v.producer
    if not isinstance(p, OnnxNode) or p.domain not in ("", "ai.onnx"):
        return None
    ins = p.inputs

    def sub(i: int) -> list[Key | None] | None:
        return entry_keys(g, ins[i] if i < len(ins) else None, depth + 1, dims)

    op = p.op_type
    if op == "Shape":
        src = ins[0]
        if src is None or src.shape is None:
            return None
        axes = list(range(len(src.shape)))[slice(p.attr("start", 0), p.attr("end", None))]
        traced = None if dims is None else dims(src)
        if traced is not None:
            return [traced[a] for a in axes]
        return [("c", src.shape[a]) if isinstance(src.shape[a], int) else ("dim", src.name, a) for a in axes]
    if op in _VIEW_OPS or (op == "Reshape" and v.shape is not None and len(v.shape) <= 1) \
            or (op == "Cast" and p.attr("to", 0) in (TensorProto.INT64, TensorProto.INT32)):
        return sub(0)
    if op == "Concat":
        parts = [entry_keys(g, x, depth + 1, dims) for x in ins]
        return None if any(q is None for q in parts) else [k for q in parts for k in q]  # type: ignore[union-attr]
    if op == "Gather" and p.attr("axis", 0) == 0:
        keys, idx = sub(0), small_constant(g, ins[1] if len(ins) > 1 else None)
        if keys is None or idx is None or idx.ndim > 1 or not all(-len(keys) <= int(i) < len(keys) for i in idx.reshape(-1)):
            return None
        return [keys[int(i)] for i in idx.reshape(-1)]
    if op == "Slice" and len(ins) in (3, 4, 5):
        keys = sub(0)
        bounds = [small_constant(g, x) for x in ins[1:]]
        if keys is None or any(b is None or b.size != 1 for b in bounds) \
                or (len(bounds) > 2 and int(bounds[2].reshape(-1)[0]) not in (0, -1)):  # type: ignore[union-attr]
            return None
        start, stop = (int(b.reshape(-1)[0]) for b in bounds[:2])  # type: ignore[union-attr]
        step = int(bounds[3].reshape(-1)[0]) if len(bounds) > 3 else 1  # type: ignore[union-attr]
        return None if step == 0 else keys[slice(start, stop, step)]
    if op == "ConstantOfShape":
        count, t = sub(0), p.attr("value")
        fill = None if t is None else numpy_helper.to_array(t).reshape(-1)
        length = key_int(count[0]) if count is not None and len(count) == 1 else None
        if length is None or fill is None or fill.size != 1 or fill.dtype.kind not in "iu":
            return None
        return [("c", int(fill[0]))] * length
    if op in ("Add", "Mul"):
        a, b = sub(0), sub(1)
        if a is None or b is None or not (len(a) == len(b) or 1 in (len(a), len(b))):
            return None
        n = max(len(a), len(b))
        return [key_arith(op, x, y) for x, y in zip(a * n if len(a) == 1 else a, b * n if len(b) == 1 else b)]
    if op == "Where":
        return _where_keys(g, p, depth, dims)
    return None


def key_int(k: Key | None) -> int | None:
    return k[1] if k is not None and k[0] == "c" else None


def key_arith(op: str, x: Key | None, y: Key | None) -> Key | None:
    if x is None or y is None:
        return None
    a, b = key_int(x), key_int(y)
    if a is not None and b is not None:
        return ("c", a + b if op == "Add" else a * b)
    if op == "Add" and a == 0:
        return y
    if op == "Add" and b == 0 or op == "Mul" and b == 1:
        return x
    if op == "Mul" and a == 1:
        return y
    return (op.lower(), *sorted((x, y), key=repr))


def nonnegative(k: Key | None) -> bool:
    """The key is provably >= 0: a size, a constant >= 0, or a sum or product of such."""
    if k is None:
        return False
    if k[0] == "c":
        return bool(k[1] >= 0)
    return k[0] == "dim" or (k[0] in ("add", "mul") and nonnegative(k[1]) and nonnegative(k[2]))


def _where_keys(g: Graph, p: OnnxNode, depth: int,
                dims: Callable[[Value], list[Key] | None] | None) -> list[Key | None] | None:
    """`Where(Equal(x, c), a, b)` entry by entry where the condition is known: c and x constants,
    or x a size (>= 0) and c negative (TorchScript's "-1 keeps the size" of `expand`)."""
    eq = produced_by(p.inputs[0], "Equal")
    if eq is None:
        return None
    x, c, a, b = (entry_keys(g, v, depth + 1, dims) for v in (eq.inputs[0], eq.inputs[1], p.inputs[1], p.inputs[2]))
    if x is None or c is None or a is None or b is None or not len(x) == len(a) == len(b) or len(c) not in (1, len(x)):
        return None
    out: list[Key | None] = []
    for xi, ci, ai, bi in zip(x, c * len(x) if len(c) == 1 else c, a, b):
        xv, cv = key_int(xi), key_int(ci)
        if xv is not None and cv is not None:
            out.append(ai if xv == cv else bi)
        elif nonnegative(xi) and cv is not None and cv < 0:
            out.append(bi)  # (a size is never negative)
        elif ai is not None and ai == bi:
            out.append(ai)
        else:
            out.append(None)
    return out


_SAME = {"Identity", "Cast", "CastLike", "Neg", "Abs", "Not", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt",
         "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Erf", "IsNaN", "IsInf", "Softmax", "LogSoftmax", "Trilu",
         "CumSum", "Dropout", "LayerNormalization", "Gelu", "Sin", "Cos", "LeakyRelu", "Clip", "Softplus"}
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Min", "Max", "Sum", "Mean", "Equal", "Less", "LessOrEqual",
              "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Where", "BitwiseAnd", "BitwiseOr", "BitwiseXor"}
DEPTH = 64  # a chain longer than this ends in the value's own keys (still true, only less general)


class DimKeys:
    """Memoized per graph state: build one per rewrite (a value's keys are fixed once computed, so
    two paths reaching the same value agree)."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.memo: dict[int, tuple[Value, list[Key] | None]] = {}

    def dims(self, v: Value | None, depth: int = 0) -> list[Key] | None:
        """One key per axis (None: rank unknown). An axis nothing traces is ("dim", v's name, axis)."""
        if v is None or v.shape is None:
            return None
        hit = self.memo.get(id(v))
        if hit is not None and hit[0] is v:
            return hit[1]
        leaf: list[Key] = [("c", d) if isinstance(d, int) else ("dim", v.name, a) for a, d in enumerate(v.shape)]
        traced = self._trace(v, depth + 1) if depth < DEPTH else None
        out = leaf if traced is None or len(traced) != len(leaf) else \
            [mine if mine[0] == "c" or t is None else t for mine, t in zip(leaf, traced)]
        self.memo[id(v)] = (v, out)
        return out

    def entries(self, v: Value | None) -> list[Key | None] | None:
        """A sizes vector's entries as keys, its Shape reads traced through `dims`."""
        return self._entries(v, 0)

    def _entries(self, v: Value | None, depth: int) -> list[Key | None] | None:
        """A sizes vector's entries, its Shape reads traced on from here (`entry_keys`)."""
        return entry_keys(self.g, v, 0, lambda src: self.dims(src, depth))

    def _trace(self, v: Value, depth: int) -> list[Key | None] | None:
        p = v.producer
        if isinstance(p, DmlNode):  # (its output has the sizes it is given, else its input's)
            if p.inputs[1] is not None:
                return self._entries(p.inputs[1], depth)
            own = None if p.static_shape is not None else self.dims(p.inputs[0], depth)
            return None if own is None else [*own]
        if not isinstance(p, OnnxNode) or p.domain not in ("", "ai.onnx") or not p.inputs or p.inputs[0] is None:
            return None
        op, ins = p.op_type, p.inputs
        x = self.dims(ins[0], depth)
        if op in _SAME:
            return None if x is None or v is not p.outputs[0] else [*x]
        if op in _BROADCAST:
            parts = [self.dims(i, depth) for i in ins]
            known = [q for q in parts if q is not None]
            return broadcast(known) if len(known) == len(parts) else None
        if op == "Expand" and len(ins) == 2:
            to = self._entries(ins[1], depth)
            return None if x is None or to is None else broadcast([x, to])
        if op == "ConstantOfShape":
            return self._entries(ins[0], depth)
        if op == "Range" and len(ins) == 3:
            start, limit, delta = (self._entries(i, depth) for i in ins)
            if delta != [("c", 1)] or start is None or limit is None or len(start) != 1 or len(limit) != 1:
                return None
            if start == [("c", 0)] and nonnegative(limit[0]):
                return limit  # (a size is >= 0: the length is the limit itself)
            n = _less(limit[0], start[0])  # Range(p, p + n): n long (integer keys: no rounding)
            return [n] if n is not None and nonnegative(n) else None
        if x is None:
            return None
        if op in ("Unsqueeze", "Squeeze"):
            axes = small_constant(self.g, ins[1]) if len(ins) > 1 and ins[1] is not None else None
            listed = [int(a) for a in axes.reshape(-1)] if axes is not None else p.attr("axes", None)
            if listed is None:
                return None
            rank = len(x) + len(listed) if op == "Unsqueeze" else len(x)
            drop = {a + rank if a < 0 else a for a in listed}
            if len(drop) != len(listed) or not all(0 <= a < rank for a in drop):
                return None
            if op == "Squeeze":
                return [k for a, k in enumerate(x) if a not in drop]
            rest = iter(x)
            return [("c", 1) if a in drop else next(rest) for a in range(rank)]
        if op == "Split":  # (every output keeps the input's sizes off the split axis)
            axis = p.attr("axis", 0)
            if not -len(x) <= axis < len(x):
                return None
            return [None if a == axis % len(x) else k for a, k in enumerate(x)]
        if op == "Transpose":
            perm = p.attr("perm", None) or list(reversed(range(len(x))))
            return [x[a] for a in perm] if sorted(perm) == list(range(len(x))) else None
        if op == "Concat":
            parts = [self.dims(i, depth) for i in ins]
            axis = p.attr("axis", 0)
            if any(q is None or len(q) != len(x) for q in parts) or not -len(x) <= axis < len(x):
                return None
            axis %= len(x)
            total: Key | None = ("c", 0)
            for q in parts:
                total = key_arith("Add", total, q[axis])  # type: ignore[index]
            return [total if a == axis else k for a, k in enumerate(x)]  # (Concat checks the others agree)
        if op == "Reshape" and len(ins) == 2:
            return self._reshape(x, self._entries(ins[1], depth), p.attr("allowzero", 0))
        if op == "Gather" and len(ins) == 2:
            idx, axis = self.dims(ins[1], depth), p.attr("axis", 0)
            if idx is None or not -len(x) <= axis < len(x):
                return None
            axis %= len(x)
            return [*x[:axis], *idx, *x[axis + 1:]]
        if op == "GatherND" and len(ins) == 2:
            return _gather_nd(x, self.dims(ins[1], depth), p.attr("batch_dims", 0))
        if op == "MatMul" and len(ins) == 2:
            y = self.dims(ins[1], depth)
            if y is None or len(x) < 2 or len(y) < 2:
                return None
            lead = broadcast([x[:-2], y[:-2]])
            return None if lead is None else [*lead, x[-2], y[-1]]
        return None

    @staticmethod
    def _reshape(x: list[Key], to: list[Key | None] | None, allowzero: int) -> list[Key | None] | None:
        """Reshape's output sizes: an entry > 0 (a constant, or a size k where a 0 would copy x's size
        there and that size is 0 whenever k is: k itself, a product with k as a factor, or no axis of
        x, where the run fails), x's size for a 0 entry (allowzero 0); -1 is known only as the whole
        of a 1-D target (x's element count)."""
        if to is None:
            return None
        if to == [("c", -1)]:
            count: Key | None = ("c", 1)
            for size in x:
                count = key_arith("Mul", count, size)
            return [count]
        out: list[Key | None] = []
        for a, k in enumerate(to):
            c = key_int(k)
            if c is not None:
                out.append(("c", c) if c > 0 or (c == 0 and allowzero) else
                           (x[a] if c == 0 and a < len(x) else None))
            elif k is not None and nonnegative(k) and (allowzero or a >= len(x) or k in _factors(x[a])):
                out.append(k)
            else:
                out.append(None)
        return out


def _gather_nd(data: list[Key], idx: list[Key] | None, batch_dims: int) -> list[Key | None] | None:
    """GatherND's output sizes: the indices' sizes but the last, then data's after the first
    batch_dims + k, k the indices' last size (a constant, or not known)."""
    k = key_int(idx[-1]) if idx else None
    if idx is None or k is None or not 0 <= batch_dims < len(idx) or not 1 <= k <= len(data) - batch_dims:
        return None
    return [*idx[:-1], *data[batch_dims + k:]]


def _factors(k: Key | None) -> list[Key]:
    """k as a product: its factors (k itself when it is no product)."""
    if k is None:
        return []
    return [*_factors(k[1]), *_factors(k[2])] if k[0] == "mul" else [k]


def _terms(k: Key) -> list[Key]:
    return [*_terms(k[1]), *_terms(k[2])] if k[0] == "add" else [k]


def _less(total: Key | None, part: Key | None) -> Key | None:
    """total - part when total is a sum with part among its terms (None otherwise)."""
    if total is None or part is None:
        return None
    terms, drop = _terms(total), _terms(part)
    for t in drop:
        if t not in terms:
            return None
        terms.remove(t)
    out: Key | None = ("c", 0)
    for t in terms:
        out = key_arith("Add", out, t)
    return out


def broadcast(parts: Sequence[Sequence[Key | None]]) -> list[Key | None] | None:
    """Numpy broadcasting of several operands' keys, right-aligned: 1s give way; equal keys are that
    key; a constant other than 1 is the size (or the run fails); else not known."""
    rank = max((len(q) for q in parts), default=0)
    out: list[Key | None] = []
    for a in range(rank):
        here = [q[a - rank + len(q)] for q in parts if a - rank + len(q) >= 0]
        rest = [k for k in here if k != ("c", 1)]
        consts = {k for k in rest if k is not None and k[0] == "c"}
        if not rest:
            out.append(("c", 1))
        elif len(consts) > 1:
            return None  # (the run would fail)
        elif consts:
            out.append(consts.pop())
        elif None not in rest and len(set(rest)) == 1:
            out.append(rest[0])
        else:
            out.append(None)
    return out
