"""`dmlgraph optimize DIR -o OUTDIR --jobs N`: a folder of models, optimized by a process pool.

Each model is optimized and saved in a worker process, so one model that fails (a bad file, an
internal error, a worker killed by the OOM killer) costs that model only: the rest go on, and the
summary lists what failed and why. Outputs keep each model's path relative to DIR.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from typing import Any

from dmlgraph.errors import DmlgraphError


@dataclass
class ModelOutcome:
    """What happened to one model of the batch."""

    model: str
    output: str
    ok: bool
    seconds: float = 0.0
    rewrites: dict[str, int] = field(default_factory=dict)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BatchOptions:
    target: str = "dml"
    exact: bool = False
    feature_level: str = "5_1"
    allow_growth: bool = False


def find_models(folder: str, out_folder: str) -> list[str]:
    """Every .onnx file under `folder` (sorted), except those under `out_folder`."""
    out_real = os.path.realpath(out_folder)
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if os.path.realpath(os.path.join(root, d)) != out_real)
        found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".onnx")]
    return found


def optimize_one(model: str, output: str, options: BatchOptions) -> ModelOutcome:
    """Optimize and save one model (in a worker); failures become the outcome's error."""
    from dmlgraph import api
    from dmlgraph.process import process_wide
    start = time.perf_counter()
    try:
        with process_wide():
            os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
            result = api.optimize(model, target=options.target, exact=options.exact,
                                  feature_level=options.feature_level, allow_growth=options.allow_growth)
            result.save(output)
    except DmlgraphError as e:
        return ModelOutcome(model, output, False, time.perf_counter() - start,
                            error=str(e).replace("\n", " "))
    except Exception as e:  # noqa: BLE001 - one model's bug must not stop the batch; reported as a bug
        return ModelOutcome(model, output, False, time.perf_counter() - start,
                            error=f"internal error: {type(e).__name__}: {e} (a bug in dmlgraph; rerun this "
                                  "model alone with --debug)")
    return ModelOutcome(model, output, True, time.perf_counter() - start, dict(result.counts),
                        _totals(result.before), _totals(result.after))


def _totals(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: stats[k] for k in ("nodes", "initializers", "initializer_bytes", "dml_nodes") if k in stats}


def run_batch(folder: str, out_folder: str, options: BatchOptions, jobs: int,
              report: Callable[[ModelOutcome, int, int], None] | None = None) -> list[ModelOutcome]:
    """Optimize every model under `folder` into `out_folder` with `jobs` worker processes.

    `report(outcome, done, total)` is called as each model finishes. A worker that dies takes
    the models it was running with it; each is tried once more alone before it counts as failed.
    """
    if not os.path.isdir(folder):
        raise DmlgraphError(f"{folder} is not a folder")
    if os.path.exists(out_folder) and not os.path.isdir(out_folder):
        raise DmlgraphError(f"cannot write into {out_folder}: it is a file", hint="pass a folder for -o")
    if os.path.realpath(out_folder) == os.path.realpath(folder):
        raise DmlgraphError(f"refusing to write the outputs over the inputs in {folder}",
                            hint="pass another folder for -o")
    models = find_models(folder, out_folder)
    if not models:
        raise DmlgraphError(f"the directory {folder} holds no .onnx files",
                            hint="pass a model file, or a directory of .onnx files")
    if not os.path.exists(out_folder) and out_folder.lower().endswith(".onnx"):
        raise DmlgraphError(f"{folder} is a folder, so -o names the folder to write its models into; "
                            f"{out_folder} looks like a model file", hint="pass a folder for -o")
    os.makedirs(out_folder, exist_ok=True)
    outputs = {m: os.path.join(out_folder, os.path.relpath(m, folder)) for m in models}
    outcomes: dict[str, ModelOutcome] = {}
    lost = _pool_pass(models, outputs, options, jobs, outcomes, report)
    for m in lost:  # alone this time: if it dies again, it was this model
        if _pool_pass([m], outputs, options, 1, outcomes, report):
            outcomes[m] = ModelOutcome(m, outputs[m], False, error="the worker process died (out of memory?)")
            if report:
                report(outcomes[m], len(outcomes), len(models))
    return [outcomes[m] for m in models]


def _pool_pass(models: list[str], outputs: dict[str, str], options: BatchOptions, jobs: int,
               outcomes: dict[str, ModelOutcome], report: Callable[[ModelOutcome, int, int], None] | None,
               ) -> list[str]:
    """One pool over `models`; returns the models whose worker died."""
    lost = []
    total = len(outcomes) + len(models)
    with ProcessPoolExecutor(max_workers=min(jobs, len(models))) as pool:
        futures: dict[Future[ModelOutcome], str] = {pool.submit(optimize_one, m, outputs[m], options): m
                                                    for m in models}
        for fut in as_completed(futures):
            m = futures[fut]
            try:
                outcomes[m] = fut.result()
            except BrokenProcessPool:
                lost.append(m)
                continue
            if report:
                report(outcomes[m], len(outcomes), total)
    return lost


def progress_line(stream: Any = None) -> Callable[[ModelOutcome, int, int], None]:
    """A one-line progress report, rewritten in place (for a terminal)."""
    out = stream or sys.stderr

    def show(outcome: ModelOutcome, done: int, total: int) -> None:
        mark = "ok" if outcome.ok else "FAILED"
        print(f"\r\033[K[{done}/{total}] {mark} {outcome.model}", end="" if done < total else "\n",
              file=out, flush=True)
    return show


def summary_text(outcomes: list[ModelOutcome]) -> str:
    """One line per model, then the totals."""
    lines = []
    for o in outcomes:
        if o.ok:
            rewrites = ", ".join(f"{k} x{v}" for k, v in o.rewrites.items() if v) or "no rewrites"
            lines.append(f"ok      {o.model} -> {o.output}: {rewrites}; nodes {o.before.get('nodes')} -> "
                         f"{o.after.get('nodes')} ({o.seconds:.1f}s)")
        else:
            lines.append(f"FAILED  {o.model}: {o.error}")
    failed = sum(not o.ok for o in outcomes)
    lines.append(f"optimized {len(outcomes) - failed} of {len(outcomes)} models"
                 + (f"; {failed} failed" if failed else ""))
    return "\n".join(lines)
