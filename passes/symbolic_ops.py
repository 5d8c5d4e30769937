"""ONNX operator semantics over the exact symbolic values of `dmlgraph.passes.symbolic`.

One function per op family, registered in `HANDLERS` (rules as data): each takes the analysis, the
node and its input values and returns its output values, or raises `Unprovable` saying what it
cannot show. `evaluate` runs a cone and names the node where a proof broke.
"""
from __future__ import annotations

import itertools
import math
import typing
from typing import Any, Callable, Sequence

import numpy as np
import onnx
from onnx import helper

from dmlgraph.ir.band import analyze_band
from dmlgraph.ir.dtypes import INT32_MAX, INT32_MIN
from dmlgraph.ir.graph import DmlNode, Node, OnnxNode, Value
from dmlgraph.passes.symbolic import (
    BOOL,
    INT64,
    SMALL_ELEMENTS,
    AbstractValue,
    Affine,
    Analysis,
    Band,
    Clamp,
    Difference,
    Dim,
    Elems,
    Lin,
    NotAMask,
    Opaque,
    Pieces,
    Stack,
    Unprovable,
    _int_of,
    _same,
    _scalar,
    as_lin,
    make_clamp,
    parse_dim,
    shape_of,
)

Handler = Callable[[Analysis, OnnxNode, list], list]
HANDLERS: dict[str, Handler] = {}
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
            env[v.name] = Opaque(_dtype(v.elem_type), dims)

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
        return Opaque(_dtype(n.outputs[0].elem_type), an.broadcast(*shapes), why)
    except Unprovable:
        return None


def _generator_value(an: Analysis, n: DmlNode, value_of: Callable[[Value | None], AbstractValue | None]
                     ) -> AbstractValue:
    """What a DIAGONAL_MATRIX1 generator (no data input, or a one-value one) holds, as a Band."""
    x, shape_v, k_v = n.inputs
    if n.kind != "DiagonalMatrix1":
        raise Unprovable(f"a {n.kind} node inside the cone")
    other = typing.cast(np.generic, np.zeros((), _dtype(n.elem_type))[()])  # (numpy types arr[()] as an array)
    if x is not None:
        u = an.uniform(value_of(x))
        if u is None:
            raise Unprovable(f"DML node {n.name!r} reads data")
        other = u
    if shape_v is not None:
        shape = _dims_from(an, value_of(shape_v), "the DML node's sizes")
    elif n.static_shape is not None:
        shape = tuple(Lin.of(d) for d in n.static_shape)
    else:
        raise Unprovable(f"DML node {n.name!r} takes its sizes from data")
    k = _scalar_lin(an, value_of(k_v), "k") if k_v is not None else Lin.of(0)
    begin = None if n.begin is None else k + n.begin
    end = None if n.end is None else k + n.end
    value = typing.cast(np.generic, np.asarray(n.value, _dtype(n.elem_type))[()])
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
        outs.append(Opaque(_dtype(v.elem_type), tuple(dims), why))
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


def _lin_breaks(v: Band, why: str) -> tuple[Lin, ...]:
    """v's breaks when none follows a clamped size (a band sliced at a clamped offset), else Unprovable(why)."""
    breaks = tuple(x for x in v.breaks if isinstance(x, Lin))
    if len(breaks) != len(v.breaks):
        raise Unprovable(why)
    return breaks


def _objs(v: Elems) -> np.ndarray:
    """The elements as an object array of v's shape (Lins stay whole)."""
    arr = np.empty(len(v.items), dtype=object)
    arr[:] = list(v.items)
    return arr.reshape(v.shape)


def _from_objs(dtype: np.dtype, arr: object) -> Elems:
    a = np.empty((), dtype=object) if not isinstance(arr, np.ndarray) else arr
    if not isinstance(arr, np.ndarray):
        a[()] = arr
    return Elems(dtype, tuple(a.shape), tuple(a.reshape(-1)))


def _dtype(elem_type: int | None) -> np.dtype:
    if not elem_type:
        raise Unprovable("a value of unknown type")
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _attr(n: OnnxNode, name: str, default: object = None) -> Any:  # an ONNX attribute's value
    return n.attr(name, default)


def _ints(an: Analysis, v: AbstractValue | None, what: str) -> list:
    """A small integer tensor's elements (Lin or clamped dims)."""
    if isinstance(v, Elems) and v.dtype.kind in "iu":
        return list(v.items)
    consts = [d.const for d in v.shape if isinstance(d, Lin) and d.is_const] if isinstance(v, Affine) else []
    if isinstance(v, Affine) and v.dtype.kind in "iu" and len(consts) == len(v.shape):
        sizes = consts
        if math.prod(sizes) <= SMALL_ELEMENTS:
            return [v.base + sum(c * i for c, i in zip(v.coef, idx)) for idx in itertools.product(*map(range, sizes))]
    raise Unprovable(f"{what} is not a known integer vector")


def _const_ints(an: Analysis, v: AbstractValue | None, what: str) -> list[int]:
    out = []
    for x in _ints(an, v, what):
        if not (isinstance(x, Lin) and x.is_const):
            raise Unprovable(f"{what} depends on the sizes")
        out.append(x.const)
    return out


def _scalar_lin(an: Analysis, v: AbstractValue | None, what: str) -> Lin:
    if v is None:
        raise Unprovable(f"{what} is missing")
    items = _ints(an, v, what) if not (isinstance(v, Elems) and v.dtype.kind == "f") else \
        [_int_of(x) for x in v.items]
    if len(items) != 1 or items[0] is None:
        raise Unprovable(f"{what} is not one integer")
    return as_lin(items[0], what)


def _dims_from(an: Analysis, v: AbstractValue | None, what: str) -> tuple[Dim, ...]:
    dims = []
    for x in _ints(an, v, what):
        if isinstance(x, Lin):
            lo, _ = an.bounds(x)
            if lo < 0:
                raise Unprovable(f"{what} holds {x.render(str)}, which may be negative")
        dims.append(x)
    return tuple(dims)


def _axis(axis: int, rank: int) -> int:
    """An ONNX axis attribute, negative counting from the end, as a position."""
    return axis + rank if axis < 0 else axis


def _rank_axes(axes: Sequence[int], rank: int) -> list[int]:
    return [_axis(a, rank) for a in axes]


def _axes_input(an: Analysis, n: OnnxNode, ins: list, idx: int) -> list[int] | None:
    if len(ins) > idx and ins[idx] is not None:
        return _const_ints(an, ins[idx], "axes")
    a = _attr(n, "axes")
    return None if a is None else list(a)


# ---- shapes ------------------------------------------------------------------------------------
@handles("Shape")
def _shape(an: Analysis, n: OnnxNode, ins: list) -> list:
    dims = shape_of(ins[0])
    r = len(dims)
    start, end = int(_attr(n, "start", 0)), _attr(n, "end")
    start = min(max(start + r if start < 0 else start, 0), r)
    stop = r if end is None else min(max(int(end) + r if int(end) < 0 else int(end), 0), r)
    picked = dims[start:stop]
    return [Elems(INT64, (len(picked),), tuple(picked))]


@handles("Size")
def _size(an: Analysis, n: OnnxNode, ins: list) -> list:
    total, symbolic = 1, None
    for d in shape_of(ins[0]):
        lin = as_lin(d, "a size")
        if lin.is_const:
            total *= lin.const
        elif symbolic is None:
            symbolic = lin
        else:
            raise Unprovable("the product of two sizes is not affine")
    value = Lin.of(total) if symbolic is None else symbolic.scale(total)
    return [Elems(INT64, (), (value,))]


@handles("Constant")
def _constant(an: Analysis, n: OnnxNode, ins: list) -> list:
    sv = stored_value
    for a in n.attributes:
        if a.name == "value":
            return [sv(an, onnx.numpy_helper.to_array(a.t))]
        if a.name in ("value_int", "value_ints"):
            return [sv(an, np.array(onnx.helper.get_attribute_value(a), np.int64))]
        if a.name in ("value_float", "value_floats"):
            return [sv(an, np.array(onnx.helper.get_attribute_value(a), np.float32))]
    raise Unprovable("a Constant of a kind the analysis does not read")


@handles("ConstantOfShape")
def _constant_of_shape(an: Analysis, n: OnnxNode, ins: list) -> list:
    dims = _dims_from(an, ins[0], "the shape")
    t = _attr(n, "value")
    arr = np.zeros(1, np.float32) if t is None else onnx.numpy_helper.to_array(t)
    return [Band(arr.dtype, dims, (), (arr.reshape(-1)[0],))]


@handles("Identity")
def _identity(an: Analysis, n: OnnxNode, ins: list) -> list:
    return [ins[0]]


# ---- casts ---------------------------------------------------------------------------------------
def _cast_scalar(x: object, dtype: np.dtype) -> object:
    if isinstance(x, Lin):
        return x
    src = np.asarray(x)
    if src.dtype.kind == "f" and dtype.kind in "iub" and dtype.kind != "b":
        if not np.isfinite(src) or not (np.iinfo(dtype).min <= float(src) <= np.iinfo(dtype).max):
            raise Unprovable(f"casting {src} to {dtype} is undefined")
    return _scalar(x, dtype)


def cast(an: Analysis, v: AbstractValue, dtype: np.dtype) -> AbstractValue:
    if isinstance(v, Pieces) and dtype.kind in "iuf":
        return _map_pieces(an, v, lambda p: cast(an, p, dtype))
    if isinstance(v, Opaque):
        return Opaque(dtype, v.shape, v.why)
    if isinstance(v, Band):
        values = tuple(_cast_scalar(x, dtype) for x in v.values)
        return Analysis.simplify(Band(dtype, v.shape, v.breaks, values))
    if isinstance(v, Elems):
        items: list[object] = []
        for x in v.items:
            if isinstance(x, Lin):
                if dtype.kind == "b":
                    s = an.sign(x)
                    if s is None:
                        raise Unprovable("a size cast to bool: whether it is 0 depends on the sizes")
                    items.append(np.bool_(s != 0))
                    continue
                lo, hi = an.bounds(x)
                if not an.fits(lo, hi, dtype):
                    raise Unprovable(f"casting a value in [{lo}, {hi}] to {dtype} is not exact at every size")
                items.append(x)
            else:
                y = _cast_scalar(x, dtype)
                items.append(Lin.of(int(y)) if dtype.kind in "iu" else y)  # type: ignore[call-overload]
        return Elems(dtype, v.shape, tuple(items))
    assert isinstance(v, Affine)
    if dtype.kind == "b":
        zero = Affine(v.dtype, v.shape, (0,) * len(v.shape), Lin.of(0))
        diff = _sub(an, v, zero)
        assert isinstance(diff, Affine)  # (the difference of two grids)
        eq = an.compare(diff, "==", "the cast to bool")
        return _not(eq)
    return an.check_fits(Affine(dtype, v.shape, v.coef, v.base), "the cast value")


def _not(v: AbstractValue) -> AbstractValue:
    if isinstance(v, Band):
        return Band(v.dtype, v.shape, v.breaks, tuple(np.logical_not(x) for x in v.values))
    assert isinstance(v, Affine)
    return Affine(v.dtype, v.shape, v.coef, Lin.of(1 - v.base.const))


@handles("Cast")
def _cast(an: Analysis, n: OnnxNode, ins: list) -> list:
    return [cast(an, ins[0], _dtype(int(_attr(n, "to"))))]


@handles("CastLike")
def _cast_like(an: Analysis, n: OnnxNode, ins: list) -> list:
    target = ins[1]
    return [cast(an, ins[0], target.dtype)]


# ---- elementwise -----------------------------------------------------------------------------------
def _is_piecewise(an: Analysis, v: AbstractValue) -> bool:
    """Held as a band or a non-integer one-value tensor: combined piece by piece, not as an index grid."""
    if isinstance(v, Band):
        return len(v.values) > 1 or _int_of(v.values[0]) is None or v.dtype.kind == "b"
    if isinstance(v, Elems):
        u = an.uniform(v)
        return u is not None and (_int_of(u) is None or v.dtype.kind == "b")
    return False


def _piecewise(an: Analysis, vs: Sequence[AbstractValue], fn: Callable[..., object], dtype: np.dtype | None = None
               ) -> Band:
    shape = an.broadcast(*(shape_of(v) for v in vs))
    bands = [an.band_at(v, shape) for v in vs]
    out = dtype if dtype is not None else bands[0].dtype
    with np.errstate(all="ignore"):
        return an.merge(bands, fn, out, shape)


def _elems_op(an: Analysis, a: Elems, b: Elems, fn: Callable[[object, object], object], dtype: np.dtype) -> Elems:
    shape = np.broadcast_shapes(a.shape, b.shape)
    ia = np.broadcast_to(_objs(a), shape)
    ib = np.broadcast_to(_objs(b), shape)
    items = tuple(fn(x, y) for x, y in zip(ia.reshape(-1), ib.reshape(-1)))
    for x in items:
        if isinstance(x, Lin):
            lo, hi = an.bounds(x)
            if not an.fits(lo, hi, dtype):
                raise Unprovable(f"the result ranges over [{lo}, {hi}], which {dtype} does not hold")
    return Elems(dtype, tuple(shape), items)


def _lin_of(x: object) -> Lin:
    if isinstance(x, (Clamp, Difference)):
        return as_lin(x, "an operand")  # (raises, naming the clamp)
    y = _int_of(x)
    if y is None:
        raise Unprovable("a non-integer value in integer arithmetic")
    return as_lin(y, "an operand")


def _add(an: Analysis, a: AbstractValue, b: AbstractValue) -> AbstractValue:
    if isinstance(a, Elems) and isinstance(b, Elems) and a.dtype.kind in "iu":
        return _elems_op(an, a, b, lambda x, y: _lin_of(x) + _lin_of(y), a.dtype)
    x, y = an.affine(a, "an operand"), an.affine(b, "an operand")
    shape = an.broadcast(x.shape, y.shape)
    x, y = an.expand_affine(x, shape), an.expand_affine(y, shape)
    return an.check_fits(Affine(x.dtype, shape, tuple(p + q for p, q in zip(x.coef, y.coef)), x.base + y.base),
                         "the sum")


def _neg(an: Analysis, a: AbstractValue) -> AbstractValue:
    if isinstance(a, Elems) and a.dtype.kind in "iu":
        return Elems(a.dtype, a.shape, tuple(-_lin_of(x) for x in a.items))
    x = an.affine(a, "the operand")
    return an.check_fits(Affine(x.dtype, x.shape, tuple(-c for c in x.coef), -x.base), "the negation")


def _sub(an: Analysis, a: AbstractValue, b: AbstractValue) -> AbstractValue:
    if isinstance(a, Elems) and isinstance(b, Elems) and a.dtype.kind in "iu":
        return _elems_op(an, a, b, lambda x, y: _size_difference(an, x, y), a.dtype)
    return _add(an, a, _neg_unchecked(an, b))


def _size_difference(an: Analysis, x: object, y: object) -> Lin | Difference:
    """x - y for sizes: a Lin, or min(e, N) - min(s, N) with e >= s (a clamped slice's length)."""
    if isinstance(x, Clamp) and isinstance(y, Clamp) and (x.lo, x.hi) == (y.lo, y.hi) and \
            an.nonneg(x.inner - y.inner):
        return Difference(x, y)  # clamping is monotone: the difference stays >= 0
    return _lin_of(x) - _lin_of(y)


def _neg_unchecked(an: Analysis, b: AbstractValue) -> Affine:
    y = an.affine(b, "an operand")
    return Affine(y.dtype, y.shape, tuple(-c for c in y.coef), -y.base)


def _mul(an: Analysis, a: AbstractValue, b: AbstractValue) -> AbstractValue:
    if isinstance(a, Elems) and isinstance(b, Elems) and a.dtype.kind in "iu":
        def times(x: object, y: object) -> Lin:
            lx, ly = _lin_of(x), _lin_of(y)
            if lx.is_const:
                return ly.scale(lx.const)
            if ly.is_const:
                return lx.scale(ly.const)
            raise Unprovable("the product of two sizes is not affine")
        return _elems_op(an, a, b, times, a.dtype)
    x, y = an.affine(a, "an operand"), an.affine(b, "an operand")
    if not any(y.coef) and y.base.is_const:
        k, z = y.base.const, x
    elif not any(x.coef) and x.base.is_const:
        k, z = x.base.const, y
    else:
        raise Unprovable("a product of two index or size expressions is not affine")
    shape = an.broadcast(x.shape, y.shape)
    z = an.expand_affine(z, shape)
    return an.check_fits(Affine(x.dtype, shape, tuple(c * k for c in z.coef), z.base.scale(k)), "the product")


def _div(an: Analysis, a: AbstractValue, b: AbstractValue) -> AbstractValue:
    x, y = an.affine(a, "the dividend"), an.affine(b, "the divisor")
    if any(y.coef) or not y.base.is_const or y.base.const == 0:
        raise Unprovable("division by a value that is not a nonzero constant")
    k = y.base.const
    if any(c % k for c in x.coef):
        raise Unprovable("an index grid divided by a constant that does not divide it is not affine")
    base = x.base.divide(k)
    if base is None:
        if x.base.is_const and not any(x.coef):
            q = abs(x.base.const) // abs(k) * (1 if (x.base.const >= 0) == (k > 0) else -1)  # int Div truncates
            if x.dtype.kind == "f":
                raise Unprovable("a float division with a fractional result")
            base = Lin.of(q)
        elif not any(x.coef) and x.dtype.kind in "iu" and k > 0 and an.nonneg(x.base):
            base = Lin.sym(an.floor_div(x.base, k))  # a size halved: a size of its own
        else:
            raise Unprovable(f"{x.base.render(str)} / {k} is not exact at every size")
    shape = an.broadcast(x.shape, y.shape)
    z = an.expand_affine(Affine(x.dtype, x.shape, tuple(c // k for c in x.coef), base), shape)
    return an.check_fits(z, "the quotient")


_NUMPY_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y,
    "Div": lambda x, y: (x / y if np.asarray(x).dtype.kind == "f" else np.trunc(np.divide(x, y)).astype(
        np.asarray(x).dtype)),
    "Max": np.maximum, "Min": np.minimum,
}
_AFFINE_BINARY = {"Add": _add, "Sub": _sub, "Mul": _mul, "Div": _div}


@handles("Add", "Sub", "Mul", "Div", "Min", "Max")
def _binary(an: Analysis, n: OnnxNode, ins: list) -> list:
    vs = [v for v in ins if v is not None]
    if any(isinstance(v, Opaque) for v in vs):
        raise Unprovable("arithmetic on data")
    if any(isinstance(v, Pieces) for v in vs):
        if len(vs) != 2 or n.op_type not in _AFFINE_BINARY or all(isinstance(v, Pieces) for v in vs):
            raise Unprovable(f"{n.op_type} of a piecewise index grid")
        fn = _AFFINE_BINARY[n.op_type]
        if isinstance(vs[0], Pieces):
            return [_map_pieces(an, vs[0], lambda p: fn(an, p, vs[1]))]
        return [_map_pieces(an, vs[1], lambda p: fn(an, vs[0], p))]
    if any(_is_piecewise(an, v) for v in vs):
        np_fn = _NUMPY_BINARY[n.op_type]
        out = vs[0]
        for v in vs[1:]:
            out = _piecewise(an, [out, v], np_fn)
        return [out]
    if n.op_type in ("Min", "Max"):
        out = vs[0]
        for v in vs[1:]:
            out = _min_max(an, out, v, n.op_type)
        return [out]
    return [_AFFINE_BINARY[n.op_type](an, vs[0], vs[1])]


def _min_max(an: Analysis, a: AbstractValue, b: AbstractValue, op: str) -> AbstractValue:
    if isinstance(a, Elems) and isinstance(b, Elems) and a.shape == b.shape == (1,) or \
            (isinstance(a, Elems) and isinstance(b, Elems) and len(a.items) == len(b.items) == 1):
        p, q = _lin_of(a.items[0]), _lin_of(b.items[0])
        s = an.sign(p - q)
        if s is None:
            # min/max of a size and a constant: a clamp, usable as a size
            if q.is_const and op == "Min":
                return Elems(a.dtype, np.broadcast_shapes(a.shape, b.shape), (make_clamp(p, None, q.const, an),))
            if p.is_const and op == "Min":
                return Elems(a.dtype, np.broadcast_shapes(a.shape, b.shape), (make_clamp(q, None, p.const, an),))
            if q.is_const and op == "Max":
                return Elems(a.dtype, np.broadcast_shapes(a.shape, b.shape), (make_clamp(p, q.const, None, an),))
            if p.is_const and op == "Max":
                return Elems(a.dtype, np.broadcast_shapes(a.shape, b.shape), (make_clamp(q, p.const, None, an),))
            raise Unprovable(f"{op} of two sizes whose order depends on the sizes")
        pick_a = (s <= 0) == (op == "Min")
        return a if pick_a else b
    x, y = an.affine(a, "an operand"), an.affine(b, "an operand")
    diff = _sub(an, x, y)
    assert isinstance(diff, Affine)
    lo, hi = an.affine_bounds(diff)
    if lo >= 0 or hi <= 0:
        a_larger = lo >= 0
        pick = (y if a_larger else x) if op == "Min" else (x if a_larger else y)
        return an.expand_affine(pick, an.broadcast(x.shape, y.shape))
    # Their order changes along the diagonals: x on one side of the crossing, y on the other.
    shape = an.broadcast(x.shape, y.shape)
    below = an.compare(diff, "<", f"{op} of two index grids")  # where x < y
    if len(below.breaks) != 1:
        raise Unprovable(f"{op} of two index grids whose order varies other than along the diagonals")
    x, y = an.expand_affine(x, shape), an.expand_affine(y, shape)
    x_first = bool(below.values[0]) == (op == "Min")  # Min takes x where x < y
    breaks = _lin_breaks(below, f"{op} of two index grids crossing at a clamped diagonal")
    return Pieces(x.dtype, shape, breaks, (x, y) if x_first else (y, x))


@handles("Neg")
def _neg_op(an: Analysis, n: OnnxNode, ins: list) -> list:
    if isinstance(ins[0], Pieces):
        return [_map_pieces(an, ins[0], lambda p: _neg(an, p))]
    if _is_piecewise(an, ins[0]):
        return [_piecewise(an, [ins[0]], np.negative)]
    return [_neg(an, ins[0])]


@handles("Abs", "Sign")
def _abs_sign(an: Analysis, n: OnnxNode, ins: list) -> list:
    fn = np.abs if n.op_type == "Abs" else np.sign
    if _is_piecewise(an, ins[0]) or isinstance(ins[0], Band):
        return [_piecewise(an, [ins[0]], fn)]
    x = an.affine(ins[0], "the operand")
    lo, hi = an.affine_bounds(x)
    if lo >= 0:
        if n.op_type == "Abs":
            return [x]
        if lo > 0:
            return [Affine(x.dtype, x.shape, (0,) * len(x.shape), Lin.of(1))]
    if hi <= 0:
        if n.op_type == "Abs":
            return [_neg(an, x)]
        if hi < 0:
            return [Affine(x.dtype, x.shape, (0,) * len(x.shape), Lin.of(-1))]
    if n.op_type == "Abs":
        return [_min_max(an, x, _neg(an, x), "Max")]  # |x| = max(x, -x): two pieces when x is diagonal
    raise Unprovable("Sign of an index grid that changes sign")


@handles("Clip")
def _clip(an: Analysis, n: OnnxNode, ins: list) -> list:
    out = ins[0]
    lo = ins[1] if len(ins) > 1 else None
    hi = ins[2] if len(ins) > 2 else None
    if lo is None and _attr(n, "min") is not None:
        lo = Elems(out.dtype, (), (np.asarray(_attr(n, "min"), out.dtype)[()],))
    if hi is None and _attr(n, "max") is not None:
        hi = Elems(out.dtype, (), (np.asarray(_attr(n, "max"), out.dtype)[()],))
    if lo is not None:
        out = _binary(an, _with_op(n, "Max"), [out, lo])[0]
    if hi is not None:
        out = _binary(an, _with_op(n, "Min"), [out, hi])[0]
    return [out]


def _with_op(n: OnnxNode, op: str) -> OnnxNode:
    return OnnxNode(n.name, op, [], [], domain=n.domain)


# ---- comparisons and logic ----------------------------------------------------------------------------
_COMPARE = {"Less": "<", "LessOrEqual": "<=", "Greater": ">", "GreaterOrEqual": ">=", "Equal": "=="}
_NUMPY_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal}


@handles(*_COMPARE)
def _compare(an: Analysis, n: OnnxNode, ins: list) -> list:
    a, b = ins
    op = _COMPARE[n.op_type]
    if isinstance(a, Opaque) or isinstance(b, Opaque):
        raise Unprovable("a comparison of data")
    if isinstance(a, Pieces) or isinstance(b, Pieces):
        return [_compare_pieces(an, a, b, op)]
    ua, ub = an.uniform(a), an.uniform(b)
    # An integer grid against a fractional or infinite float constant: x < 2.5 is x < 3.
    for grid, const, flipped in ((a, ub, False), (b, ua, True)):
        if const is not None and const.dtype.kind == "f" and _int_of(const) is None and \
                not _is_piecewise(an, grid) and an.uniform(grid) is None:
            return [_compare_fraction(an, an.affine(grid, "the compared grid"), float(const),
                                      _FLIPPED[op] if flipped else op)]
    if _is_piecewise(an, a) or _is_piecewise(an, b):
        return [_piecewise(an, [a, b], _NUMPY_COMPARE[op], BOOL)]
    x, y = an.affine(a, "the left operand"), an.affine(b, "the right operand")
    diff = _sub(an, x, y)
    assert isinstance(diff, Affine)
    return [an.compare(diff, op, "the comparison")]


_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "=="}


def _compare_pieces(an: Analysis, a: AbstractValue, b: AbstractValue, op: str) -> AbstractValue:
    """Piecewise grids compared piece by piece: each piece's comparison holds on its own diagonals."""
    if isinstance(b, Pieces):
        a, b, op = b, a, _FLIPPED[op]
    assert isinstance(a, Pieces)
    if isinstance(b, Pieces):
        raise Unprovable("two piecewise index grids compared")
    other = an.affine(b, "the value compared with a piecewise grid")
    shape = an.broadcast(a.shape, other.shape)
    bands = [an.compare(_as_affine(_sub(an, an.expand_affine(p, shape), an.expand_affine(other, shape))), op,
                        "a piece of a piecewise grid") for p in a.pieces]
    return _select_pieces(an, a.breaks, bands, shape)


def _select_pieces(an: Analysis, breaks: tuple[Lin, ...], bands: list[Band], shape: tuple[Dim, ...]) -> Band:
    """The band that is bands[k] on the k-th run of diagonals between `breaks`."""
    which = Band(INT64, shape, breaks, tuple(np.int64(k) for k in range(len(bands))))
    return an.merge([which, *bands], lambda k, *vals: vals[int(k)], BOOL, shape)


def _map_pieces(an: Analysis, v: Pieces, fn: Callable[[Affine], AbstractValue]) -> Pieces:
    """fn (an affine map: negation, a constant added or multiplied, a cast) applied to each piece."""
    out = []
    for p in v.pieces:
        q = fn(p)
        if not isinstance(q, Affine):
            raise Unprovable("a piecewise grid mapped to something else")
        out.append(q)
    return Pieces(out[0].dtype, out[0].shape, v.breaks, tuple(out))


def _as_affine(v: AbstractValue) -> Affine:
    assert isinstance(v, Affine)
    return v


def _compare_fraction(an: Analysis, x: Affine, c: float, op: str) -> AbstractValue:
    """x OP c for integer-valued x and a constant c that is not an integer (or is +-inf, NaN)."""
    if math.isnan(c) or op == "==":
        return _uniform_bool(an, x.shape, False)  # NaN compares false; an integer never equals a fraction
    if math.isinf(c):
        below = c > 0  # x < +inf always; x < -inf never
        return _uniform_bool(an, x.shape, below if op in ("<", "<=") else not below)
    t = Lin.of(math.ceil(c))  # x < c <=> x < ceil(c); x > c <=> x >= ceil(c)
    new_op = "<" if op in ("<", "<=") else ">="
    diff = _sub(an, x, Affine(x.dtype, x.shape, (0,) * len(x.shape), t))
    assert isinstance(diff, Affine)
    return an.compare(diff, new_op, "the comparison")


def _uniform_bool(an: Analysis, shape: tuple[Dim, ...], b: bool) -> Band:
    return Band(BOOL, shape, (), (np.bool_(b),))


@handles("And", "Or", "Xor")
def _logic(an: Analysis, n: OnnxNode, ins: list) -> list:
    fn = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}[n.op_type]
    return [_piecewise(an, ins, fn, BOOL)]


@handles("Not")
def _not_op(an: Analysis, n: OnnxNode, ins: list) -> list:
    return [_piecewise(an, ins, np.logical_not, BOOL)]


@handles("Where")
def _where(an: Analysis, n: OnnxNode, ins: list) -> list:
    c, x, y = ins
    uc = an.uniform(c)
    if uc is not None:
        pick = x if bool(uc) else y
        shape = an.broadcast(shape_of(c), shape_of(x), shape_of(y))
        if isinstance(pick, Affine):
            return [an.expand_affine(pick, shape)]
        return [an.band_at(pick, shape)]
    return [_piecewise(an, [c, x, y], lambda p, q, r: q if p else r, _value_dtype(x, y))]


def _value_dtype(x: AbstractValue, y: AbstractValue) -> np.dtype:
    return x.dtype


# ---- index grids -----------------------------------------------------------------------------------
@handles("Range")
def _range(an: Analysis, n: OnnxNode, ins: list) -> list:
    start, limit, delta = (_scalar_lin(an, v, w) for v, w in zip(ins, ("start", "limit", "delta")))
    if not delta.is_const or delta.const == 0:
        raise Unprovable("the step is not a nonzero constant")
    step = delta.const
    span = limit - start if step > 0 else start - limit
    size = span.divide(abs(step)) if abs(step) > 1 else span
    if size is None:
        if not span.is_const:
            raise Unprovable("the length ceil((limit - start) / step) is not exact at every size")
        size = Lin.of(-(-span.const // abs(step)))
    dim = make_clamp(size, 0, None, an)
    return [an.check_fits(Affine(ins[0].dtype, (dim,), (step,), start), "the range")]


@handles("CumSum")
def _cumsum(an: Analysis, n: OnnxNode, ins: list) -> list:
    x = ins[0]
    shape = shape_of(x)
    axis = _const_ints(an, ins[1], "the axis")[0]
    axis = _axis(axis, len(shape))
    u = an.uniform(x)
    c = _int_of(u) if u is not None else None
    if c is None or not c.is_const:
        raise Unprovable("a cumulative sum of anything but one integer value repeated is not affine")
    k = c.const
    exclusive, reverse = int(_attr(n, "exclusive", 0)), int(_attr(n, "reverse", 0))
    coef = [0] * len(shape)
    if not reverse:  # element t = k * (t + 1), or k * t when exclusive
        coef[axis] = k
        base = Lin.of(0 if exclusive else k)
    else:  # k * (n - t), or k * (n - 1 - t)
        coef[axis] = -k
        base = as_lin(shape[axis], "the summed axis").scale(k) - (k if exclusive else 0)
    return [an.check_fits(Affine(x.dtype, shape, tuple(coef), base), "the cumulative sum")]


@handles("Trilu")
def _trilu(an: Analysis, n: OnnxNode, ins: list) -> list:
    x = ins[0]
    shape = shape_of(x)
    if len(shape) < 2:
        raise Unprovable("Trilu of fewer than 2 dims")
    k = _scalar_lin(an, ins[1], "k") if len(ins) > 1 and ins[1] is not None else Lin.of(0)
    upper = int(_attr(n, "upper", 1))
    keep = Band(BOOL, shape, (k,), (np.bool_(False), np.bool_(True))) if upper else \
        Band(BOOL, shape, (k + 1,), (np.bool_(True), np.bool_(False)))
    zero = np.zeros((), x.dtype)[()]
    data = an.band_at(x, shape)
    return [an.merge([keep, data], lambda p, q: q if p else zero, x.dtype, shape)]


@handles("EyeLike")
def _eyelike(an: Analysis, n: OnnxNode, ins: list) -> list:
    shape = shape_of(ins[0])
    if len(shape) != 2:
        raise Unprovable("EyeLike of a tensor that is not 2-D")
    dt = _attr(n, "dtype")
    dtype = ins[0].dtype if dt is None else _dtype(int(dt))
    k = Lin.of(int(_attr(n, "k", 0)))
    zero, one = np.zeros((), dtype)[()], np.ones((), dtype)[()]
    return [Band(dtype, shape, (k, k + 1), (zero, one, zero))]


# ---- layout ----------------------------------------------------------------------------------------
def _relayout(an: Analysis, v: AbstractValue, new_shape: tuple[Dim, ...], old_to_new: dict[int, int]) -> AbstractValue:
    """v with its axes moved: old axis a -> new axis old_to_new[a]; other new axes have size 1."""
    if isinstance(v, Opaque):
        return Opaque(v.dtype, new_shape, v.why)
    if isinstance(v, Elems):
        sizes = [d.const for d in new_shape if isinstance(d, Lin) and d.is_const]
        if len(sizes) != len(new_shape):
            raise Unprovable("a small tensor reshaped to a size-dependent shape")
        return Elems(v.dtype, tuple(sizes), v.items)
    if isinstance(v, Affine):
        coef = [0] * len(new_shape)
        for a, b in old_to_new.items():
            coef[b] = v.coef[a]
        for a, c in enumerate(v.coef):
            if c and a not in old_to_new:
                raise Unprovable("a varying axis is dropped")
        return Affine(v.dtype, new_shape, tuple(coef), v.base)
    if not isinstance(v, Band):
        raise Unprovable(f"moving the axes of a {type(v).__name__}")
    if len(v.values) == 1:
        return Band(v.dtype, new_shape, (), v.values)
    r_old, r_new = len(v.shape), len(new_shape)
    if len(new_shape) < 2 or old_to_new.get(r_old - 2) != r_new - 2 or old_to_new.get(r_old - 1) != r_new - 1:
        raise Unprovable("the band's row and column axes do not stay the last two")
    return Band(v.dtype, new_shape, v.breaks, v.values)


def _non_unit(dims: Sequence[Dim]) -> list[int]:
    return [a for a, d in enumerate(dims) if d != Lin.of(1)]


@handles("Unsqueeze")
def _unsqueeze(an: Analysis, n: OnnxNode, ins: list) -> list:
    v = ins[0]
    shape = shape_of(v)
    axes = sorted(_rank_axes(_axes_input(an, n, ins, 1) or [], len(shape) + len(_axes_input(an, n, ins, 1) or [])))
    new: list[Dim] = list(shape)
    for a in axes:
        new.insert(a, Lin.of(1))
    mapping, k = {}, 0
    for b in range(len(new)):
        if b not in axes:
            mapping[k] = b
            k += 1
    return [_relayout(an, v, tuple(new), mapping)]


@handles("Squeeze")
def _squeeze(an: Analysis, n: OnnxNode, ins: list) -> list:
    v = ins[0]
    shape = shape_of(v)
    axes = _axes_input(an, n, ins, 1)
    axes = [a for a, d in enumerate(shape) if d == Lin.of(1)] if axes is None else _rank_axes(axes, len(shape))
    for a in axes:
        if not an.dims_equal(shape[a], Lin.of(1)):
            raise Unprovable("a squeezed axis is not provably of size 1")
    keep = [a for a in range(len(shape)) if a not in axes]
    return [_relayout(an, v, tuple(shape[a] for a in keep), {a: i for i, a in enumerate(keep)})]


@handles("Reshape")
def _reshape(an: Analysis, n: OnnxNode, ins: list) -> list:
    v = ins[0]
    shape = shape_of(v)
    target = _ints(an, ins[1], "the target shape")
    allow_zero = int(_attr(n, "allowzero", 0))
    dims: list[Dim | None] = []
    for a, t in enumerate(target):
        if isinstance(t, Lin) and t.is_const and t.const == 0 and not allow_zero:
            dims.append(shape[a])
        elif isinstance(t, Lin) and t.is_const and t.const == -1:
            dims.append(None)
        else:
            dims.append(t)
    sizes = [-1 if d is None else d.const for d in dims if d is None or isinstance(d, Lin) and d.is_const]
    if isinstance(v, Elems) and len(sizes) == len(dims):
        out = np.empty(v.shape, dtype=np.int8).reshape(sizes)
        return [Elems(v.dtype, tuple(out.shape), v.items)]
    src = _non_unit(shape)
    known = [a for a, d in enumerate(dims) if d is not None and d != Lin.of(1)]
    holes = [a for a, d in enumerate(dims) if d is None]
    if len(holes) > 1:
        raise Unprovable("more than one -1 in the target shape")
    if holes:
        if len(src) != len(known) + 1:
            raise Unprovable("a -1 that merges or splits sizes")
        # the -1 takes the one input size left over, in order
        order = sorted(known + holes)
        for a_src, a_dst in zip(src, order):
            if dims[a_dst] is None:
                dims[a_dst] = shape[a_src]
    full = tuple(d for d in dims if d is not None)
    dst = _non_unit(full)
    if len(src) != len(dst) or not all(an.dims_equal(shape[a], full[b]) for a, b in zip(src, dst)):
        raise Unprovable("a reshape that merges or splits sizes")
    return [_relayout(an, v, full, dict(zip(src, dst)))]


@handles("Flatten")
def _flatten(an: Analysis, n: OnnxNode, ins: list) -> list:
    v = ins[0]
    shape = shape_of(v)
    axis = int(_attr(n, "axis", 1))
    axis = _axis(axis, len(shape))
    left, right = shape[:axis], shape[axis:]
    out: list[Dim] = []
    for part in (left, right):
        big = [d for d in part if d != Lin.of(1)]
        if len(big) > 1:
            raise Unprovable("a flatten that merges sizes")
        out.append(big[0] if big else Lin.of(1))
    src = _non_unit(shape)
    dst = _non_unit(out)
    return [_relayout(an, v, tuple(out), dict(zip(src, dst)))]


@handles("Expand")
def _expand(an: Analysis, n: OnnxNode, ins: list) -> list:
    v = ins[0]
    shape = an.broadcast(shape_of(v), _dims_from(an, ins[1], "the shape"))
    if isinstance(v, Affine):
        return [an.expand_affine(v, shape)]
    if isinstance(v, Opaque):
        return [Opaque(v.dtype, shape, v.why)]
    if isinstance(v, Elems) and an.uniform(v) is None:
        return [an.expand_affine(an.affine(v, "the expanded value"), shape)]
    return [an.band_at(v, shape)]


@handles("Transpose")
def _transpose(an: Analysis, n: OnnxNode, ins: list) -> list:
    v = ins[0]
    shape = shape_of(v)
    perm = _attr(n, "perm")
    perm = list(reversed(range(len(shape)))) if perm is None else list(perm)
    new = tuple(shape[p] for p in perm)
    if isinstance(v, Band) and len(v.values) > 1:
        r = len(shape)
        lead_ok = sorted(perm[:-2]) == list(range(r - 2))
        if lead_ok and perm[-2:] == [r - 2, r - 1]:
            return [Band(v.dtype, new, v.breaks, v.values)]
        if lead_ok and perm[-2:] == [r - 1, r - 2]:
            # element (i, j) of the result is (j, i) of v: diagonal d becomes -d
            lins = _lin_breaks(v, "transposing a band whose diagonals follow a clamped size")
            breaks = tuple(Lin.of(1) - x for x in reversed(lins))
            return [Band(v.dtype, new, breaks, tuple(reversed(v.values)))]
        raise Unprovable("a transpose that moves the band's axes")
    return [_relayout(an, v, new, {p: i for i, p in enumerate(perm)})]


@handles("Gather")
def _gather(an: Analysis, n: OnnxNode, ins: list) -> list:
    data, idx = ins
    axis = int(_attr(n, "axis", 0))
    dshape = shape_of(data)
    axis = _axis(axis, len(dshape))
    if isinstance(data, Elems) and isinstance(idx, Elems):
        items = _objs(data)
        picked = np.take(items, np.array(_const_ints(an, idx, "the indices")).reshape(idx.shape), axis=axis)
        return [_from_objs(data.dtype, picked)]
    if isinstance(data, (Band, Opaque)):
        u = an.uniform(data) if isinstance(data, Band) else None
        if u is None:
            raise Unprovable("gathering from a band or from data")
    try:
        x = an.affine(data, "the gathered tensor") if not isinstance(data, Band) else None
    except Unprovable:
        raise NotAMask("it looks up stored values by position (an embedding), not a mask") from None
    ix = an.affine(idx, "the indices")
    size = as_lin(dshape[axis], "the gathered axis")
    lo, _ = an.affine_bounds(ix)
    top = ix.base + sum((as_lin(d, "an index size") - 1).scale(c) for c, d in zip(ix.coef, ix.shape) if c > 0)
    if lo < 0 or not an.nonneg(size - 1 - top):
        raise Unprovable("the indices are not provably within [0, size): a negative or clamped index is not affine")
    new_shape = dshape[:axis] + ix.shape + dshape[axis + 1:]
    if x is None:
        assert isinstance(data, Band)
        return [Band(data.dtype, new_shape, (), data.values)]
    c = x.coef[axis]
    coef = x.coef[:axis] + tuple(c * ci for ci in ix.coef) + x.coef[axis + 1:]
    return [an.check_fits(Affine(x.dtype, new_shape, coef, x.base + ix.base.scale(c)), "the gathered values")]


def _slice_args(an: Analysis, n: OnnxNode, ins: list, rank: int) -> list[tuple[int, Lin, Lin | None, int]]:
    """(axis, start, end or None for 'to the end', step) per sliced axis, from inputs or attributes."""
    if len(ins) > 1:
        starts, ends = _ints(an, ins[1], "starts"), _ints(an, ins[2], "ends")
        axes = _const_ints(an, ins[3], "axes") if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = _const_ints(an, ins[4], "steps") if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    else:
        starts = [Lin.of(s) for s in _attr(n, "starts")]
        ends = [Lin.of(e) for e in _attr(n, "ends")]
        axes = list(_attr(n, "axes", range(len(starts))))
        steps = [1] * len(starts)
    out = []
    for a, s, e, st in zip(_rank_axes(axes, rank), starts, ends, steps):
        s, e = as_lin(s, "a slice start"), as_lin(e, "a slice end")
        out.append((a, s, None if e.is_const and e.const >= SLICE_TO_END else e, st))
    return out


def _slice_bound(an: Analysis, b: Lin, size: Lin) -> Lin:
    """An ONNX Slice start/end clamped to [0, size], as a Lin when the clamp is provably a no-op."""
    if b.is_const and b.const < 0:
        b = size + b
    if not an.nonneg(b):
        raise Unprovable("a slice bound that may be negative")
    if not an.nonneg(size - b):
        if size.is_const:
            raise Unprovable(f"the slice bound {b.render(str)} may pass the fixed size {size.const}, where the "
                             "slice clamps (its sizes and diagonal would follow min(bound, size))")
        raise Unprovable(f"the slice bound {b.render(str)} may pass the end {size.render(str)}")
    return b


@handles("Slice")
def _slice(an: Analysis, n: OnnxNode, ins: list) -> list:
    v = ins[0]
    shape = list(shape_of(v))
    args = _slice_args(an, n, ins, len(shape))
    if isinstance(v, Elems) and any(not s.is_const or (e is not None and not e.is_const) for _, s, e, _ in args):
        # a size-dependent slice of a stored arange (position ids): slice it as an index grid
        return [slice_value(an, an.affine(v, "a small tensor sliced by a size"), args)]
    if isinstance(v, Elems):
        items = _objs(v)
        index = [slice(None)] * len(v.shape)
        for a, s, e, st in args:
            index[a] = slice(s.const, None if e is None else e.const, st)
        picked = items[tuple(index)]
        return [_from_objs(v.dtype, picked)]
    return [slice_value(an, v, args)]


def slice_value(an: Analysis, v: AbstractValue, args: list[tuple[int, Lin, Lin | None, int]]) -> AbstractValue:
    """v[start:end] along each (axis, start, end or None for 'to the end', step) of args."""
    shape = list(shape_of(v))
    offsets: list[Dim] = [Lin.of(0)] * len(shape)
    for a, s, e, st in args:
        if st != 1:
            raise Unprovable("a slice with a step other than 1")
        size = shape[a]
        if isinstance(size, Lin) and size.is_const and (not s.is_const or (e is not None and not e.is_const)):
            # [s:e] of a fixed size N (a stored mask buffer): ONNX clamps both bounds to N, so the
            # slice is [min(s, N), min(e, N)), exactly, at every size
            s = size + s if s.is_const and s.const < 0 else s
            end = size if e is None else (size + e if e.is_const and e.const < 0 else e)
            if not an.nonneg(s) or not an.nonneg(end - s):
                raise Unprovable(f"a slice [{s.render(str)}:{end.render(str)}] of a fixed size that may be "
                                 "negative or reversed")
            lo, hi = make_clamp(s, None, size.const, an), make_clamp(end, None, size.const, an)
            shape[a] = make_clamp(hi - lo, 0, None, an) if isinstance(lo, Lin) and isinstance(hi, Lin) else \
                hi if lo == Lin.of(0) else Difference(hi, lo)
            offsets[a] = lo
            continue
        size_lin = as_lin(size, "a sliced size")
        start = _slice_bound(an, s, size_lin)
        end = size_lin if e is None else _slice_bound(an, e, size_lin)
        shape[a] = make_clamp(end - start, 0, None, an)
        offsets[a] = start
    new_shape = tuple(shape)
    if isinstance(v, Opaque):
        return Opaque(v.dtype, new_shape, v.why)
    if isinstance(v, Affine):
        base = v.base
        for c, off in zip(v.coef, offsets):
            base = base + as_lin(off, "a slice offset").scale(c)
        return Affine(v.dtype, new_shape, v.coef, base)
    if not isinstance(v, Band):
        raise Unprovable(f"slicing a {type(v).__name__}")
    r = len(shape)
    if len(v.values) == 1 or r < 2:
        return Band(v.dtype, new_shape, v.breaks, v.values)
    # element (i, j) of the slice is (i + s, j + t) of v: diagonal d is d + t - s of v
    row, col = offsets[r - 2], offsets[r - 1]
    if isinstance(row, Lin) and isinstance(col, Lin):
        shift: Lin | Clamp = col - row
    elif col == Lin.of(0) and isinstance(row, Clamp):
        shift = -row
    elif row == Lin.of(0) and isinstance(col, Clamp):
        shift = col
    else:
        raise Unprovable("a band sliced at two clamped offsets")
    if isinstance(shift, Lin) and shift.is_const:
        return Band(v.dtype, new_shape, tuple(x - shift.const for x in v.breaks), v.values)
    if isinstance(shift, Lin):
        breaks = _lin_breaks(v, "a band whose diagonals follow a clamped size, sliced at a size-dependent offset")
        return Band(v.dtype, new_shape, tuple(x - shift for x in breaks), v.values)
    if not all(isinstance(x, Lin) and x.is_const for x in v.breaks):
        raise Unprovable("a band whose diagonals move with the sizes, sliced at a clamped offset")
    return Band(v.dtype, new_shape, tuple(-shift + x.const for x in v.breaks), v.values)


@handles("Concat")
def _concat(an: Analysis, n: OnnxNode, ins: list) -> list:
    vs = [v for v in ins if v is not None]
    axis = int(_attr(n, "axis", 0))
    if all(isinstance(v, Elems) for v in vs):
        rank = len(vs[0].shape)
        axis = _axis(axis, rank)
        arrays = [_objs(v) for v in vs]
        out = np.concatenate(arrays, axis=axis)
        return [_from_objs(vs[0].dtype, out)]
    rank = len(shape_of(vs[0]))
    axis = _axis(axis, rank)
    if axis == rank - 1 and all(_stackable(v) for v in vs):
        return [_stack(an, vs)]
    offsets, total = [], Lin.of(0)
    for v in vs:
        offsets.append(total)
        total = total + as_lin(shape_of(v)[axis], "a concatenated size")
    shape = list(shape_of(vs[0]))
    shape[axis] = total
    for v in vs[1:]:
        for a, (d, e) in enumerate(zip(shape_of(v), shape)):
            if a != axis and not an.dims_equal(d, e):
                raise Unprovable("concatenated pieces whose other sizes are not provably equal")
    if any(isinstance(v, Band) and len(v.values) > 1 for v in vs) or any(_is_piecewise(an, v) for v in vs):
        return [_concat_bands(an, [an.band_at(v, shape_of(v)) for v in vs], offsets, axis, tuple(shape))]
    return [_concat_grids(an, [an.affine(v, "a concatenated piece") for v in vs], offsets, axis, tuple(shape))]


def _stackable(v: AbstractValue) -> bool:
    return isinstance(v, Stack) or (isinstance(v, Affine) and bool(v.shape) and v.shape[-1] == Lin.of(1))


def _stack(an: Analysis, vs: list) -> Stack:
    """Index grids (each [..., 1]) or stacks of them, side by side along the last axis."""
    lead = an.broadcast(*(shape_of(v)[:-1] for v in vs))
    parts: list[Affine] = []
    for v in vs:
        pieces = v.parts if isinstance(v, Stack) else (Affine(v.dtype, v.shape[:-1], v.coef[:-1], v.base),)
        parts += [an.expand_affine(p, lead) for p in pieces]
    return Stack(vs[0].dtype, lead + (Lin.of(len(parts)),), tuple(parts))


@handles("GatherND")
def _gather_nd(an: Analysis, n: OnnxNode, ins: list) -> list:
    data, idx = ins
    if int(_attr(n, "batch_dims", 0)):
        raise Unprovable("GatherND with batch_dims")
    if isinstance(idx, Affine) and idx.shape and idx.shape[-1] == Lin.of(1):
        idx = _stack(an, [idx])
    if not isinstance(idx, Stack):
        raise Unprovable("GatherND indices that are not index grids stacked along the last axis")
    dshape = shape_of(data)
    k = len(idx.parts)
    if k != len(dshape):
        raise Unprovable("GatherND of a slice (fewer indices than dims)")
    for p, size in zip(idx.parts, dshape):
        lo, _ = an.affine_bounds(p)
        top = p.base + sum((as_lin(d, "an index size") - 1).scale(c) for c, d in zip(p.coef, p.shape) if c > 0)
        if lo < 0 or not an.nonneg(as_lin(size, "a gathered size") - 1 - top):
            raise Unprovable("GatherND indices not provably within the data: a negative index wraps")
    out_shape = idx.shape[:-1]
    if isinstance(data, Affine):  # positions of positions: still affine
        base, coef = data.base, [0] * len(out_shape)
        for c, p in zip(data.coef, idx.parts):
            base = base + p.base.scale(c)
            coef = [a + c * b for a, b in zip(coef, p.coef)]
        return [an.check_fits(Affine(data.dtype, out_shape, tuple(coef), base), "the gathered positions")]
    if isinstance(data, Band):
        if len(data.values) == 1 or k < 2:
            return [Band(data.dtype, out_shape, (), data.values[:1])] if len(data.values) == 1 else \
                _raise("gathering a band by fewer than two indices")
        # element = f(col - row) with col - row an index grid over the result: a band when it is j - i + c
        diff = _sub(an, idx.parts[-1], idx.parts[-2])
        assert isinstance(diff, Affine)
        r = len(out_shape)
        if r < 2 or any(diff.coef[:-2]) or diff.coef[-1] != 1 or diff.coef[-2] != -1:
            raise Unprovable("gathering a band at positions whose difference is not the result's diagonal")
        breaks = _lin_breaks(data, "gathering a band whose diagonals follow a clamped size")
        return [Band(data.dtype, out_shape, tuple(x - diff.base for x in breaks), data.values)]
    raise Unprovable(f"GatherND of a {type(data).__name__}")


def _raise(why: str) -> list:
    raise Unprovable(why)


def _concat_grids(an: Analysis, parts: list[Affine], offsets: list[Lin], axis: int, shape: tuple[Dim, ...]
                  ) -> Affine:
    """Pieces that continue one another: the same coefficients, and piece k starting where the grid
    of piece 0 would be at its offset."""
    first = parts[0]
    for p, off in zip(parts[1:], offsets[1:]):
        if p.coef != first.coef or p.dtype != first.dtype or \
                an.sign(p.base - (first.base + off.scale(first.coef[axis]))) != 0:
            raise Unprovable("concatenated index grids that do not continue one another")
    return Affine(first.dtype, shape, first.coef, first.base)


def _concat_bands(an: Analysis, parts: list[Band], offsets: list[Lin], axis: int, shape: tuple[Dim, ...]) -> Band:
    """Bands side by side (or stacked) are one band when each piece is the whole band seen from its
    offset: piece k holds f_k(x) at local diagonal x, the whole holds F(x + shift_k), and the two must
    agree on every diagonal the piece has."""
    rank = len(shape)
    if axis < rank - 2:
        if any(p.breaks != parts[0].breaks or not all(_same(a, b) for a, b in zip(p.values, parts[0].values))
               for p in parts):
            raise Unprovable("batch slices holding different bands")
        return Band(parts[0].dtype, shape, parts[0].breaks, parts[0].values)
    # columns: local x = d - offset; rows: local x = d + offset
    sign = -1 if axis == rank - 1 else 1
    for ref, (ref_part, ref_off) in enumerate(zip(parts, offsets)):
        # F(d) = f_ref(d + sign * ref_off)
        ref_breaks = _lin_breaks(ref_part, "concatenated bands whose diagonals follow a clamped size")
        whole = Band(ref_part.dtype, shape, tuple(x - ref_off.scale(sign) for x in ref_breaks), ref_part.values)
        try:
            for k, (p, off) in enumerate(zip(parts, offsets)):
                if k != ref:
                    _agree_on_piece(an, p, whole, off.scale(sign), axis, rank)
        except Unprovable:
            continue
        return whole
    raise Unprovable("concatenated bands that are not one band")


def _agree_on_piece(an: Analysis, piece: Band, whole: Band, shift: Lin, axis: int, rank: int) -> None:
    """piece(x) == whole(x - shift) for every diagonal x of the piece, or Unprovable."""
    rows, cols = as_lin(piece.shape[-2], "a row count"), as_lin(piece.shape[-1], "a column count")
    lo, hi = Lin.of(1) - rows, cols  # the piece's diagonals: [1 - rows, cols)
    whole_breaks = _lin_breaks(whole, "concatenated bands whose diagonals follow a clamped size")
    moved = Band(whole.dtype, piece.shape, tuple(x + shift for x in whole_breaks), whole.values)
    both = an.merge([piece, moved], lambda a, b: np.bool_(_same(a, b)), BOOL, piece.shape)
    edges = (None,) + both.breaks + (None,)
    for k, same in enumerate(both.values):
        if bool(same):
            continue
        a, b = edges[k], edges[k + 1]
        if isinstance(a, Clamp) or isinstance(b, Clamp):
            raise Unprovable("a concatenated piece differs from the band at a clamped diagonal")
        # a run of disagreement [a, b) must miss [lo, hi): b <= lo or a >= hi, provably
        misses = (b is not None and an.nonneg(lo - b)) or (a is not None and an.nonneg(a - hi))
        if not misses:
            raise Unprovable("a concatenated piece differs from the band on its diagonals")


@handles("Split")
def _split(an: Analysis, n: OnnxNode, ins: list) -> list:
    v = ins[0]
    shape = shape_of(v)
    axis = int(_attr(n, "axis", 0))
    axis = _axis(axis, len(shape))
    if len(ins) > 1 and ins[1] is not None:
        sizes = [as_lin(x, "a split size") for x in _ints(an, ins[1], "split")]
    elif _attr(n, "split") is not None:
        sizes = [Lin.of(x) for x in _attr(n, "split")]
    else:  # equal parts: ceil(size / n) each, the last one what is left
        parts = len(n.outputs)
        total = as_lin(shape[axis], "the split size")
        if not total.is_const:
            raise Unprovable("an equal split of a size-dependent axis")
        sizes = [Lin.of(-(-total.const // parts))] * (parts - 1)
        sizes.append(total - sum(x.const for x in sizes))
    if isinstance(v, Elems):
        if not all(x.is_const for x in sizes):
            raise Unprovable("a size-dependent split of a small tensor")
        out = np.split(_objs(v), np.cumsum([x.const for x in sizes])[:-1], axis=axis)
        return [_from_objs(v.dtype, p) for p in out]
    pieces, start = [], Lin.of(0)
    for size in sizes:
        pieces.append(slice_value(an, v, [(axis, start, start + size, 1)]))
        start = start + size
    return pieces

