"""Exact symbolic values for cones that depend on the graph inputs only through their shapes.

A mask is a band at every size only if each element is known as a function of the sizes; sampling
sizes proves nothing. So each value is carried as an exact expression (Lin, Elems, Affine, Band,
Opaque), proved for every dim in [0, max_dim]; what cannot be shown raises `Unprovable` naming
the node. The value kinds and what each operation checks: docs/internals.md, passes/symbolic.py.
"""
from __future__ import annotations

import ast
import functools
import math
from typing import Callable, Sequence, Union

import numpy as np

from dmlgraph.ir.frozen import Frozen

Symbol = str  # a dim's name: the dim_param the model (or shape inference) gives it
DIM_MAX = 2**31 - 1
INT64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
SMALL_ELEMENTS = 4096  # a constant this small is read element by element


class Unprovable(Exception):
    """The analysis cannot show what a value is at every size; the message says why."""


class NotAMask(Unprovable):
    """The cone computes something other than a mask (weights looked up by position, ...)."""


# ---- integer affine expressions of the dims ---------------------------------------------------
class Lin(Frozen):
    """const + sum(coef * symbol), exact Python integers; `terms` sorted, no zero coefficients."""

    terms: tuple[tuple[Symbol, int], ...]
    const: int

    def __init__(self, terms: tuple[tuple[Symbol, int], ...] = (), const: int = 0) -> None:
        self.__dict__.update(terms=terms, const=const)

    @staticmethod
    def of(c: int) -> "Lin":
        return Lin((), int(c))

    @staticmethod
    def sym(s: Symbol) -> "Lin":
        return Lin(((s, 1),), 0)

    @property
    def is_const(self) -> bool:
        return not self.terms

    def __add__(self, other: "Lin | int") -> "Lin":
        o = other if isinstance(other, Lin) else Lin.of(other)
        acc = dict(self.terms)
        for s, c in o.terms:
            acc[s] = acc.get(s, 0) + c
        return Lin(tuple(sorted((s, c) for s, c in acc.items() if c)), self.const + o.const)

    def __radd__(self, other: int) -> "Lin":
        return self + other  # sum() of Lins starts from 0

    def __neg__(self) -> "Lin":
        return self.scale(-1)

    def __sub__(self, other: "Lin | int") -> "Lin":
        return self + -(other if isinstance(other, Lin) else Lin.of(other))

    def scale(self, k: int) -> "Lin":
        if k == 0:
            return Lin.of(0)
        return Lin(tuple((s, c * k) for s, c in self.terms), self.const * k)

    def bounds(self, max_dim: int, lows: dict[Symbol, int] | None = None,
               highs: dict[Symbol, int] | None = None) -> tuple[int, int]:
        """The least and greatest value over every dim in [0, max_dim] (or [lows[dim], highs[dim]])."""
        lo = hi = self.const
        for s, c in self.terms:
            least = lows.get(s, 0) if lows else 0
            most = highs.get(s, max_dim) if highs else max_dim
            lo += min(c * least, c * most)
            hi += max(c * least, c * most)
        return lo, hi

    def substitute(self, s: Symbol, e: "Lin") -> "Lin":
        """self with symbol s replaced by e."""
        c = dict(self.terms).get(s, 0)
        if not c:
            return self
        return Lin(tuple(t for t in self.terms if t[0] != s), self.const) + e.scale(c)

    def divide(self, k: int) -> "Lin | None":
        """self / k when every coefficient divides exactly, else None."""
        if k == 0 or self.const % k or any(c % k for _, c in self.terms):
            return None
        return Lin(tuple((s, c // k) for s, c in self.terms), self.const // k)

    def symbolic_part(self) -> "Lin":
        return Lin(self.terms, 0)

    def render(self, names: Callable[[Symbol], str]) -> str:
        parts = []
        for s, c in self.terms:
            n = names(s)
            parts.append(n if c == 1 else f"-{n}" if c == -1 else f"{c}*{n}")
        if self.const or not parts:
            parts.append(str(self.const))
        text = " + ".join(parts)
        return text.replace("+ -", "- ")


class Clamp(Frozen):
    """min(max(inner, lo), hi): a size that a Range or a Slice clamps (lo/hi None = no clamp)."""

    inner: Lin
    lo: int | None
    hi: int | None

    def __init__(self, inner: Lin, lo: int | None = 0, hi: int | None = None) -> None:
        self.__dict__.update(inner=inner, lo=lo, hi=hi)

    def bounds(self, max_dim: int) -> tuple[int, int]:
        a, b = self.inner.bounds(max_dim)
        if self.lo is not None:
            a, b = max(a, self.lo), max(b, self.lo)
        if self.hi is not None:
            a, b = min(a, self.hi), min(b, self.hi)
        return a, b

    # A clamp moves and mirrors exactly: clamp(x, lo, hi) + c = clamp(x + c, lo + c, hi + c), and
    # -clamp(x, lo, hi) = clamp(-x, -hi, -lo). So a band's diagonal can follow a clamped offset.
    is_const = False

    @property
    def terms(self) -> tuple[tuple[Symbol, int], ...]:
        return self.inner.terms

    @property
    def const(self) -> int:
        return self.inner.const

    def __add__(self, c: int) -> "Clamp":
        assert isinstance(c, int), "only a constant moves a clamp"
        return Clamp(self.inner + c, None if self.lo is None else self.lo + c, None if self.hi is None else self.hi + c)

    def __sub__(self, c: int) -> "Clamp":
        return self + (-c)

    def __neg__(self) -> "Clamp":
        return Clamp(-self.inner, None if self.hi is None else -self.hi, None if self.lo is None else -self.lo)

    def symbolic_part(self) -> "Clamp":
        return self - self.inner.const

    def render(self, names: Callable[[Symbol], str]) -> str:
        return render_dim(self, names)


class Difference(Frozen):
    """a - b of two sizes, a >= b at every size (a slice's length between clamped bounds)."""

    a: "Lin | Clamp"
    b: "Lin | Clamp"

    def __init__(self, a: "Lin | Clamp", b: "Lin | Clamp") -> None:
        self.__dict__.update(a=a, b=b)

    def bounds(self, max_dim: int) -> tuple[int, int]:
        (a0, a1), (b0, b1) = self.a.bounds(max_dim), self.b.bounds(max_dim)
        return max(a0 - b1, 0), a1 - b0


Dim = Union[Lin, Clamp, Difference]  # a size: exact, clamped, or the difference of two


def make_clamp(inner: Lin, lo: int | None, hi: int | None, an: "Analysis") -> "Lin | Clamp":
    """The clamp, dropped where the range of `inner` makes it a no-op."""
    a, b = an.bounds(inner)
    if lo is not None and a >= lo:
        lo = None
    if hi is not None and b <= hi:
        hi = None
    if lo is not None and hi is not None and lo >= hi:
        return Lin.of(hi)  # min(max(x, lo), hi) with max(x, lo) >= lo >= hi
    if lo is None and hi is None:
        return inner
    if lo is not None and b <= lo:
        return Lin.of(lo)
    if hi is not None and a >= hi:
        return Lin.of(hi)
    return Clamp(inner, lo, hi)


def as_lin(d: object, what: str) -> Lin:
    if isinstance(d, Lin):
        return d
    text = render_dim(d, str) if isinstance(d, (Clamp, Difference)) else repr(d)
    raise Unprovable(f"{what} is a clamped size ({text}), which this analysis does not compute with")


# ---- abstract tensors -------------------------------------------------------------------------
class Opaque(Frozen):
    """A tensor whose data is unknown: only its shape may be read. `why` says what made its data
    unknown inside the cone (None for the cone's inputs), so a later use of the data can say so."""

    dtype: np.dtype
    shape: tuple[Dim, ...]
    why: str | None

    def __init__(self, dtype: np.dtype, shape: tuple[Dim, ...], why: str | None = None) -> None:
        self.__dict__.update(dtype=dtype, shape=shape, why=why)


class Elems(Frozen):
    """A small tensor of static shape with every element known: Lin for integers, else a numpy scalar."""

    dtype: np.dtype
    shape: tuple[int, ...]
    items: tuple

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...], items: tuple) -> None:
        self.__dict__.update(dtype=dtype, shape=shape, items=items)


class Affine(Frozen):
    """Element (i_0, ..., i_r-1) = sum(coef[a] * i_a) + base; integer-valued (ints or exact floats)."""

    dtype: np.dtype
    shape: tuple[Dim, ...]
    coef: tuple[int, ...]
    base: Lin

    def __init__(self, dtype: np.dtype, shape: tuple[Dim, ...], coef: tuple[int, ...], base: Lin) -> None:
        self.__dict__.update(dtype=dtype, shape=shape, coef=coef, base=base)


class Band(Frozen):
    """Element (..., i, j) = values[k] where breaks[k-1] <= j - i < breaks[k]; the same in every batch slice.

    `breaks` are strictly increasing at every size (proved when made); values are numpy scalars.
    Without breaks it is one value repeated, at any rank (a ConstantOfShape, a fill).
    """

    dtype: np.dtype
    shape: tuple[Dim, ...]
    breaks: tuple[Lin | Clamp, ...]  # (Clamp: a band sliced at a clamped offset)
    values: tuple

    def __init__(self, dtype: np.dtype, shape: tuple[Dim, ...], breaks: tuple[Lin | Clamp, ...], values: tuple) -> None:
        self.__dict__.update(dtype=dtype, shape=shape, breaks=breaks, values=values)


class Pieces(Frozen):
    """An integer-valued tensor that is a different index grid on each run of diagonals: pieces[k]
    holds where breaks[k-1] <= j - i < breaks[k]. Min/Max/Abs of grids whose difference runs along
    the diagonals make it (T5's -min(relative_position, 0); |j - i|), and a comparison of it with a
    bound is a band again."""

    dtype: np.dtype
    shape: tuple[Dim, ...]
    breaks: tuple[Lin, ...]
    pieces: tuple[Affine, ...]

    def __init__(self, dtype: np.dtype, shape: tuple[Dim, ...], breaks: tuple[Lin, ...], pieces: tuple[Affine, ...]) -> None:
        self.__dict__.update(dtype=dtype, shape=shape, breaks=breaks, pieces=pieces)


class Stack(Frozen):
    """Index grids stacked along a last axis of size len(parts): the index tuples GatherND reads
    (exporters build them as Concat of Unsqueeze(grid, -1)). Each part has the shape without it."""

    dtype: np.dtype
    shape: tuple[Dim, ...]
    parts: tuple[Affine, ...]

    def __init__(self, dtype: np.dtype, shape: tuple[Dim, ...], parts: tuple[Affine, ...]) -> None:
        self.__dict__.update(dtype=dtype, shape=shape, parts=parts)


AbstractValue = Union[Opaque, Elems, Affine, Band, Pieces, Stack]


def shape_of(v: AbstractValue) -> tuple[Dim, ...]:
    if isinstance(v, Elems):
        return tuple(Lin.of(d) for d in v.shape)
    return v.shape


# ---- the analysis -------------------------------------------------------------------------------
class Analysis:
    """The proofs over every size (`max_dim` bounds each dim) that the op semantics in
    `symbolic_ops` call, and the floor-division symbols one analysis of a cone introduced."""

    def __init__(self, max_dim: int = DIM_MAX):
        self.max_dim = max_dim
        self.derived: dict[Symbol, tuple[Lin, int]] = {}  # a symbol standing for e // k
        # rows [-S:] taken as [max(N - S, 0):], (S, their length, N): true where S >= 1 only, so an
        # application must prove S = 0 harmless (passes/tails.py); None: declined as before
        self.tails: list[tuple[Lin, Dim, Lin]] | None = None

    def floor_div(self, e: Lin, k: int) -> Symbol:
        """A new symbol q for e // k (e >= 0, k > 0). When e is one size n (+ c), bounds read n as
        k*q + r - c with r in [0, k-1], which relates q to n (n - q >= 0 for k >= 2); otherwise q is
        a size of its own in [0, max_dim]. Either way a proof covers every real size, and more."""
        name = f"({e.render(str)}) // {k}"
        self.derived[name] = (e, k)
        return name

    def bounds(self, e: Lin, lows: dict[Symbol, int] | None = None) -> tuple[int, int]:
        """The range of e over every size, with what floor divisions tell about the sizes they divide."""
        highs: dict[Symbol, int] = {}
        for q, (d, k) in self.derived.items():
            if len(d.terms) == 1 and d.terms[0][1] == 1 and d.terms[0][0] in dict(e.terms):
                n = d.terms[0][0]
                r = f"{q} remainder"
                e = e.substitute(n, Lin.sym(q).scale(k) + Lin.sym(r) - d.const)
                highs[r] = k - 1
        return e.bounds(self.max_dim, lows, highs)

    # -- proofs over the box --
    def sign(self, e: Lin) -> int | None:
        """-1, 0 or 1 when e has that sign at every size; None when it depends on the sizes."""
        lo, hi = self.bounds(e)
        if lo > 0:
            return 1
        if hi < 0:
            return -1
        if lo == hi == 0:
            return 0
        return None

    def nonneg(self, e: Lin) -> bool:
        """e >= 0 at every size."""
        return self.bounds(e)[0] >= 0

    def upper(self, d: Dim) -> int:
        return d.bounds(self.max_dim)[1]

    def dims_equal(self, a: Dim, b: Dim) -> bool:
        if a == b:
            return True
        return isinstance(a, Lin) and isinstance(b, Lin) and self.sign(a - b) == 0

    def fits(self, lo: float, hi: float, dtype: np.dtype) -> bool:
        """Every integer in [lo, hi] is held exactly by dtype."""
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return info.min <= lo and hi <= info.max
        if dtype.kind == "f":
            limit = 2 ** (np.finfo(dtype).nmant + 1)
            return -limit <= lo and hi <= limit
        return False

    def affine_bounds(self, a: Affine) -> tuple[int, int]:
        lo, hi = self.bounds(a.base)
        for c, d in zip(a.coef, a.shape):
            if c:
                top = max(self.upper(d) - 1, 0)
                lo += min(0, c * top)
                hi += max(0, c * top)
        return lo, hi

    def check_fits(self, a: Affine, what: str) -> Affine:
        lo, hi = self.affine_bounds(a)
        if not self.fits(lo, hi, a.dtype):
            raise Unprovable(f"{what} ranges over [{lo}, {hi}] for sizes up to {self.max_dim}, which "
                             f"{a.dtype} does not hold exactly")
        return a

    def order(self, a: "Lin | Clamp", b: "Lin | Clamp") -> int:
        """-1 if a < b, 0 if a == b, 1 if a > b at every size; Unprovable otherwise."""
        if a == b:
            return 0
        if not isinstance(a, Lin) or not isinstance(b, Lin):
            raise Unprovable(f"ordering the clamped bounds {render_dim(a, str)} and {render_dim(b, str)}")
        s = self.sign(a - b)
        if s is None:
            raise Unprovable(f"whether {a.render(_plain)} < {b.render(_plain)} depends on the sizes")
        return s

    # -- broadcasting --
    def broadcast(self, *shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
        rank = max(len(s) for s in shapes)
        out: list[Dim] = []
        for axis in range(rank):
            pairs = [(s[k], s[k + 1] if k + 1 < len(s) else None) for s in shapes if (k := axis - rank + len(s)) >= 0]
            pick: Dim = Lin.of(1)
            pick_next: Dim | None = None
            for d, d_next in pairs:
                if d == Lin.of(1):
                    continue
                if pick == Lin.of(1):
                    pick, pick_next = d, d_next
                elif _equal_where_it_runs(pick, d) or _equal_where_it_runs(d, pick):
                    pick = pick if isinstance(pick, Clamp) else d
                elif self.rows_equal_where_it_runs((pick, pick_next), (d, d_next)) or \
                        self.rows_equal_where_it_runs((d, d_next), (pick, pick_next)):
                    pick = pick if isinstance(pick, Difference) else d
                elif not self.dims_equal(pick, d):
                    raise Unprovable(f"broadcasting {_show(pick)} with {_show(d)}: the sizes are not provably "
                                     "equal (nor one of them 1)")
            out.append(pick)
        return tuple(out)

    def rows_equal_where_it_runs(self, a: tuple[Dim, Dim | None], b: tuple[Dim, Dim | None]) -> bool:
        """a = (min(X, N) - min(P, N), min(X, N)), a stored buffer's rows [P:X] and columns [:X], and
        b = (X - P, X), N >= 2: where X > N the columns are N against X > N, neither 1, so the
        broadcast fails; where X <= N, P <= X too and the rows are X - P. So the rows are one size
        wherever it runs, which the rows alone do not show (docs/masks.md)."""
        (rows, cols), (size, x) = a, b
        if not (isinstance(rows, Difference) and isinstance(cols, Clamp) and rows.a == cols and isinstance(size, Lin)
                and isinstance(x, Lin) and cols.inner == x and cols.hi is not None and cols.hi >= 2
                and (cols.lo is None or cols.lo <= 0)):
            return False
        n, start = cols.hi, rows.b
        if isinstance(start, Clamp):
            if start.hi != n or (start.lo is not None and (start.lo > 0 or not self.nonneg(start.inner - start.lo))):
                return False
            start = start.inner
        elif not (isinstance(start, Lin) and self.nonneg(Lin.of(n) - start)):
            return False
        return self.sign(x - start - size) == 0

    def expand_affine(self, a: Affine, shape: tuple[Dim, ...]) -> Affine:
        """`a` viewed at a broadcast shape: new axes and broadcast axes get coefficient 0."""
        pad = len(shape) - len(a.shape)
        coef = (0,) * pad + a.coef
        coef = tuple(0 if (i >= pad and a.shape[i - pad] == Lin.of(1)) else c for i, c in enumerate(coef))
        return Affine(a.dtype, shape, coef, a.base)

    def band_at(self, v: AbstractValue, shape: tuple[Dim, ...]) -> Band:
        """v as a Band of `shape` (a uniform value is a Band without breaks)."""
        if isinstance(v, Band):
            if len(shape) - len(v.shape) < 0:
                raise Unprovable("a band broadcast to a lower rank")
            lead = shape[len(shape) - len(v.shape):][-2:]
            own = v.shape[-2:]
            for d_own, d in zip(own, lead):
                if d_own == Lin.of(1) and d != Lin.of(1):
                    raise Unprovable("a band with a size-1 row or column axis broadcast along it is not a band")
            return Band(v.dtype, shape, v.breaks, v.values)
        u = self.uniform(v)
        if u is None:
            raise Unprovable(f"a tensor that varies along an index ({type(v).__name__}) where a band or one value "
                             "was expected")
        return Band(u.dtype, shape, (), (u,))

    def uniform(self, v: AbstractValue | None) -> np.generic | None:
        """The one value every element holds, as a numpy scalar of v's dtype (None if it varies)."""
        if isinstance(v, Band):
            return v.values[0] if len(v.values) == 1 else None
        if isinstance(v, Affine):
            if any(v.coef) or not v.base.is_const:
                return None
            return as_scalar(v.base.const, v.dtype)
        if isinstance(v, Elems):
            if not v.items:
                return None
            first = v.items[0]
            if all(same_bits(first, x) for x in v.items[1:]):
                if isinstance(first, Lin):
                    return as_scalar(first.const, v.dtype) if first.is_const else None
                return None if isinstance(first, (Clamp, Difference)) else first
        return None

    def affine(self, v: AbstractValue, what: str) -> Affine:
        """v as an Affine (an index grid); Unprovable if it is not one."""
        if isinstance(v, Affine):
            return v
        if isinstance(v, Elems) and v.dtype.kind in "iuf" and len(v.items) == 1:
            item = v.items[0]
            base = item if isinstance(item, Lin) else int_of(item)
            if base is None:
                raise Unprovable(f"{what} is a non-integer value")
            return Affine(v.dtype, tuple(Lin.of(d) for d in v.shape), (0,) * len(v.shape), base)
        long_axes = [a for a, d in enumerate(v.shape) if d != 1] if isinstance(v, Elems) else []
        if isinstance(v, Elems) and v.dtype.kind in "iuf" and len(long_axes) == 1:
            # [c, c + s, c + 2s, ...] along one axis: an arithmetic progression is an index grid
            items = [x if isinstance(x, Lin) else int_of(x) for x in v.items]
            if all(isinstance(x, Lin) and x.is_const for x in items):
                step = items[1].const - items[0].const  # type: ignore[union-attr]
                if all(items[k].const == items[0].const + k * step for k in range(len(items))):  # type: ignore[union-attr]
                    coef = tuple(step if a == long_axes[0] else 0 for a in range(len(v.shape)))
                    return Affine(v.dtype, tuple(Lin.of(d) for d in v.shape), coef, items[0])  # type: ignore[arg-type]
        u = self.uniform(v)
        if u is not None and u.dtype.kind in "iuf":
            base = int_of(u)
            if base is not None:
                return Affine(v.dtype, shape_of(v), (0,) * len(shape_of(v)), base)
        raise Unprovable(f"{what} is not an index grid ({type(v).__name__})")

    # -- piecewise bands --
    def merge(self, parts: Sequence[Band], fn: Callable[..., object], dtype: np.dtype,
              shape: tuple[Dim, ...]) -> Band:
        """fn applied piece by piece to bands on the same diagonals (their breakpoints merged)."""
        breaks: list[Lin | Clamp] = []
        for b in parts:
            for x in b.breaks:
                if not any(self.order(x, y) == 0 for y in breaks):
                    breaks.append(x)
        breaks = _sorted(breaks, self.order)
        values = []
        for k in range(len(breaks) + 1):
            probe = breaks[k - 1] if k > 0 else None  # a point inside piece k: its first diagonal
            args = [p.values[self.piece(p, probe, k == 0)] for p in parts]
            values.append(as_scalar(fn(*args), dtype))
        return self.simplify(Band(dtype, shape, tuple(breaks), tuple(values)))

    def piece(self, b: Band, at: "Lin | Clamp | None", leftmost: bool) -> int:
        """Which piece of b holds diagonal `at` (the leftmost piece when `leftmost`)."""
        if leftmost:
            return 0
        assert at is not None
        k = 0
        for x in b.breaks:
            if self.order(x, at) <= 0:
                k += 1
        return k

    @staticmethod
    def simplify(b: Band) -> Band:
        breaks, values = [], [b.values[0]]
        for x, v in zip(b.breaks, b.values[1:]):
            if same_bits(v, values[-1]):
                continue
            breaks.append(x)
            values.append(v)
        return Band(b.dtype, b.shape, tuple(breaks), tuple(values))

    def compare(self, diff: Affine, op: str, what: str) -> Band:
        """The boolean `diff OP 0` (OP one of <, <=, >, >=, ==) as a Band, or a uniform bool."""
        rank = len(diff.shape)
        lead = diff.coef[:-2] if rank >= 2 else diff.coef
        if any(lead):
            raise Unprovable(f"{what} compares a batch index, not a diagonal")
        ci, cj = (diff.coef[-2], diff.coef[-1]) if rank >= 2 else (0, diff.coef[-1] if rank else 0)
        base = diff.base
        if ci != -cj or (ci == 0 and cj == 0):
            # Sizes, or one index against a bound: a band only if it holds everywhere or nowhere. The
            # comparison is linear in the index, so its extremes are at the corners of the index box:
            # it is decided by the range over all four (== is never true only where no value is 0,
            # which corners on both sides of 0 do not show)
            corners = [self._corner_bounds(diff, ci, cj, corner) for corner in range(4)]
            verdict = _decide((min(lo for lo, _ in corners), max(hi for _, hi in corners)), op)
            if verdict is not None:
                return _bool_const(verdict, diff.shape)
            if ci == 0 and cj == 0:
                raise Unprovable(f"{what} compares sizes whose order depends on the sizes")
            if not (ci == 0 and rank >= 2 and diff.shape[-2] == Lin.of(1)):
                raise Unprovable(f"{what} compares a row or column index with a bound, not a diagonal")
            ci = -cj  # one row (a decode step's query): its index is 0, so a column is its diagonal j - i
        # diff = a * (j - i) + base, a = cj
        a = cj
        if a < 0:
            a, base, op = -a, -base, FLIP[op]
        # a * d + base OP 0  <=>  d OP' t
        if op == "==":
            t = (-base).divide(a)
            if t is None:
                if base.is_const:
                    return _bool_const(False, diff.shape)
                raise Unprovable(f"{what}: {a} * (j - i) == {(-base).render(_plain)} needs an exact division")
            return Band(BOOL, diff.shape, (t, t + 1), (np.bool_(False), np.bool_(True), np.bool_(False)))
        # strict forms: d < x  (values True below x), d >= x (True from x)
        if op in ("<", "<="):
            # a*d + base < 0  <=> d < -base/a  <=> d < ceil(-base / a)
            # a*d + base <= 0 <=> d <= floor(-base / a) <=> d < floor(-base/a) + 1
            x = self._div_bound(-base, a, ceil=(op == "<"))
            x = x if op == "<" else x + 1
            return Band(BOOL, diff.shape, (x,), (np.bool_(True), np.bool_(False)))
        # a*d + base > 0 <=> d > -base/a <=> d >= floor(-base/a) + 1 ; >= 0 <=> d >= ceil(-base/a)
        x = self._div_bound(-base, a, ceil=(op == ">="))
        x = x if op == ">=" else x + 1
        return Band(BOOL, diff.shape, (x,), (np.bool_(False), np.bool_(True)))

    def _div_bound(self, e: Lin, a: int, ceil: bool) -> Lin:
        if a == 1:
            return e
        q = e.divide(a)
        if q is not None:
            return q
        if e.is_const:
            return Lin.of(-((-e.const) // a) if ceil else e.const // a)
        raise Unprovable(f"a diagonal bound {e.render(_plain)} / {a} is not an integer expression")

    def _corner_bounds(self, diff: Affine, ci: int, cj: int, corner: int) -> tuple[int, int]:
        """The range of diff at one corner of the index box (i, j each at 0 or size - 1), at every size
        where that corner exists (a size `n + k` has a last index only when n >= 1 - k)."""
        e = diff.base
        rank = len(diff.shape)
        lows: dict[Symbol, int] = {}
        for c, axis, at_end in ((ci, rank - 2, corner & 1), (cj, rank - 1, corner & 2)):
            if c and at_end:
                size = as_lin(diff.shape[axis], "an index bound")
                e = e + (size - 1).scale(c)
                if len(size.terms) == 1 and size.terms[0][1] == 1:
                    lows[size.terms[0][0]] = max(lows.get(size.terms[0][0], 0), 1 - size.const)
        return self.bounds(e, lows)

# ---- helpers -------------------------------------------------------------------------------------
def _equal_where_it_runs(a: Dim, b: Dim) -> bool:
    """a = min(x, hi) (hi >= 2, no lower clamp above 0) and b = x: where they differ, x > hi >= 2, so
    neither is 1 and the broadcast fails; wherever it runs they are one size (docs/masks.md)."""
    return isinstance(a, Clamp) and isinstance(b, Lin) and a.inner == b and a.hi is not None and a.hi >= 2 \
        and (a.lo is None or a.lo <= 0)


FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "=="}


def _decide(bounds: tuple[int, int], op: str) -> bool | None:
    """Whether `x OP 0` holds for every x in [lo, hi] (True), for none (False), or varies (None)."""
    lo, hi = bounds
    every = {"<": hi < 0, "<=": hi <= 0, ">": lo > 0, ">=": lo >= 0, "==": lo == hi == 0}[op]
    never = {"<": lo >= 0, "<=": lo > 0, ">": hi <= 0, ">=": hi < 0, "==": hi < 0 or lo > 0}[op]
    return True if every else False if never else None


def _bool_const(b: bool, shape: tuple[Dim, ...]) -> Band:
    return Band(BOOL, shape, (), (np.bool_(b),))


def _plain(s: Symbol) -> str:
    return s


def parse_dim(text: str) -> Lin:
    """A dim_param as an integer affine expression of names (`past + seq`, `2*n - 1`); a name that is
    not such an expression is one symbol of its own."""
    try:
        tree = ast.parse(text, mode="eval").body
        return _lin_of_ast(tree)
    except (SyntaxError, ValueError, RecursionError):
        return Lin.sym(text)


def _lin_of_ast(t: ast.AST) -> Lin:
    if isinstance(t, ast.Name):
        return Lin.sym(t.id)
    if isinstance(t, ast.Constant) and type(t.value) is int:
        return Lin.of(t.value)
    if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.USub):
        return -_lin_of_ast(t.operand)
    if isinstance(t, ast.BinOp) and isinstance(t.op, (ast.Add, ast.Sub)):
        a, b = _lin_of_ast(t.left), _lin_of_ast(t.right)
        return a + b if isinstance(t.op, ast.Add) else a - b
    if isinstance(t, ast.BinOp) and isinstance(t.op, ast.Mult):
        a, b = _lin_of_ast(t.left), _lin_of_ast(t.right)
        if a.is_const:
            return b.scale(a.const)
        if b.is_const:
            return a.scale(b.const)
    raise ValueError("not an affine expression")


def render_dim(d: Dim, names: Callable[[Symbol], str]) -> str:
    """A size as text: `sequence`, `past + 1`, `min(sequence, 64)`."""
    if isinstance(d, Lin):
        return d.render(names)
    if isinstance(d, Difference):
        return f"{render_dim(d.a, names)} - {render_dim(d.b, names)}"
    text = d.inner.render(names)
    if d.lo is not None:
        text = f"max({text}, {d.lo})"
    if d.hi is not None:
        text = f"min({text}, {d.hi})"
    return text


def _show(d: Dim) -> str:
    return render_dim(d, _plain)


def as_scalar(x: object, dtype: np.dtype) -> np.generic:
    if isinstance(x, Lin):
        if not x.is_const:
            raise Unprovable("a size-dependent value where a constant was needed")
        x = x.const
    if isinstance(x, np.generic) and x.dtype == dtype:
        return x
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dtype).reshape(-1)[0]


def same_bits(a: object, b: object) -> bool:
    """Equal, bit for bit for numpy scalars (so -0.0 and NaN payloads are kept apart)."""
    if isinstance(a, np.generic) and isinstance(b, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return a == b


def int_of(x: object) -> Lin | None:
    """An integer-valued scalar as a constant Lin (None for a fraction, inf or NaN)."""
    if isinstance(x, Lin):
        return x
    f = np.asarray(x)
    if f.dtype.kind == "b":
        return Lin.of(int(f))
    if f.dtype.kind in "iu":
        return Lin.of(int(f))
    if f.dtype.kind == "f" and np.isfinite(f) and float(f) == math.floor(float(f)):
        return Lin.of(int(f))
    return None


def _sorted(xs: "list[Lin | Clamp]", order: "Callable[[Lin | Clamp, Lin | Clamp], int]") -> "list[Lin | Clamp]":
    return sorted(xs, key=functools.cmp_to_key(order))




# ---- the DIAGONAL_MATRIX1 fill a band is -----------------------------------------------------------
class SizedFill(Frozen):
    """One DIAGONAL_MATRIX1 fill whose sizes, and bounds, may be expressions of the dims.

    The bounds are `begin + shift` and `end + shift` (None: unbounded, never shifted): DML compiles
    an operator at fixed sizes, so `shift` is computed from the shapes at run time and added when the
    node is bound (a KV-cache causal mask: end 1, shift past).
    """

    dtype: np.dtype
    shape: tuple[Dim, ...]
    begin: int | None
    end: int | None
    shift: "Lin | Clamp"
    value: np.generic
    other: np.generic
    derived: tuple[tuple[Symbol, Lin, int], ...]  # symbols standing for e // k, as (name, e, k)

    def __init__(self, dtype: np.dtype, shape: tuple[Dim, ...], begin: int | None, end: int | None,
                 shift: "Lin | Clamp", value: np.generic, other: np.generic,
                 derived: tuple[tuple[Symbol, Lin, int], ...] = ()) -> None:
        self.__dict__.update(dtype=dtype, shape=shape, begin=begin, end=end, shift=shift, value=value, other=other,
                             derived=derived)

    def sizes(self) -> list[Lin]:
        """Every affine expression the node reads at run time, in its dims and its shift."""
        def lins(d: Dim) -> list[Lin]:
            return lins(d.a) + lins(d.b) if isinstance(d, Difference) else [d.inner if isinstance(d, Clamp) else d]
        return [e for d in [*self.shape, self.shift] for e in lins(d)]

    def bound_text(self, names: Callable[[Symbol], str]) -> tuple[str, str]:
        """Begin and End as text in the dims' names (MIN / MAX when unbounded)."""
        def text(b: int | None, unbounded: str) -> str:
            return unbounded if b is None else (self.shift + b).render(names)
        return text(self.begin, "MIN"), text(self.end, "MAX")


def _is_plus_zero(x: np.generic) -> bool:
    return not np.asarray(x).tobytes().strip(b"\0")


def sized_fill(b: Band, derived: dict[Symbol, tuple[Lin, int]] | None = None) -> SizedFill | str:
    """b as one DIAGONAL_MATRIX1 fill (preferring the form whose else-value is +0, which needs no
    input), or the reason it is not one."""
    v, x = b.values, b.breaks
    if len(v) == 2:  # v0 on (-inf, x0), v1 on [x0, inf)
        forms = [(None, x[0], v[0], v[1]), (x[0], None, v[1], v[0])]
    elif len(v) == 3 and same_bits(v[0], v[2]):  # v1 on [x0, x1), v0 outside (an inverted range)
        forms = [(x[0], x[1], v[1], v[0]), (x[1], x[0], v[0], v[1])]
    else:
        return (f"it takes {len(v)} runs of values along the diagonals "
                f"({', '.join(str(a) for a in v)}): more than one DIAGONAL_MATRIX1 fill")
    begin, end, value, other = next((f for f in forms if _is_plus_zero(f[3])), forms[0])
    moving = {e.symbolic_part() for e in (begin, end) if e is not None}
    if len(moving) > 1:
        return "its Begin and End move with different sizes (one run-time shift cannot carry both)"
    shift = moving.pop() if moving else Lin.of(0)
    return SizedFill(b.dtype, b.shape, None if begin is None else begin.const, None if end is None else end.const,
                     shift, value, other, tuple((n, e, k) for n, (e, k) in (derived or {}).items()))
