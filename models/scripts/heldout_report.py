"""Measure dmlgraph on the held-out exports (make_heldout.py): the table in docs/heldout.md.

Run (project venv, no torch): .venv/bin/python models/scripts/heldout_report.py [DIR] [--json FILE]
Per model: `dmlgraph optimize --json` on both targets (exit code, nodes and bytes before -> after),
`dmlgraph inspect --json` (mask census: lowered / declined with reasons / missed), then at every saved
input set: the onnx output against the original in onnxruntime (bit-exact or max abs diff), and the dml
output through `dmlgraph.validate` (its reference kernels); a set onnxruntime runs on the original and
dmlgraph refuses is counted as refused.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

import dmlgraph
from dmlgraph.errors import DmlgraphError

CLI = [sys.executable, "-m", "dmlgraph"]


def _cli(*args: str) -> tuple[int, dict | None, str]:
    p = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True)
    try:
        doc = json.loads(p.stdout) if p.stdout.strip() else None
    except json.JSONDecodeError:
        doc = None
    err = p.stderr.strip().splitlines()
    return p.returncode, doc, (err[-1] if err else "")


def _disk_bytes(path: str) -> int:
    """The file plus the external data files it names (each counted once)."""
    from onnx.external_data_helper import _get_all_tensors
    locs = {e.value for t in _get_all_tensors(onnx.load(path, load_external_data=False))
            for e in t.external_data if e.key == "location"}
    return os.path.getsize(path) + sum(os.path.getsize(os.path.join(os.path.dirname(path), rel)) for rel in locs)


def _checks(path: str) -> bool:
    try:
        onnx.checker.check_model(path)
        return True
    except Exception:  # noqa: BLE001 (recorded, not hidden)
        return False


def _ort(path: str, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = {i.name for i in s.get_inputs()}
    return s.run(None, {k: v for k, v in feeds.items() if k in names})


def _compare(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[bool, float]:
    """(bit-exact, max abs diff over finite entries)."""
    same, diff = True, 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return False, float("inf")
        same = same and x.tobytes() == y.tobytes()
        if x.size and x.dtype.kind == "f":
            both = np.isfinite(x) & np.isfinite(y)
            if not (np.isfinite(x) == np.isfinite(y)).all():
                diff = float("inf")
            elif both.any():
                diff = max(diff, float(np.abs(x[both].astype(np.float64) - y[both]).max()))
        elif x.size and not np.array_equal(x, y):
            diff = float("inf")
    return same, diff


def measure(path: str, inputs: str, tmp: str) -> dict:
    name = os.path.basename(path)[:-5]
    row: dict = {"model": name, "targets": {}, "sets": {}}
    outs = {}
    for target in ("dml", "onnx"):
        out = os.path.join(tmp, f"{name}.{target}.onnx")
        rc, doc, err = _cli("optimize", path, "-o", out, "--target", target)
        t = {"exit": rc, "error": err if rc else ""}
        if doc:
            t.update(nodes=(doc["before"]["nodes"], doc["after"]["nodes"]),
                     bytes=(_disk_bytes(path), _disk_bytes(out)),
                     dml_nodes=doc["after"].get("dml_nodes", 0), rewrites=sum(doc["rewrites"].values()),
                     declined=[d.get("reason", str(d)) if isinstance(d, dict) else str(d) for d in doc["declined"]],
                     grows=doc.get("grows"))
        if rc == 0 and os.path.exists(out) and _checks(path):
            t["checker"] = "pass" if _checks(out) else "FAIL"
        row["targets"][target] = t
        outs[target] = out if rc == 0 and os.path.exists(out) else None
    rc, doc, err = _cli("inspect", path)
    row["inspect_exit"] = rc
    if doc:
        masks = doc["masks"]
        row["census"] = dict(collections.Counter(m["status"] for m in masks))
        row["declined_reasons"] = dict(collections.Counter(
            (m.get("reason") or "?").split(": ", 1)[-1][:110] for m in masks if m["status"] == "declined"))
        row["missed"] = [f"{m['op_type']} {m['value']}" for m in masks if m["status"] == "missed"]
    else:
        row["inspect_error"] = err
    for npz in sorted(glob.glob(os.path.join(inputs, name, "*.npz"))):
        feeds = dict(np.load(npz))
        s: dict = {}
        try:
            ref = _ort(path, feeds)
        except Exception as e:  # noqa: BLE001 (onnxruntime itself refuses: not dmlgraph's to run)
            row["sets"][os.path.basename(npz)[:-4]] = {"ort_original": f"{type(e).__name__}"}
            continue
        if outs["onnx"]:
            try:
                same, diff = _compare(ref, _ort(outs["onnx"], feeds))
                s["onnx"] = "exact" if same else f"diff {diff:.3g}"
            except Exception as e:  # noqa: BLE001 (recorded, not hidden)
                s["onnx"] = f"ORT FAILS: {type(e).__name__}: {str(e)[:160]}"
        if outs["dml"]:
            try:
                r = dmlgraph.validate(path, outs["dml"], feeds)
                s["dml"] = "pass" if r.ok else "FAIL: " + "; ".join(
                    f"{c.name} {c.detail}" for c in r.outputs + r.tensors if not c.match)[:200]
            except DmlgraphError as e:
                s["dml"] = f"REFUSED: {str(e)[:160]}"
            except Exception as e:  # noqa: BLE001 (recorded, not hidden)
                s["dml"] = f"CRASH: {type(e).__name__}: {str(e)[:160]}"
        row["sets"][os.path.basename(npz)[:-4]] = s
    return row


def _pair(t: dict, key: str) -> str:
    return f"{t[key][0]:,} -> {t[key][1]:,}" if key in t else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                           "out", "heldout"))
    ap.add_argument("--json", help="also write the rows as JSON")
    ap.add_argument("--rows", nargs="*", help="print the table of saved --json files instead of measuring")
    ap.add_argument("only", nargs="*", help="model name substrings")
    args = ap.parse_args(argv)
    if args.rows is not None:
        merged = {r["model"]: r for f in args.rows for r in json.load(open(f))}
        _table([merged[k] for k in sorted(merged)])
        return 0
    paths = sorted(p for p in glob.glob(os.path.join(args.dir, "*.onnx"))
                   if not args.only or any(w in os.path.basename(p) for w in args.only))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in paths:
            rows.append(measure(p, os.path.join(args.dir, "inputs"), tmp))
            print(f"measured {rows[-1]['model']}", file=sys.stderr, flush=True)
    _table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


def _table(rows: list[dict]) -> None:
    print("| model | census lowered / declined / missed | dml exit, nodes, bytes | onnx exit, nodes, bytes "
          "| onnx vs ort (sets) | dml validate (sets) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        c = r.get("census", {})
        cen = f"{c.get('lowered', 0)} / {c.get('declined', 0)} / {c.get('missed', 0)}" if "census" in r else \
            f"inspect exit {r['inspect_exit']}"
        d, o = r["targets"]["dml"], r["targets"]["onnx"]
        on = collections.Counter(v.get("onnx", "-").split(":")[0] for v in r["sets"].values())
        dm = collections.Counter(v.get("dml", "-").split(":")[0] for v in r["sets"].values())
        print(f"| {r['model']} | {cen} | {d['exit']}, {_pair(d, 'nodes')}, {_pair(d, 'bytes')} | "
              f"{o['exit']}, {_pair(o, 'nodes')}, {_pair(o, 'bytes')} | "
              f"{', '.join(f'{k} {n}' for k, n in sorted(on.items()))} | "
              f"{', '.join(f'{k} {n}' for k, n in sorted(dm.items()))} |")


if __name__ == "__main__":
    sys.exit(main())
