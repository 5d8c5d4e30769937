"""Sizes at run time: ONNX nodes computing a mask's output shape and bound shift from the inputs' shapes.

A lowered mask whose sizes vary reads them where the original did: `Shape(input)[axis]`, combined
by the integer affine expressions `dmlgraph.passes.symbolic` proved (`past + 1`, `min(T, 64)`). Nodes the
graph already has (Shape/Gather/Concat of the same values) are reused, and so are the nodes made
for an earlier copy of the same mask, so a model's per-layer masks share one set of size nodes and
optimizing a portable export again reproduces the same graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeGuard, cast

import numpy as np
from onnx import TensorProto, helper

from dmlgraph.io.dim_keys import DimKeys, Key
from dmlgraph.ir.dtypes import bitwise_equal
from dmlgraph.ir.graph import Graph, Node, OnnxNode, Value, copies
from dmlgraph.passes.common import const_value
from dmlgraph.passes.symbolic import Clamp, Difference, Dim, Lin, Symbol
from dmlgraph.rewrite import Context, detached, detached_constant


class SizeMemo:
    """One optimizer run's size nodes and constants, found again by what they compute (a context
    analysis: `ctx.analysis(SizeMemo)`), so copies of one mask share their plumbing."""

    def __init__(self, graph: Graph):
        self.constants: dict[tuple, tuple[Value, TensorProto | None, np.ndarray | None]] = {}
        self.plumbing: dict[tuple, Node] | None = None  # the graph's size nodes by _plumbing_key
        self.values: dict[tuple, tuple[Value, list]] = {}  # SizeBuilder's results, with the nodes they read


@dataclass
class Made:
    """What one replacement creates besides its generator: new constants and size nodes (detached:
    the rewriter adds them), each made once (a second request in the same replacement finds it)."""

    initializers: list[Value] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    constants: dict[tuple, Value] = field(default_factory=dict)
    plumbing: dict[tuple, Node] = field(default_factory=dict)


def constant(ctx: Context, name: str, arr: np.ndarray, made: Made) -> Value:
    """The initializer `name` if it already holds exactly `arr`, else a new one (added to `made`)."""
    graph, found = ctx.graph, ctx.analysis(SizeMemo).constants  # (each rewrite asks for the same few)
    key = (name, arr.dtype.str, arr.shape, arr.tobytes())
    if key in made.constants:
        return made.constants[key]
    hit = found.get(key)
    if hit is not None:
        cached, tensor, array = hit
        if graph.find(cached.name) is cached and graph.stored(cached) and cached.initializer is tensor \
                and cached.array is array:
            return cached  # (still that initializer, holding what it held)
    existing = graph.find(name)  # (a body reads its scopes' constants too)
    if existing is None or not graph.stored(existing) or existing.name in graph.overridable_inputs:
        v = _new_constant(name, arr, made)
    else:
        old = const_value(graph, existing)
        same = old is not None and bitwise_equal(np.asarray(old), arr)
        v = existing if same else _new_constant(name, arr, made)
    made.constants[key] = v
    found[key] = (v, v.initializer, v.array)
    return v


def _new_constant(name: str, arr: np.ndarray, made: Made) -> Value:
    v = detached_constant(name, arr)
    made.initializers.append(v)
    return v


_PLUMBING_OPS = ("Shape", "Gather", "Concat", "Reshape", "Add", "Sub", "Mul", "Neg", "Min", "Max", "Div")


def _plumbing_key(op_type: str, inputs: Sequence[Value | None], attributes: Sequence) -> tuple:
    """attributes: AttributeProtos, or (name, int) pairs."""
    return op_type, tuple(id(v) for v in inputs), tuple(a if isinstance(a, tuple) else (a.name, a.i) for a in attributes)


def existing_size_node(ctx: Context, op_type: str, inputs: list[Value], axis: int | None) -> Value | None:
    """The output of a node already computing op_type(inputs) (axis attribute as given), if any.

    Reusing it keeps shared size plumbing shared, and makes optimizing a portable export again
    reproduce the same graph instead of a renamed copy. The lookup is a hash of the graph's size
    plumbing, built once per optimizer run (scanning the input's consumers instead is quadratic
    when thousands of blocks read the same input's shape).
    """
    graph, memo = ctx.graph, ctx.analysis(SizeMemo)
    index = memo.plumbing
    if index is None:
        index = memo.plumbing = {}
        for p in [*graph.nodes.values(), *_enclosing_plumbing(graph)]:
            if _plumbing(p):
                index.setdefault(_plumbing_key(p.op_type, p.inputs, p.attributes), p)
    key = _plumbing_key(op_type, inputs, () if axis is None else (("axis", axis),))
    n = index.get(key)
    if n is None:
        return None
    # (A node's op type and attributes never change after it is made: its inputs may.)
    if not graph.sees(n) or n.inputs != inputs:
        # Removed or rewired (replace_uses) since it was indexed; a live twin may remain.
        n = next((c for c in graph.visible_readers(inputs[0]) if _computes(graph, c, inputs, key)), None)
        if n is None:
            del index[key]
            return None
        index[key] = n
    return n.outputs[0]


def _computes(graph: Graph, n: Node, inputs: list[Value], key: tuple) -> bool:
    return graph.sees(n) and isinstance(n, OnnxNode) and _plumbing(n) and n.inputs == inputs \
        and _plumbing_key(n.op_type, n.inputs, n.attributes) == key


def _enclosing_plumbing(graph: Graph) -> list[Node]:
    """A body's view of its scopes' size plumbing: the nodes that compute what it reads, followed
    back (at most OUTER_PLUMBING nodes; not into other bodies), whose plumbing it may read too."""
    found: dict[int, Node] = {}
    stack = list(graph.free_values().values()) if graph.parent is not None else []
    while stack and len(found) < OUTER_PLUMBING:
        p = stack.pop().producer
        if p is not None and p.id not in found and not (isinstance(p, OnnxNode) and p.has_subgraph):
            found[p.id] = p
            stack.extend(x for x in p.inputs if x is not None)
    return list(found.values())


OUTER_PLUMBING = 256


def _plumbing(n: Node) -> TypeGuard[OnnxNode]:
    return isinstance(n, OnnxNode) and n.op_type in _PLUMBING_OPS and n.domain in ("", "ai.onnx") \
        and len(n.outputs) == 1 and None not in n.inputs


def locate(graph: Graph, inputs: Sequence[Value], name: Symbol) -> tuple[Value, int] | None:
    """A value and axis whose size is the dim named `name` (the mask's own inputs first, then the
    graph's inputs), so the lowered mask reads it where the model has it."""
    return next(iter(claims(graph, inputs, name)), None)


def claims(graph: Graph, inputs: Sequence[Value], name: Symbol) -> list[tuple[Value, int]]:
    """Every value and axis whose dim is named `name`: among the mask's own inputs (whose shapes its
    proof read), else among the graph's inputs; `locate`'s is the first. Several are a claim that
    their sizes agree, which the proof took as a premise and a model may break (Optimum's merged
    decoders name attention_mask's length like input_ids', though it is past + sequence)."""
    # Graph inputs first, in their order: the same choice when a portable output is lowered again
    # (its guard makes the mask read more of the inputs, in another order).
    order = {v.name: i for i, v in enumerate(graph.rule_inputs)}
    for values in (list(dict.fromkeys(inputs)), graph.rule_inputs):
        found = [(v, axis) for v in values for axis, d in enumerate(v.shape or ()) if d == name]
        if found:
            return sorted(found, key=lambda p: order.get(p[0].name, len(order)))
    return []


def _existing_dim_read(graph: Graph, v: Value, axis: int) -> Value | None:
    """The output of a node the model has reading exactly dim `axis` of `v` as a [1] tensor:
    `Shape(v, start=axis, end=axis + 1)` (the dynamo exporter's form), negative bounds included."""
    rank = len(v.shape or ())
    same = copies(v)  # (a Shape of an Identity of v reads v's sizes too)
    for n in [n for u in same for n in graph.visible_readers(u)]:
        if not (isinstance(n, OnnxNode) and n.op_type == "Shape" and n.domain in ("", "ai.onnx")
                and graph.sees(n) and n.inputs and any(n.inputs[0] is u for u in same) and rank):
            continue
        start, end = n.attr("start", 0), n.attr("end", None)
        if end is None:
            continue
        start, end = (start + rank if start < 0 else start), (end + rank if end < 0 else end)
        if start == axis and end == axis + 1:
            return n.outputs[0]
    return None


def _existing_gather(graph: Graph, shape: Value, axis: int, scalar: bool = False) -> OnnxNode | None:
    """A node the model has reading entry `axis` of the shape vector `shape` as a [1] tensor:
    `Gather(shape, c, axis=0)` of a constant c holding [axis] (so its `Concat`s are found too);
    with `scalar`, as a 0-D tensor (c a 0-D constant)."""
    rank = shape.shape[0] if shape.shape and isinstance(shape.shape[0], int) else None
    for n in graph.visible_readers(shape):
        if not (isinstance(n, OnnxNode) and n.op_type == "Gather" and n.domain in ("", "ai.onnx") and graph.sees(n)
                and len(n.inputs) == 2 and n.inputs[0] is shape and n.attr("axis", 0) == 0):
            continue
        idx = const_value(graph, n.inputs[1])
        if idx is None or idx.shape != (() if scalar else (1,)) or idx.dtype.kind not in "iu":
            continue
        at = int(idx.reshape(-1)[0])
        if at == axis or (rank is not None and at < 0 and at + rank == axis):
            return n
    return None


CONE = 256  # nodes of a replaced value's cone searched for a Shape of its sizes


def _cone(graph: Graph, v: Value) -> tuple[list[Node], set[int]] | None:
    """The nodes `v` is computed from, nearest first (a Shape's input is not followed: only its
    sizes are read), and the ids of those that die once v's producer is replaced: every reader
    dead and no graph output. None: no producer, or more than CONE nodes."""
    first = v.producer
    if first is None:
        return None
    order, seen = [first], {first.id}
    for n in order:
        if len(order) > CONE:
            return None
        if isinstance(n, OnnxNode) and n.op_type == "Shape":
            continue
        for x in n.inputs:
            p = x.producer if x is not None else None
            if p is not None and p.id not in seen and p.id in graph.nodes:
                seen.add(p.id)
                order.append(p)
    dead = {first.id}
    changed = True
    while changed:
        changed = False
        for n in order:
            if n.id not in dead and all(not graph.is_graph_output(o) and all(c.id in dead for c in o.consumers)
                                        for o in n.outputs):
                dead.add(n.id)
                changed = True
    return order, dead


def _full_shape(graph: Graph, n: Node, rank: int) -> TypeGuard[OnnxNode]:
    """`Shape(y)` of every axis of a rank-`rank` y, a node of the graph."""
    return isinstance(n, OnnxNode) and n.op_type == "Shape" and n.domain in ("", "ai.onnx") and graph.sees(n) \
        and bool(n.inputs) and n.inputs[0] is not None and len(n.inputs[0].shape or ()) == rank \
        and n.attr("start", 0) == 0 and n.attr("end", None) is None


class SizeBuilder:
    """Makes (or finds) the nodes computing size expressions over the shapes of the graph's values.

    Symbols are dim names, read from `inputs` (or the graph's inputs), or from the axis `reads`
    gives (one proved to hold that size, where the names alone would mislead). New nodes and
    constants go to `made`, detached: the rewriter adds them with the generator.
    """

    def __init__(self, ctx: Context, inputs: Sequence[Value], made: Made,
                 derived: dict[Symbol, tuple[Lin, int]] | None = None):
        self.ctx, self.graph, self.memo = ctx, ctx.graph, ctx.analysis(SizeMemo)
        self.inputs = list(inputs)
        self.made = made
        self.derived = derived or {}  # symbols standing for e // k
        self.reads: dict[Symbol, tuple[Value, int]] = {}  # (set by a caller that traced them)

    def vector(self, dims: Sequence[Dim], hint: str, replacing: Value | None = None) -> Value:
        """A 1-D int64 tensor holding every dim: the output shape. `replacing`: the value the
        vector's node replaces, whose cone may hold a Shape of the same sizes (`_own_vector`)."""
        def make(chain: list) -> Value:
            own = None if replacing is None else self._own_vector(dims, replacing, chain)
            return own if own is not None else self._node(
                "Concat", [self.dim(d, chain) for d in dims], f"{hint}__sizes", chain, axis=0, shape=(len(dims),))
        return self._cached(("vector", tuple(self._key(d) for d in dims)), make)

    def _own_vector(self, dims: Sequence[Dim], replacing: Value, chain: list) -> Value | None:
        """The model's own `Shape(y)` holding exactly `dims`, read where it stays: y's sizes and the
        dims' reads traced to the same keys (`DimKeys`: Range lengths, broadcasts, Reshape and Concat
        sizes; never dim names), the Shape found in the cone of `replacing` (or reading a value of
        it) and kept by a reader that does not die with it. TorchScript's T5 builds its relative
        positions' [S, P + S] and reads `Shape(Sub)` of them: the generator reads that, no Concat."""
        keys = DimKeys(self.graph)
        want = [self._dim_key(d, keys) for d in dims]
        if None in want:
            return None
        cone = _cone(self.graph, replacing)
        if cone is None:
            return None
        nodes, dead = cone
        seen: set[int] = set()
        for n in nodes:
            # (never a Shape of what the replaced node writes: the generator takes those values over,
            # so that Shape would read its own output, a cycle: ProphetNet's `Shape(Trilu)`, XLNet's
            # `Shape(mask)`)
            for v in [*n.outputs, *(i for i in n.inputs if i is not None)]:
                if v.producer is not None and v.producer is replacing.producer:
                    continue
                for s in self.graph.visible_readers(v):
                    if s.id in seen or s.id in dead or not _full_shape(self.graph, s, len(want)):
                        continue
                    seen.add(s.id)
                    if keys.dims(s.inputs[0]) == want:
                        chain.append((s, list(s.inputs)))
                        return s.outputs[0]
        return None

    def _dim_key(self, d: Dim, keys: DimKeys) -> Key | None:
        """d as a structural key of what `dim` reads for it: sums of sizes and constants only."""
        if not isinstance(d, Lin) or d.const < 0 or any(c <= 0 or sym in self.derived for sym, c in d.terms):
            return None
        acc: Key | None = ("c", d.const)
        for sym, c in d.terms:
            v, axis = self.symbol_read(sym)
            k = keys.dims(v)
            if k is None or axis >= len(k):
                return None
            term = k[axis] if c == 1 else ("mul", *sorted((k[axis], ("c", c)), key=repr))
            acc = ("add", *sorted((acc, term), key=repr)) if acc != ("c", 0) else term
        return acc

    def scalar(self, e: Lin | Clamp, hint: str) -> Value:
        """A 0-D int64 tensor holding e: the run-time shift of a mask's bounds."""
        def make(chain: list) -> Value:
            own = self._own_scalar(e, chain)
            if own is not None:
                return own
            one = self.dim(e, chain)
            empty = constant(self.ctx, "dmlgraph__scalar_shape", np.zeros(0, np.int64), self.made)
            return self._node("Reshape", [one, empty], f"{one.name}__scalar", chain, shape=())
        return self._cached(("scalar", self._key(e)), make)

    def dim(self, d: Dim, chain: list) -> Value:
        """A [1] int64 tensor holding d."""
        if isinstance(d, Difference):
            a, b = self.dim(d.a, chain), self.dim(d.b, chain)
            return self._node("Sub", [a, b], f"{a.name}__sub", chain, shape=(1,))
        if isinstance(d, Clamp):
            x = self.dim(d.inner, chain)
            if d.lo is not None:
                x = self._node("Max", [x, self._const(d.lo)], f"{x.name}__atleast{d.lo}", chain, shape=(1,))
            if d.hi is not None:
                x = self._node("Min", [x, self._const(d.hi)], f"{x.name}__atmost{d.hi}", chain, shape=(1,))
            return x
        if d.is_const:
            return self._const(d.const)
        acc: Value | None = None
        for sym, c in d.terms:
            term = self._symbol(sym, chain)
            if abs(c) != 1:
                term = self._node("Mul", [term, self._const(abs(c))], f"{term.name}__x{abs(c)}", chain, shape=(1,))
            if acc is None:
                acc = term if c > 0 else self._node("Neg", [term], f"{term.name}__neg", chain, shape=(1,))
            else:
                op = "Add" if c > 0 else "Sub"
                acc = self._node(op, [acc, term], f"{acc.name}__{op.lower()}", chain, shape=(1,))
        assert acc is not None
        if d.const:
            op = "Add" if d.const > 0 else "Sub"
            acc = self._node(op, [acc, self._const(abs(d.const))], f"{acc.name}__{op.lower()}{abs(d.const)}", chain,
                             shape=(1,))
        return acc

    def _symbol(self, sym: Symbol, chain: list) -> Value:
        if sym in self.derived:  # e // k: ONNX's integer Div truncates, which is floor for e >= 0
            e, k = self.derived[sym]
            x = self.dim(e, chain)
            return self._node("Div", [x, self._const(k)], f"{x.name}__div{k}", chain, shape=(1,))
        v, axis = self.symbol_read(sym)
        return _existing_dim_read(self.graph, v, axis) or self._read(v, axis, chain)

    def symbol_read(self, sym: Symbol) -> tuple[Value, int]:
        """The value and axis `_symbol` reads: the one `reads` gives, else the first claim the model
        reads as Shape(u, start=a, end=a + 1) itself, else the first."""
        if sym in self.reads:
            return self.reads[sym]
        found = claims(self.graph, self.inputs, sym)
        assert found, f"no input has a dim named {sym!r} (checked when matched)"
        return next(((u, a) for u, a in found if _existing_dim_read(self.graph, u, a) is not None), found[0])

    def _own_scalar(self, e: Lin | Clamp, chain: list) -> Value | None:
        """The model's own 0-D int64 value of e, where it computes one: a plain size's
        `Gather(Shape(v), axis)` with a 0-D index (TorchScript's `size(axis)`), or the `Add`/`Sub`
        of two such reads (a KV cache's `past = total - S`). No Gather, arithmetic and Reshape of
        our own beside the model's."""
        if not isinstance(e, Lin) or e.const or not 1 <= len(e.terms) <= 2 \
                or any(abs(c) != 1 or sym in self.derived for sym, c in e.terms):
            return None
        terms = sorted(e.terms, key=lambda t: -t[1])  # (a + b, a - b, or a: the positive term first)
        if terms[0][1] != 1:
            return None
        reads = [self._own_read(sym) for sym, _ in terms]
        if None in reads:
            return None
        steps = cast("list[OnnxNode]", reads)
        if len(terms) == 2:
            a, b = (n.outputs[0] for n in steps)
            op = "Add" if terms[1][1] > 0 else "Sub"
            out = existing_size_node(self.ctx, op, [a, b], None)
            if out is None and op == "Add":
                out = existing_size_node(self.ctx, op, [b, a], None)
            if out is None or out.producer is None or out.shape != ():
                return None
            steps.append(cast(OnnxNode, out.producer))
        for n in steps:
            chain.append((n, list(n.inputs)))
        return steps[-1].outputs[0]

    def _own_read(self, sym: Symbol) -> OnnxNode | None:
        """The model's own `Gather(Shape(v), axis)` with a 0-D index, v and axis the symbol's first claim."""
        found = [self.reads[sym]] if sym in self.reads else claims(self.graph, self.inputs, sym)
        if not found:
            return None
        v, axis = found[0]
        shape = existing_size_node(self.ctx, "Shape", [v], None)
        return None if shape is None else _existing_gather(self.graph, shape, axis, scalar=True)

    def guard(self, exprs: Sequence[Lin]) -> Value | None:
        """A 0-D int64 zero that the run fails to compute where the values whose dims share the name
        of a size `exprs` read disagree on it (None: no such claim). The proof took every dim of a
        name for one size; this checks that claim at run time across values, where `_symbol` reads one:
        per other value's size b, Gather([0], (a - b)^2) is [0] where they agree and an index out of
        range (onnxruntime refuses the run, naming the node) where not. It goes to the node's bound
        shift (adding 0), not into the sizes, which shape inference must still see through.
        (Two axes of one value sharing a name are not checked: such a value is rarely a lie.)"""
        syms: dict[Symbol, None] = {}
        todo = list(exprs)
        while todo:
            for sym, _ in todo.pop().terms:
                if sym in self.derived:
                    todo.append(self.derived[sym][0])
                else:
                    syms[sym] = None
        pairs = []
        seen = self._cone_reads()
        keys = DimKeys(self.graph)

        def traced(v: Value, axis: int) -> Key | None:
            dims = keys.dims(v)
            return dims[axis] if dims is not None and axis < len(dims) else None

        for sym in syms:
            (v0, axis0), *others = claims(self.graph, self.inputs, sym)
            first = traced(v0, axis0)
            # (a claim whose two sizes trace to one key holds by the ops themselves: no guard)
            pairs += [(sym, (v0, axis0), (v, axis)) for v, axis in dict(reversed(others)).items()
                      if v is not v0 and (seen is None or any(v is u for u in self.inputs)
                                          or ("dim", v.name, axis) in seen)
                      and (first is None or traced(v, axis) != first)]
        if not pairs:
            return None

        def make(chain: list) -> Value:
            zero = self._const(0)
            acc = None
            for sym, first, (v, axis) in pairs:
                d = self._node("Sub", [self._read(*first, chain), self._read(v, axis, chain)],
                               f"dmlgraph__{sym}__vs_{v.name}_{axis}", chain, shape=(1,))
                sq = self._node("Mul", [d, d], f"{d.name}__squared", chain, shape=(1,))
                ok = self._node("Gather", [zero, sq], f"dmlgraph__{sym}__same_in_{v.name}_{axis}", chain, axis=0,
                                shape=(1,))
                acc = ok if acc is None else self._node("Add", [acc, ok], f"{acc.name}__and", chain, shape=(1,))
            assert acc is not None
            empty = constant(self.ctx, "dmlgraph__scalar_shape", np.zeros(0, np.int64), self.made)
            return self._node("Reshape", [acc, empty], f"{acc.name}__scalar", chain, shape=())
        return self._cached(("guard", tuple((self._source(s), s) for s in syms)), make)

    def _cone_reads(self) -> set[Key] | None:
        """The graph-input axes the proof's reads are sizes of: every symbolic dim of the mask's
        inputs traced back (`DimKeys`) to graph inputs' axes and constants (None: one is not, so any
        claim may be in them). A claim on an axis not among them is one the original mask never
        reads, so the lowered mask cannot differ from it there: no guard (docs/semantics.md)."""
        names = {v.name for v in self.graph.rule_inputs}
        keys = DimKeys(self.graph)
        out: set[Key] = set()
        todo: list[Key | None] = []
        for v in self.inputs:
            dims = keys.dims(v)
            if dims is None:
                return None
            todo += [k for k, d in zip(dims, v.shape or ()) if not isinstance(d, int)]
        while todo:
            k = todo.pop()
            if k is None or k[0] not in ("c", "dim", "add", "mul"):
                return None
            if k[0] in ("add", "mul"):
                todo += [k[1], k[2]]
            elif k[0] == "dim":
                if k[1] not in names:
                    return None
                out.add(k)
        return out

    def add(self, a: Value, b: Value) -> Value:
        """a + b, two 0-D int64 tensors."""
        return self._node("Add", [a, b], f"{a.name}__plus", [], shape=())

    def _read(self, v: Value, axis: int, chain: list) -> Value:
        """A [1] int64 tensor holding v's size on `axis`."""
        shape = self._node("Shape", [v], f"{v.name}__shape", chain, shape=(len(v.shape or ()),))
        own = _existing_gather(self.graph, shape, axis)
        if own is not None:  # (the model's own Gather, whatever its index constant is named)
            chain.append((own, list(own.inputs)))
            return own.outputs[0]
        idx = constant(self.ctx, f"dmlgraph__axis{axis}", np.array([axis], np.int64), self.made)
        return self._node("Gather", [shape, idx], f"{v.name}__dim{axis}", chain, axis=0, shape=(1,))

    def _const(self, c: int) -> Value:
        return constant(self.ctx, f"dmlgraph__size{c}" if c >= 0 else f"dmlgraph__size_neg{-c}",
                        np.array([c], np.int64), self.made)

    def _key(self, d: Dim) -> tuple:
        def lin(e: Lin) -> tuple:
            return tuple((self._source(s), s, c) for s, c in e.terms), e.const
        if isinstance(d, Difference):
            return ("difference", self._key(d.a), self._key(d.b))
        return ("clamp", lin(d.inner), d.lo, d.hi) if isinstance(d, Clamp) else ("lin", lin(d))

    def _source(self, sym: Symbol) -> object:
        """What a symbol is read from: an input's identity, or a derived symbol's definition."""
        if sym in self.derived:
            e, k = self.derived[sym]
            return ("div", self._key(e), k)
        found = [self.reads[sym]] if sym in self.reads else claims(self.graph, self.inputs, sym)
        return tuple((id(v), axis) for v, axis in found) if found else sym

    def _cached(self, key: tuple, make: Callable[[list], Value]) -> Value:
        """The value made for `key` before, while every node of it is alive and reads what it read."""
        done = self.memo.values
        hit = done.get(key)
        if hit is not None and all(self.graph.sees(n) and n.inputs == ins for n, ins in hit[1]):
            return hit[0]
        chain: list = []
        out = make(chain)
        done[key] = (out, chain)
        return out

    def _node(self, op_type: str, inputs: list[Value], name_hint: str, chain: list, axis: int | None = None,
              shape: tuple | None = None) -> Value:
        attrs = [] if axis is None else [helper.make_attribute("axis", axis)]
        key = _plumbing_key(op_type, inputs, attrs)
        n = self.made.plumbing.get(key)
        out = n.outputs[0] if n is not None else \
            existing_size_node(self.ctx, op_type, inputs, axis) if op_type in _PLUMBING_OPS else None
        if out is None:
            out = detached(name_hint, TensorProto.INT64, shape)
            n = OnnxNode("", op_type, inputs, [out], attrs)  # the rewriter names it after its output
            self.made.plumbing[key] = n
            if op_type in _PLUMBING_OPS:
                if self.memo.plumbing is not None:  # (else made with the index, on first use)
                    self.memo.plumbing[key] = n
            self.made.nodes.append(n)
        n = n if n is not None else out.producer
        assert n is not None
        chain.append((n, list(n.inputs)))
        return out
