"""`python -m benchmarks`: every suite in one run, then one table of every goal and whether it is met.

The kernel suite (`bench_kernels`: the DIAGONAL_MATRIX1 kernel against a copy of the same bytes
and onnxruntime, interleaved rounds in one process) and the pipeline suite (`bench_pipeline`:
optimizer rates and onnxscript across graph shapes, `dmlgraph optimize` against an onnxruntime
load in fresh processes, the executor, memory), the portable suite (`benchmarks.portable`: the
`--target onnx` output against the original in onnxruntime: time, outputs and memory) and the
size table (`benchmarks.size_table`: nodes and bytes on both targets; the last two are issue
25's goals) each print their full table; the goals table at the end is what the README shows.
Every figure is a median, every ratio one against a baseline measured side by side in the
same run.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks import kernels, pipeline, portable, size_table


@dataclass(frozen=True)
class Goal:
    """One line of the goals table (JSON keys: suite, goal, measured, target, met)."""
    suite: str
    goal: str
    measured: str
    target: str
    met: bool | None


def goals(kernel_rows: list[dict[str, Any]], pipeline_rows: list[pipeline.Row],
          portable_result: portable.Result | None = None, sizes: dict[str, Any] | None = None) -> list[Goal]:
    """The kernel suite's targets over all its rows, then every pipeline row that has a target, then
    the portable suite's targets and the size table's (issue 25) when they ran."""
    out = [Goal("kernels", t.goal, t.detail, t.target, t.met) for t in kernels.targets(kernel_rows)]
    for r in pipeline_rows:
        if not r.target:
            continue
        fmt = pipeline.format_number
        measured = f"{fmt(r.ours)} vs {fmt(r.baseline)} {r.unit}: {fmt(r.ratio)}x"
        if r.floor is not None and r.baseline:
            measured += f"; onnx floor {fmt(r.floor)} {r.unit}: {fmt(r.floor / r.baseline)}x"
        if r.ratio is None:
            measured = r.note or "not measured"
        out.append(Goal("pipeline", r.case, measured, r.target, r.met))
    if portable_result is not None:
        out += [Goal("portable", t.goal, t.detail, t.target, t.met) for t in portable.targets(portable_result)]
    if sizes is not None:
        out += [Goal("sizes", *row) for row in size_table.goal_rows(sizes)]
    return out


def format_goals(rows: list[Goal]) -> str:
    """The goals as a plain-text table, with a count of those met."""
    head = ("goal", "measured", "target", "met")
    body = [(g.goal, g.measured, g.target, "-" if g.met is None else ("yes" if g.met else "NO")) for g in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    judged = [g for g in rows if g.met is not None]
    lines.append(f"\n{sum(bool(g.met) for g in judged)} of {len(judged)} goals met"
                 + (f" ({len(rows) - len(judged)} not measured)" if len(judged) < len(rows) else ""))
    return "\n".join(lines)


def run(quick: bool = False, json_out: str | None = None, log: Callable[[str], None] = print) -> list[Goal]:
    """Run the kernel suite, then the pipeline suite, then print the goals table; write JSON if asked."""
    start = time.perf_counter()
    log("== kernels (progress on stderr) ==")
    kernel_rounds = 3 if quick else 7
    kernel_rows = kernels.run(quick=quick, rounds=kernel_rounds, log=log)
    log("\n== pipeline ==")
    pipeline_rows = pipeline.run(quick=quick, log=log)
    log("\n== portable output vs the original in onnxruntime ==")
    portable_result = portable.run(quick=quick, log=log)
    log("\n== sizes of both targets' outputs ==")
    size_paths = ([os.path.join(portable.MODELS, m + ".onnx") for m in portable.QUICK_MODELS] if quick else None)
    size_rows = size_table.run(log=log, paths=size_paths)
    sizes = size_table.summary(size_rows)
    result = goals(kernel_rows, pipeline_rows, portable_result, sizes)
    log(f"\n== goals ({time.perf_counter() - start:.0f} s in all) ==")
    log(format_goals(result))
    if json_out:
        document = {"suite": "all", "quick": quick, "python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "goals": [asdict(g) for g in result],
                    "kernels": kernels.payload(kernel_rows, kernel_rounds, quick),
                    "pipeline": pipeline.payload(pipeline_rows, quick),
                    "portable": portable.payload(portable_result, quick, portable.rounds_for(quick), False),
                    "sizes": {"rows": [asdict(r) for r in size_rows], "summary": sizes}}
        with open(json_out, "w") as f:
            json.dump(document, f, indent=1, default=str)
        log(f"wrote {json_out}")
    return result
