"""Views and layout (Unsqueeze, Squeeze, Reshape, Flatten, Expand, Transpose, Slice, Concat, Gather,
GatherND, Split): moving axes keeps a band a band only while its row and column axes stay last.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from dmlgraph.ir.graph import OnnxNode, Value
from dmlgraph.passes.symbolic import (
    BOOL,
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
    Stack,
    Unprovable,
    as_lin,
    make_clamp,
    render_dim,
    same_bits,
    shape_of,
)
from dmlgraph.passes.symbolic_ops.arith import is_piecewise, sub
from dmlgraph.passes.symbolic_ops.core import (
    REJOINS,
    SLICE_TO_END,
    attr,
    axes_input,
    axis_index,
    const_ints,
    dims_from,
    from_objs,
    handles,
    ints,
    lin_breaks,
    objs,
    rank_axes,
)


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
    axes = sorted(rank_axes(axes_input(an, n, ins, 1) or [], len(shape) + len(axes_input(an, n, ins, 1) or [])))
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
    axes = axes_input(an, n, ins, 1) or None  # (empty axes are no axes to onnxruntime)
    if axes is None:  # every axis of size 1 at run time: a size that may be 1 is dropped only where it is
        for d in shape:
            lo, hi = an.bounds(d) if isinstance(d, Lin) else d.bounds(an.max_dim)
            if d != Lin.of(1) and lo <= 1 <= hi:
                raise Unprovable(f"a Squeeze without axes of the size {render_dim(d, str)}, which drops that "
                                 "axis only at the sizes where it is 1")
    axes = [a for a, d in enumerate(shape) if d == Lin.of(1)] if axes is None else rank_axes(axes, len(shape))
    for a in axes:
        if not an.dims_equal(shape[a], Lin.of(1)):
            raise Unprovable("a squeezed axis is not provably of size 1")
    keep = [a for a in range(len(shape)) if a not in axes]
    return [_relayout(an, v, tuple(shape[a] for a in keep), {a: i for i, a in enumerate(keep)})]


@handles("Reshape")
def _reshape(an: Analysis, n: OnnxNode, ins: list) -> list:
    v = ins[0]
    shape = shape_of(v)
    target = ints(an, ins[1], "the target shape")
    allow_zero = int(attr(n, "allowzero", 0))
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
    axis = int(attr(n, "axis", 1))
    axis = axis_index(axis, len(shape))
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
    shape = an.broadcast(shape_of(v), dims_from(an, ins[1], "the shape"))
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
    perm = attr(n, "perm")
    perm = list(reversed(range(len(shape)))) if perm is None else list(perm)
    new = tuple(shape[p] for p in perm)
    if isinstance(v, Elems):  # its items move with the axes (a reshape would keep their order)
        return [from_objs(v.dtype, objs(v).transpose(perm))]
    if isinstance(v, Band) and len(v.values) > 1:
        r = len(shape)
        lead_ok = sorted(perm[:-2]) == list(range(r - 2))
        if lead_ok and perm[-2:] == [r - 2, r - 1]:
            return [Band(v.dtype, new, v.breaks, v.values)]
        if lead_ok and perm[-2:] == [r - 1, r - 2]:
            # element (i, j) of the result is (j, i) of v: diagonal d becomes -d
            lins = lin_breaks(v, "transposing a band whose diagonals follow a clamped size")
            breaks = tuple(Lin.of(1) - x for x in reversed(lins))
            return [Band(v.dtype, new, breaks, tuple(reversed(v.values)))]
        raise Unprovable("a transpose that moves the band's axes")
    return [_relayout(an, v, new, {p: i for i, p in enumerate(perm)})]


@handles("Gather")
def _gather(an: Analysis, n: OnnxNode, ins: list) -> list:
    data, idx = ins
    axis = int(attr(n, "axis", 0))
    dshape = shape_of(data)
    axis = axis_index(axis, len(dshape))
    if isinstance(data, Elems) and isinstance(idx, Elems):
        items = objs(data)
        picked = np.take(items, np.array(const_ints(an, idx, "the indices")).reshape(idx.shape), axis=axis)
        return [from_objs(data.dtype, picked)]
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
        starts, ends = ints(an, ins[1], "starts"), ints(an, ins[2], "ends")
        axes = const_ints(an, ins[3], "axes") if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = const_ints(an, ins[4], "steps") if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    else:
        starts = [Lin.of(s) for s in attr(n, "starts")]
        ends = [Lin.of(e) for e in attr(n, "ends")]
        axes = list(attr(n, "axes", range(len(starts))))
        steps = [1] * len(starts)
    out = []
    for a, s, e, st in zip(rank_axes(axes, rank), starts, ends, steps):
        s, e = as_lin(s, "a slice start"), as_lin(e, "a slice end")
        out.append((a, s, None if e.is_const and _to_end(e.const, st) else e, st))
    return out


def _to_end(end: int, step: int) -> bool:
    """A Slice end that means "to the end": a huge one stepping forward; stepping back, onnxruntime
    reads only INT32_MAX and INT64_MAX so (to the first element), and clamps any other end."""
    return end >= SLICE_TO_END if step > 0 else end in (2**31 - 1, 2**63 - 1)


def slice_positions(size: int, start: int, end: int | None, step: int) -> list[int]:
    """The positions [start:end:step] takes along an axis of a fixed size, as ONNX and onnxruntime
    clamp them (end None, or a sentinel `_to_end` reads: to the end): stepping back, the start is
    clamped to [0, size - 1] and the end to [-1, size - 1] (Python's slices would leave a start
    before the first element empty, and read INT64_MAX as the last element)."""
    if step == 0:
        raise Unprovable("a slice step of 0")
    end = None if end is not None and _to_end(end, step) else end
    start = start + size if start < 0 else start
    start = min(max(start, 0), size - 1 if step < 0 else size)
    if end is None:
        end = -1 if step < 0 else size
    else:
        end = end + size if end < 0 else end
        end = min(max(end, -1), size - 1) if step < 0 else min(max(end, 0), size)
    return list(range(start, end, step))


def _slice_bound(an: Analysis, b: Lin, size: Lin, start: bool = False) -> Lin:
    """An ONNX Slice start/end clamped to [0, size], as a Lin when the clamp is provably a no-op. A
    start may pass the end: where it does, the slice is empty (docs/semantics.md, "Slice bounds")."""
    if b.is_const and b.const < 0:
        b = size + b
    if not an.nonneg(b):
        if an.bounds(b)[1] <= 0:  # (-S: from the end where S > 0, yet the whole axis at S = 0)
            raise Unprovable(f"a slice bound {b.render(str)} that counts from the end only where it is not 0 "
                             "(at 0 ONNX keeps the whole axis, which no one size expression states)")
        raise Unprovable("a slice bound that may be negative")
    if not start and not an.nonneg(size - b):
        if size.is_const:
            raise Unprovable(f"the slice bound {b.render(str)} may pass the fixed size {size.const}, where the "
                             "slice clamps (its sizes and diagonal would follow min(bound, size))")
        raise Unprovable(f"the slice bound {b.render(str)} may pass the end {size.render(str)}")
    return b


def _from_end(b: Lin) -> bool:
    return b.is_const and b.const < 0


def _clamped_bound(an: Analysis, b: Lin, size: Lin | Clamp) -> Lin | Clamp:
    """A slice bound as ONNX takes it: a negative one counts from the end (`[-1:]`), then each is
    clamped to [0, size]; exact where the size is itself clamped (a stored buffer sliced by sizes)."""
    if _from_end(b):
        if isinstance(size, Lin):
            return make_clamp(size + b, 0, None, an)
        if size.hi is None or size.hi + b.const >= 0:
            # max(clamp(x, lo, hi) + c, 0) = clamp(x + c, max(lo + c, 0), hi + c) where hi + c >= 0
            moved = size + b.const
            return Clamp(moved.inner, 0 if moved.lo is None else max(moved.lo, 0), moved.hi)
        raise Unprovable(f"a slice from the end ({b.const}) of the size {render_dim(size, str)}")
    if isinstance(size, Lin):
        return _slice_bound(an, b, size)
    if b == Lin.of(0):
        return b
    raise Unprovable(f"a slice bound {b.render(str)} of the clamped size {render_dim(size, str)}")


@handles("Slice")
def _slice(an: Analysis, n: OnnxNode, ins: list) -> list:
    v = ins[0]
    shape = list(shape_of(v))
    args = _slice_args(an, n, ins, len(shape))
    if isinstance(v, Elems) and any(not s.is_const or (e is not None and not e.is_const) for _, s, e, _ in args):
        # a size-dependent slice of a stored arange (position ids): slice it as an index grid
        return [slice_value(an, an.affine(v, "a small tensor sliced by a size"), args)]
    if isinstance(v, Elems):
        picked = objs(v)
        for a, s, e, st in args:
            where = slice_positions(v.shape[a], s.const, None if e is None else e.const, st)
            picked = np.take(picked, np.array(where, np.int64), axis=a)
        return [from_objs(v.dtype, picked)]
    return [slice_value(an, v, args)]


def slice_value(an: Analysis, v: AbstractValue, args: list[tuple[int, Lin, Lin | None, int]]) -> AbstractValue:
    """v[start:end] along each (axis, start, end or None for 'to the end', step) of args."""
    shape = list(shape_of(v))
    offsets: list[Dim] = [Lin.of(0)] * len(shape)
    for a, s, e, st in args:
        if st != 1:
            raise Unprovable("a slice with a step other than 1")
        size = shape[a]
        if s == Lin.of(0) and e is None:
            continue  # [0:] is the whole axis, whatever its size is (a clamped difference too)
        tail = _tail(an, s, e, size)
        if tail is not None:
            shape[a], offsets[a] = tail
            continue
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
            offsets[a] = s  # (not min(s, N): where s passes N the slice is empty, and any offset describes it)
            continue
        if isinstance(size, (Lin, Clamp)) and (_from_end(s) or (e is not None and _from_end(e)) or
                                               isinstance(size, Clamp)):
            piece = _piece_of_clamp(an, s, e, size) if isinstance(size, Clamp) else None
            if piece is not None:
                shape[a], offsets[a] = piece
                continue
            first = _clamped_bound(an, s, size)
            last = size if e is None else _clamped_bound(an, e, size)
            if isinstance(first, Lin) and isinstance(last, Lin):
                shape[a] = make_clamp(last - first, 0, None, an)
            elif first == Lin.of(0):
                shape[a] = last
            elif e is None or (s.is_const and e.is_const and e.const >= s.const):  # (so last >= first)
                shape[a] = Difference(last, first)
            else:
                raise Unprovable(f"a slice [{s.render(str)}:{e.render(str)}] that may be reversed")
            offsets[a] = first
            continue
        size_lin = as_lin(size, "a sliced size")
        start = _slice_bound(an, s, size_lin, start=True)
        shape[a] = _slice_length(an, start, e, size_lin)
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
        breaks = lin_breaks(v, "a band whose diagonals follow a clamped size, sliced at a size-dependent offset")
        return Band(v.dtype, new_shape, tuple(x - shift for x in breaks), v.values)
    if not all(isinstance(x, Lin) and x.is_const for x in v.breaks):
        raise Unprovable("a band whose diagonals move with the sizes, sliced at a clamped offset")
    return Band(v.dtype, new_shape, tuple(-shift + x.const for x in v.breaks), v.values)


def _tail(an: Analysis, s: Lin, e: Lin | None, size: Dim) -> tuple[Dim, Lin | Clamp] | None:
    """(length, offset) of [-S:] taken as [max(N - S, 0):], N the size, where the analysis allows it
    (`Analysis.tails`): exact for S >= 1 only (at S = 0 ONNX keeps all N), so it records S and the
    length for the mask's readers to prove S = 0 harmless (passes/tails.py; docs/masks.md)."""
    if an.tails is None or e is not None or s.is_const or not isinstance(size, Lin) or an.bounds(s)[1] > 0 \
            or an.nonneg(s):
        return None
    offset = make_clamp(size + s, 0, None, an)
    # (a Difference, even where min(S, N) or S would do: a size no other source makes and no later
    # step computes with, so the tail's axis is found in the mask's shape by it, or the proof fails)
    length = Difference(size, offset)
    if an.bounds(s)[1] == 0:  # (S >= 1 at every size: exact, nothing to prove)
        an.tails.append((-s, length, size))
    return length, offset


def _slice_length(an: Analysis, start: Lin, e: Lin | None, size: Lin) -> Lin | Clamp:
    """The length of [start:e] along an axis of `size`, start >= 0 (it may pass the end: the length is
    0 there). A constant end that may pass the end is clamped: min(e, N) - s = clamp(N - s, 0, e - s)."""
    if e is None or (e.is_const and e.const >= 0 and start.is_const and start.const <= e.const
                     and not an.nonneg(size - e)):
        hi = None if e is None else e.const - start.const
        return _not_one_row(make_clamp(size - start, 0, hi, an))
    end = _slice_bound(an, e, size)  # (within [0, N]: the length is max(e - s, 0) whether s passes N or not)
    return make_clamp(end - start, 0, None, an)


def _piece_of_clamp(an: Analysis, s: Lin, e: Lin | None, size: Clamp) -> tuple[Lin | Clamp, Lin] | None:
    """(length, offset) of [s:] or [:e] (constants) of an axis of clamped size (a stored buffer sliced
    by a size); None for other slices."""
    if e is None and s.is_const and s.const > 0:
        # it starts at s where it has rows; max(clamp(x, lo, hi) - s, 0) = clamp(x - s, max(lo - s, 0), max(hi - s, 0))
        low = 0 if size.lo is None else max(size.lo - s.const, 0)
        high = None if size.hi is None else max(size.hi - s.const, 0)
        return _not_one_row(make_clamp(size.inner - s.const, low, high, an)), s
    if s == Lin.of(0) and e is not None and e.is_const and e.const >= 0:
        # min(clamp(x, lo, hi), e) = clamp(x, min(lo, e), min(hi, e))
        low_e = None if size.lo is None else min(size.lo, e.const)
        high_e = e.const if size.hi is None else min(size.hi, e.const)
        return _not_one_row(make_clamp(size.inner, low_e, high_e, an)), s
    return None


def _not_one_row(d: Lin | Clamp) -> Lin | Clamp:
    """A clamped length of at most 1 (`[0:1]` of an S axis is min(S, 1)) is 1 at most sizes, where an
    application broadcasts it along the data: no band there, and no size shape inference calls 1."""
    if isinstance(d, Clamp) and d.hi is not None and d.hi <= 1:
        raise Unprovable(f"a slice of at most one row or column ({render_dim(d, str)}), which broadcasts")
    return d


@handles("Concat")
def _concat(an: Analysis, n: OnnxNode, ins: list) -> list:
    vs = [v for v in ins if v is not None]
    axis = int(attr(n, "axis", 0))
    if all(isinstance(v, Elems) for v in vs):
        rank = len(vs[0].shape)
        axis = axis_index(axis, rank)
        arrays = [objs(v) for v in vs]
        out = np.concatenate(arrays, axis=axis)
        return [from_objs(vs[0].dtype, out)]
    rank = len(shape_of(vs[0]))
    axis = axis_index(axis, rank)
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
    if any(isinstance(v, Band) and len(v.values) > 1 for v in vs) or any(is_piecewise(an, v) for v in vs):
        return [_concat_bands(an, [an.band_at(v, shape_of(v)) for v in vs], offsets, axis, tuple(shape))]
    return [_concat_grids(an, [an.affine(v, "a concatenated piece") for v in vs], offsets, axis, tuple(shape))]


def _rejoined(an: Analysis, n: OnnxNode, value_of: Callable[[Value | None], AbstractValue | None]
              ) -> AbstractValue | None:
    """A Concat of Slices of one tensor along the Concat's axis, [0:b1] [b1:b2] ... [bk:], is that tensor
    whatever the bounds: ONNX clamps equal bounds of one axis to one position, so the pieces meet. With
    more than two pieces the inner bounds must be constants of one sign in order (clamping keeps
    their order). None when the node is not such a Concat."""
    pieces = [p for p in (v.producer if v is not None else None for v in n.inputs)
              if isinstance(p, OnnxNode) and p.op_type == "Slice" and p.domain in ("", "ai.onnx") and len(p.inputs) >= 3]
    if len(pieces) < 2 or len(pieces) != len(n.inputs) or any(p.inputs[0] is not pieces[0].inputs[0] for p in pieces):
        return None
    try:
        v = value_of(pieces[0].inputs[0])
        if v is None:
            return None
        rank = len(shape_of(v))
        axis = axis_index(int(attr(n, "axis", 0)), rank)
        spans = []
        for p in pieces:
            args = _slice_args(an, p, [value_of(x) for x in p.inputs], rank)
            if len(args) != 1 or args[0][0] != axis or args[0][3] != 1:
                return None
            spans.append(args[0][1:3])
    except Unprovable:
        return None
    if spans[0][0] != Lin.of(0) or spans[-1][1] is not None:
        return None
    inner = [e for _, e in spans[:-1]]
    if any(e is None or e != s for e, (s, _) in zip(inner, spans[1:])):
        return None
    if len(inner) > 1:
        if not all(e is not None and e.is_const for e in inner):
            return None
        consts = [e.const for e in inner if e is not None]
        if consts != sorted(consts) or (min(consts) < 0 <= max(consts)):
            return None
    return v


REJOINS["Concat"] = _rejoined


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
    if int(attr(n, "batch_dims", 0)):
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
        diff = sub(an, idx.parts[-1], idx.parts[-2])
        assert isinstance(diff, Affine)
        r = len(out_shape)
        if r < 2 or any(diff.coef[:-2]) or diff.coef[-1] != 1 or diff.coef[-2] != -1:
            raise Unprovable("gathering a band at positions whose difference is not the result's diagonal")
        breaks = lin_breaks(data, "gathering a band whose diagonals follow a clamped size")
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
        if any(p.breaks != parts[0].breaks or not all(same_bits(a, b) for a, b in zip(p.values, parts[0].values))
               for p in parts):
            raise Unprovable("batch slices holding different bands")
        return Band(parts[0].dtype, shape, parts[0].breaks, parts[0].values)
    # columns: local x = d - offset; rows: local x = d + offset
    sign = -1 if axis == rank - 1 else 1
    for ref, (ref_part, ref_off) in enumerate(zip(parts, offsets)):
        # F(d) = f_ref(d + sign * ref_off)
        ref_breaks = lin_breaks(ref_part, "concatenated bands whose diagonals follow a clamped size")
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
    whole_breaks = lin_breaks(whole, "concatenated bands whose diagonals follow a clamped size")
    moved = Band(whole.dtype, piece.shape, tuple(x + shift for x in whole_breaks), whole.values)
    both = an.merge([piece, moved], lambda a, b: np.bool_(same_bits(a, b)), BOOL, piece.shape)
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
    axis = int(attr(n, "axis", 0))
    axis = axis_index(axis, len(shape))
    if len(ins) > 1 and ins[1] is not None:
        sizes = [as_lin(x, "a split size") for x in ints(an, ins[1], "split")]
    elif attr(n, "split") is not None:
        sizes = [Lin.of(x) for x in attr(n, "split")]
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
        out = np.split(objs(v), np.cumsum([x.const for x in sizes])[:-1], axis=axis)
        return [from_objs(v.dtype, p) for p in out]
    pieces, start = [], Lin.of(0)
    for size in sizes:
        pieces.append(slice_value(an, v, [(axis, start, start + size, 1)]))
        start = start + size
    return pieces
