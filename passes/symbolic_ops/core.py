"""The registry of op handlers, `evaluate` (which runs a cone through them) and the helpers every
op family shares: reading attributes, small integer tensors, axes and stored constants.
"""
from __future__ import annotations

import itertools
import math
import typing
from typing import Any, Callable, Sequence

import numpy as np
from onnx import helper

from dmlgraph.ir.band import analyze_band
from dmlgraph.ir.dtypes import INT32_MAX, INT32_MIN
from dmlgraph.ir.graph import DmlNode, Node, OnnxNode, Value
from dmlgraph.passes.symbolic import (
    SMALL_ELEMENTS,
    AbstractValue,
    Affine,
    Analysis,
    Band,
    Dim,
    Elems,
    Lin,
    NotAMask,
    Opaque,
    Unprovable,
    as_lin,
    int_of,
    parse_dim,
    shape_of,
)

Handler = Callable[[Analysis, OnnxNode, list], list]
HANDLERS: dict[str, Handler] = {}
# Second tries that read a node's producers (Concat of Slice pieces): (analysis, node, value_of) -> value or None
REJOINS: dict[str, Callable[[Analysis, OnnxNode, Callable[[Value | None], "AbstractValue | None"]],
                            "AbstractValue | None"]] = {}
SLICE_TO_END = 2**62  # a Slice end at least this large means "to the end" (exporters write INT64_MAX)


def handles(*ops: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for op in ops:
            HANDLERS[op] = fn
        return fn
    return register


def evaluate(an: Analysis, nodes: Sequence[Node], inputs: Sequence[Value], target: Value,
             constant: Callable[[Value], np.ndarray | None],
             env: dict[str, AbstractValue] | None = None) -> AbstractValue:
    """The symbolic value of `target`, computed from `nodes` (its cone) and the shapes of `inputs`.
    `env` (when given) receives every value computed, also when the proof breaks before the target."""
    env = {} if env is None else env
    produced = {v.name for n in nodes for v in n.outputs}
    for v in inputs:
        if v.name not in produced:
            known = typing.cast("tuple[int | str, ...]", v.shape)  # the caller checked: every dim a size or a name
            dims = tuple(Lin.of(d) if isinstance(d, int) else parse_dim(d) for d in known)
            env[v.name] = Opaque(dtype_of(v.elem_type), dims)

    def value_of(v: Value | None) -> AbstractValue | None:
        if v is None or v.name == "":
            return None
        if v.name in env:
            return env[v.name]
        arr = constant(v)
        if arr is None:
            raise Unprovable(f"value {v.name!r} is neither computed from shapes nor a constant")
        env[v.name] = stored_value(an, np.asarray(arr))
        return env[v.name]

    for n in _topological(nodes):
        if isinstance(n, DmlNode):  # a mask lowered already (a band inside this cone)
            env[n.outputs[0].name] = _generator_value(an, n, value_of)
            continue
        assert isinstance(n, OnnxNode)
        fn = HANDLERS.get(n.op_type)
        if fn is None or n.domain not in ("", "ai.onnx"):
            why = f"node {n.name or n.outputs[0].name!r} ({n.op_type}) is not an op the analysis knows"
            unknown = _annotated(n, why)  # its data is unknown; its shape is what shape inference says
            if unknown is None:
                raise Unprovable(why)
            env.update(zip((v.name for v in n.outputs), unknown))
            continue
        ins = [value_of(v) for v in n.inputs]
        label = f"node {n.name or n.outputs[0].name!r} ({n.op_type})"
        try:
            outs = fn(an, n, ins)
        except (Unprovable, ValueError, IndexError, KeyError, TypeError, OverflowError, AssertionError) as e:
            again = REJOINS[n.op_type](an, n, value_of) if n.op_type in REJOINS else None
            if again is not None:
                env[n.outputs[0].name] = again
                continue
            upstream = next((x.why for x in ins if isinstance(x, Opaque) and x.why), None)
            why = upstream or (f"{label}: {e}" if isinstance(e, Unprovable) else f"{label} cannot be analysed: {e}")
            if isinstance(e, NotAMask) and upstream is None:
                raise NotAMask(why) from None
            # Its values are beyond the analysis; its shape is known when it is elementwise (exporters
            # compute broadcast shapes as Shape(Max(a, b))) or annotated. The rest of the cone goes
            # on, so a band further on (or beside) is still found; a use of this data says `why`,
            # which names the node that first lost the values.
            if n.op_type in ELEMENTWISE:
                shaped = _shape_only(an, n, ins, why)
                unknown = None if shaped is None else [shaped]
            else:
                unknown = _annotated(n, why)
            if unknown is None:
                raise Unprovable(why) from None
            outs = unknown
        for v, out in zip(n.outputs, outs):
            env[v.name] = out
    if target.name not in env:
        raise Unprovable(f"value {target.name!r} is not computed by its cone")
    return env[target.name]


ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Min", "Max", "Neg", "Abs", "Sign", "Clip", "Cast", "CastLike", "Less",
               "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "And", "Or", "Xor", "Not", "Where"}


def _shape_only(an: Analysis, n: OnnxNode, ins: list, why: str) -> Opaque | None:
    """The output of an elementwise node as a tensor of known shape and unknown data (None if even
    its shape is not known)."""
    try:
        shapes = [shape_of(x) for x in ins if x is not None]
        if n.op_type == "Clip":
            shapes = shapes[:1]
        return Opaque(dtype_of(n.outputs[0].elem_type), an.broadcast(*shapes), why)
    except Unprovable:
        return None


def _generator_value(an: Analysis, n: DmlNode, value_of: Callable[[Value | None], AbstractValue | None]
                     ) -> AbstractValue:
    """What a DIAGONAL_MATRIX1 generator (no data input, or a one-value one) holds, as a Band."""
    x, shape_v, k_v = n.operands
    if n.kind != "DiagonalMatrix1":
        raise Unprovable(f"a {n.kind} node inside the cone")
    other = typing.cast(np.generic, np.zeros((), dtype_of(n.elem_type))[()])  # (numpy types arr[()] as an array)
    if x is not None:
        u = an.uniform(value_of(x))
        if u is None:
            raise Unprovable(f"DML node {n.name!r} reads data")
        other = u
    if shape_v is not None:
        shape = dims_from(an, value_of(shape_v), "the DML node's sizes")
    elif n.static_shape is not None:
        shape = tuple(Lin.of(d) for d in n.static_shape)
    else:
        raise Unprovable(f"DML node {n.name!r} takes its sizes from data")
    k = scalar_lin(an, value_of(k_v), "k") if k_v is not None else Lin.of(0)
    begin = None if n.begin is None else k + n.begin
    end = None if n.end is None else k + n.end
    value = typing.cast(np.generic, np.asarray(n.value, dtype_of(n.elem_type))[()])
    return _band_from_bounds(value.dtype, shape, begin, end, value, other)


def _annotated(n: OnnxNode, why: str) -> list[AbstractValue] | None:
    """n's outputs as unknown data of the shapes shape inference gives them (None: not given)."""
    outs: list[AbstractValue] = []
    for v in n.outputs:
        if v.shape is None or v.elem_type is None:
            return None
        dims = [Lin.of(d) if isinstance(d, int) else parse_dim(d) for d in v.shape if d is not None]
        if len(dims) != len(v.shape):
            return None  # an unknown dim (parse_dim would fail on it)
        outs.append(Opaque(dtype_of(v.elem_type), tuple(dims), why))
    return outs


def _topological(nodes: Sequence[Node]) -> list[Node]:
    ids = {n.id for n in nodes}
    done: set[int] = set()
    order: list[Node] = []
    for root in sorted(nodes, key=lambda n: n.id):
        stack = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if n.id in done:
                continue
            if expanded:
                done.add(n.id)
                order.append(n)
                continue
            stack.append((n, True))
            for v in n.inputs:
                p = v.producer if v is not None else None
                if p is not None and p.id in ids and p.id not in done:
                    stack.append((p, False))
    return order


def stored_value(an: Analysis, arr: np.ndarray) -> AbstractValue:
    """A stored constant: a band (exactly) when it is one, else element by element when small."""
    if arr.ndim >= 2 and arr.size > 1 and arr.dtype.kind in "biuf":
        p = analyze_band(arr)
        if p is not None:
            begin = None if p.begin == INT32_MIN else Lin.of(p.begin)
            end = None if p.end == INT32_MAX else Lin.of(p.end)
            return _band_from_bounds(arr.dtype, tuple(Lin.of(d) for d in arr.shape), begin, end, p.value, p.other)
    if arr.size <= SMALL_ELEMENTS:
        items = tuple(Lin.of(int(x)) if arr.dtype.kind in "iu" else x for x in arr.reshape(-1))
        return Elems(arr.dtype, tuple(arr.shape), items)
    flat = arr.reshape(-1)
    if np.all(flat.view(np.uint8).reshape(flat.size, -1) == flat[:1].view(np.uint8)):
        return Band(arr.dtype, tuple(Lin.of(d) for d in arr.shape), (), (flat[0],))
    raise NotAMask(f"a stored constant of shape {list(arr.shape)} that is neither small nor a band")


def _band_from_bounds(dtype: np.dtype, shape: tuple[Dim, ...], begin: Lin | None, end: Lin | None,
                      value: np.generic, other: np.generic) -> Band:
    """The Band of a stored DIAGONAL_MATRIX1 fill. An unbounded end gets no break: every element of the
    array, and of any slice or gather of it, lies on a diagonal of the array, where the two agree."""
    if begin is None:
        return Band(dtype, shape, (), (value,)) if end is None else Band(dtype, shape, (end,), (value, other))
    if end is None:
        return Band(dtype, shape, (begin,), (other, value))
    # both ends move together (one shift), so their order is their constants' order
    if begin.const == end.const:
        return Band(dtype, shape, (), (other,))  # Begin == End fills nothing
    if begin.const < end.const:
        return Band(dtype, shape, (begin, end), (other, value, other))
    return Band(dtype, shape, (end, begin), (value, other, value))


def lin_breaks(v: Band, why: str) -> tuple[Lin, ...]:
    """v's breaks when none follows a clamped size (a band sliced at a clamped offset), else Unprovable(why)."""
    breaks = tuple(x for x in v.breaks if isinstance(x, Lin))
    if len(breaks) != len(v.breaks):
        raise Unprovable(why)
    return breaks


def objs(v: Elems) -> np.ndarray:
    """The elements as an object array of v's shape (Lins stay whole)."""
    arr = np.empty(len(v.items), dtype=object)
    arr[:] = list(v.items)
    return arr.reshape(v.shape)


def from_objs(dtype: np.dtype, arr: object) -> Elems:
    a = np.empty((), dtype=object) if not isinstance(arr, np.ndarray) else arr
    if not isinstance(arr, np.ndarray):
        a[()] = arr
    return Elems(dtype, tuple(a.shape), tuple(a.reshape(-1)))


def dtype_of(elem_type: int | None) -> np.dtype:
    if not elem_type:
        raise Unprovable("a value of unknown type")
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def attr(n: OnnxNode, name: str, default: object = None) -> Any:  # an ONNX attribute's value
    return n.attr(name, default)


def ints(an: Analysis, v: AbstractValue | None, what: str) -> list:
    """A small integer tensor's elements (Lin or clamped dims)."""
    if isinstance(v, Elems) and v.dtype.kind in "iu":
        return list(v.items)
    consts = [d.const for d in v.shape if isinstance(d, Lin) and d.is_const] if isinstance(v, Affine) else []
    if isinstance(v, Affine) and v.dtype.kind in "iu" and len(consts) == len(v.shape):
        sizes = consts
        if math.prod(sizes) <= SMALL_ELEMENTS:
            return [v.base + sum(c * i for c, i in zip(v.coef, idx)) for idx in itertools.product(*map(range, sizes))]
    raise Unprovable(f"{what} is not a known integer vector")


def const_ints(an: Analysis, v: AbstractValue | None, what: str) -> list[int]:
    out = []
    for x in ints(an, v, what):
        if not (isinstance(x, Lin) and x.is_const):
            raise Unprovable(f"{what} depends on the sizes")
        out.append(x.const)
    return out


def scalar_lin(an: Analysis, v: AbstractValue | None, what: str) -> Lin:
    if v is None:
        raise Unprovable(f"{what} is missing")
    items = ints(an, v, what) if not (isinstance(v, Elems) and v.dtype.kind == "f") else \
        [int_of(x) for x in v.items]
    if len(items) != 1 or items[0] is None:
        raise Unprovable(f"{what} is not one integer")
    return as_lin(items[0], what)


def dims_from(an: Analysis, v: AbstractValue | None, what: str) -> tuple[Dim, ...]:
    dims = []
    for x in ints(an, v, what):
        if isinstance(x, Lin):
            lo, _ = an.bounds(x)
            if lo < 0:
                raise Unprovable(f"{what} holds {x.render(str)}, which may be negative")
        dims.append(x)
    return tuple(dims)


def axis_index(axis: int, rank: int) -> int:
    """An ONNX axis attribute, negative counting from the end, as a position."""
    return axis + rank if axis < 0 else axis


def rank_axes(axes: Sequence[int], rank: int) -> list[int]:
    return [axis_index(a, rank) for a in axes]


def axes_input(an: Analysis, n: OnnxNode, ins: list, idx: int) -> list[int] | None:
    if len(ins) > idx and ins[idx] is not None:
        return const_ints(an, ins[idx], "axes")
    a = attr(n, "axes")
    return None if a is None else list(a)
