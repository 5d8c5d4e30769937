"""The Python API: optimize, inspect, run and validate a model given as a ModelProto, a path or
its serialized bytes.

Each call reads the caller's model and never changes it, returns plain typed results, and leaves
the process as it found it (no gc pause, no rlimit, no child process, no signal handler: see
`dmlgraph.process` for the opt-in). Errors are `dmlgraph.DmlgraphError`s whose message says what
is wrong and whose `hint` says what to do.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dmlgraph import pipeline
from dmlgraph.inspection import analyze
from dmlgraph.ir.ops import FeatureLevel
from dmlgraph.pipeline import (
    Decline,
    ModelLike,
    OptimizeResult,
    Rewrite,
    TensorCheck,
    ValidationResult,
    make_options,
)

__all__ = ["Decline", "Inspection", "OptimizeResult", "Rewrite", "TensorCheck", "ValidationResult", "inspect",
           "optimize", "run", "validate"]


def optimize(model: ModelLike, *, target: str = "dml", exact: bool = False, feature_level: str | FeatureLevel = "5_1",
             min_mask_bytes: int | None = None, progress: Callable[[str], None] | None = None,
             allow_growth: bool = False) -> OptimizeResult:
    """Lower every diagonal-structured computation of `model` (a ModelProto, a path, or the bytes
    of a serialized model); `model` is not modified. Returns an `OptimizeResult` (`.model`,
    `.rewrites`, `.declined`, `.counts`, `.before` / `.after`; `.save(path)` writes it).

    target: "dml" writes com.dmlgraph DiagonalMatrix1 nodes; "onnx" expands them into standard ops.
    exact: only bit-exact rewrites. feature_level: the DirectML level to target ("5_1" has
    DIAGONAL_MATRIX1; below it, EyeLike becomes DIAGONAL_MATRIX where that level allows).
    min_mask_bytes: lower a stored mask only from this many bytes on (None: whenever its generator
    is smaller than it). progress: called with a short message per step (the CLI prints them on a
    terminal). allow_growth: keep a lowering even where it makes the model bigger on `target` (more
    nodes, or more bytes than its provenance metadata); by default each such site is declined with
    the numbers, the others kept.

    Raises `DmlgraphError` (`ModelError` for an unreadable or invalid model) with a `hint`.
    """
    opts = make_options(exact=exact, feature_level=feature_level, min_mask_bytes=min_mask_bytes,
                        allow_growth=allow_growth)
    return pipeline.lower(model, opts, target, progress)


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


def inspect(model: ModelLike, *, target: str = "dml", exact: bool = False, feature_level: str | FeatureLevel = "5_1",
            top: int = 10) -> Inspection:
    """What is in `model`, what would lower and what it saves, and why the rest does not; nothing
    is written. target, exact, feature_level: as `optimize` (the totals describe that target's
    output); top: how many of the largest initializers the report lists. Returns an `Inspection`
    (`.candidates`, `.declined`, `.totals`, `.report`, `.to_json()`: docs/inspect.md).

    Raises `DmlgraphError` (`ModelError` for an unreadable or invalid model) with a `hint`.
    """
    opts = make_options(exact=exact, feature_level=feature_level)
    return Inspection(analyze(model, opts, top, target).report)


def run(model: ModelLike, inputs: Mapping[str, npt.ArrayLike], *, threads: int | None = None) -> dict[str, np.ndarray]:
    """Run `model` (original or lowered: DML nodes run on the reference kernels) on `inputs`,
    keyed by graph input name; returns the outputs by name. Inputs are checked (names, dtypes,
    shapes) before anything runs; lists and other array-likes are converted to the input's dtype
    when their values fit it (`pipeline.as_feeds`). `threads`: onnxruntime's intra-op threads
    (None: onnxruntime's default, one per core).

    Raises `DmlgraphError` with a `hint` (bad inputs, a model onnxruntime refuses or fails on).
    """
    _, g = pipeline.load(model)
    return pipeline.run_graph(g, pipeline.as_feeds(g, inputs), threads)


def validate(original: ModelLike, lowered: ModelLike | OptimizeResult | None = None,
             inputs: Mapping[str, npt.ArrayLike] | None = None, *, dims: Mapping[str, int] | None = None,
             seed: int = 0, exact: bool = False, feature_level: str | FeatureLevel = "5_1",
             threads: int | None = None) -> ValidationResult:
    """Run `original` and `lowered` (default: `original` lowered in memory with `exact` and
    `feature_level`) on the same inputs (`inputs`, else random ones with symbolic dims from
    `dims` and `seed`) and compare each rewritten tensor and each output. `lowered` may be a model
    `optimize` wrote (a path, either target) or an `OptimizeResult`. `threads`: onnxruntime's
    intra-op threads for both models (None: onnxruntime's default, one per core). Returns a
    `ValidationResult`: `.ok`, and a `TensorCheck` per compared tensor in `.tensors` / `.outputs`.

    Raises `DmlgraphError` with a `hint` (bad inputs or dims, a model onnxruntime refuses, a
    `lowered` that is not a lowering of `original`); a mismatch is `ok=False`, not an error.
    """
    opts = make_options(exact=exact, feature_level=feature_level)
    return pipeline.validate(original, lowered, inputs, dims=dims, seed=seed, options=opts, threads=threads)
