"""Measure dmlgraph on the KV-cache corpus: the table in docs/corpus.md.

Run: .venv/bin/python models/kv_report.py [--json FILE]
Per model: the mask sites `expected.json` lists, the ones lowered (Begin/End as expressions of the
dims), the declined ones (with the reason), the mask census of `inspect` (lowered / declined /
missed), and `validate --exact` at every saved input set.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

from dmlgraph import pipeline, inspection
from dmlgraph.io.modelfile import load_model
from dmlgraph.io.onnx_io import import_model
from dmlgraph.rewrite import Options

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATOR_KINDS = ("mask_subgraph", "trilu")


def measure(entry: dict) -> dict:
    path = os.path.join(HERE, entry["file"])
    result = pipeline.optimize_graph(import_model(load_model(path), base_dir=HERE), Options())
    lowered = sorted(tuple(m.captures["bounds"]) for m in result.applied if "bounds" in m.captures)
    wanted = sorted((s["begin"], s["end"]) for s in entry["masks"] if s["kind"] in GENERATOR_KINDS)
    declined = sorted({m.reason.split(": ", 1)[-1] for m in result.declined if m.rule == "mask_subgraph"})
    census = collections.Counter(m["status"] for m in inspection.inspect_model(path)["masks"])
    sets = {}
    for name, rel in sorted(entry.get("input_sets", {}).items()):
        report = pipeline.validate(path, Options(exact_only=True), feeds=pipeline.load_inputs(os.path.join(HERE, rel)))
        sets[name] = report["ok"]
    # min(x, N): the clamp a stored N-row buffer's slice adds, equal to x wherever the model runs
    same = [tuple(re.sub(r"^min\((.*), \d+\)$", r"\1", t) for t in b) for b in lowered]
    return {"model": entry["file"], "sites": len(wanted), "lowered": [f"[{b}, {e})" for b, e in lowered],
            "lowered_sites": sum(1 for w in wanted if w in same), "declined": declined,
            "census": dict(census), "validate": sets}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    with open(os.path.join(HERE, "expected.json")) as f:
        entries = json.load(f)["symbolic_models"]
    rows = [measure(e) for e in entries]
    print("| model | sites lowered | Begin/End lowered | census lowered / declined / missed | validate --exact |")
    print("|---|---|---|---|---|")
    for r in rows:
        c = r["census"]
        val = ", ".join(f"{k} {'pass' if ok else 'FAIL'}" for k, ok in r["validate"].items())
        print(f"| {r['model']} | {r['lowered_sites']}/{r['sites']} | {'; '.join(r['lowered'])} | "
              f"{c.get('lowered', 0)} / {c.get('declined', 0)} / {c.get('missed', 0)} | {val} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
