"""Measure dmlgraph on the model corpus: the table in the README.

Run: .venv/bin/python models/corpus_report.py [--json FILE]
For each model: nodes before/after, nodes covered by the mask rules, constant bytes (initializers
and Constant nodes) before/after, DIAGONAL_MATRIX1 nodes created, and `validate` against
onnxruntime at sequence lengths 7 and 12 (rewritten tensors bit-exact; outputs as validate says).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from dmlgraph import pipeline
from dmlgraph.rewrite import Options

HERE = os.path.dirname(os.path.abspath(__file__))


def measure(entry: dict) -> dict:
    path = os.path.join(HERE, entry["file"])
    result = pipeline.optimize(path, Options())
    covered = {n.id for m in result.passes.applied for n in m.nodes}
    dynamic = entry.get("dynamic_axes") or []
    checks = []
    for size in (7, 12) if dynamic else (None,):
        dims = {d: (2 if d == "batch" else size) for d in dynamic}
        report = pipeline.validate(path, dims=dims)
        checks.append(report["ok"])  # rewritten tensors bit-exact (or equal, for the finite-input rules)
    return {
        "model": entry["file"], "nodes_before": result.before["nodes"], "nodes_after": result.after["nodes"],
        "mask_nodes_removed": len(covered),
        "constant_bytes_before": result.before["constant_bytes"], "constant_bytes_after": result.after["constant_bytes"],
        "dml_nodes": result.after["dml_nodes"], "expected_bands": len(entry["masks"]),
        "validate": "pass" if all(checks) else "FAIL", "lengths": "7, 12" if dynamic else "static",
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    with open(os.path.join(HERE, "expected.json")) as f:
        entries = json.load(f)["models"]
    rows = [measure(e) for e in entries]
    head = "| model | nodes before -> after | mask nodes removed | constant bytes before -> after | DML1 nodes | validate (lengths) |"
    print(head)
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['nodes_before']} -> {r['nodes_after']} | {r['mask_nodes_removed']} | "
              f"{r['constant_bytes_before']:,} -> {r['constant_bytes_after']:,} | {r['dml_nodes']} | "
              f"{r['validate']} ({r['lengths']}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if all(r["validate"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
