"""Slice and Transpose of a DIAGONAL_MATRIX1 output (holding data, moving at run time, or of shapes
only): the same node over the sliced (transposed) input, its region moved.

A slice starting at (r0, c0) moves the diagonals [b, e) to [b + r0 - c0, e + r0 - c0), the starts
read as onnxruntime clamps them; a transpose of the last two axes maps [b, e) to [-e + 1, -b + 1).
Proof: docs/masks.md, "Views of a band that holds data".
"""
from __future__ import annotations

from typing import Any, cast

import numpy as np
from onnx import TensorProto

from dmlgraph.ir.dtypes import INT32_MAX
from dmlgraph.ir.graph import Dim, DmlNode, Graph, OnnxNode, Value
from dmlgraph.ir.ops import BOUND_LIMIT
from dmlgraph.passes.broadcast import Built, ShapeSource, same_dims, shape_source
from dmlgraph.passes.common import const_value

Plan = dict[str, Any]


def _input_axes(d: DmlNode, d_value: Value, axes: list[int]) -> tuple[str | None, dict[int, str]]:
    """(why the band's input cannot take the view, how it takes it along each of `axes` that it has):
    "take" where its dim is the band's, "choose" where it is the band's or a broadcast 1 at run time
    (a dim not 1 is the band's: broadcasting allows nothing else). Static 1s and axes the input lacks
    (right-aligned) broadcast: left as they are."""
    x = d.inputs[0]
    if x is None:
        return None, {}
    if x.shape is None:
        return f"the band's input {x.name!r} has an unknown shape", {}
    band = cast("tuple[Dim, ...]", d_value.shape)
    lead = len(band) - len(x.shape)
    if lead < 0:
        return f"the band's input {x.name!r} {list(x.shape)} has more axes than the band", {}
    # (the band takes x's shape, unless claimed: then its mask's sizes may broadcast x)
    own = d.inputs[1] is None and d.static_shape is None and not d.claimed
    if own or _full(d, d_value):  # (x's dims are the band's, 1s included: each is sliced, none broadcast)
        return None, {a: "take" for a in axes if a >= lead}
    how = {}
    for a in axes:
        if a < lead or x.shape[a - lead] == 1:
            continue
        how[a] = "take" if own or isinstance(x.shape[a - lead], int) or \
            same_dims((x.shape[a - lead],), (band[a],)) else "choose"
    return None, how


def _claim_reason(d: DmlNode, what: str) -> str | None:
    """Why a claimed band's mask sizes (`DmlNode.matrix`) cannot be viewed: they must be a vector of
    known length (the view moves its last two)."""
    m = d.matrix if d.claimed else None
    if m is not None and (m.shape is None or len(m.shape) != 1 or not isinstance(m.shape[0], int) or m.shape[0] < 2):
        return f"{what} of a band applied by a claimed dim name whose mask sizes have no known length"
    return None


def _claimed_matrix(d: DmlNode, lengths: dict[int, Value], first: dict[int, Value | int], rank: int, hint: str,
                    built: Built) -> Value:
    """A claimed band's mask sizes [.., H, W] at the slice: a side sliced takes the slice's length, and
    its start shifts the band, unless it is 1 (the model broadcast the mask along it: kept, no
    shift). `first` is updated in place to the shifts the mask's band takes."""
    m = cast(Value, d.matrix)
    n = cast(int, cast("tuple[Dim, ...]", m.shape)[0])
    one = built.constant(f"{hint}__one1", np.array([1], np.int64))
    pieces = []
    if n > 2:
        pieces.append(built.node("Slice", [m, built.constant(f"{hint}__z1", np.array([0], np.int64)),
                                           built.constant(f"{hint}__b", np.array([n - 2], np.int64))],
                                 f"{hint}__mask_batch", shape=(n - 2,)))
    for a, i in ((rank - 2, n - 2), (rank - 1, n - 1)):
        side = built.node("Slice", [m, built.constant(f"{hint}__i", np.array([i], np.int64)),
                                    built.constant(f"{hint}__i1", np.array([i + 1], np.int64))], f"{hint}__side", shape=(1,))
        if a not in lengths:
            pieces.append(side)
            continue
        broadcast = built.node("Equal", [side, one], f"{hint}__bcast", TensorProto.BOOL, (1,))
        pieces.append(built.node("Where", [broadcast, one, lengths[a]], f"{hint}__side", shape=(1,)))
        f = first.get(a, 0)
        if f != 0:
            start = built.constant(f"{hint}__f", np.array([f], np.int64)) if isinstance(f, int) else \
                built.node("Reshape", [f, one], f"{hint}__f", shape=(1,))
            moved = built.node("Where", [broadcast, built.constant(f"{hint}__z1", np.array([0], np.int64)), start],
                               f"{hint}__start", shape=(1,))
            first[a] = built.node("Reshape", [moved, built.constant(f"{hint}__scalar", np.zeros(0, np.int64))],
                                  f"{hint}__start", shape=())
    return built.node("Concat", pieces, f"{hint}__mask_sizes", shape=(n,), axis=0)


def match_slice(graph: Graph, node: OnnxNode, d: DmlNode, d_value: Value) -> tuple[str | None, Plan]:
    """(why Slice(d) is not lowered, the plan)."""
    rank = len(d_value.shape or ())
    if d_value.shape is None or rank < 2:
        return f"the band feeding Slice {node.name!r} has an unknown rank", {}
    if len(node.inputs) < 3:
        return f"Slice {node.name!r} in its opset-1 form (bounds as attributes)", {}
    starts, ends = cast(Value, node.inputs[1]), cast(Value, node.inputs[2])
    axes_v = node.input(3)
    steps_v = node.input(4)
    if steps_v is not None:
        steps = const_value(graph, steps_v)
        if steps is None or np.any(np.asarray(steps) != 1):
            return f"Slice {node.name!r} has a step other than 1 (or a run-time step): its rows would not keep the band", {}
    if axes_v is not None:
        arr = const_value(graph, axes_v)
        if arr is None:
            return f"the axes of Slice {node.name!r} are run-time values", {}
        axes = [int(a) for a in np.asarray(arr).reshape(-1)]
    elif starts.shape is not None and len(starts.shape) == 1 and isinstance(starts.shape[0], int):
        axes = list(range(starts.shape[0]))
    else:
        return f"Slice {node.name!r} has no axes and starts of unknown length", {}
    if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
        return f"the axes {axes} of Slice {node.name!r} are out of range or repeated", {}
    axes = [a % rank for a in axes]
    why = _claim_reason(d, f"Slice {node.name!r}")
    if why is None and d.claimed and any(a < rank - 2 for a in axes):
        why = f"Slice {node.name!r} of a batch axis of a band applied by a claimed dim name"
    if why is not None:
        return why, {}
    why, how = _input_axes(d, d_value, axes)
    if why is not None:
        return f"Slice {node.name!r}: {why}", {}
    source = shape_source(graph, d_value)
    if source is None:
        return f"the band feeding Slice {node.name!r} has an unknown rank", {}
    return None, {"view": "slice", "axes": axes, "how": how, "source": source, "full": _full(d, d_value),
                  "starts": starts, "ends": ends}


def one_line(graph: Graph, node: OnnxNode, rank: int) -> int | None:
    """0 (rows) or 1 (columns) where Slice `node` keeps at most one line of a matrix axis at every
    size: constant bounds of one sign at most 1 apart (`[0:1]`, `[-2:-1]`) or `[-1:]`; else None."""
    s_arr, e_arr = const_value(graph, cast(Value, node.inputs[1])), const_value(graph, cast(Value, node.inputs[2]))
    axes_v = node.input(3)
    axes_arr = const_value(graph, axes_v) if axes_v is not None else None
    if s_arr is None or e_arr is None or (axes_v is not None and axes_arr is None) or rank < 2:
        return None
    starts, ends = np.asarray(s_arr).reshape(-1), np.asarray(e_arr).reshape(-1)
    axes = range(len(starts)) if axes_arr is None else np.asarray(axes_arr).reshape(-1)
    for s, e, a in zip(starts, ends, axes):
        if int(a) % rank >= rank - 2 and ((s >= 0) == (e >= 0) and int(e) - int(s) <= 1 or s == -1 and e >= INT32_MAX):
            return int(a) % rank - (rank - 2)
    return None


def _full(d: DmlNode, d_value: Value) -> bool:
    """The band's input has the band's shape (so the viewed input has the view's)."""
    x = d.inputs[0]
    return x is not None and (d.inputs[1] is None and d.static_shape is None or same_dims(x.shape, d_value.shape))


def match_transpose(graph: Graph, node: OnnxNode, d: DmlNode, d_value: Value) -> tuple[str | None, Plan]:
    rank = len(d_value.shape or ())
    perm = node.attr("perm", None)
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    if d_value.shape is None or rank < 2 or sorted(perm) != list(range(rank)):
        return f"the band feeding Transpose {node.name!r} has an unknown rank", {}
    if sorted(perm[-2:]) != [rank - 2, rank - 1]:
        return f"Transpose {node.name!r} moves a matrix axis among the batch axes", {}
    why = _claim_reason(d, f"Transpose {node.name!r}")
    if why is None and d.claimed and perm[:-2] != list(range(rank - 2)):
        why = f"Transpose {node.name!r} moves the batch axes of a band applied by a claimed dim name"
    if why is not None:
        return why, {}
    x = d.inputs[0]
    if x is not None and x.shape is None:
        return f"Transpose {node.name!r}: the band's input {x.name!r} has an unknown shape", {}
    source = shape_source(graph, d_value)
    if source is None:
        return f"the band feeding Transpose {node.name!r} has an unknown rank", {}
    return None, {"view": "transpose", "perm": perm, "mirror": perm[-2:] == [rank - 1, rank - 2],
                  "source": source, "full": _full(d, d_value)}


def _sizes(source: ShapeSource, hint: str, built: Built) -> Value:
    if source.static is not None:
        return built.constant(f"{hint}__sizes", np.array(source.static, np.int64))
    if source.vector is not None:
        return source.vector
    return built.node("Shape", [source.of], f"{hint}__band_shape", shape=(source.rank,))


def _int64(v: Value, hint: str, built: Built) -> Value:
    if v.elem_type == TensorProto.INT64:
        return v
    return built.node("Cast", [v], f"{hint}__bounds", shape=v.shape, to=TensorProto.INT64)


def _bound(v: Value, arr: np.ndarray | None, i: int, hint: str, built: Built) -> Value:
    """Entry i of a Slice's (int64) starts/ends as a 1-element vector (`arr`: their constant value)."""
    if arr is not None:
        return built.constant(f"{hint}__bound", np.asarray(arr, np.int64).reshape(-1)[i:i + 1])
    lo, hi = built.constant(f"{hint}__i", np.array([i], np.int64)), built.constant(f"{hint}__i1", np.array([i + 1], np.int64))
    return built.node("Slice", [v, lo, hi], f"{hint}__bound", shape=(1,))


def _sliced_input(x: Value, out: tuple[Dim, ...] | None, axes: list[int], how: dict[int, str], starts: Value,
                  ends: Value, hint: str, built: Built) -> Value:
    """x sliced like the band along the axes in `how`; along a "choose" axis the bounds are [0:] where
    x's dim is 1 at run time (broadcast: kept whole)."""
    taken, x_shape = sorted(how), list(cast("tuple[Dim, ...]", x.shape))
    rank = len(out) if out is not None else len(x_shape)
    lead = rank - len(x_shape)
    idx = built.constant(f"{hint}__pos", np.array([axes.index(a) for a in taken], np.int64))
    s = built.node("Gather", [starts, idx], f"{hint}__xstarts", shape=(len(taken),), axis=0)
    e = built.node("Gather", [ends, idx], f"{hint}__xends", shape=(len(taken),), axis=0)
    if any(how[a] == "choose" for a in taken):
        xs = built.node("Shape", [x], f"{hint}__xshape", shape=(rank - lead,))
        dims = built.node("Gather", [xs, built.constant(f"{hint}__xaxes", np.array([a - lead for a in taken], np.int64))],
                          f"{hint}__xdims", shape=(len(taken),), axis=0)
        one = built.constant(f"{hint}__one", np.array([1 if how[a] == "choose" else -1 for a in taken], np.int64))
        kept = built.node("Equal", [dims, one], f"{hint}__broadcast", TensorProto.BOOL, (len(taken),))
        s = built.node("Where", [kept, built.constant(f"{hint}__z", np.zeros(1, np.int64)), s], f"{hint}__xstarts",
                       shape=(len(taken),))
        e = built.node("Where", [kept, built.constant(f"{hint}__big", np.array([BOUND_LIMIT], np.int64)), e],
                       f"{hint}__xends", shape=(len(taken),))
    ax = built.constant(f"{hint}__axes", np.array([a - lead for a in taken], np.int64))
    for a in taken:
        x_shape[a - lead] = out[a] if out is not None and how[a] == "take" else None
    return built.node("Slice", [x, s, e, ax], f"{hint}__input", x.elem_type, tuple(x_shape))


def _static_axis(n: Dim, s: np.ndarray | None, e: np.ndarray | None, i: int) -> tuple[int | None, int | None]:
    """(first kept index, length) of [s:e] on an axis of size n where they are constants (Python's
    slice clamps as ONNX does for step 1); the first is s itself for a start s >= 0 at any size (where s
    passes n the slice is empty, and any shift describes it)."""
    if s is None:
        return None, None
    start = int(s.reshape(-1)[i])
    if isinstance(n, int) and e is not None:
        r = range(n)[start:int(e.reshape(-1)[i])]
        return r.start if len(r) else 0, len(r)
    return (start, None) if start >= 0 else (None, None)


def build_slice(graph: Graph, node: OnnxNode, d: DmlNode, plan: Plan, hint: str, built: Built
                ) -> tuple[Value | None, Value | None, Value | None, int | None, int | None, Value | None]:
    """(x, sizes or None for x's / the static shape, k, begin, end, a claimed band's mask sizes) of the
    band at the slice."""
    x, source = d.inputs[0], plan["source"]
    rank, axes, static_out = source.rank, plan["axes"], node.outputs[0].static_shape
    s_arr, e_arr = const_value(graph, plan["starts"]), const_value(graph, plan["ends"])
    starts, ends = _int64(plan["starts"], hint, built), _int64(plan["ends"], hint, built)
    if plan["how"]:
        x = _sliced_input(cast(Value, x), node.outputs[0].shape, axes, plan["how"], starts, ends, hint, built)
    # (a claimed band's output broadcasts x's sizes with its mask's, whose sides of 1 stay: the sizes say it)
    need_sizes = static_out is None and (not plan["full"] or d.claimed)
    need_lengths = need_sizes or d.claimed
    band_shape = cast("tuple[Dim, ...]", node.inputs[0].shape)  # type: ignore[union-attr]
    sizes_vec: Value | None = None
    zero = built.constant(f"{hint}__zero", np.array([0], np.int64))
    first: dict[int, Value | int] = {}
    lengths: dict[int, Value] = {}
    for i, a in enumerate(axes):
        matrix = a >= rank - 2
        if not matrix and not need_lengths:
            continue
        n_dim = source.static[a] if source.static is not None else band_shape[a]
        f0, length = _static_axis(n_dim, s_arr, e_arr, i)
        if f0 is not None and (length is not None or not need_lengths):
            if matrix:
                first[a] = f0
            if length is not None:
                lengths[a] = built.constant(f"{hint}__len", np.array([length], np.int64))
            continue
        if isinstance(n_dim, int):
            n = built.constant(f"{hint}__n", np.array(n_dim, np.int64))
        else:
            if sizes_vec is None:
                sizes_vec = _sizes(source, hint, built)
            n = built.node("Gather", [sizes_vec, built.constant(f"{hint}__a", np.array(a, np.int64))],
                           f"{hint}__n", shape=())
            if d.claimed:  # (the output's dim: the sizes' broadcast with the mask's)
                mi = cast("tuple[int]", cast(Value, d.matrix).shape)[0] - rank + a
                md = built.node("Gather", [cast(Value, d.matrix), built.constant(f"{hint}__m", np.array(mi, np.int64))],
                                f"{hint}__mask_n", shape=())
                is1 = built.node("Equal", [n, built.constant(f"{hint}__one", np.array(1, np.int64))], f"{hint}__is1",
                                 TensorProto.BOOL, ())
                n = built.node("Where", [is1, md, n], f"{hint}__n", shape=())
        rng = built.node("Range", [built.constant(f"{hint}__z", np.array(0, np.int64)), n,
                                   built.constant(f"{hint}__one", np.array(1, np.int64))], f"{hint}__range", shape=(None,))
        kept = built.node("Slice", [rng, _bound(starts, s_arr, i, hint, built), _bound(ends, e_arr, i, hint, built), zero],
                          f"{hint}__kept", shape=(None,))
        lengths[a] = built.node("Shape", [kept], f"{hint}__len", shape=(1,))
        if matrix:  # (an empty slice takes 0: any shift describes it)
            padded = built.node("Concat", [kept, zero], f"{hint}__kept0", shape=(None,), axis=0)
            first[a] = f0 if f0 is not None else built.node(
                "Gather", [padded, built.constant(f"{hint}__z", np.array(0, np.int64))], f"{hint}__start", shape=())
    if need_sizes and sizes_vec is None:
        sizes_vec = _sizes(source, hint, built)
    sizes = _sliced_sizes(cast(Value, sizes_vec), lengths, rank, hint, built) if need_sizes else None
    matrix = _claimed_matrix(d, lengths, first, rank, hint, built) if d.claimed else None
    k, begin, end = d.inputs[2], d.begin, d.end
    if begin is None and end is None:
        return x, sizes, k, begin, end, matrix
    row, col = first.get(rank - 2, 0), first.get(rank - 1, 0)
    if isinstance(row, int) and isinstance(col, int):  # a static shift moves the bounds themselves
        return x, sizes, k, None if begin is None else begin + row - col, \
            None if end is None else end + row - col, matrix
    if isinstance(col, int):
        shift = row if col == 0 else built.node("Sub", [cast(Value, row), built.constant(
            f"{hint}__c0", np.array(col, np.int64))], f"{hint}__shift", shape=())
    elif isinstance(row, int):
        shift = built.node("Sub", [built.constant(f"{hint}__r0", np.array(row, np.int64)), col], f"{hint}__shift",
                           shape=())
    else:
        shift = built.node("Sub", [row, col], f"{hint}__shift", shape=())
    return x, sizes, _plus_k(k, cast(Value, shift), hint, built), begin, end, matrix


def _sliced_sizes(sizes_vec: Value, lengths: dict[int, Value], rank: int, hint: str, built: Built) -> Value:
    """The band's sizes with each sliced axis' length in place."""
    pieces, i = [], 0
    for a in sorted(lengths):
        if a > i:
            lo = built.constant(f"{hint}__lo", np.array([i], np.int64))
            hi = built.constant(f"{hint}__hi", np.array([a], np.int64))
            pieces.append(built.node("Slice", [sizes_vec, lo, hi], f"{hint}__dims", shape=(a - i,)))
        pieces.append(lengths[a])
        i = a + 1
    if i < rank:
        lo = built.constant(f"{hint}__lo", np.array([i], np.int64))
        hi = built.constant(f"{hint}__hi", np.array([rank], np.int64))
        pieces.append(built.node("Slice", [sizes_vec, lo, hi], f"{hint}__dims", shape=(rank - i,)))
    return built.node("Concat", pieces, f"{hint}__out_sizes", shape=(rank,), axis=0) if len(pieces) > 1 else pieces[0]


def _clamped_k(k: Value, hint: str, built: Built) -> Value:
    """k inside +-2^62 as an int64 scalar (the same bounds on any matrix: `ops.clamp_bound`), so a
    shift or a negation cannot wrap."""
    if k.elem_type != TensorProto.INT64:
        k = built.node("Cast", [k], f"{hint}__k64", shape=k.shape, to=TensorProto.INT64)
    k = built.node("Reshape", [k, built.constant(f"{hint}__scalar", np.zeros(0, np.int64))], f"{hint}__k", shape=())
    k = built.node("Max", [k, built.constant(f"{hint}__lo", np.array(-BOUND_LIMIT, np.int64))], f"{hint}__k", shape=())
    return built.node("Min", [k, built.constant(f"{hint}__hi", np.array(BOUND_LIMIT, np.int64))], f"{hint}__k", shape=())


def _plus_k(k: Value | None, shift: Value, hint: str, built: Built) -> Value:
    if k is None:
        return shift
    return built.node("Add", [_clamped_k(k, hint, built), shift], f"{hint}__k_shifted", shape=())


def build_transpose(graph: Graph, node: OnnxNode, d: DmlNode, plan: Plan, hint: str, built: Built
                    ) -> tuple[Value | None, Value | None, Value | None, int | None, int | None, Value | None]:
    """(x, sizes or None for x's, k, begin, end, a claimed band's mask sizes) of the band transposed."""
    x, perm, rank = d.inputs[0], plan["perm"], plan["source"].rank
    if x is not None and not all(s == 1 for s in cast("tuple[Dim, ...]", x.shape)):
        xs = cast("tuple[Dim, ...]", x.shape)
        if len(xs) < rank:  # right-align x to the band first
            pad = built.constant(f"{hint}__pad_axes", np.arange(rank - len(xs), dtype=np.int64))
            xs = (1,) * (rank - len(xs)) + tuple(xs)
            x = built.node("Unsqueeze", [x, pad], f"{hint}__aligned", x.elem_type, xs)
        x = built.node("Transpose", [x], f"{hint}__input", x.elem_type, tuple(xs[p] for p in perm), perm=perm)
    sizes = None
    if not plan["full"] and node.outputs[0].static_shape is None:
        source = plan["source"]
        if source.static is not None:
            sizes = built.constant(f"{hint}__sizes", np.array([source.static[p] for p in perm], np.int64))
        else:
            order = built.constant(f"{hint}__perm", np.array(perm, np.int64))
            sizes = built.node("Gather", [_sizes(source, hint, built), order], f"{hint}__out_sizes", shape=(rank,), axis=0)
    k, begin, end, matrix = d.inputs[2], d.begin, d.end, d.matrix if d.claimed else None
    if matrix is not None and plan["mirror"]:  # (the batch axes stay: the match checked)
        n = cast(int, cast("tuple[Dim, ...]", matrix.shape)[0])
        order = built.constant(f"{hint}__mask_perm", np.array(list(range(n - 2)) + [n - 1, n - 2], np.int64))
        matrix = built.node("Gather", [matrix, order], f"{hint}__mask_sizes", shape=(n,), axis=0)
    if plan["mirror"]:
        begin, end = (None if d.end is None else 1 - d.end), (None if d.begin is None else 1 - d.begin)
        if k is not None:
            k = built.node("Neg", [_clamped_k(k, hint, built)], f"{hint}__k_negated", shape=())
    return x, sizes, k, begin, end, matrix
