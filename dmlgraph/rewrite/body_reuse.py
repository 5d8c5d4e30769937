"""Bodies that repeat up to their names lowered once: the lowering of one, renamed, is every other's.

Real models repeat If/Loop/Scan bodies (one per layer), so `nested` asks `key` for each body and
lowers one body per key as a *template*, names replaced by tokens; `Template.instance` renames it
for another body, or returns None and that body is lowered as usual. Why an instance is byte for
byte the body's own lowering, and where nothing is reused: docs/internals.md, rewrite/body_reuse.py.
"""
from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, cast

import numpy as np
import onnx

from dmlgraph.ir.graph import DmlNode, Graph, Node, ReservedNames, Value
from dmlgraph.rewrite import Match, PassResult
from dmlgraph.rewrite.engine import Replacement

ENABLED = True  # (tests compare the written models with reuse off)
_OPEN, _CLOSE = "\u2983", "\u2984"
_DIM = "unk__dmlgraph_c"
FRESH = "unk__dmlgraph_"  # `nested.body_types.FreshDims`
_TOKEN = re.compile(f"{_OPEN}\\d{{6}}{_CLOSE}|{_DIM}\\d{{6}}")
_ONNX_FRESH = re.compile(r"unk__\d+")
_MARKS = (_OPEN.encode(), _CLOSE.encode(), FRESH.encode())
_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS
TOKENS = 10 ** 6  # tokens have six digits: a body of more names or fresh dims is not reused
Written = tuple[onnx.GraphProto, "onnx.GraphProto | None"]  # a lowered body: as written, its portable form
SMALL = 4096  # elements: a borrowed constant keyed by its bytes (a larger one by its identity)


def _plain(s: str) -> bool:
    """Strings repr quotes as a token is quoted (so a reason renames to the body's own), free of
    tokens' characters."""
    return s.isprintable() and "'" not in s and "\\" not in s and _OPEN not in s and _CLOSE not in s and _DIM not in s


_NAME_TOKENS: list[str] = []
_DIM_TOKENS: list[str] = []


def _tokens(made: list[str], form: str, n: int) -> list[str]:
    """`made` holding at least `form.format(i)` for i < n (each token made once for all bodies)."""
    made += [form.format(i) for i in range(len(made), n)]
    return made


class Canonical:
    """A body's names and fresh dims as tokens, both ways."""

    def __init__(self, names: set[str], dims: set[str]) -> None:
        self.token = dict(zip(sorted(names), _tokens(_NAME_TOKENS, f"{_OPEN}{{:06d}}{_CLOSE}", len(names))))
        if dims:
            self.token.update(zip(sorted(dims), _tokens(_DIM_TOKENS, f"{_DIM}{{:06d}}", len(dims))))
        self.real = dict(zip(self.token.values(), self.token))

    def to_token(self, s: str) -> str:
        return self.token.get(s, s)

    def to_real(self, s: str) -> str:
        r = self.real.get(s)
        if r is not None:
            return r
        if _OPEN in s or _DIM in s:
            return _TOKEN.sub(lambda m: self.real[m.group()], s)
        return s

    def dims(self, shape: tuple | None) -> tuple | None:
        return None if shape is None else tuple(self.to_real(d) if isinstance(d, str) else d for d in shape)


def rename_graph(g: onnx.GraphProto, f: Callable[[str], str]) -> None:
    """Rename, in place, every name of a graph without bodies (its own, its nodes', its values')."""
    g.name = f(g.name)
    for n in g.node[:]:  # (`graph.free_names` says why [:])
        if n.name:
            n.name = f(n.name)
        for names in (n.input, n.output):
            for i, x in enumerate(names[:]):
                names[i] = f(x)
    for t in g.initializer[:]:
        t.name = f(t.name)
    for field in (g.input, g.output, g.value_info):
        for vi in field[:]:
            vi.name = f(vi.name)


def canonical_input(vi: onnx.ValueInfoProto, c: Canonical) -> onnx.ValueInfoProto:
    """A formal input under the template's names: its name and its symbolic dims as tokens."""
    new = onnx.ValueInfoProto()
    new.CopyFrom(vi)
    new.name = c.to_token(vi.name)
    if new.type.HasField("tensor_type"):
        for d in new.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                d.dim_param = c.to_token(d.dim_param)
    return new


def _input_dims(inputs: list[onnx.ValueInfoProto]) -> Iterator[str]:
    for vi in inputs:
        for d in vi.type.tensor_type.shape.dim[:]:
            if d.dim_param:
                yield d.dim_param


def _tensor_bytes(t: onnx.TensorProto, memo: dict) -> bytes:
    """A TensorProto serialized without its name (once per TensorProto: bodies share them)."""
    got = memo.get(id(t))
    if got is None:
        blank = onnx.TensorProto()
        blank.CopyFrom(t)
        blank.name = ""
        got = memo[id(t)] = (t, blank.SerializeToString())  # (t kept: its id stays its own)
    return got[1]


def _constant_key(const: Value | np.ndarray | DmlNode, c: Canonical, memo: dict) -> tuple:
    """What the rules can read of a borrowed enclosing constant."""
    if isinstance(const, DmlNode):
        value = np.asarray(const.value)
        return ("dml", c.to_token(const.name), const.elem_type, const.kind, value.dtype.str, value.tobytes(),
                const.begin, const.end, const.static_shape, const.exact, const.rule, const.outputs[0].elem_type)
    array = const if isinstance(const, np.ndarray) else const.array
    if isinstance(const, Value) and const.initializer is not None:
        t = const.initializer
        if const.static_shape is not None and math.prod(const.static_shape) <= SMALL \
                and t.data_location != onnx.TensorProto.EXTERNAL:
            return ("tensor", const.elem_type, const.shape, _tensor_bytes(t, memo))
    elif array is not None and array.size <= SMALL:
        return ("array", array.dtype.str, array.shape, np.ascontiguousarray(array).tobytes(),
                const.elem_type if isinstance(const, Value) else None)
    memo[id(const)] = const  # (its id stays its own while the key lives)
    return ("object", id(const))


def canonical_tensor(t: onnx.TensorProto, c: Canonical) -> onnx.TensorProto:
    new = onnx.TensorProto()
    new.CopyFrom(t)
    new.name = c.to_token(t.name)
    return new


def canonical_constant(const: Value | np.ndarray | DmlNode, c: Canonical) -> Value | np.ndarray | DmlNode:
    """A borrowed constant under the template's names (a TensorProto renamed: export writes its name)."""
    if isinstance(const, DmlNode):
        new = copy.copy(const)
        new.name = c.to_token(const.name)
        return new
    if isinstance(const, np.ndarray):
        return const
    v = Value(c.to_token(const.name), const.elem_type, const.shape)
    v.array, v.base_dir = const.array, const.base_dir
    if const.initializer is not None:
        v.initializer = canonical_tensor(const.initializer, c)
    return v


def key(proto: onnx.GraphProto, inputs: list[onnx.ValueInfoProto], constants: list[onnx.TensorProto],
        borrowed: dict, outer: frozenset[str], varying: dict[str, str], context: tuple,
        function_keys: set, memo: dict
        ) -> tuple[tuple, Canonical, onnx.GraphProto] | None:
    """The key of a body (`nested.bodies.BodySpec`'s fields, its varying set, `context`: the holder's op and
    attribute, the model's opsets), its names as tokens, and its proto in tokens; None where it may
    not be reused."""
    if not ENABLED or proto.sparse_initializer or proto.quantization_annotation:
        return None
    names = {proto.name}
    for n in proto.node[:]:  # (`graph.free_names` says why [:])
        for a in n.attribute[:]:
            if a.type == _GRAPH or a.type == _GRAPHS:
                return None
        if function_keys and (n.domain, n.op_type, n.overload) in function_keys:
            return None
        names.add(n.name)
        names.update(n.input[:])
        names.update(n.output[:])
    names.update([t.name for t in proto.initializer[:]])
    for field in (proto.input, proto.output, proto.value_info, inputs):
        if field:  # (a body's inputs and value_info are often empty: no generator for them)
            names.update([vi.name for vi in field[:]])
    names.update(const.name for const in borrowed.values() if isinstance(const, DmlNode))
    names.discard("")
    raw = proto.SerializeToString()
    given = list(_input_dims(inputs))
    dims = {d for d in given if d.startswith(FRESH)}
    if any(FRESH in d for d in given if d not in dims):  # (a model's own dim that holds one: not a token)
        return None
    if len(names) >= TOKENS or len(dims) >= TOKENS or any(m in raw for m in _MARKS) \
            or not _plain("".join(names)) or not _plain("".join(given)):
        return None
    c = Canonical(names, dims)
    cproto = onnx.GraphProto()
    cproto.CopyFrom(proto)
    rename_graph(cproto, c.to_token)
    k = (context, cproto.SerializeToString(),
         tuple((c.to_token(vi.name), (canonical_input(vi, c) if dims else vi).type.SerializeToString()) for vi in inputs),
         tuple((c.to_token(t.name), _tensor_bytes(t, memo)) for t in constants),
         tuple((c.to_token(name), _constant_key(const, c, memo)) for name, const in borrowed.items()),
         tuple(sorted(c.to_token(name) for name in outer)),
         tuple(sorted((c.to_token(name), what) for name, what in varying.items())))
    return k, c, cproto


class SeenValues(dict):
    """A graph's values that remember every name looked up in them."""

    def __init__(self, values: dict[str, Value], seen: set[str]) -> None:
        super().__init__(values)
        self.seen = seen

    def __contains__(self, name: object) -> bool:
        self.seen.add(name)  # type: ignore[arg-type]
        return dict.__contains__(self, name)

    def __getitem__(self, name: str) -> Value:
        self.seen.add(name)
        return dict.__getitem__(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        self.seen.add(name)
        return dict.get(self, name, default)


class AskedReserved:
    """A template's reserved names: the first body's scopes', asked in its names, every answer kept."""

    def __init__(self, c: Canonical, reserved: ReservedNames) -> None:
        self.c, self.reserved = c, reserved
        self.answers: dict[str, bool] = {}
        self.enclosed: dict[str, bool] = {}  # `encloses`' answers

    def __contains__(self, name: object) -> bool:
        assert isinstance(name, str)  # (graphs ask for names)
        answer = self.answers.get(name)
        if answer is None:
            answer = self.answers[name] = self.c.to_real(name) in self.reserved
        return answer

    def __ior__(self, names: set[str]) -> "AskedReserved":
        raise AssertionError("a template holds no bodies")

    def encloses(self, name: str) -> bool:
        """`nested.enclosing.EnclosingNames.encloses`, asked in the first body's names, every answer kept."""
        answer = self.enclosed.get(name)
        if answer is None:
            answer = self.enclosed[name] = _encloses(self.reserved, self.c.to_real(name))
        return answer


def _encloses(reserved: ReservedNames, name: str) -> bool:
    encloses = getattr(reserved, "encloses", None)
    return bool(encloses(name)) if encloses is not None else False


@dataclass
class Template:
    """One lowering in tokens: what it reported, the body it wrote (None: unchanged), what it asked."""

    result: PassResult
    explained: list[Match]
    lowered: list[bool]  # per applied match: its DML node stayed in the body
    written: tuple[onnx.GraphProto, onnx.GraphProto | None] | None  # (as written, its portable form)
    seen: set[str]  # every name the lowering tested, held or made
    reserved: dict[str, bool]
    enclosed: dict[str, bool]  # (`AskedReserved.encloses`)

    @staticmethod
    def lower(g: Graph, c: Canonical, run: Callable[[Graph], tuple[PassResult, list[Match], Written | None]]
              ) -> Template | None:
        seen = set(g.values)
        g.values = SeenValues(g.values, seen)
        asked = AskedReserved(c, g.reserved)
        g.reserved = asked
        result, explained, written = run(g)
        if g.sized_names:
            return None
        seen.update(g.values)
        lowered = [isinstance(m.dml, DmlNode) and m.dml.id in g.nodes for m in result.applied]
        return Template(result, explained, lowered, written, seen, asked.answers, asked.enclosed)

    def instance(self, c: Canonical, reserved: ReservedNames, scope: str
                 ) -> tuple[PassResult, list[Match], Written | None] | None:
        """The lowering renamed into the body of `c` (under `scope`), or None where that body's own
        lowering could choose other names."""
        real = {c.to_real(s) for s in self.seen}
        if len(real) != len(self.seen):
            return None
        if any((c.to_real(name) in reserved) != answer for name, answer in self.reserved.items()):
            return None
        if any(_encloses(reserved, c.to_real(name)) != answer for name, answer in self.enclosed.items()):
            return None
        r = _Renamed(c)
        applied = [r.match(m, {"scope": scope, "lowered": low}) for m, low in zip(self.result.applied, self.lowered)]
        declined = [r.match(m, {"scope": scope}) for m in self.result.declined]
        explained = [r.match(m, {"scope": scope}) for m in self.explained]
        written = None
        if self.written is not None:
            protos = []
            for proto in self.written:
                if proto is not None:
                    copied = onnx.GraphProto()
                    copied.CopyFrom(proto)
                    rename_graph(copied, c.to_real)
                    proto = copied
                protos.append(proto)
            written = (cast(onnx.GraphProto, protos[0]), protos[1])
        res = self.result
        return PassResult(res.changed, dict(res.counts), declined, applied, res.iterations), explained, written


def renamed_row(row: dict, c: Canonical) -> dict:
    """A mask census row of a template (in tokens) in the names of the body of `c`."""
    return {k: list(c.dims(tuple(v)) or ()) if k == "shape" and v is not None else c.to_real(v) if isinstance(v, str) else v
            for k, v in row.items()}


def has_invented_dims(g: Graph) -> bool:
    """Whether shape inference invented dims in `g` (numbered by the model it ran on)."""
    return any(isinstance(d, str) and _ONNX_FRESH.fullmatch(d) for v in g.values.values() for d in v.shape or ())


_SLOTS: dict[type, tuple[str, ...]] = {}


def _slots(cls: type) -> tuple[str, ...]:
    slots = _SLOTS.get(cls)
    if slots is None:
        slots = _SLOTS[cls] = tuple(a for c in cls.__mro__ for a in getattr(c, "__slots__", ()))
    return slots


class _Renamed:
    """Copies of a template's nodes and values in one body's names (each copied once)."""

    def __init__(self, c: Canonical) -> None:
        self.c = c
        self.nodes: dict[int, Node] = {}
        self.values: dict[int, Value] = {}

    def value(self, v: Value | None) -> Value | None:
        if v is None:
            return None
        new = self.values.get(id(v))
        if new is None:
            new = self.values[id(v)] = Value(self.c.to_real(v.name), v.elem_type, self.c.dims(v.shape))
            new.initializer, new.array, new.base_dir = v.initializer, v.array, v.base_dir
        return new

    def node(self, n: Node) -> Node:
        new = self.nodes.get(n.id)
        if new is None:
            cls = n.__class__
            new = self.nodes[n.id] = cls.__new__(cls)
            for slot in _slots(cls):
                setattr(new, slot, getattr(n, slot))
            new.id = next(Node._ids)
            new.name = self.c.to_real(n.name)
            new.inputs = [self.value(v) for v in n.inputs]
            new.outputs = [v for v in map(self.value, n.outputs) if v is not None]
        return new

    def match(self, m: Match, captures: dict) -> Match:
        dml = None if m.dml is None else self.node(m.dml)
        assert dml is None or isinstance(dml, DmlNode), "a DmlNode renames to a DmlNode"
        bounds = m.captures.get("bounds")  # (a mask's Begin/End as text: the KV-cache reports read them)
        if bounds is not None:
            captures = {"bounds": tuple(self.c.to_real(b) for b in bounds)} | captures
        rep = m.replacement  # (what it replaces, in the body's names: `costs.site_costs` reads it)
        renamed = None if rep is None else Replacement(
            replaces=[(cast(Value, self.value(old)), cast(Value, self.value(new))) for old, new in rep.replaces],
            exact=rep.exact, rule=rep.rule)
        return Match(m.rule, [self.node(n) for n in m.nodes], captures,
                     None if m.reason is None else self.c.to_real(m.reason), [self.c.to_real(i) for i in m.initializers],
                     renamed, dml=dml)
