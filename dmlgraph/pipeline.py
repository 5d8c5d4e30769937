"""The one pipeline: load -> rules -> export -> check (`lower`), and running and comparing graphs.

The Python API (`dmlgraph.api`), the CLI, `inspect` and the onnx-ir pass all lower through `lower`,
so a model means the same thing to each of them. Targets and rule options are defined here once.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Union, cast

import numpy as np
import numpy.typing as npt
import onnx

from dmlgraph import __version__, mask_census
from dmlgraph.costs import (
    GROWTH_ALLOWANCE,
    GROWTH_DECLINE,
    STAMP,
    all_nodes,
    growing_sites,
    growth,
    kernel_reason,
    run_time_nodes,
    same_computation,
    site_costs,
    unstamped_bytes,
)
from dmlgraph.errors import DmlgraphError, InternalError, ModelError
from dmlgraph.io import saving
from dmlgraph.io.modelfile import (
    check_model_proto,
    checker_failure,
    data_nbytes,
    load_model,
    onnxruntime_refuses,
    tensor_nbytes,
    without_weights,
)
from dmlgraph.io.onnx_io import PORTABLE_MIN_OPSET, export_model, import_model, portable_is_exact
from dmlgraph.io.portable import ONE_OPERATOR
from dmlgraph.io.saving import atomic_writer, check_for_save, output_target
from dmlgraph.io.shape_inference import PendingShapes
from dmlgraph.ir.dtypes import bitwise_equal
from dmlgraph.ir.graph import DmlNode, Graph, Node, Value, gc_paused
from dmlgraph.ir.ops import FeatureLevel
from dmlgraph.rewrite import Match, Options, PassManager, PassResult, site_key
from dmlgraph.rewrite.nested import SCOPE, nested_dml_nodes, optimize_nested, qualified_name
from dmlgraph.runtime.onnx_runner import numpy_dtype

ModelLike = Union[onnx.ModelProto, bytes, str, "os.PathLike[str]"]
IN_MEMORY = "<in-memory model>"  # what reports call a model given as a ModelProto
# A checked model's bytes are kept with the result up to this size, so that saving it unchanged
# skips a second full check; a bigger copy would cost more memory than the check costs time.
KEEP_CHECKED_BYTES = 64 << 20
TARGETS = ("dml", "onnx")  # com.dmlgraph DiagonalMatrix1 nodes (DirectML); standard ONNX (any runtime)


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise DmlgraphError(f"unknown target {target!r}", hint="use target 'dml' or 'onnx'")
    return target


def make_options(*, exact: bool = False, feature_level: str | FeatureLevel = "5_1",
                 min_mask_bytes: int | None = None, allow_growth: bool = False) -> Options:
    """The rule options from keyword arguments (a feature level as "5_1", "4_0", ...)."""
    level = feature_level if isinstance(feature_level, FeatureLevel) else FeatureLevel.parse(feature_level)
    if min_mask_bytes is not None and min_mask_bytes < 0:
        raise DmlgraphError(f"min_mask_bytes {min_mask_bytes} is negative", hint="pass 0 or more, or None")
    return Options(feature_level=level, exact_only=exact, min_mask_bytes=min_mask_bytes, allow_growth=allow_growth)


@gc_paused
def load(model: ModelLike, base_dir: str | None = None) -> tuple[onnx.ModelProto, Graph]:
    """Read a model safely (external data stays on disk) and import it; a ModelProto is checked
    as a file would be, and only read. A file's shape inference starts as soon as it has parsed
    (in a child where allowed: it then runs beside the checks and the build; a file that fails a
    check stops it).

    Like every whole-model step, with the cyclic collector paused where allowed (see `gc_paused`):
    its full passes over the proto walk and the new graph find nothing to free."""
    model = as_model(model)
    notes: list[str] = []
    if isinstance(model, onnx.ModelProto):  # (`base_dir`: where its external data lives, if any)
        check_model_proto(model, IN_MEMORY, base_dir, notes=notes)
        g = import_model(model, base_dir)
        g.info.notes = notes
        return model, g
    path = model
    shapes: PendingShapes | None = None

    def infer(parsed: onnx.ModelProto) -> None:  # (the child infers while the file is checked, then built)
        nonlocal shapes
        shapes = PendingShapes(parsed)
        shapes.start()
    try:
        proto = load_model(path, parsed=infer, notes=notes)
        g = import_model(proto, os.path.dirname(os.path.abspath(path)), shapes)
        g.info.notes = notes
        return proto, g
    finally:
        if shapes is not None:
            shapes.close()


def as_model(model: object) -> onnx.ModelProto | str:
    """What a caller passed as a model, as a ModelProto (given, or parsed from its serialized
    bytes) or a path (a str, from a str or an os.PathLike); anything else is a DmlgraphError."""
    hint = "pass a path (str or pathlib.Path), an onnx.ModelProto, or the bytes of an .onnx file"
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and others
            raise ModelError(f"the {len(model)} bytes given as a model are not a serialized ONNX model "
                             f"({str(e).strip() or type(e).__name__})", hint=hint) from None
        return proto
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        path = os.fsdecode(path) if isinstance(path, bytes) else path
        if "\0" in path:
            raise DmlgraphError(f"the model path {path!r} contains a NUL character", hint=hint)
        return path
    raise DmlgraphError(f"a model cannot be given as {type(model).__name__}", hint=hint)


def model_label(model: ModelLike) -> str:
    model = as_model(model)
    return IN_MEMORY if isinstance(model, onnx.ModelProto) else model


def as_feeds(g: Graph, inputs: object) -> dict[str, np.ndarray]:
    """A caller's inputs as arrays by name: a mapping (or name, value pairs) whose values are
    arrays, or lists, scalars and other array-likes, converted to the dtype the model declares
    for that input when the values fit it (ints into a float input, not floats into an int one).
    Arrays are passed on as they are: `check_feeds` checks them."""
    hint = "pass a dict of input name -> numpy array (or a list of numbers)"
    if isinstance(inputs, Mapping):
        pairs = dict(inputs)
    else:
        try:
            pairs = dict(inputs)  # type: ignore[call-overload]  # (name, value) pairs, or an error
        except (TypeError, ValueError):
            raise DmlgraphError(f"inputs must be a mapping of input names to arrays, not {type(inputs).__name__}",
                                hint=hint) from None
    declared = {v.name: v.elem_type for v in g.inputs} | {n: g.initializers[n].elem_type for n in g.overridable_inputs}
    feeds: dict[str, np.ndarray] = {}
    for name, value in pairs.items():
        if not isinstance(name, str):
            raise DmlgraphError(f"input name {name!r} is not a str", hint=hint)
        if isinstance(value, np.ndarray):
            feeds[name] = value
            continue
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as e:
            raise DmlgraphError(f"input {name!r} is not an array: {e}", hint=hint) from None
        et = declared.get(name)
        try:
            want = numpy_dtype(et) if et else None
        except Exception:  # noqa: BLE001 - a type numpy cannot name: `check_feeds` says what it is
            want = None
        if want is not None and arr.dtype != want:
            fits = arr.dtype.kind in "biuf" and want.kind in "biuf" and np.can_cast(arr.dtype, want, "same_kind")
            cast = arr.astype(want) if fits else arr
            if not fits or (want.kind in "biu" and not np.array_equal(cast, arr)):
                held = {"U": "str", "S": "bytes", "O": "object"}.get(arr.dtype.kind, str(arr.dtype))
                raise DmlgraphError(f"input {name!r} holds {held} values; the model takes {want}, which "
                                    "cannot hold them", hint=f"pass values of type {want}")
            arr = cast
        feeds[name] = arr
    return feeds


def graph_stats(g: Graph) -> dict:
    """Node count, op histogram and initializer bytes: the numbers of a before/after table."""
    ops = {op: len(nodes) for op, nodes in g.by_op.items() if nodes}  # (the graph's op index)
    init_bytes = sum(_value_nbytes(v) for v in g.initializers.values())
    # Constant nodes store tensors too (TorchScript exports put masks there).
    const_bytes = sum(tensor_nbytes(a.t) for n in g.by_op.get("Constant", {}).values()
                      for a in getattr(n, "attributes", ()) if a.name == "value")
    dml = sum(isinstance(n, DmlNode) for op in ("DiagonalMatrix1", "DiagonalMatrix") for n in g.by_op.get(op, {}).values())
    return {"nodes": len(g.nodes), "ops": dict(sorted(ops.items())), "initializers": len(g.initializers),
            "initializer_bytes": init_bytes, "constant_bytes": init_bytes + const_bytes, "dml_nodes": dml}


def _value_nbytes(v: Value) -> int:
    """An initializer's bytes from its type and shape (which load_model checked against its data)."""
    if v.initializer is None:
        assert v.array is not None, "a constant holds a TensorProto or an array"
        return int(v.array.nbytes)
    assert v.elem_type is not None, "import sets an initializer's type from its TensorProto"
    n = data_nbytes(v.elem_type, cast("tuple[int, ...]", v.shape))  # (an initializer's dims: tuple(t.dims))
    return tensor_nbytes(v.initializer) if n is None else n


def node_label(n: Node, m: Match | None = None) -> dict:
    """A covered node; a node inside a body or function is named with its path (`If_3/then_branch/x`)."""
    return {"name": n.name if m is None else qualified_name(m, n), "op_type": n.op_type}


def node_ref(m: Match, n: Node) -> str:
    """A node as `Rewrite.nodes` names it: its name, or for an unnamed node (ONNX allows them) its
    op type and first output (`Where -> scores`); inside a body or function, after its path."""
    own = n.name or (f"{n.op_type} -> {n.outputs[0].name}" if n.outputs else n.op_type)
    scope = m.captures.get(SCOPE)
    return f"{scope}/{own}" if scope else own


def match_record(m: Match, with_reason: bool = False) -> dict:
    rec: dict[str, Any] = {"rule": m.rule, "nodes": [node_label(n, m) for n in m.nodes]}
    if with_reason:
        rec["reason"] = m.reason
    return rec


def optimize_graph(g: Graph, options: Options, progress: Callable[[str], None] | None = None,
                   census: bool = False, target: str = "dml") -> PassResult:
    """Every rule on `g`, then on each If/Loop/Scan body and local function (`nested`), in place
    (`census`: with the mask census of each body and function in the result; `target` the export's:
    on `onnx` a lowered body's portable form is written from the copy its rules ran on)."""
    from dmlgraph.passes import default_phases  # the one place where core and passes meet
    from dmlgraph.passes.scoped import varying_masks

    manager = PassManager(default_phases(), options)  # (one for the main graph and every body)

    def flat(graph: Graph) -> PassResult:
        return manager.run(graph, progress if graph is g else None)

    return optimize_nested(g, flat, varying_masks, mask_census.body_census if census else None, mask_census.kinds,
                           options.exact_only if target == "onnx" else None, not options.declined_sites)


@dataclass(frozen=True)
class Rewrite:
    """One applied rewrite: the rule, the nodes it covered, the node it put in their place."""

    rule: str
    nodes: tuple[str, ...]  # `node_ref` of each covered node
    op: str | None  # "DiagonalMatrix1", "DiagonalMatrix", or None for a rule that makes no DML node
    exact: bool  # bit-exact for every input (else: equal for finite inputs)


@dataclass(frozen=True)
class Decline:
    """A place a rule matched but did not rewrite, and why."""

    rule: str
    nodes: tuple[str, ...]  # `node_ref` of each node
    initializers: tuple[str, ...]
    reason: str


@dataclass
class OptimizeResult:
    """What `optimize` made: the lowered model, its rewrites and declines, before/after totals.

    Attributes: `model` (the lowered onnx.ModelProto, what `save` writes); `rewrites` (a `Rewrite`
    per applied rewrite); `declined` (a `Decline` per site a rule matched but did not rewrite, with
    the reason); `counts` (rewrites per rule, every rule listed); `before` / `after` (nodes, ops,
    initializers, initializer_bytes, constant_bytes, dml_nodes); `report` (the `dmlgraph optimize
    --json` document); `graph` and `passes` (the lowered IR graph and the rules' own records, for
    tools built on dmlgraph: inspect, dxdispatch); `source` (the input's path, if given one).
    """

    model: onnx.ModelProto
    rewrites: list[Rewrite]
    declined: list[Decline]
    counts: dict[str, int]  # rewrites per rule (every rule listed)
    before: dict[str, Any]  # nodes, ops, initializers, initializer_bytes, constant_bytes, dml_nodes
    after: dict[str, Any]
    report: dict[str, Any] = field(repr=False)  # the `dmlgraph optimize --json` document
    graph: Graph = field(repr=False)
    passes: PassResult = field(repr=False)
    source: str | None = None  # the input model's path (its folder holds any external data)
    original: onnx.ModelProto | None = field(default=None, repr=False)  # the input, as loaded
    checked_bytes: bytes | None = field(default=None, repr=False)  # `model` as `optimize` checked it, if kept

    def check(self) -> None:
        """onnx's checker with full_check on the model, as `saving.check_for_save` runs it (weights
        and external-data locations left out: the input's are not the output's, and a proto's are
        looked up from the working directory); where the input model itself fails the full check
        (an exporter's inconsistent shapes), the output must pass the checks the input passes.
        Raises AssertionError: a failure is a bug in dmlgraph."""
        failure = full_check_failure(self.model)
        if failure is None:
            return
        if self.original is None or full_check_failure(self.original) is None:
            raise AssertionError(f"dmlgraph made a model that fails onnx's full check: {failure}")
        worse = worse_than_source(self.model, self.original, self.report.get("target", "dml"), self._source_dir)
        if worse is not None:
            raise AssertionError(f"dmlgraph made a model that {worse}")

    @gc_paused
    def save(self, path: str | os.PathLike[str], *, in_place: bool = False) -> int:
        """Write the model atomically after onnx's full check; returns the model file's size in bytes.

        Refuses to replace the input model unless `in_place`, and to replace anything but a
        regular file (a character device or FIFO is written through; a folder path such as
        `newdir/` is refused). Weights the input kept as external data are copied from beside it.
        A model that serializes to the bytes `optimize` checked (one still as it made it) is not
        checked again.
        """
        return saving.save_model(self.model, path, input_path=self.source, in_place=in_place,
                                 base_dir=self._source_dir, check=self._check_unless_checked)

    @property
    def _source_dir(self) -> str | None:
        """The input's folder: where its external data is."""
        return None if self.source is None else os.path.dirname(os.path.abspath(self.source))

    def _check_unless_checked(self, data: bytes | None) -> None:
        """`check`, unless `data` (the bytes the save writes) are the bytes `optimize` checked."""
        if data is None or data != self.checked_bytes:
            self.check()

    def to_json(self) -> str:
        return json.dumps(self.report, indent=2, sort_keys=True, default=str)


def full_check_failure(model: onnx.ModelProto) -> str | None:
    """What onnx.checker with full_check (strict shape inference) says about the model without
    its weights (`check_for_save`); None when it passes."""
    try:
        check_for_save(model)
    except InternalError as e:
        cause = e.__cause__ or e
        return str(cause).strip() or type(cause).__name__
    return None


@gc_paused
def lower(model: ModelLike, options: Options | None = None, target: str = "dml",
          progress: Callable[[str], None] | None = None, *, base_dir: str | None = None,
          loaded: Callable[[onnx.ModelProto, Graph], None] | None = None, check: bool = True,
          census: bool = False, explain_growth: bool = False) -> OptimizeResult:
    """The pipeline: load `model` (a path or a ModelProto, never modified), run every rule on
    every scope, export to `target`, clean, stamp, and check the result as saving would.

    A site whose lowering would make the model bigger (nodes at any depth, or bytes past the
    stamp: `growth`) is declined unless `options.allow_growth`, the others kept. `loaded(proto, graph)` sees the
    graph as imported, before any rule runs (inspect takes its census there); `base_dir` is where
    a ModelProto's external data lives. `check=False` skips the output check (inspect writes
    nothing; `save` checks a model that was not checked). `census`: take the mask census of every
    body and function too (`PassResult.census`). `explain_growth` (with allow_growth): find the
    sites optimize would decline too (`report["site_growth"]`: inspect shows them).
    """
    options = options or Options()
    check_target(target)
    model = as_model(model)
    label = model_label(model)
    source, g = load(model, base_dir)
    notes, dir_of = list(g.info.notes), g.info.base_dir  # (dir_of: where the input's external data is)
    if loaded is not None:
        loaded(source, g)
    before = graph_stats(g)
    result, exported, cleaned = _lower_graph(g, source, options, target, progress, census)
    reference = _Reference(source)  # (the input, and its clean-up: a lowering must beat both)
    grown = reference.growth(exported) if result.applied else growth(source, exported)
    full = exported  # the lowering of every site (inspect and --allow-growth show it)
    if grown is not None and result.applied and not options.allow_growth:
        if check:
            _check_output(exported, source, label, target, dir_of, bool(notes))  # (a broken lowering: our bug)
        g, result, exported, cleaned = _decline_growing_sites(model, base_dir, source, reference, options, target,
                                                              result, exported, census, grown, (g, cleaned))
    if target == "onnx" and result.applied and not options.allow_growth:
        g, result, exported, cleaned = _decline_costlier_sites(model, base_dir, source, reference, options,
                                                               result, exported, census, (g, cleaned))
    if result.applied or cleaned:  # (a model given back unchanged stays byte for byte the input)
        stamp(exported, target, options, result.counts, source)
    serialized = _check_output(exported, source, label, target, dir_of, bool(notes)) if check else None
    if serialized is not None and len(serialized) > KEEP_CHECKED_BYTES:
        serialized = None
    # The numbers describe the file written: the portable target expands each DML node.
    if target == "dml" and not cleaned and result.applied:
        after = graph_stats(g)
    else:
        try:
            after = graph_stats(import_model(exported))
        except DmlgraphError as e:  # what we made does not load: our bug, not the user's input
            raise InternalError(f"the exported model does not load again: {e}") from e
    report = {
        "model": label, "target": target, "feature_level": options.feature_level.label,
        "exact_only": options.exact_only,
        "rewrites": result.counts,
        "lowered": [match_record(m) | {"dml": _dml_summary(m), "exact": _exact(m, g, target, options)}
                    for m in result.applied],
        "declined": [match_record(m, True) for m in result.declined],
        "before": before | {"nodes_all_scopes": all_nodes(source)}, "after": after | {"nodes_all_scopes": all_nodes(exported)},
        "grows": grown,  # how lowering every site would make the cleaned input bigger (then declined sites)
        "declined_for_growth": sum(1 for m in result.declined if (m.reason or "").startswith(GROWTH_DECLINE)),
        "notes": notes,  # what loading took though onnx's checks refuse it
    }
    if grown is not None and options.allow_growth and explain_growth and result.applied:
        # The sites optimize would decline, with its reasons (inspect lowers every site).
        without = _without_growing_sites(model, base_dir, source, reference, dataclasses.replace(
            options, allow_growth=False), target, result, full, census)
        report["site_growth"] = [match_record(m, True) for m in (without[1].declined if without else [])
                                 if (m.reason or "").startswith(GROWTH_DECLINE)] if without else \
            [match_record(m) | {"reason": "every site (no kept subset stops the growth)"} for m in result.applied]
        # (what optimize then writes: a lowering of the kept sites, unless it computes what the input does)
        report["writes_lowered"] = bool(without and without[1].applied and not same_computation(source, without[2]))
    if target == "onnx" and result.applied:
        report["portable"] = portable_summary([*[n for n in g.nodes.values() if isinstance(n, DmlNode)],
                                               *nested_dml_nodes(result)])
    rewrites = [Rewrite(m.rule, tuple(node_ref(m, n) for n in m.nodes), _op(m.dml), _exact(m, g, target, options))
                for m in result.applied]
    declined = [Decline(m.rule, tuple(node_ref(m, n) for n in m.nodes), tuple(m.initializers), m.reason or "")
                for m in result.declined]
    path = None if isinstance(model, onnx.ModelProto) else model
    return OptimizeResult(exported, rewrites, declined, dict(result.counts), before, after, report, g, result,
                          source=path, original=source, checked_bytes=serialized)


def _decline_growing_sites(model: onnx.ModelProto | str, base_dir: str | None, source: onnx.ModelProto,
                           reference: _Reference, options: Options, target: str, result: PassResult,
                           exported: onnx.ModelProto, census: bool, grown: str, lowered: tuple[Graph, bool]
                           ) -> tuple[Graph, PassResult, onnx.ModelProto, bool]:
    """Nothing grows: the sites whose lowering would make the model bigger on this target are
    declined, each with its numbers (`declines_for_growth`), and the rest lowered again; the
    input is kept when no site is left, or the kept ones write again what it computes."""
    g, cleaned = lowered
    kept = _without_growing_sites(model, base_dir, source, reference, options, target, result, exported, census)
    if kept is not None:
        g, result, exported, cleaned = kept
        if result.applied and not same_computation(source, exported):
            return g, result, exported, cleaned
    else:  # no subset found that does not grow: every site declined, the input kept (cleaned)
        result = _all_declined(result, f"not written: the lowered model would grow on target {target} over the "
                                       f"input cleaned up ({grown}); the input is kept")
    exported, cleaned = reference.kept()
    return g, result, exported, cleaned


def _decline_costlier_sites(model: onnx.ModelProto | str, base_dir: str | None, source: onnx.ModelProto,
                            reference: _Reference, options: Options, result: PassResult,
                            exported: onnx.ModelProto, census: bool, lowered: tuple[Graph, bool]
                            ) -> tuple[Graph, PassResult, onnx.ModelProto, bool]:
    """On `onnx`: the sites whose standard form runs more onnxruntime kernels than what it replaces
    (`site_costs`' fourth number: a stored matrix sliced at run time is two Slices, its generator
    a ConstantOfShape, a Trilu and their sizes) are declined with their numbers and the rest
    lowered again, as growing ones are (docs/portable.md, "Kernels")."""
    g, cleaned = lowered
    first = g, result, exported, cleaned
    declined = dict(options.declined_sites) | {site_key(m): m.reason or "" for m in result.declined
                                               if (m.reason or "").startswith(GROWTH_DECLINE)}
    changed = False
    for _ in range(2 * len(result.applied) + 2):  # (a declined select leaves its mask's generator to decline next)
        costs = site_costs(reference.cleaned, exported, result.applied)
        found = {site_key(m): kernel_reason(c) for m, c in zip(result.applied, costs)
                 if c is not None and c[3] >= 0.5 and site_key(m) not in declined}
        if not found:
            break
        declined |= found
        for _ in range(3):  # (a stored matrix the declined mask read is a site of its own, which may grow)
            _, g2 = load(model, base_dir)
            result2, out, cleaned2 = _lower_graph(g2, source, dataclasses.replace(options, declined_sites=declined),
                                                  "onnx", None, census)
            grows = {site_key(m): why for m, why in growing_sites(reference.cleaned, out, result2.applied, "onnx")
                     if site_key(m) not in declined} if reference.growth(out) is not None else {}
            if not grows:
                break
            declined |= grows
        if reference.growth(out) is not None:
            break  # (not seen)
        g, result, exported, cleaned, changed = g2, result2, out, cleaned2, True
        if not result.applied:
            break
    if not changed or len(run_time_nodes(exported.graph)) >= len(run_time_nodes(first[2].graph)):
        return first  # (what was lowered instead costs as much: trilu_offsets_ts's other Trilus)
    if not result.applied or same_computation(source, exported):
        exported, cleaned = reference.kept()
    return g, result, exported, cleaned


def _all_declined(result: PassResult, reason: str) -> PassResult:
    """`result` with every lowered site declined for `reason`."""
    for m in result.applied:
        m.reason = reason
    return PassResult(result.changed, {k: 0 for k in result.counts}, result.declined + result.applied,
                      [], result.iterations, result.superseded, result.census)


def _input_kept(source: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """A copy of the input, cleaned, to be written: (it, whether the clean-up changed it)."""
    exported = onnx.ModelProto()
    exported.CopyFrom(source)
    return exported, clean(exported)


def _exact(m: Match, g: Graph, target: str, options: Options) -> bool:
    """Whether a rewrite is bit-exact in what `target` writes: on `onnx`, its portable form too."""
    dml = m.dml
    if not isinstance(dml, DmlNode) or target != "onnx":
        return bool(getattr(dml, "exact", True))
    if dml.id in g.nodes or dml.portable_form is not None:  # (a body's: its form written with its body)
        return dml.exact and dml.portable_exact
    return dml.exact and portable_is_exact(dml, g.info.opset_imports.get("", 0), options.exact_only)


def _lower_graph(g: Graph, source: onnx.ModelProto, options: Options, target: str,
                 progress: Callable[[str], None] | None, census: bool) -> tuple[PassResult, onnx.ModelProto, bool]:
    """The rules on `g` (in place), then the export to `target`, cleaned: (what ran, the model,
    whether the clean-up changed it). The portable target writes opset 13 ops at least (Trilu
    needs 14): below that every site is declined, saying so, and the input kept."""
    result = optimize_graph(g, options, progress, census, target)
    opset = g.info.opset_imports.get("", 0)
    if target == "onnx" and opset < PORTABLE_MIN_OPSET and result.applied:
        result = _all_declined(result, f"not written: the portable target writes ops of opset {PORTABLE_MIN_OPSET} "
                                       f"or later and the model imports opset {opset}; convert it "
                                       "(onnx.version_converter) or use --target dml")
        return (result, *_input_kept(source))
    g.remove_dead()
    exported = export_model(g, target, options.exact_only)
    return result, exported, clean(exported)


def _without_growing_sites(model: onnx.ModelProto | str, base_dir: str | None, source: onnx.ModelProto,
                           reference: _Reference, options: Options, target: str, result: PassResult,
                           exported: onnx.ModelProto, census: bool
                           ) -> tuple[Graph, PassResult, onnx.ModelProto, bool] | None:
    """The model lowered again with the sites that grow it declined (`growing_sites`: each site's
    own cost read off the one export, no export per site); while the written model still grows
    (shared plumbing, sites in bodies), the costliest remaining site is declined too. None when
    no kept subset stops the growth."""
    declined = dict(options.declined_sites)
    applied, out = result.applied, exported
    for _ in range(2 * len(applied) + 1):
        found = [(m, why) for m, why in growing_sites(reference.cleaned, out, applied, target) if site_key(m) not in declined]
        if not found:  # no site grows the model on its own, together they do: the costliest go
            found = _costliest_sites(reference, out, applied, declined, target)
            if not found:
                return None
        declined |= {site_key(m): why for m, why in found}
        _, g = load(model, base_dir)
        result, out, cleaned = _lower_graph(g, source, dataclasses.replace(options, declined_sites=declined), target,
                                            None, census)
        if reference.growth(out) is None:
            return g, result, out, cleaned
        applied = result.applied
        if not applied:  # every site declined with its own numbers: the input is written
            return g, result, out, cleaned
    return None


def _costliest_sites(reference: _Reference, out: onnx.ModelProto, applied: list[Match],
                     declined: dict[tuple[str, ...], str], target: str) -> list[tuple[Match, str]]:
    """The costliest sites of `out` whose costs together cover what it adds over `reference`
    (nodes if it has more, else bytes), costliest first: declined in one run, not one run per
    site (thousands of body sites made that quadratic). Empty when no site has a cost."""
    extra_nodes, extra_bytes = reference.extra(out)
    extra = extra_nodes if extra_nodes > 0 else extra_bytes - GROWTH_ALLOWANCE
    costs = sorted(((c[:2], i, c[2]) for i, c in enumerate(site_costs(reference.cleaned, out, applied))
                    if c is not None and site_key(applied[i]) not in declined), reverse=True)
    added = f"{extra_nodes} node{'s' if extra_nodes > 1 else ''}" if extra_nodes > 0 else f"{extra_bytes} bytes"
    why = f"{GROWTH_DECLINE}{added} on target {target} together with the other sites ({reference.growth(out)})"
    found: list[tuple[Match, str]] = []
    covered = 0.0
    for (nodes, size), i, what in costs:
        found.append((applied[i], f"{why}, this one among the costliest: {what}"))
        covered += nodes if extra_nodes > 0 else size
        if covered >= extra:
            break
    return found


class _Reference:
    """What a lowering must beat: the input (no more nodes, no more bytes: `growth`), and the
    input cleaned up, which is what declining every site writes (onnx-ir's passes can shrink it
    a lot: Optimum's llama 625 -> 374 nodes). Against the clean-up a lowering may trade nodes for
    bytes (a stored mask for its generator: a node more, kilobytes less), not lose on both. The
    clean-up runs once, when first needed, and is what a declined model writes (`kept`)."""

    def __init__(self, source: onnx.ModelProto) -> None:
        self.source = source

    @functools.cached_property
    def _clean_up(self) -> tuple[onnx.ModelProto, bool]:
        return _input_kept(self.source)

    @property
    def cleaned(self) -> onnx.ModelProto:
        return self._clean_up[0]

    @functools.cached_property
    def _sizes(self) -> tuple[int, int, int, int]:
        """Nodes and bytes of the input, then of its clean-up."""
        return (all_nodes(self.source), unstamped_bytes(self.source),
                all_nodes(self.cleaned), unstamped_bytes(self.cleaned))

    def kept(self) -> tuple[onnx.ModelProto, bool]:
        """The input cleaned, to be written (a copy: the stamp edits it), and whether the clean-up
        changed it."""
        copy = onnx.ModelProto()
        copy.CopyFrom(self.cleaned)
        return copy, self._clean_up[1]

    def growth(self, model: onnx.ModelProto) -> str | None:
        grown = growth(self.source, model)
        if grown is not None:
            return grown
        _, _, n0, b0 = self._sizes
        n1, b1 = all_nodes(model), unstamped_bytes(model)
        if (n1 > n0 and b1 >= b0) or (n1 >= n0 and b1 > b0 + GROWTH_ALLOWANCE):
            return f"nodes {n0} -> {n1}, bytes {b0} -> {b1} over the input cleaned up"
        return None

    def extra(self, model: onnx.ModelProto) -> tuple[int, int]:
        """The nodes and bytes `model` has over the smaller of the two."""
        n_src, b_src, n_clean, b_clean = self._sizes
        return all_nodes(model) - min(n_src, n_clean), unstamped_bytes(model) - min(b_src, b_clean)


def portable_summary(nodes: Iterable[DmlNode]) -> dict[str, Any]:
    """How the portable output writes the lowered sites: how many are one Trilu / EyeLike (one
    DIAGONAL_MATRIX1 / DIAGONAL_MATRIX on onnxruntime's DML provider, `triangular` in WebNN), and
    what each other form is (`io.portable.form`); per site, its standard nodes: the mask part and
    the whole site with the select applying it (`io.portable.MASK` says which are which)."""
    written = [n for n in nodes if n.portable_form is not None]
    forms = Counter(n.portable_form for n in written)
    counted = [(n, n.portable_nodes) for n in written if n.portable_nodes is not None]
    per_site = [{"output": n.outputs[0].name, "form": n.portable_form, "mask_nodes": c[0], "site_nodes": c[1]}
                for n, c in counted]
    return {"sites": sum(forms.values()), "one_operator": sum(c for f, c in forms.items() if f in ONE_OPERATOR),
            "forms": dict(forms.most_common()),
            "mask_nodes": _histogram(c[0] for _, c in counted), "site_nodes": _histogram(c[1] for _, c in counted),
            "per_site": per_site}


def _histogram(counts: Iterable[int]) -> dict[str, int]:
    """{"3": sites with 3 nodes, ...}, fewest first (string keys: the JSON's)."""
    return {str(k): v for k, v in sorted(Counter(counts).items())}


def _op(dml: object) -> str | None:
    return getattr(dml, "op_type", None) if dml is not None else None


def clean(model: onnx.ModelProto) -> bool:
    """onnx-ir's common-subexpression and unused-node passes on `model` (`dmlgraph.io.cleanup`)."""
    from dmlgraph.io.cleanup import cleanup
    return cleanup(model)


def stamp(model: onnx.ModelProto, target: str, options: Options, counts: dict[str, int],
          source: onnx.ModelProto | None = None) -> None:
    """Provenance in the model's metadata_props (Netron shows them): dmlgraph's version, the
    target, the feature level, exactness and the rewrites per rule (replacing an earlier stamp,
    unless this run rewrote nothing in a model made for the same target)."""
    old = {p.key: p.value for p in model.metadata_props if p.key.startswith(STAMP)}
    if old.get(f"{STAMP}target") == target and (not any(counts.values()) or
                                               (source is not None and model.graph == source.graph)):
        # A model this target made, given back as it was (the portable target's Trilus are found
        # and written again the same): its stamp still names the run that made it.
        return
    props = [(p.key, p.value) for p in model.metadata_props if not p.key.startswith(STAMP)]
    props += [(f"{STAMP}version", __version__), (f"{STAMP}target", target),
              (f"{STAMP}feature_level", options.feature_level.label),
              (f"{STAMP}exact_only", "1" if options.exact_only else "0"),
              (f"{STAMP}rewrites", json.dumps({k: v for k, v in sorted(counts.items()) if v},
                                              separators=(",", ":")))]
    del model.metadata_props[:]
    for k, v in props:
        model.metadata_props.add(key=k, value=v)


def stamped_rewrites(model: onnx.ModelProto) -> dict[str, int]:
    """The rewrites per rule `stamp` recorded in a model dmlgraph wrote ({} for any other model)."""
    text = next((p.value for p in model.metadata_props if p.key == f"{STAMP}rewrites"), None)
    try:
        counts = json.loads(text) if text else {}
    except ValueError:
        return {}
    ok = isinstance(counts, dict) and all(isinstance(k, str) and type(v) is int for k, v in counts.items())
    return counts if ok else {}


def _check_output(model: onnx.ModelProto, source: onnx.ModelProto, label: str, target: str,
                  base_dir: str | None, taken: bool) -> bytes | None:
    """The model to be written must pass the full ONNX check (returns what `check_for_save` does),
    unless the source fails it too: a source the loader `taken` though onnx's checker refuses it
    (onnxruntime loads it) is followed by an output no worse than it (`worse_than_source`); one
    that passed the checker and fails strict inference is the user's to fix (ModelError, exit 2).
    Anything else is our rewrite's fault (InternalError)."""
    try:
        return check_for_save(model)
    except InternalError as e:
        failure = full_check_failure(source)
        if failure is None:
            raise e
        if not taken:  # (strict inference refuses what the loader's checker passed: the user's to fix)
            raise ModelError(f"{label} fails the ONNX checker's full check (strict shape and type inference): "
                             f"{failure.splitlines()[0]}", hint="fix the model (re-export it); run and inspect "
                             "do not need the full check") from None
        worse = worse_than_source(model, source, target, base_dir)
        if worse is not None:
            raise InternalError(f"the model to be written {worse}; nothing was written") from None
        return None


def worse_than_source(model: onnx.ModelProto, source: onnx.ModelProto, target: str,
                      base_dir: str | None) -> str | None:
    """How `model` (the lowering of `source`, which fails onnx's full check) is worse than the
    source, or None: it must pass onnx's checker if the source does, else fail it no differently
    (the checker reports the first problem it meets, the source's unless a rewrite made a new
    one), and on the portable target load in onnxruntime if the source does."""
    failure = checker_failure(without_weights(model, keep_dims=False))
    if failure is not None and failure != checker_failure(without_weights(source, keep_dims=False)):
        return f"fails onnx's checker ({failure})"
    if target == "onnx" and onnxruntime_refuses(source, base_dir) is None:
        refused = onnxruntime_refuses(model, base_dir)
        if refused is not None:
            return f"does not load in onnxruntime ({refused}), though its input does"
    return None


def _dml_summary(m: Match) -> dict | None:
    dml = m.dml
    if dml is None:
        return None
    return {"op": dml.kind, "begin": dml.begin, "end": dml.end, "value": np.asarray(dml.value).item(),
            "has_input": dml.inputs[0] is not None, "runtime_k": dml.inputs[2] is not None}


# ---- running and validation ------------------------------------------------------------------
def parse_dims(items: Iterable[str] | None) -> dict[str, int]:
    dims = {}
    for item in items or ():
        name, sep, size = item.partition("=")
        if not sep or not size.strip().isdigit() or not name.strip():
            raise DmlgraphError(f"--dim {item!r} is not NAME=SIZE", hint="for example --dim sequence=16")
        dims[name.strip()] = int(size)
    return dims


# Generated inputs are refused above this many bytes in total (and any tensor above DirectML's
# 2^32 - 1 elements), before anything is allocated: a declared [70000, 70000] float32 input would
# otherwise ask numpy for 18 GiB. Real inputs (--inputs) are not limited.
MAX_GENERATED_INPUT_BYTES = 1 << 30
MAX_TENSOR_ELEMENTS = 2**32 - 1


def _dim_size(name: str, dims: Mapping[str, int], default_dim: int) -> int:
    """A symbolic dim's size: `dims[name]`, else for a sum the exporter named ("past_sequence +
    sequence", as torch writes a KV-cache model's attention_mask length) the sum of its terms'
    sizes, else `default_dim`."""
    if name in dims:
        return int(dims[name])
    terms = [t.strip() for t in name.split("+")]
    if len(terms) > 1 and all(t.isdigit() or t.isidentifier() for t in terms):
        return sum(int(t) if t.isdigit() else int(dims.get(t, default_dim)) for t in terms)
    return default_dim


def make_inputs(g: Graph, dims: dict[str, int] | None = None, seed: int = 0, default_dim: int = 4,
                max_bytes: int = MAX_GENERATED_INPUT_BYTES) -> dict:
    """Random inputs from the graph's input types; symbolic dims from `dims` (else `default_dim`;
    a dim named as a sum, "past_sequence + sequence", is the sum of its terms').

    Shapes are checked before any allocation: negative dims, a tensor of more than 2^32 - 1 elements
    or more than `max_bytes` in all are refused with a DmlgraphError.
    """
    dims = dims or {}
    for name, size in dims.items():
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise DmlgraphError(f"dim {name!r} = {size!r} is not a size", hint="give each symbolic dim an int >= 0")
    known = sorted({d for v in g.inputs for d in (v.shape or ()) if isinstance(d, str) and d})
    unknown = sorted(set(dims) - set(known))
    if unknown:
        raise DmlgraphError(f"dim {unknown[0]!r}: the model's inputs have no dim of that name",
                            hint=f"its dim names are: {', '.join(known)}" if known else
                            "its inputs have no named (symbolic) dims")
    hint = "give symbolic dims smaller sizes with --dim NAME=SIZE, or pass real inputs with --inputs IN.npz"
    plan = []
    total = 0
    for v in g.inputs:
        if v.elem_type is None or v.shape is None:
            raise DmlgraphError(f"input {v.name!r} has no known type or shape",
                                hint="pass real inputs with --inputs IN.npz")
        shape = tuple(d if isinstance(d, int) else _dim_size(d, dims, default_dim) if d else default_dim
                      for d in v.shape)
        if any(d < 0 for d in shape):
            raise DmlgraphError(f"input {v.name!r} has a negative dimension in its shape {list(shape)}",
                                hint="the model is corrupt; re-export it, or pass real inputs with --inputs")
        try:
            dt = numpy_dtype(v.elem_type)
        except Exception:  # noqa: BLE001 - an unknown or non-numeric ONNX type
            raise DmlgraphError(f"cannot generate values for input {v.name!r} of ONNX type {v.elem_type}",
                                hint="pass real inputs with --inputs IN.npz") from None
        if dt.kind not in "biuf":
            raise DmlgraphError(f"cannot generate values for input {v.name!r} of type {dt}",
                                hint="pass real inputs with --inputs IN.npz")
        n = 1
        for d in shape:
            n *= d
        if n > MAX_TENSOR_ELEMENTS:
            raise DmlgraphError(f"input {v.name!r} would have shape {list(shape)}: {n} elements, more than "
                                f"a tensor can hold (2^32 - 1); refusing to generate it", hint=hint)
        total += n * dt.itemsize
        plan.append((v.name, shape, dt))
    if total > max_bytes:
        raise DmlgraphError(f"generated inputs would take {total / 2**30:.2f} GiB "
                            f"({', '.join(f'{name} {list(shape)}' for name, shape, _ in plan)}); the limit "
                            f"for generated inputs is {max_bytes / 2**30:.3g} GiB", hint=hint)
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape, dt in plan:
        if dt == np.bool_:
            arr = np.asarray(rng.random(shape) < 0.5)  # (a 0-d comparison gives a numpy scalar)
        elif np.issubdtype(dt, np.integer):
            arr = rng.integers(0, 4, shape).astype(dt)
        else:
            arr = rng.standard_normal(shape).astype(dt)
        feeds[name] = arr
    return feeds


def check_feeds(g: Graph, feeds: dict) -> None:
    """User-supplied inputs must match the graph: names, dtypes, ranks, static and symbolic sizes.

    Checked up front so a wrong file gets a message naming the input, instead of whatever the
    first kernel that reads it says (or does).
    """
    names = [v.name for v in g.inputs]
    hint = f"the model's inputs are {', '.join(names) or '(none)'}"
    if g.overridable_inputs:
        hint += f"; these initializers may be fed too: {', '.join(g.overridable_inputs)}"
    unknown = sorted(set(feeds) - set(names) - set(g.overridable_inputs))
    if unknown:
        raise DmlgraphError(f"the inputs have names the model does not take: {', '.join(unknown)}", hint=hint)
    missing = [n for n in names if n not in feeds]
    if missing:
        raise DmlgraphError(f"missing inputs: {', '.join(missing)}", hint=hint)
    want: np.dtype[Any] | None
    for name in g.overridable_inputs:  # a default the model lets callers replace: same type and shape
        v = g.initializers[name]
        assert v.elem_type is not None and v.shape is not None, "import sets an initializer's type and shape"
        if name in feeds:
            arr, want = np.asarray(feeds[name]), numpy_dtype(v.elem_type)
            if arr.dtype != want or tuple(arr.shape) != tuple(v.shape):
                raise DmlgraphError(f"input {name!r} is {arr.dtype} {list(arr.shape)}; the model declares it "
                                    f"{want} {list(v.shape)} (an initializer it lets callers replace)")
    for v in g.inputs:
        arr = feeds[v.name]
        if v.elem_type:
            try:
                want = numpy_dtype(v.elem_type)
            except Exception:  # noqa: BLE001 - a type numpy cannot name: leave it to the runtime
                want = None
            if want is not None and arr.dtype != want:
                raise DmlgraphError(f"input {v.name!r} is {arr.dtype}, the model declares {want}",
                                    hint=f"convert it, e.g. arr.astype(numpy.{want})")
        if v.shape is None:
            continue
        if arr.ndim != len(v.shape):
            raise DmlgraphError(f"input {v.name!r} has rank {arr.ndim} (shape {list(arr.shape)}), the model "
                                f"declares rank {len(v.shape)} ({list(v.shape)})")
        for axis, (d, got) in enumerate(zip(v.shape, arr.shape)):
            if isinstance(d, int) and d != got:
                raise DmlgraphError(f"input {v.name!r} has shape {list(arr.shape)}, the model declares "
                                    f"{list(v.shape)} (axis {axis} must be {d})")


def load_inputs(path: str) -> dict[str, np.ndarray]:
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        if not magic.startswith(b"PK"):  # (numpy.load would call anything else pickled data)
            what = "a single array (.npy)" if magic == b"\x93NUMPY" else "not an .npz archive"
            raise DmlgraphError(f"cannot read inputs {path}: it is {what}",
                                hint="write one array per graph input, by name: numpy.savez(path, **arrays)")
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise DmlgraphError(f"inputs file {path} does not exist") from None
    except DmlgraphError:
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable npz is the same user error
        raise DmlgraphError(f"cannot read inputs {path}: {e}", hint="give an .npz made by numpy.savez") from None


@contextlib.contextmanager
def generated_inputs_hint(g: Graph, dims: Mapping[str, int] | None) -> Iterator[None]:
    """A run on generated inputs that onnxruntime refuses (dims that must agree, a head size the
    model leaves symbolic) gets a hint saying the inputs were made up and how to set them."""
    try:
        yield
    except DmlgraphError as e:
        if e.hint is None and str(e).startswith(("onnxruntime failed", "onnx.reference failed")):
            names = sorted({d for v in g.inputs for d in (v.shape or ()) if isinstance(d, str) and d} - set(dims or {}))
            e.hint = ("the inputs were generated, every symbolic dim 4 unless set" +
                      (f" ({', '.join(names)})" if names else "") +
                      "; set sizes that fit the model with --dim NAME=SIZE, or pass real inputs with --inputs IN.npz")
        raise


def check_threads(threads: object) -> None:
    """onnxruntime's intra-op thread count as the API takes it: None (its default) or an int >= 1."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer))
                                or threads < 1):
        raise DmlgraphError(f"threads={threads!r} is not a thread count",
                            hint="pass an int >= 1, or None for onnxruntime's default")


def run_graph(g: Graph, feeds: dict, threads: int | None = None) -> dict[str, np.ndarray]:
    from dmlgraph.runtime.executor import Executor  # (the executor's kernels: not for optimize)
    check_threads(threads)
    check_feeds(g, feeds)
    return Executor(g, threads).run(apply_overrides(g, feeds))


def apply_overrides(g: Graph, feeds: dict) -> dict:
    """The feeds of `g.inputs`; a fed initializer that is also a graph input (a default the model
    lets callers replace, as ONNX allows) replaces its value in `g`."""
    rest = dict(feeds)
    for name in g.overridable_inputs:
        if name in rest:
            v = g.initializers[name]
            v.initializer, v.array = None, np.asarray(rest.pop(name))
    return rest


def check_output_path(path: str, model_path: str | None = None, what: str = "the outputs") -> None:
    """Refuse an output path whose folder is missing, that names a folder or is not a regular
    file, character device or FIFO (`saving.output_target`), or that is the model."""
    out, through = output_target(path, what)
    folder = os.path.dirname(out)
    if not os.path.isdir(folder):
        raise DmlgraphError(f"cannot write {path}: the folder {folder} does not exist",
                            hint="create the folder first or choose another output path")
    if model_path is not None and os.path.exists(out) and os.path.exists(model_path) \
            and os.path.samefile(out, model_path):
        raise DmlgraphError(f"refusing to overwrite the input model {model_path} with {what}",
                            hint="choose a different output path")
    if (not through and not os.access(folder, os.W_OK)) or (os.path.exists(out) and not os.access(out, os.W_OK)):
        raise DmlgraphError(f"cannot write {path}: permission denied", hint="choose a writable output path")


def save_outputs(outputs: dict[str, np.ndarray], path: str, model_path: str | None = None) -> None:
    """Write outputs as an .npz at exactly `path`, atomically (temp file beside it, then rename).

    On any failure nothing is left behind and an existing file at `path` is untouched. Refuses a
    missing folder, a directory, and the model file itself.
    """
    check_output_path(path, model_path)
    with atomic_writer(path) as f:
        np.savez(f, **outputs)  # type: ignore[arg-type]  # (numpy's stub misreads **kwds)  # a file object: numpy appends no .npz suffix


# Float outputs downstream of a rewrite may differ in the last bits: onnxruntime's reductions
# (LayerNorm, Softmax) take other SIMD paths when the graph runs as several sessions. The rewrites
# themselves are checked bit for bit on the tensors they produce; outputs get this tolerance.
OUTPUT_RTOL, OUTPUT_ATOL = 1e-5, 1e-6


def _compare_one(name: str, e: np.ndarray, g: np.ndarray | None, exact: bool, tolerance: bool) -> dict:
    e = np.asarray(e)
    row = {"name": name, "shape": list(e.shape), "dtype": str(e.dtype)}
    if g is None:
        return row | {"match": False, "detail": "missing from the lowered model"}
    g = np.asarray(g)
    if bitwise_equal(e, g):
        return row | {"match": True, "detail": "bit-exact"}
    if e.shape != g.shape or e.dtype != g.dtype:
        return row | {"match": False, "detail": f"shape/dtype differ: {list(g.shape)} {g.dtype}"}
    if not exact and np.array_equal(e, g, equal_nan=e.dtype.kind == "f"):
        return row | {"match": True, "detail": "equal values (signed zeros or NaN payloads differ)"}
    if tolerance and e.dtype.kind == "f" and np.allclose(g, e, rtol=OUTPUT_RTOL, atol=OUTPUT_ATOL, equal_nan=True):
        err = float(np.nanmax(np.abs(g.astype(np.float64) - e)))
        return row | {"match": True, "detail": f"within rtol {OUTPUT_RTOL:g} (max abs diff {err:.3g})"}
    return row | {"match": False, "detail": f"{int(np.sum(e != g))} of {e.size} elements differ"}


@dataclass(frozen=True)
class TensorCheck:
    """One compared tensor: a rewritten one (compared bit for bit, or as values for a rule that
    is equal only for finite inputs) or a model output (bit-exact or within tolerance)."""

    name: str
    match: bool
    detail: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class ValidationResult:
    """`ok` when every rewritten tensor and every output matched; the rows say how.

    Attributes: `ok`; `tensors` (a `TensorCheck` per tensor a DML node of the lowered model
    produced, compared with the same tensor of the original); `outputs` (one per model output);
    `exact` (every rewrite in the lowered model is bit-exact: its tensors are compared bit for bit;
    outputs match bit for bit or within OUTPUT_RTOL); `inputs` (the
    feeds both models ran on, given or generated); `report` (the `dmlgraph validate --json` document).
    """

    ok: bool
    tensors: list[TensorCheck]
    outputs: list[TensorCheck]
    exact: bool  # every rewrite in the lowered model is bit-exact
    inputs: dict[str, np.ndarray] = field(repr=False)
    report: dict[str, Any] = field(default_factory=dict, repr=False)  # the `dmlgraph validate --json` document


def validate(original: ModelLike, lowered: ModelLike | OptimizeResult | None = None,
             inputs: Mapping[str, npt.ArrayLike] | None = None, *, dims: Mapping[str, int] | None = None,
             seed: int = 0, options: Options | None = None, threads: int | None = None) -> ValidationResult:
    """Run `original` and its lowered form on the same inputs (`inputs`, else random ones with
    symbolic dims from `dims`) and compare each rewritten tensor and each output; onnxruntime runs
    `threads` intra-op threads (None: its default).

    Without `lowered`, `original` is lowered in memory with `options`. Every rewritten tensor keeps
    its name, so each DML node's output is compared with the same tensor of the original: bit for
    bit for exact rules, as values for the rules only equal for finite inputs. Model outputs must
    match bit-exactly or within OUTPUT_RTOL. onnxruntime's graph optimizations are off on both sides.
    """
    check_threads(threads)
    original = as_model(original)
    _, g_original = load(original)
    if inputs is not None:
        feeds = as_feeds(g_original, inputs)
        check_feeds(g_original, feeds)
    else:
        feeds = make_inputs(g_original, dict(dims or {}), seed)
    generated = generated_inputs_hint(g_original, dims) if inputs is None else contextlib.nullcontext()
    counts: dict[str, int] = {}
    nested_exact = True
    if lowered is None:
        _, g_lowered = load(original)
        result = optimize_graph(g_lowered, options or Options())
        counts, nested_exact = result.counts, all(n.exact for n in nested_dml_nodes(result))
    else:
        lowered_proto, g_lowered = load(lowered.model if isinstance(lowered, OptimizeResult) else lowered)
        counts = lowered.counts if isinstance(lowered, OptimizeResult) else stamped_rewrites(lowered_proto)
    with generated:
        tensors, outputs, exact = compare_graphs(g_original, g_lowered, feeds, nested_exact, threads)
    ok = all(r["match"] for r in tensors + outputs)
    report = {"model": model_label(original), "inputs": {k: list(np.shape(v)) for k, v in feeds.items()},
              "rewrites": counts, "exact": exact, "tensors": tensors, "outputs": outputs, "ok": ok}
    return ValidationResult(ok, [_row(r) for r in tensors], [_row(r) for r in outputs], exact, feeds, report)


def _row(r: dict[str, Any]) -> TensorCheck:
    return TensorCheck(r["name"], bool(r["match"]), str(r["detail"]), tuple(r["shape"]), r["dtype"])


def compare_graphs(original: Graph, lowered: Graph, feeds: dict, nested_exact: bool = True,
                   threads: int | None = None) -> tuple[list[dict], list[dict], bool]:
    """Run both graphs on `feeds` and compare (rows for the rewritten tensors, rows for the model
    outputs, whether every rewrite was bit-exact; `nested_exact`: whether the DML nodes inside
    If/Loop/Scan bodies are). Both graphs get the rewritten tensors as extra outputs: use graphs
    made for this call."""
    from dmlgraph.runtime.executor import Executor
    dml = [n for n in lowered.nodes.values() if isinstance(n, DmlNode)]
    rewritten = [n.outputs[0].name for n in dml if n.outputs[0].name in original.values]
    output_names = [v.name for v in original.outputs]
    missing = [name for name in output_names if name not in lowered.values]
    if missing:
        raise DmlgraphError(f"the lowered model has no output {missing[0]!r} of the original",
                            hint="compare a model with the model it was lowered from")
    for g in (original, lowered):  # expose the rewritten tensors as extra outputs on both sides
        g.outputs = g.outputs + [g.values[name] for name in rewritten if not g.is_graph_output(g.values[name])]
    run_lowered = Executor(lowered, threads, optimize=False)
    # The original runs in the lowered model's sessions (its nodes where theirs are), so both round
    # alike where one hands a float16 value to the next: the rewrite is checked, not the cut.
    expected = Executor(original, threads, optimize=False, stages=run_lowered.value_stages()).run(
        apply_overrides(original, feeds))
    got = run_lowered.run(apply_overrides(lowered, feeds))
    exact = {n.outputs[0].name: n.exact for n in dml}
    # (a DML node inside a body is checked through the model outputs it reaches)
    all_exact = all(exact.values()) and nested_exact
    tensors = [_compare_one(name, expected[name], got.get(name), exact[name], False) for name in rewritten]
    outputs = [_compare_one(name, expected[name], got.get(name), all_exact, True) for name in output_names]
    return tensors, outputs, all_exact
