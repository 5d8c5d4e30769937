"""The Python API: optimize, inspect, run and validate a model given as a ModelProto or a path.

Each call reads the caller's model and never changes it, returns plain typed results, and leaves
the process as it found it (no gc pause, no rlimit, no child process, no signal handler: see
`dmlgraph.process` for the opt-in). Errors are `dmlgraph.DmlgraphError`s whose message says what
is wrong and whose `hint` says what to do.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from dmlgraph import pipeline
from dmlgraph.errors import DmlgraphError
from dmlgraph.io import saving
from dmlgraph.io.modelfile import without_weights
from dmlgraph.ir.ops import FeatureLevel
from dmlgraph.pipeline import ModelLike
from dmlgraph.rewrite import Options

TARGETS = ("dml", "onnx")


@dataclass(frozen=True)
class Rewrite:
    """One applied rewrite: the rule, the nodes it covered, the node it put in their place."""

    rule: str
    nodes: tuple[str, ...]
    op: str | None  # "DiagonalMatrix1", "DiagonalMatrix", or None for a rule that makes no DML node
    exact: bool  # bit-exact for every input (else: equal for finite inputs)


@dataclass(frozen=True)
class Decline:
    """A place a rule matched but did not rewrite, and why."""

    rule: str
    nodes: tuple[str, ...]
    initializers: tuple[str, ...]
    reason: str


@dataclass
class OptimizeResult:
    """What `optimize` made: the lowered model, its rewrites and declines, before/after totals."""

    model: onnx.ModelProto
    rewrites: list[Rewrite]
    declined: list[Decline]
    counts: dict[str, int]  # rewrites per rule (every rule listed)
    before: dict[str, Any]  # nodes, ops, initializers, initializer_bytes, constant_bytes, dml_nodes
    after: dict[str, Any]
    report: dict[str, Any] = field(repr=False)  # the `dmlgraph optimize --json` document
    source: str | None = None  # the input model's path (its folder holds any external data)
    original: onnx.ModelProto | None = field(default=None, repr=False)  # the input, as loaded
    checked_bytes: bytes | None = field(default=None, repr=False)  # `model` as `optimize` checked it, if kept

    def check(self) -> None:
        """onnx's checker with full_check on the model (weights left out); where the input model
        itself fails the full check (an exporter's inconsistent shapes), the output must pass the
        checks the input passes. Raises AssertionError: a failure is a bug in dmlgraph."""
        failure = _full_check_failure(self.model)
        if failure is None:
            return
        if self.original is None or _full_check_failure(self.original) is None:
            raise AssertionError(f"dmlgraph made a model that fails onnx's full check: {failure}")
        try:
            onnx.checker.check_model(without_weights(self.model, keep_dims=False), full_check=False)
        except Exception as e:
            raise AssertionError(f"dmlgraph made a model that fails onnx's checker: {e}") from e

    def save(self, path: str | os.PathLike[str], *, in_place: bool = False) -> int:
        """Write the model atomically after onnx's full check; returns the file's size in bytes.

        Refuses to replace the input model unless `in_place`. Weights the input kept as external
        data are copied from beside it. A model that serializes to the bytes `optimize` checked
        (one still as it made it) is not checked again.
        """
        out = os.fspath(path)
        base_dir = None if self.source is None else os.path.dirname(os.path.abspath(self.source))
        saving.save_model(self.model, out, input_path=self.source, in_place=in_place, base_dir=base_dir,
                          check=self._check_unless_checked)
        return os.path.getsize(out)

    def _check_unless_checked(self, data: bytes | None) -> None:
        """`check`, unless `data` (the bytes the save writes) are the bytes `optimize` checked."""
        if data is None or data != self.checked_bytes:
            self.check()

    def to_json(self) -> str:
        return json.dumps(self.report, indent=2, sort_keys=True, default=str)


def _full_check_failure(model: onnx.ModelProto) -> str | None:
    """What onnx.checker with full_check (strict shape inference) says about the model without
    its weights; None when it passes."""
    try:
        onnx.checker.check_model(without_weights(model, keep_dims=True), full_check=True)
    except Exception as e:  # noqa: BLE001 - checker and inference raise several types; all mean "fails"
        return str(e).strip() or type(e).__name__
    return None


def options(*, exact: bool = False, feature_level: str | FeatureLevel = "5_1",
            min_mask_bytes: int | None = None, allow_growth: bool = False) -> Options:
    """The rule options from keyword arguments (a feature level as "5_1", "4_0", ...)."""
    level = feature_level if isinstance(feature_level, FeatureLevel) else FeatureLevel.parse(feature_level)
    if min_mask_bytes is not None and min_mask_bytes < 0:
        raise DmlgraphError(f"min_mask_bytes {min_mask_bytes} is negative", hint="pass 0 or more, or None")
    return Options(feature_level=level, exact_only=exact, min_mask_bytes=min_mask_bytes, allow_growth=allow_growth)


def optimize(model: ModelLike, *, target: str = "dml", exact: bool = False, feature_level: str = "5_1",
             min_mask_bytes: int | None = None, progress: Callable[[str], None] | None = None,
             allow_growth: bool = False) -> OptimizeResult:
    """Lower every diagonal-structured computation of `model` (a ModelProto or a path).

    target "dml" writes com.dmlgraph DiagonalMatrix1 nodes; "onnx" expands them into standard ops.
    exact: only bit-exact rewrites. feature_level: the DirectML level to target ("5_1" has
    DIAGONAL_MATRIX1; below it, EyeLike becomes DIAGONAL_MATRIX where that level allows).
    `model` is not modified. A lowering that would make the model bigger on `target` (more nodes,
    or more bytes than its provenance metadata) is declined, every site with the numbers, and the
    input is given back (cleaned) unless `allow_growth`.
    """
    if target not in TARGETS:
        raise DmlgraphError(f"unknown target {target!r}", hint="use target='dml' or target='onnx'")
    opts = options(exact=exact, feature_level=feature_level, min_mask_bytes=min_mask_bytes,
                   allow_growth=allow_growth)
    result = pipeline.optimize(model, opts, target, progress)
    assert result.model is not None
    rewrites = [Rewrite(m.rule, tuple(n.name for n in m.nodes), _op(m.captures.get("dml")),
                        bool(getattr(m.captures.get("dml"), "exact", True)))
                for m in result.passes.applied]
    declined = [Decline(m.rule, tuple(n.name for n in m.nodes), tuple(m.initializers), m.reason or "")
                for m in result.passes.declined]
    source = None if isinstance(model, onnx.ModelProto) else os.fspath(model)
    return OptimizeResult(result.model, rewrites, declined, dict(result.passes.counts), result.before,
                          result.after, result.report, source, result.source_model, result.serialized)


def _op(dml: object) -> str | None:
    return getattr(dml, "op_type", None) if dml is not None else None


@dataclass
class Inspection:
    """What `inspect` found: candidates (what would lower, and what it saves), declines, totals."""

    report: dict[str, Any] = field(repr=False)

    @property
    def candidates(self) -> list[dict[str, Any]]:
        return list(self.report["candidates"])

    @property
    def declined(self) -> list[dict[str, Any]]:
        return list(self.report["declined"])

    @property
    def totals(self) -> dict[str, Any]:
        return dict(self.report["totals"])

    def to_json(self) -> str:
        """The `dmlgraph inspect --json` document (schema: docs/inspect.md)."""
        return json.dumps(self.report, indent=2, sort_keys=True)


def inspect(model: ModelLike, *, target: str = "dml", exact: bool = False, feature_level: str = "5_1",
            top: int = 10) -> Inspection:
    """What is in `model`, what would lower and what it saves, and why the rest does not."""
    from dmlgraph.inspection import analyze
    opts = options(exact=exact, feature_level=feature_level)
    return Inspection(analyze(model, opts, top, target).report)


def run(model: ModelLike, inputs: Mapping[str, np.ndarray], *, threads: int | None = None) -> dict[str, np.ndarray]:
    """Run `model` (original or lowered: DML nodes run on the reference kernels) on `inputs`,
    keyed by graph input name; returns the outputs by name. Inputs are checked (names, dtypes,
    shapes) before anything runs."""
    _, g = pipeline.load(model)
    return pipeline.run_graph(g, dict(inputs), threads)


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
    """`ok` when every rewritten tensor and every output matched; the rows say how."""

    ok: bool
    tensors: list[TensorCheck]
    outputs: list[TensorCheck]
    exact: bool  # every rewrite in the lowered model is bit-exact
    inputs: dict[str, np.ndarray] = field(repr=False)


def validate(original: ModelLike, lowered: ModelLike | OptimizeResult,
             inputs: Mapping[str, np.ndarray] | None = None, *, dims: Mapping[str, int] | None = None,
             seed: int = 0) -> ValidationResult:
    """Run `original` and `lowered` on the same inputs (`inputs`, else random ones with symbolic
    dims from `dims`) and compare each rewritten tensor and each output."""
    _, g_original = pipeline.load(original)
    lowered_model = lowered.model if isinstance(lowered, OptimizeResult) else lowered
    _, g_lowered = pipeline.load(lowered_model)
    if inputs is not None:
        feeds = dict(inputs)
        pipeline.check_feeds(g_original, feeds)
    else:
        feeds = pipeline.make_inputs(g_original, dict(dims or {}), seed)
    tensors, outputs, exact = pipeline.compare_graphs(g_original, g_lowered, feeds)
    return ValidationResult(all(r["match"] for r in tensors + outputs), [_row(r) for r in tensors],
                            [_row(r) for r in outputs], exact, feeds)


def _row(r: dict[str, Any]) -> TensorCheck:
    return TensorCheck(r["name"], bool(r["match"]), str(r["detail"]), tuple(r["shape"]), r["dtype"])
