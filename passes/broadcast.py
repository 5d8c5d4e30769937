"""Output sizes of a rewritten mask application, as a plan (at match time) and ONNX nodes (at rewrite).

The DIAGONAL_MATRIX1 replacing `And(P, band)` or `Where(band, X, c)` takes the broadcast of the
operands' shapes as its run-time `shape`, computed without reading any mask and broadcast pairwise
by `Where(Equal(a, 1), b, a)`. Why that is exact: docs/internals.md, passes/broadcast.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, cast

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper

from dmlgraph.io.dim_keys import DimKeys, Key
from dmlgraph.ir.frozen import Frozen
from dmlgraph.ir.graph import Dim, DmlNode, Graph, Node, OnnxNode, Value, copied, produced_by
from dmlgraph.passes.common import const_value
from dmlgraph.passes.symbolic_ops.layout import slice_positions
from dmlgraph.rewrite import Context, detached, detached_constant


@dataclass
class Built:
    """The new nodes and constants of one replacement, detached (the rewriter adds them), in
    dependency order."""

    nodes: list[Node] = field(default_factory=list)
    initializers: list[Value] = field(default_factory=list)

    def constant(self, name: str, arr: npt.ArrayLike) -> Value:
        v = detached_constant(name, np.asarray(arr))
        self.initializers.append(v)
        return v

    def node(self, op_type: str, inputs: Sequence[Value | None], name: str, elem_type: int | None = TensorProto.INT64,
             shape: tuple[Dim, ...] | None = None, attributes: list[onnx.AttributeProto] | None = None,
             **attrs: Any) -> Value:
        out = detached(name, elem_type, shape)
        attributes = list(attributes or []) + [helper.make_attribute(k, v) for k, v in attrs.items()]
        # Unnamed: the rewriter makes the output's name unique, not the node's, and onnxruntime
        # refuses two nodes of one name (any number may have none).
        self.nodes.append(OnnxNode("", op_type, inputs, [out], attributes))
        return out


class ShapeSource(Frozen):
    """Where one operand's sizes come from: a static tuple, a 1-D int64 value, or Shape(of)."""

    rank: int
    static: tuple[int, ...] | None
    vector: Value | None  # a 1-D int64 value holding the sizes
    of: Value | None      # a value whose Shape() gives the sizes

    def __init__(self, rank: int, static: tuple[int, ...] | None = None, vector: Value | None = None,
                 of: Value | None = None) -> None:
        self.__dict__.update(rank=rank, static=static, vector=vector, of=of)


def shape_source(graph: Graph, v: Value) -> ShapeSource | None:
    """How to get `v`'s sizes at run time without keeping a mask alive (None: its rank is unknown)."""
    if v.shape is None:
        return None
    rank = len(v.shape)
    if v.static_shape is not None:
        return ShapeSource(rank, static=v.static_shape)
    p = cast(Value, copied(v)).producer  # (an Identity's output has its input's sizes)
    if isinstance(p, DmlNode):
        if p.inputs[1] is not None:
            return ShapeSource(rank, vector=p.inputs[1])
        if p.static_shape is not None:
            return ShapeSource(rank, static=p.static_shape)
        x = p.inputs[0]
        return None if x is None else shape_source(graph, x)
    if isinstance(p, OnnxNode) and p.domain in ("", "ai.onnx"):
        if p.op_type == "ConstantOfShape":
            s = p.inputs[0]
            arr = const_value(graph, s)
            return ShapeSource(rank, static=tuple(int(d) for d in arr)) if arr is not None \
                else ShapeSource(rank, vector=s)
        if p.op_type == "Expand":  # Expand of a one-element constant: the target sizes, padded
            c, t = p.inputs[0], p.inputs[1]
            arr = const_value(graph, c)
            if arr is not None and arr.size == 1 and t is not None and t.shape is not None and t.shape == (rank,) \
                    and arr.ndim <= rank:
                return ShapeSource(rank, vector=t)
    return ShapeSource(rank, of=v)


def same_dims(a: tuple[Dim, ...] | None, b: tuple[Dim, ...] | None) -> bool:
    """Shape inference proved these shapes equal: same length, every dim the same int or name.

    An `unk__N` name counts: shape inference invents one per unknown dim and copies it only where it
    proved the dims equal, and every shape of one graph comes from one inference run (rules copy
    names, they never invent them).
    """
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x is not None and x == y for x, y in zip(a, b))


def fits_into(operand: tuple[Dim, ...] | None, target: tuple[Dim, ...] | None) -> bool:
    """Broadcasting `operand` against `target` provably gives `target`'s shape: no more dims, each a
    static 1 or provably the target's."""
    if operand is None or target is None or len(operand) > len(target):
        return False
    return all(o == 1 or (o is not None and o == t) for o, t in zip(reversed(operand), reversed(target)))


def keeps_matrix(operand: tuple[Dim, ...] | list[Dim] | None, band: tuple[Dim, ...] | None) -> bool:
    """Broadcasting `operand` (a shape) against the band (its last two dims: `matrix_dims`) cannot
    change the band's matrix: each of the operand's last two dims is absent, a static 1, or provably
    the band's."""
    if operand is None or band is None or len(band) < 2:
        return False
    tail = (None,) * max(0, 2 - len(operand)) + tuple(operand[-2:])
    return all(o == 1 or (o is not None and o == b) or i < 2 - len(operand)
               for i, (o, b) in enumerate(zip(tail, band[-2:])))


def build_matrix_of(sizes: Value, band: ShapeSource, hint: str, built: Built) -> Value:
    """`sizes` with its last two entries replaced by the band's (leading dims broadcast, matrix the
    band's): the output sizes of an application whose data could not be proved to keep the band's
    matrix. Data that would widen it then fails to broadcast into these sizes when the node runs:
    an error, never a different mask."""
    lead = built.node("Slice", [sizes, built.constant(f"{hint}__c", [0]), built.constant(f"{hint}__c", [-2])],
                      f"{hint}__lead")
    if band.static is not None:
        tail = built.constant(f"{hint}__matrix", np.array(band.static[-2:], np.int64))
    else:
        vec = band.vector if band.vector is not None else built.node("Shape", [band.of], f"{hint}__band_shape")
        tail = built.node("Slice", [vec, built.constant(f"{hint}__c", [-2]), built.constant(f"{hint}__c", [band.rank])],
                          f"{hint}__matrix")
    return built.node("Concat", [lead, tail], f"{hint}__sizes", shape=sizes.shape, axis=0)


def build_guarded(sources: list[ShapeSource], band: ShapeSource, hint: str, built: Built, graph: Graph) -> Value | None:
    """`build_matrix_of(build_broadcast(sources), band)` without the "is this dim 1" chain, when
    the leading axes settle: every source but one has static 1s there (a band's [1, 1, H, W]), so
    the lead is that one's, read by one `Shape(start, end)`; the matrix is the band's entries as
    its sizes vector holds them. None when the lead does not settle so."""
    rank = max(s.rank for s in sources)
    if rank < 2:
        return None
    lead_of = None
    for s in sources:
        dims = _source_dims(graph, s) if s.vector is None else _entries(graph, s.vector)
        if dims is None or len(dims) != s.rank:
            return None
        lead = [1] * (rank - s.rank) + list(dims)
        if all(d == 1 for d in lead[:rank - 2]):
            continue
        if lead_of is not None or s.rank != rank:
            return None
        lead_of = s
    parts: list[Value] = []
    if rank > 2 and lead_of is not None:
        if lead_of.static is not None:
            parts.append(built.constant(f"{hint}__lead", np.array(lead_of.static[:rank - 2], np.int64)))
        elif lead_of.of is not None:
            parts.append(built.node("Shape", [lead_of.of], f"{hint}__lead", shape=(rank - 2,), start=0, end=rank - 2))
        else:
            parts.append(built.node("Slice", [cast(Value, lead_of.vector), built.constant(f"{hint}__c", [0]),
                                              built.constant(f"{hint}__c", [rank - 2])], f"{hint}__lead"))
    elif rank > 2:
        parts.append(built.constant(f"{hint}__lead", np.ones(rank - 2, np.int64)))
    if band.static is not None:
        parts.append(built.constant(f"{hint}__matrix", np.array(band.static[-2:], np.int64)))
    elif band.vector is not None:
        parts += _matrix_entries(graph, band.vector) or [
            built.node("Slice", [band.vector, built.constant(f"{hint}__c", [-2]), built.constant(f"{hint}__c", [band.rank])],
                       f"{hint}__matrix")]
    else:
        parts.append(built.node("Shape", [band.of], f"{hint}__matrix", shape=(2,), start=-2))
    if len(parts) == 1:
        return parts[0]
    return built.node("Concat", parts, f"{hint}__sizes", shape=(rank,), axis=0)


def _entries(graph: Graph, vec: Value | None) -> list[Dim] | None:
    """`vector_dims`, with an entry None where a `Concat`'s piece is not known but its length is."""
    dims = vector_dims(graph, vec)
    if dims is not None or vec is None:
        return dims
    p = vec.producer
    if not (isinstance(p, OnnxNode) and p.op_type == "Concat" and p.domain in ("", "ai.onnx")):
        return None
    out: list[Dim] = []
    for x in p.inputs:
        part = vector_dims(graph, x)
        n = _length(x)
        if part is None and n is None:
            return None
        out += part if part is not None else [None] * cast(int, n)
    return out


def _length(x: Value | None) -> int | None:
    return x.shape[0] if x is not None and x.shape is not None and len(x.shape) == 1 \
        and isinstance(x.shape[0], int) else None


def _matrix_entries(graph: Graph, vec: Value) -> list[Value] | None:
    """The values a `Concat` sizes vector ends with that hold its last two entries."""
    p = vec.producer
    if not (isinstance(p, OnnxNode) and p.op_type == "Concat" and p.domain in ("", "ai.onnx")):
        return None
    found: list[Value] = []
    need = 2
    for x in reversed(p.inputs):
        dims = vector_dims(graph, x)
        length = len(dims) if dims is not None else _length(x)
        if x is None or length is None or length > need:
            return None
        found.insert(0, x)
        need -= length
        if need == 0:
            return found
    return None


def broadcast_dims(shapes: list[tuple[Dim, ...]]) -> tuple[Dim, ...] | None:
    """The broadcast of inferred shapes where inference can tell it (unknown dims where it cannot)."""
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        out.append(dims.pop() if len(dims) == 1 else (1 if not dims else None))
    return tuple(out)


def needed(sources: list[ShapeSource]) -> list[ShapeSource]:
    """The sources that can change the broadcast: a static all-ones shape no longer than another
    operand's rank never does."""
    rank = max(s.rank for s in sources)
    keep = [s for s in sources if not (s.static is not None and all(d == 1 for d in s.static) and s.rank <= rank)]
    return keep or sources[:1]


def static_broadcast(sources: list[ShapeSource]) -> tuple[int, ...] | None:
    """numpy's broadcast of the sources when every one is static (None otherwise)."""
    if any(s.static is None for s in sources):
        return None
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*(cast("tuple[int, ...]", s.static) for s in sources)))
    except ValueError:
        return None


def _source_dims(graph: Graph, s: ShapeSource) -> list[Dim] | None:
    if s.static is not None:
        return list(s.static)
    if s.vector is not None:
        return vector_dims(graph, s.vector)
    return None if s.of is None or s.of.shape is None else list(s.of.shape)


def sum_name(a: str, b: str) -> str:
    """The dim name of a + b, as the dynamo exporter writes it ("past_sequence + sequence"), its
    terms sorted so that the two orders of one sum name one size."""
    return " + ".join(sorted([*a.split(" + "), *b.split(" + ")]))


def _canonical(d: Dim) -> Dim:
    """A dim name that is a sum of names, with its terms sorted (see `sum_name`)."""
    return " + ".join(sorted(d.split(" + "))) if isinstance(d, str) and " + " in d else d


def settled_broadcast(graph: Graph, sources: list[ShapeSource]) -> tuple[list[Dim], list[list[Dim]]] | None:
    """The broadcast of `sources` where shape inference settles it: on every axis the entries
    other than a static 1 are one int or one dim name (equal names are equal sizes; a name against
    a 1 is the name, whatever its size). A dim `DimKeys` traces to a constant is that constant,
    whatever name it is declared with (a declared name is a claim; the ops' sizes are not).
    Returns it and each source's dims (padded with 1s)."""
    rank = max(s.rank for s in sources)
    keys = DimKeys(graph)
    per: list[list[Dim]] = []
    for s in sources:
        dims = _source_dims(graph, s)
        if dims is None or len(dims) != s.rank:
            return None
        traced = keys.dims(s.of) if s.of is not None else keys.entries(s.vector) if s.vector is not None else None
        if traced is not None and len(traced) == s.rank:
            dims = [k[1] if k is not None and k[0] == "c" else _traced_name(graph, k) if d is None else d
                    for d, k in zip(dims, traced)]
        per.append([cast(Dim, 1)] * (rank - s.rank) + [_canonical(d) for d in dims])
    out: list[Dim] = []
    for i in range(rank):
        values = {d[i] for d in per} - {1}
        if None in values or len(values) > 1:
            return None
        out.append(values.pop() if values else 1)
    return out, per


def _traced_name(graph: Graph, k: Key | None) -> Dim:
    """A dim inference leaves unknown that `DimKeys` traces to a graph input's axis, named for it
    (an `unk__` name: made up, no claim; `_traced_reads` reads it off that axis)."""
    if k is None or k[0] != "dim" or not any(v.name == k[1] for v in graph.rule_inputs):
        return None
    return f"unk__{k[1]}:{k[2]}"


def _settled_vector(ctx: Context, sources: list[ShapeSource], hint: str, built: Built) -> Value | None:
    """The broadcast's sizes without an "is this dim 1" chain, when inference settles it: a source
    already holding them, else the dims read where the model reads them (`sizes.SizeBuilder`)."""
    from dmlgraph.passes.sizes import Made, SizeBuilder, locate
    from dmlgraph.passes.symbolic import Lin

    graph = ctx.graph
    settled = settled_broadcast(graph, sources)
    if settled is None:
        return None
    dims, per = settled
    rank = len(dims)
    for s, d in zip(sources, per):
        if s.rank == rank and d == dims:
            if s.static is not None:
                return built.constant(f"{hint}__sizes", np.array(s.static, np.int64))
            if s.vector is not None:
                return s.vector
    made = Made()
    builder = SizeBuilder(ctx, [], made)
    builder.reads = _traced_reads(graph, sources, per, dims, lambda name: builder.symbol_read(name)
                                  if locate(graph, [], name) is not None else None)
    if not all(isinstance(d, int) or d in builder.reads or (isinstance(d, str) and locate(graph, [], d) is not None)
               for d in dims):
        return None
    vec = builder.vector([Lin.of(d) if isinstance(d, int) else Lin.sym(cast(str, d)) for d in dims], hint)
    built.nodes.extend(made.nodes)
    built.initializers.extend(made.initializers)
    return vec


def _traced_reads(graph: Graph, sources: list[ShapeSource], per: list[list[Dim]], dims: list[Dim],
                  named: Callable[[str], tuple[Value, int] | None]) -> dict[str, tuple[Value, int]]:
    """The graph-input axes to read a broadcast's sizes off where the names would mislead or say
    nothing: a dim name is read off the first input naming it (`named`), a claim; where every
    operand holding that name traces (`DimKeys`, no names) to one other input axis, that axis is
    the size. A padding declared [1, 1, 1, "S"] but T long must not size the rows
    (docs/limits.md); a name no input has (`named` None: an `unk__N` inference made up for a
    GatherND's output) is read where it traces to."""
    keys, inputs = DimKeys(graph), {v.name: v for v in graph.rule_inputs}
    traced: dict[str, set] = {}
    for s, d in zip(sources, per):
        got = keys.dims(s.of) if s.of is not None else keys.entries(s.vector) if s.vector is not None else None
        if got is None or len(got) != s.rank:
            continue
        for name, k in zip(d[len(d) - s.rank:], got):
            if isinstance(name, str):
                traced.setdefault(name, set()).add(k)
    out: dict[str, tuple[Value, int]] = {}
    for name, found in traced.items():
        if name not in dims or len(found) != 1:
            continue
        (k,) = found
        if k is None or k[0] != "dim" or k[1] not in inputs:
            continue
        claim = named(name)
        if claim is None or (claim[0].name, claim[1]) != (k[1], k[2]):
            out[name] = (inputs[k[1]], k[2])
    return out


def build_broadcast(sources: list[ShapeSource], hint: str, built: Built, ctx: Context | None = None) -> Value:
    """The broadcast of `sources` (a 1-D int64 value), computed by nodes added to `built`."""
    if ctx is not None:
        settled = _settled_vector(ctx, sources, hint, built)
        if settled is not None:
            return settled
    rank = max(s.rank for s in sources)
    vectors: list[Value] = []
    for s in sources:
        if s.static is not None:
            v = built.constant(f"{hint}__sizes", np.array((1,) * (rank - s.rank) + s.static, np.int64))
        else:
            v = s.vector if s.vector is not None else built.node("Shape", [s.of], f"{hint}__shape", shape=(s.rank,))
            if s.rank < rank:
                ones = built.constant(f"{hint}__ones", np.ones(rank - s.rank, np.int64))
                v = built.node("Concat", [ones, v], f"{hint}__padded", shape=(rank,), axis=0)
        vectors.append(v)
    out = vectors[0]
    if len(vectors) > 1:
        one = built.constant(f"{hint}__one", np.array(1, np.int64))
        for v in vectors[1:]:
            is_one = built.node("Equal", [out, one], f"{hint}__is_one", TensorProto.BOOL, (rank,))
            out = built.node("Where", [is_one, v, out], f"{hint}__sizes", shape=(rank,))
    return out


# ---- what a shape vector holds ------------------------------------------------------------------------
def vector_dims(graph: Graph, v: Value | None, depth: int = 0) -> list[Dim] | None:
    """The dims a 1-D int64 shape vector holds, as ints and inferred dim names (None: an entry not
    known; the whole result None: not even the length).

    Follows the plumbing exporters and this package write: constants, `Shape` (with start/end),
    `Gather`/`Slice` by constants, `Concat`, `Unsqueeze`/`Squeeze`/`Reshape`/`Cast`/`Identity`, and
    `Where(Equal(v, -1), ones, v)` (TorchScript's "-1 means keep" of `expand`) and this module's
    `Where(Equal(a, 1), b, a)`. A dim name is a size >= 0, so it never equals a negative constant.
    """
    if v is None or depth > 32:
        return None
    arr = const_value(graph, v)
    if arr is not None:
        return [int(d) for d in np.asarray(arr).reshape(-1)] if np.asarray(arr).dtype.kind in "iu" else None
    p = v.producer
    if isinstance(p, DmlNode) or not isinstance(p, OnnxNode) or p.domain not in ("", "ai.onnx"):
        return None
    op, ins = p.op_type, p.inputs

    def sub(i: int) -> list[Dim] | None:
        return vector_dims(graph, ins[i] if i < len(ins) else None, depth + 1)

    if op == "Shape":
        src = ins[0]
        if src is None or src.shape is None:
            return None
        return list(src.shape)[slice(p.attr("start", 0), p.attr("end", None))]
    if op in ("Unsqueeze", "Squeeze", "Reshape", "Cast", "Identity", "Flatten"):
        return sub(0)
    if op == "Concat":
        parts = [vector_dims(graph, x, depth + 1) for x in ins]
        known = [q for q in parts if q is not None]
        return None if len(known) != len(parts) else [d for q in known for d in q]
    if op in ("Gather", "Slice"):
        dims = sub(0)
        if dims is None:
            return None
        if op == "Gather":
            idx = const_value(graph, ins[1])
            if idx is None or not all(-len(dims) <= int(i) < len(dims) for i in np.asarray(idx).reshape(-1)):
                return None  # (an index out of range: the model fails when it runs, not here)
            return [dims[int(i)] for i in np.asarray(idx).reshape(-1)]
        bounds = [const_value(graph, x) for x in ins[1:]]
        if any(b is None for b in bounds) or (len(bounds) > 2 and list(np.asarray(bounds[2]).reshape(-1)) != [0]):
            return None
        step = int(np.asarray(bounds[3]).reshape(-1)[0]) if len(bounds) > 3 else 1
        if step == 0:
            return None
        # (ONNX's clamps, not Python's: they differ stepping back)
        return [dims[i] for i in slice_positions(len(dims), int(np.asarray(bounds[0]).reshape(-1)[0]),
                                                 int(np.asarray(bounds[1]).reshape(-1)[0]), step)]
    if op == "ConstantOfShape":
        n, t = sub(0), p.attr("value")
        fill = 0 if t is None else int(onnx.numpy_helper.to_array(t).reshape(-1)[0])
        return None if n is None or len(n) != 1 or not isinstance(n[0], int) else [fill] * n[0]
    if op == "Add":  # one size plus another: dynamo names such a dim "past_sequence + sequence"
        a, b = sub(0), sub(1)
        if a is None or b is None or len(a) != 1 or len(b) != 1:
            return None
        if isinstance(a[0], int) and isinstance(b[0], int):
            return [a[0] + b[0]]
        return [sum_name(a[0], b[0])] if isinstance(a[0], str) and isinstance(b[0], str) else [None]
    if op == "Mul":
        a, b = sub(0), sub(1)
        if a is None or b is None or not all(isinstance(d, int) for d in a + b):
            return None
        product = np.multiply(cast("list[int]", a), cast("list[int]", b))
        return [int(d) for d in np.broadcast_to(product, np.broadcast_shapes((len(a),), (len(b),)))]
    if op == "Where":
        return _where_dims(graph, p, depth)
    return None


def _where_dims(graph: Graph, p: OnnxNode, depth: int) -> list[Dim] | None:
    """`Where(Equal(x, c), a, b)` over shape vectors, entry by entry (c a constant)."""
    cond = produced_by(p.inputs[0], "Equal")
    if cond is None:
        return None
    x, cs, a, b = (vector_dims(graph, v, depth + 1) for v in (cond.inputs[0], cond.inputs[1], *p.inputs[1:3]))
    if x is None or cs is None or a is None or b is None or not len(x) == len(a) == len(b) \
            or len(cs) not in (1, len(x)) or not all(isinstance(ci, int) for ci in cs):
        return None
    consts = cast("list[int]", cs * len(x) if len(cs) == 1 else cs)
    out: list[Dim] = []
    for xi, c, ai, bi in zip(x, consts, a, b):
        if isinstance(xi, int):
            out.append(ai if xi == c else bi)
        elif xi is not None and c < 0:
            out.append(bi)  # a dim name is never negative
        elif ai is not None and ai == bi:
            out.append(ai)  # both branches agree
        elif ai == c and bi is not None and bi == xi:
            out.append(xi)  # Where(x == c, c, x) is x (the broadcast of a dim with a 1)
        else:
            out.append(None)
    return out


def matrix_dims(graph: Graph, v: Value) -> tuple[Dim, Dim] | None:
    """The last two dims of `v`: for a DIAGONAL_MATRIX1 output, read from its own sizes (the sizes a
    generator was proved to have can name input dims that shape inference could not see)."""
    p = cast(Value, copied(v)).producer
    if isinstance(p, DmlNode):
        sizes = p.matrix if p.claimed else p.inputs[1]  # (a claimed node's matrix is its mask's)
        if sizes is not None:
            dims = vector_dims(graph, sizes)
            if dims is not None and len(dims) >= 2 and None not in dims[-2:]:
                return cast("tuple[Dim, Dim]", tuple(dims[-2:]))
        elif p.static_shape is not None:
            return cast("tuple[Dim, Dim]", tuple(p.static_shape[-2:]))
    return None if v.shape is None or len(v.shape) < 2 else cast("tuple[Dim, Dim]", tuple(v.shape[-2:]))
