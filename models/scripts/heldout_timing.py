"""Portable run time of held-out exports: the `onnx` output against the original in onnxruntime.

Run (project venv): .venv/bin/python models/scripts/heldout_timing.py DIR MODEL... [--rounds N] [--json FILE]
CPU provider, default graph optimizations, one thread; per saved input set, interleaved rounds of
20 runs of each model (CPU time, the order alternating), the median of the per-round ratios.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

SETS = ("prefill_past", "decode", "long", "left_padded", "seq5", "b2", "r16c16")


def _session(path: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def ratios(src: str, out: str, inputs: str, rounds: int) -> dict[str, float]:
    a, b = _session(src), _session(out)
    names = {i.name for i in a.get_inputs()}
    found = {}
    for npz in sorted(glob.glob(os.path.join(inputs, "*.npz"))):
        set_name = os.path.basename(npz)[:-4]
        if set_name not in SETS:
            continue
        feeds = {k: v for k, v in np.load(npz).items() if k in names}
        per_round = []
        for r in range(rounds):
            took = {}
            for s in ((b, a) if r % 2 == 0 else (a, b)):
                s.run(None, feeds)
                t0 = time.process_time()
                for _ in range(20):
                    s.run(None, feeds)
                took[id(s)] = time.process_time() - t0
            per_round.append(took[id(b)] / took[id(a)])
        found[set_name] = round(float(np.median(per_round)), 3)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            src, out = os.path.join(args.dir, name + ".onnx"), os.path.join(tmp, name + ".onnx")
            subprocess.run([sys.executable, "-m", "dmlgraph", "optimize", src, "-o", out, "--target", "onnx"],
                           check=True, capture_output=True)
            for set_name, r in ratios(src, out, os.path.join(args.dir, "inputs", name), args.rounds).items():
                res[f"{name}/{set_name}"] = r
                print(f"{name} {set_name} {r}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
