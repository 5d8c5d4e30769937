"""How long dmlgraph takes on a model, against onnxruntime's session creation on the same file.

Run (project venv): .venv/bin/python models/scripts/optimize_timing.py DIR MODEL... [--rounds 3] [--json FILE]

Per model, `rounds` interleaved rounds (side by side, in one process, after one warm-up round), each
timing wall seconds of: `onnxruntime.InferenceSession` (CPU provider, default graph optimizations;
the baseline), `dmlgraph.inspect` (target onnx), `dmlgraph.optimize` on `onnx` and on `dml` (each
with its save to a temporary file); and in fresh processes (docs/benchmarks.md's goal) `python -m
dmlgraph optimize --target onnx` against a process that only creates the session. Reported: the
median per step, and its ratio to its baseline's median (in-process steps to the session, the CLI
to the loading process). Also the census per model (lowered / declined / missed), to count the
masks per layer.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import onnxruntime as ort

import dmlgraph

ORT_LOAD = "import onnxruntime as o, sys; o.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])"


def _steps(path: str, tmp: str) -> dict[str, object]:
    out = os.path.join(tmp, "cli.onnx")
    return {
        "ort_session": lambda: ort.InferenceSession(path, providers=["CPUExecutionProvider"]),
        # fresh processes, as docs/benchmarks.md's goal: the CLI against a process that loads the model
        "ort_process": lambda: subprocess.run([sys.executable, "-c", ORT_LOAD, path], check=True),
        "cli_optimize_onnx": lambda: subprocess.run([sys.executable, "-m", "dmlgraph", "optimize", path, "-o", out,
                                                     "--target", "onnx"], check=True, capture_output=True),
        "inspect": lambda: dmlgraph.inspect(path, target="onnx"),
        "optimize_onnx": lambda: dmlgraph.optimize(path, target="onnx").save(os.path.join(tmp, "o.onnx")),
        "optimize_dml": lambda: dmlgraph.optimize(path, target="dml").save(os.path.join(tmp, "d.onnx")),
    }


def time_model(path: str, rounds: int) -> dict[str, object]:
    seconds: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        steps = _steps(path, tmp)
        for r in range(rounds + 1):
            for name, step in steps.items():
                t0 = time.perf_counter()
                step()
                if r:  # (round 0 warms the imports and caches up)
                    seconds.setdefault(name, []).append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    masks = dmlgraph.inspect(path, target="onnx").report["masks"]
    base = {k: med["ort_process" if k.startswith(("ort_process", "cli_")) else "ort_session"] for k in med}
    return {"median_s": med, "ratio_to_ort": {k: v / base[k] for k, v in med.items()},
            "all_s": seconds, "census": dict(collections.Counter(m["status"] for m in masks))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    found = {}
    for name in args.models:
        found[name] = r = time_model(os.path.join(args.dir, name + ".onnx"), args.rounds)
        med, ratio = r["median_s"], r["ratio_to_ort"]
        print(f"{name}: " + ", ".join(f"{k} {med[k]:.2f}s ({ratio[k]:.1f}x)" for k in med)
              + f", census {r['census']}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(found, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
