"""onnx's shape inference, made safe to run on any model, and run beside the import where it can.

Data propagation is linear in the length of every 1-D value, so a long vector can hang it: it is
skipped when the plain pass finds one, and big models infer in a capped, timed child process. The
result is what `onnx.shape_inference.infer_shapes` returns, or the plain pass's; inference helps,
it never refuses a model. The guards and the paths in detail: docs/internals.md, io/shape_inference.py.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import re
import select
import signal
import struct
import sys
import time
import warnings
from collections.abc import Callable, Iterable

import onnx
from onnx.onnx_cpp2py_export import shape_inference as _cpp

from dmlgraph.errors import ModelError
from dmlgraph.io import inference_scopes
from dmlgraph.io.modelfile import copy_fields, iter_graphs, without_weights
from dmlgraph.process import address_space_headroom, policy
from dmlgraph.process import interrupts_deferred as _interrupts_deferred

MAX_DATA_PROP_LENGTH = 1 << 18  # dims data propagation may make of one value (tens of milliseconds)
CHILD_MEMORY = 2 << 30  # bytes of address space data propagation may add (in the child, or in-process)
CHILD_SECONDS = 10.0  # data propagation's deadline: this, or 20x the time to the plain pass if longer
USE_CHILD = sys.platform.startswith("linux") and hasattr(os, "fork")  # (macOS: fork without exec is unsafe)


def infer_shapes(model: onnx.ModelProto, check_types: bool = False) -> onnx.ModelProto:
    """`model` (a copy of it) with every shape onnx can infer, in-process (for small models; the
    import uses `start`). `check_types`: a node input whose type its op does not accept raises
    ModelError (see `_plain`)."""
    data = without_weights(model, keep_dims=True).SerializeToString()
    plain = _plain(data) if check_types else _run(data, data_prop=False)
    if plain is None:
        return onnx.ModelProto.FromString(data)
    if _long_vector(plain):
        return plain
    with _in_process_cap():
        return _run(data, data_prop=True) or plain


ValueType = tuple[str, "int | None", "tuple | None"]  # name, element type, shape (None: unknown)
TypeShape = tuple["int | None", "tuple[int | str | None, ...] | None"]  # element type, shape (None: unknown)
Send = Callable[[bytes, bytes], None]  # a child's answer: kind, payload


_INVENTED = re.compile(r"unk__\d+")  # the dims ONNX shape inference makes up


def value_types(model: onnx.ModelProto) -> list[ValueType]:
    """What `model`'s main graph's value_info says about each value, and what inference found for
    its outputs: a body's output may be declared without a shape (an If branch's usually is), which
    inference fills in; the importer still lets a declared shape win."""
    cache: dict[bytes, TypeShape] = {}
    mg = model.graph
    found = [(vi.name, *type_shape(vi.type, cache)) for vi in mg.value_info]
    for vi in mg.output:  # (a dim inference invents is left unknown: its number depends on the model)
        et, shape = type_shape(vi.type, cache)
        found.append((vi.name, et, None if shape is None else
                      tuple(None if isinstance(d, str) and _INVENTED.fullmatch(d) else d for d in shape)))
    return found


def type_shape(tp: onnx.TypeProto, cache: dict[bytes, TypeShape] | None = None) -> TypeShape:
    """(element type, shape) of a TypeProto; None where unknown. `cache`: decoded types by their
    bytes (the values of a model share a few types)."""
    key = tp.SerializeToString() if cache is not None else None
    if cache is not None and key is not None and key in cache:
        return cache[key]
    decoded: TypeShape
    if not tp.HasField("tensor_type"):
        decoded = None, None
    elif not tp.tensor_type.HasField("shape"):
        decoded = tp.tensor_type.elem_type or None, None
    else:
        tt = tp.tensor_type
        decoded = tt.elem_type or None, tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                              for d in tt.shape.dim)
    if cache is not None and key is not None:
        cache[key] = decoded
    return decoded


def _in_process_cap() -> contextlib.AbstractContextManager:
    """Data propagation in-process: under the child's address-space cap where the process owner
    allows caps (`dmlgraph.process.process_wide`), else uncapped."""
    return address_space_headroom(CHILD_MEMORY) if policy().memory_caps else contextlib.nullcontext()


def whole_value_types(model: onnx.ModelProto, scope: bool = True) -> list[ValueType] | None:
    """`value_types(infer_shapes(model, check_types=True))` when every pass ran on the whole model
    (no error, no value over the data-propagation limit), else None: a model made of independent
    parts (`nested`'s bodies) then gets each part's types from the part alone. (`scope`: see `_Target`.)"""
    target = _Target(model, scope)
    try:
        plain = onnx.ModelProto.FromString(_cpp.infer_shapes(target.data, True, False, False))
        if target.long_vector(plain):
            return None
        return value_types(onnx.ModelProto.FromString(_cpp.infer_shapes(target.data, False, False, True)))
    except _CannotTell:
        return whole_value_types(model, scope=False)
    except Exception:  # noqa: BLE001 - inference errors of every kind
        return None


def inferred_value_types(model: onnx.ModelProto, scope: bool = True) -> list[ValueType]:
    """`value_types(infer_shapes(model, check_types=True))`, with each If in a scope of its own
    where that pays (`_Target`)."""
    target = _Target(model, scope)
    plain = _plain(target.data)
    if plain is None:
        return value_types(onnx.ModelProto.FromString(target.data))
    if _long_vector(plain):
        return value_types(plain)
    with _in_process_cap():
        propagated = _run(target.data, data_prop=True)
    try:
        return target.choose(plain, propagated)
    except _CannotTell:
        return inferred_value_types(model, scope=False)


def axis_shapes(model: onnx.ModelProto, names: frozenset[str]) -> dict[str, tuple | None]:
    """Each value's inferred shape when every graph-input axis declared by one of `names` is a
    size of its own (`name@input:axis`): equal dims there are proved, not claimed (issue 26)."""
    view = without_weights(model, keep_dims=True)
    if view is model:  # (a model without big weights comes back as is: it is edited below)
        view = onnx.ModelProto()
        view.CopyFrom(model)
    _read_through(view.graph, _identity_aliases(view.graph))
    del view.graph.value_info[:]  # (an exporter's annotations carry the names too: inferred from the inputs alone)
    for vi in view.graph.output:
        vi.type.tensor_type.ClearField("shape")
    stored = {t.name for t in view.graph.initializer}
    for vi in view.graph.input:
        for a, d in enumerate(vi.type.tensor_type.shape.dim if vi.name not in stored else ()):
            if d.dim_param and any(t in names for t in d.dim_param.split(" + ")):
                d.dim_param = f"{d.dim_param}@{vi.name}:{a}"
    inferred = infer_shapes(view)
    cache: dict[bytes, TypeShape] = {}
    found = {vi.name: type_shape(vi.type, cache)[1] for vi in inferred.graph.input}
    found.update((name, shape) for name, _, shape in value_types(inferred))
    return found


def children_available() -> bool:
    """The child pays where the process can fork and has a second CPU for it: on one CPU it costs
    more than it saves (measured: 20-21k nodes/s instead of 23-24k in-process on the bench model).
    Only where the process owner allowed children (`dmlgraph.process.process_wide`)."""
    return USE_CHILD and policy().children and len(os.sched_getaffinity(0)) > 1


def start(model: onnx.ModelProto) -> "PendingShapes":
    """Begin inferring `model`'s shapes; `.value_types()` gives them. `model` must not change meanwhile."""
    pending = PendingShapes(model)
    pending.start()
    return pending


# Below this many nodes a fork costs more than the data propagation it moves off the main path:
# an If/Loop body or a small model is inferred in-process. A fork of a process that has imported
# numpy and onnx costs ~30 ms of CPU (the copy-on-write faults of both processes after it), more
# than a few hundred nodes' inference: measured on 2 shared CPUs, in-process took 10% less CPU
# and 7-9% less wall time on a 574-node KV decoder export (7% on a 685-node one), within 4%
# either way on 620-775-node synthetic models, 9-17% less at 1,550-3,100 nodes; that was under
# load, where the child's parallelism helps least, so the line stays above the KV exports only.
# 250 If bodies took 3.7 s with a child each, mostly fork and wait.
CHILD_MIN_NODES = 1000


class PendingShapes:
    """Shapes being inferred by a child (`_infer_job`, which sends the value types decoded) while
    the caller goes on; what the child does not answer, in-process when the result is asked for."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.child: _Child | None = None
        self.started = 0.0

    def start(self) -> None:
        """Fork the inference child where that pays. Call it inside the `try` whose `finally`
        calls `close`: a Ctrl-C then finds the child either unborn or known here."""
        if children_available() and len(self.model.graph.node) >= CHILD_MIN_NODES:
            with _interrupts_deferred():
                self.started = time.perf_counter()
                self.child = _Child.start(lambda send: _infer_job(self.model, send))

    def value_types(self) -> list[ValueType]:
        """`value_types` of the inferred model."""
        try:
            if self.child is None:
                return inferred_value_types(self.model)
            # Normally the child answers about when the caller has built its graph (the two take
            # about as long); the deadline ends a runaway data propagation.
            now = time.perf_counter()
            kind, payload = self.child.read(deadline=now + max(CHILD_SECONDS, 20 * (now - self.started)))
            if kind == _TYPES:
                return pickle.loads(payload)
            if kind == _RETRY:  # (a type error raises here as it does without a child)
                return inferred_value_types(self.model)
            # The child died (out of memory) or ran out of time: data propagation ran away, and
            # the plain pass is what is known.
            data = _view(self.model)
            return value_types(_plain(data) or onnx.ModelProto.FromString(data))
        finally:
            self.close()

    def close(self) -> None:
        """Stop the child, if any (the caller no longer wants the shapes)."""
        child, self.child = self.child, None
        if child is not None:
            child.stop()


def _view(model: onnx.ModelProto) -> bytes:
    """`_inference_view`, serialized."""
    return _inference_view(model).SerializeToString()


def _inference_view(model: onnx.ModelProto) -> onnx.ModelProto:
    """What inference runs on: the model without its weights (inference reads their dims and types,
    and copying them in and out would cost more than inference itself), its Identity nodes seen
    through (`_identities_aliased`), and without what its main graph declares of a value
    (value_info) where that contradicts what the model's inputs make of it (`_contradicted`):
    onnx's inference takes a declared dim over the one it infers, so a Trilu output declared [7, 7]
    where its input is [a, b] would be [7, 7], and so would everything computed from it; the
    lowered model would then refuse inputs the original accepts."""
    view = without_weights(model, keep_dims=True)
    named = input_dims(model)
    aliases = _identity_aliases(model.graph)
    if named or aliases:
        if view is model:  # (no weights left out: a copy of its own)
            view = onnx.ModelProto()
            view.CopyFrom(model)
        for vi in view.graph.input:
            for d, name in zip(vi.type.tensor_type.shape.dim, named.get(vi.name, ())):
                if not d.HasField("dim_value") and not d.dim_param:
                    d.dim_param = name
        _read_through(view.graph, aliases)
    contradicted, known = _contradicted(view)
    unlinked = _unlinked_names(view)
    if not contradicted and not known and not unlinked:
        return view
    if view is model:  # (no weights left out: a copy of its own)
        view = onnx.ModelProto()
        view.CopyFrom(model)
    kept = [vi for vi in view.graph.value_info if vi.name not in contradicted]
    for vi in kept:  # (a name no input has links values only as the exporter claims: inference decides)
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param in unlinked:
                d.Clear()
    for vi in kept:  # (a dim declared unknown that the plain pass knows: onnx would keep it unknown)
        for a, d in known.get(vi.name, {}).items():
            dim = vi.type.tensor_type.shape.dim[a]
            if isinstance(d, int):
                dim.dim_value = d
            else:
                dim.dim_param = d
    del view.graph.value_info[:]
    view.graph.value_info.extend(kept)
    return view


_TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _unlinked_names(view: onnx.ModelProto) -> set[str]:
    """The dim names the main graph's value_info declares that mention no graph input's dim name
    (`unk__7`, a renamed `d_41`; not `past_sequence + sequence` nor dynamo's `batch*sequence`):
    they link internal values only to each other, as the exporter claims, and, named apart, hide
    what inference proves (two values it would give one name)."""
    inputs = {d.dim_param for vi in view.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}
    return {d.dim_param for vi in view.graph.value_info for d in vi.type.tensor_type.shape.dim
            if d.dim_param and not any(t in inputs for t in _TOKEN.findall(d.dim_param))}


def _read_through(g: onnx.GraphProto, aliases: dict[str, str]) -> None:
    """Every node of `g` reads the value each alias copies instead of the alias."""
    for n in g.node:
        for i, x in enumerate(n.input):
            if x in aliases:
                n.input[i] = aliases[x]


def _identity_aliases(g: onnx.GraphProto) -> dict[str, str]:
    """Each main-graph Identity output and the value it copies (through chains of them). onnx's
    inference reads the values of a node's shape inputs (Unsqueeze's axes, Reshape's shape, ...)
    only from a constant or, with data propagation, from the node making them, and neither passes
    an Identity: an `Identity(Constant axes)` before an Unsqueeze leaves its output's rank, and all
    computed from it, unknown. Readers of the copy read the value itself in the view; the Identity
    is kept, so its output is typed as its input (what it is at run time)."""
    copies = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity" and n.domain in ("", "ai.onnx")
              and len(n.input) == 1 and len(n.output) == 1 and n.input[0] and n.output[0]}
    aliases = {}
    for y in copies:
        x, steps = copies[y], 0
        while x in copies and steps < len(copies):
            x, steps = copies[x], steps + 1
        aliases[y] = x
    return aliases


INPUT_DIM = "unk__input_"  # an unnamed input dim's own name (`input_dims`)


def input_dims(model: onnx.ModelProto) -> dict[str, tuple]:
    """The main graph's inputs that have an unnamed dim, each with its shape where every such dim
    has a name of its own (`unk__input_N`; export writes `unk__` dims as unknown). Inference then
    carries the dim by name, and the symbolic proof can read it as one size, never equal to another
    (an unnamed dim claims nothing); the lowered model reads it at run time as any named one."""
    mg = model.graph
    inits = {t.name for t in mg.initializer}
    found: dict[str, tuple] = {}
    for vi in mg.input:
        tt = vi.type.tensor_type
        if vi.name in inits or not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        if any(not d.HasField("dim_value") and not d.dim_param for d in tt.shape.dim):
            found[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                   for d in tt.shape.dim)
    if not found:
        return found
    taken = {d.dim_param for vi in itertools.chain(mg.input, mg.output, mg.value_info)
             for d in vi.type.tensor_type.shape.dim if d.dim_param.startswith(INPUT_DIM)}
    fresh = (name for name in (f"{INPUT_DIM}{i}" for i in itertools.count()) if name not in taken)
    return {k: tuple(next(fresh) if d is None else d for d in shape) for k, shape in found.items()}


def _contradicted(view: onnx.ModelProto) -> tuple[set[str], dict[str, dict[int, int | str]]]:
    """The values whose declared type (main-graph value_info) the plain pass, run without any
    declaration, contradicts: another element type or rank, or a dim it infers (a number, or a
    name from the model's inputs; not one it makes up, `unk__N`) that the declaration sets to
    something else. A declaration that only adds what inference cannot tell is not one of them.
    An initializer's own type and dims (one the model does not list as an input) are what it is:
    a declaration of it with any other dim (`[n]` or `[?]` where it is `[1]`) is contradicted too
    (onnx takes the declared one, and a Concat of it has no length). Also, per value kept, the
    dims it declares unknown where the plain pass infers a number or an input's dim name. (One
    plain pass more, on models that declare anything.)"""
    if not view.graph.value_info:
        return set(), {}
    bare = onnx.ModelProto()
    copy_fields(bare, view, skip="graph")
    copy_fields(bare.graph, view.graph, skip="value_info")
    inferred = _run(bare.SerializeToString(), data_prop=False)
    cache: dict[bytes, TypeShape] = {}
    found = {} if inferred is None else {name: (et, shape) for name, et, shape in value_types(inferred)}
    inputs = {vi.name for vi in view.graph.input}
    stored = {t.name: (t.data_type or None, tuple(t.dims)) for t in view.graph.initializer if t.name not in inputs}
    found.update(stored)
    bad: set[str] = set()
    known: dict[str, dict[int, int | str]] = {}
    for vi in view.graph.value_info:
        if vi.name not in found:
            continue
        et, shape = type_shape(vi.type, cache)
        i_et, i_shape = found[vi.name]
        if et and i_et and et != i_et or vi.name in stored and shape is not None and shape != i_shape:
            bad.add(vi.name)
        elif shape is not None and i_shape is not None and (len(shape) != len(i_shape) or any(
                d is not None and i is not None and d != i and not (isinstance(i, str) and i.startswith("unk__"))
                for d, i in zip(shape, i_shape))):
            bad.add(vi.name)
        elif shape is not None and i_shape is not None:
            fill = {a: i for a, (d, i) in enumerate(zip(shape, i_shape))
                    if d is None and i is not None and not (isinstance(i, str) and i.startswith("unk__"))}
            if fill:
                known[vi.name] = fill
    return bad, known


class _CannotTell(Exception):
    """The branches of a scoped model could not be inferred on their own: infer it unscoped."""


class _Target:
    """What inference runs on: the model without its weights (`_view`), with each If of its main
    graph in a scope of its own where it has many (`inference_scopes`: the same main-graph types
    in linear time; onnx's own is quadratic in the If nodes). `scope=False`: as it is."""

    def __init__(self, model: onnx.ModelProto, scope: bool = True) -> None:
        view = _inference_view(model)
        self.data = view.SerializeToString()
        self.scoped = inference_scopes.scoped(view, data=self.data) if scope else None
        if self.scoped is not None:
            self.data = self.scoped.model.SerializeToString()

    def choose(self, plain: onnx.ModelProto, propagated: onnx.ModelProto | None) -> list[ValueType]:
        """`value_types` of what `infer_shapes` returns, given both passes' results (`propagated`:
        None if data propagation failed): the plain pass's when it has a long vector anywhere,
        else data propagation's. Where both type the main graph alike, that is the answer either way."""
        plain_types = value_types(plain)
        if propagated is None:
            return plain_types
        propagated_types = value_types(propagated)
        return plain_types if propagated_types != plain_types and self.long_vector(plain) else propagated_types

    def long_vector(self, plain: onnx.ModelProto) -> bool:
        """`_long_vector` of what the plain pass gives the model (`plain`: its result on `data`): a
        scoped model's branches, whose inferred types onnx does not keep, inferred on their own."""
        if _long_vector(plain):
            return True
        if self.scoped is None:
            return False
        try:
            bodies = onnx.ModelProto.FromString(_cpp.infer_shapes(
                self.scoped.bodies_model(plain).SerializeToString(), True, False, False))
        except Exception as e:
            raise _CannotTell() from e
        return _long_vector(bodies)


# What onnx's type check says when an input's type is not one its op accepts (Trilu's k as float):
# onnxruntime refuses such a model, so it is an error in the input, not a shape left unknown.
_TYPE_ERRORS = ("has unsupported type", "[TypeInferenceError]")


def _plain(data: bytes) -> onnx.ModelProto | None:
    """The plain pass, with onnx's type check of every node's inputs against its schema: a type
    error raises ModelError; any other inference failure is only fewer known shapes."""
    try:
        return onnx.ModelProto.FromString(_cpp.infer_shapes(data, True, False, False))
    except Exception as e:  # noqa: BLE001 - InferenceError and others
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if any(t in message for t in _TYPE_ERRORS):
            raise ModelError(f"the model has a type error: {message}",
                             hint="onnxruntime refuses it too; fix the types in the model (re-export it)") from None
    return _run(data, data_prop=False)


def _run(data: bytes, data_prop: bool) -> onnx.ModelProto | None:
    try:
        return onnx.ModelProto.FromString(_cpp.infer_shapes(data, False, False, data_prop))
    except Exception:  # noqa: BLE001 - inference errors of every kind: fewer known shapes
        return None


def _long_vector(model: onnx.ModelProto, stored: bool = False,
                 graphs: list[tuple[onnx.GraphProto, str]] | None = None) -> bool:
    """Whether a 1-D value of `model` (an inferred one) has a static length over the limit;
    `stored`: or a 1-D initializer or Constant value (what the plain pass finds without computing).
    `graphs`: `iter_graphs(model.graph)`, when the caller has it."""
    for g, _ in graphs if graphs is not None else iter_graphs(model.graph):
        if _declares_long_vector(g.input, g.output, g.value_info):
            return True
        if stored and _stores_long_vector(g):
            return True
    return False


def _declares_long_vector(*infos: Iterable[onnx.ValueInfoProto]) -> bool:
    for vi in itertools.chain(*infos):
        dims = vi.type.tensor_type.shape.dim
        if len(dims) == 1 and dims[0].dim_value > MAX_DATA_PROP_LENGTH:
            return True
    return False


def _flat_long_vector(model: onnx.ModelProto, types: list[ValueType]) -> bool:
    """`_long_vector(model)` for a model without subgraphs whose `value_types` are `types` (their
    decoded shapes read instead of walking its value_info a second time)."""
    return _declares_long_vector(model.graph.input, model.graph.output) or any(
        shape is not None and len(shape) == 1 and isinstance(shape[0], int) and shape[0] > MAX_DATA_PROP_LENGTH
        for _, _, shape in types)


def _stores_long_vector(g: onnx.GraphProto) -> bool:
    if any(len(t.dims) == 1 and t.dims[0] > MAX_DATA_PROP_LENGTH for t in g.initializer):
        return True
    # A Constant that long is that many bytes at least (its size, read in C, before its attributes).
    return any(n.op_type == "Constant" and n.ByteSize() > MAX_DATA_PROP_LENGTH and any(
        (len(a.t.dims) == 1 and a.t.dims[0] > MAX_DATA_PROP_LENGTH) or max(len(a.ints), len(a.floats)) >
        MAX_DATA_PROP_LENGTH for a in n.attribute) for n in g.node)


# The child's answer: a kind byte and a length, then that many bytes (the pickled value types;
# nothing for a retry).
_TYPES = b"T"
_RETRY = b"R"
_HEADER = struct.Struct("<cQ")


def _infer_job(model: onnx.ModelProto, send: Send) -> None:
    """What `infer_shapes(model, check_types=True)` finds, in one pass where it can: data
    propagation with the type check, under a memory cap. When its shapes hold no long vector the
    plain pass's hold none either (data propagation only adds dims): that is the answer, and the
    plain pass is run only to apply the guard to a long vector (or, for a scoped model, whose
    branches' propagated types onnx does not keep, to decide). A model that declares or stores a
    long vector, a type error, or another failure is answered "retry" (the caller's in-process
    path, plain pass first, tells them apart); a runaway dies unanswered."""
    graphs = list(iter_graphs(model.graph))
    if _long_vector(model, stored=True, graphs=graphs):  # the guard holds without inference: the caller's path, plain first
        send(_RETRY, b"")
        return
    target = _Target(model)
    with address_space_headroom(CHILD_MEMORY):  # (the child's whole life from here)
        try:
            inferred = onnx.ModelProto.FromString(_cpp.infer_shapes(target.data, True, False, True))
        except MemoryError:
            return
        except Exception:  # noqa: BLE001 - InferenceError and others
            send(_RETRY, b"")
            return
        if target.scoped is not None:  # (its branches' propagated types are not kept: the plain pass decides)
            plain = _run(target.data, data_prop=False)
            try:
                if plain is None:
                    raise _CannotTell()
                send(_TYPES, pickle.dumps(target.choose(plain, inferred)))
            except _CannotTell:
                send(_RETRY, b"")
            return
        types = value_types(inferred)
        if _flat_long_vector(inferred, types) if len(graphs) == 1 else _long_vector(inferred):
            plain = _run(target.data, data_prop=False)
            if plain is None:
                inferred = onnx.ModelProto.FromString(target.data)  # (as `infer_shapes`: the declared types)
            elif _long_vector(plain):
                inferred = plain
            types = value_types(inferred)
        send(_TYPES, pickle.dumps(types))


class _Child:
    """A forked child running `job(send)`; `send(kind, payload)` writes its answer to a pipe."""

    pid: int | None  # None once stopped
    fd: int | None

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd

    @classmethod
    def start(cls, job: Callable[[Send], None]) -> "_Child | None":
        try:
            r, w = os.pipe()
        except OSError:
            return None
        with _interrupts_deferred():  # a Ctrl-C now must not find a child the parent does not know
            try:
                with warnings.catch_warnings():  # (3.12+ warns when threads exist: the child runs none of their code)
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError:  # no fork allowed here (process limits, memory): in-process instead
                os.close(r)
                os.close(w)
                return None
            if pid != 0:
                os.close(w)
                return cls(pid, r)
            code = 1  # the child: onnx's C++ and a pipe, then out without running any exit handlers
            try:
                # Ctrl-C reaches the whole process group: the parent answers it and kills this child.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                os.close(r)
                _die_with_parent()

                def send(kind: bytes, payload: bytes) -> None:
                    view = memoryview(_HEADER.pack(kind, len(payload)) + payload)
                    while view:
                        view = view[os.write(w, view):]

                job(send)
                code = 0
            finally:
                os._exit(code)

    def read(self, deadline: float | None) -> tuple[bytes | None, bytes]:
        """The child's answer, or (None, b"") if it died first or `deadline` passed."""
        head = self._read_exactly(_HEADER.size, deadline)
        if head is None:
            return None, b""
        kind, size = _HEADER.unpack(head)
        body = self._read_exactly(size, deadline)
        return (kind, body) if body is not None else (None, b"")

    def _read_exactly(self, n: int, deadline: float | None) -> bytes | None:
        chunks, left = [], n
        fd = self.fd
        assert fd is not None, "read after stop"
        while left:
            wait = None if deadline is None else deadline - time.perf_counter()
            if wait is not None and (wait <= 0 or not select.select([fd], [], [], wait)[0]):
                return None
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:  # the child is gone
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def stop(self) -> None:
        """Kill and reap the child and close the pipe, once; an interrupt waits until it is done
        (else a second stop would close the pipe twice, or the child would be left behind)."""
        with _interrupts_deferred():
            fd, pid, self.fd, self.pid = self.fd, self.pid, None, None
            if fd is not None:
                os.close(fd)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


def _die_with_parent() -> None:
    """Have the kernel kill this child if the parent dies first (prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
