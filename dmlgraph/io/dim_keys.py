"""A tensor's sizes as structural keys, traced back through the ops that carry sizes (no dim names).

`portable.entry_keys` says what a sizes *vector's* entries are; this says what a *tensor's* sizes are,
so that `Shape(Sub(Unsqueeze(Range(n)), ...))` and `Concat(Gather(Shape(x), 1), ...)` are seen to hold
the same sizes when both come from the same reads: a generator can then take the model's own sizes
vector instead of building one (`SizeBuilder.vector`). Every key is a true statement about the
run-time size (an op either determines it or the run fails), so equal keys are equal sizes.
"""
from __future__ import annotations

from collections.abc import Sequence

from dmlgraph.io.portable import Key, _arith, _const_array, _key_int, _size, entry_keys
from dmlgraph.ir.graph import Graph, OnnxNode, Value

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

    def _entries(self, v: Value | None, depth: int) -> list[Key | None] | None:
        """A sizes vector's entries, its Shape reads traced on from here (`entry_keys`)."""
        return entry_keys(self.g, v, 0, lambda src: self.dims(src, depth))

    def _trace(self, v: Value, depth: int) -> list[Key | None] | None:
        p = v.producer
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
            if start == [("c", 0)] and delta == [("c", 1)] and limit is not None and len(limit) == 1 \
                    and _size(limit[0]):
                return limit  # (a size is >= 0: the length is the limit itself)
            return None
        if x is None:
            return None
        if op in ("Unsqueeze", "Squeeze"):
            axes = _const_array(self.g, ins[1]) if len(ins) > 1 and ins[1] is not None else None
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
                total = _arith("Add", total, q[axis])  # type: ignore[index]
            return [total if a == axis else k for a, k in enumerate(x)]  # (Concat checks the others agree)
        if op == "Reshape" and len(ins) == 2:
            return self._reshape(x, self._entries(ins[1], depth), p.attr("allowzero", 0))
        if op == "Gather" and len(ins) == 2:
            idx, axis = self.dims(ins[1], depth), p.attr("axis", 0)
            if idx is None or not -len(x) <= axis < len(x):
                return None
            axis %= len(x)
            return [*x[:axis], *idx, *x[axis + 1:]]
        if op == "MatMul" and len(ins) == 2:
            y = self.dims(ins[1], depth)
            if y is None or len(x) < 2 or len(y) < 2:
                return None
            lead = broadcast([x[:-2], y[:-2]])
            return None if lead is None else [*lead, x[-2], y[-1]]
        return None

    @staticmethod
    def _reshape(x: list[Key], to: list[Key | None] | None, allowzero: int) -> list[Key | None] | None:
        """Reshape's output sizes: an entry > 0 (a constant, or a size where 0 would copy x's size and
        x's size is that same key), x's size for a 0 entry (allowzero 0), not known for -1."""
        if to is None:
            return None
        out: list[Key | None] = []
        for a, k in enumerate(to):
            c = _key_int(k)
            if c is not None:
                out.append(("c", c) if c > 0 or (c == 0 and allowzero) else
                           (x[a] if c == 0 and a < len(x) else None))
            elif k is not None and _size(k) and (allowzero or (a < len(x) and x[a] == k)):
                out.append(k)
            else:
                out.append(None)
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
