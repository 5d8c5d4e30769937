"""`python -m benchmarks sizes` (= `python -m benchmarks.size_table`): what `optimize` writes, per
model of models/ and models/synthetic/, on both targets (issue 25, items 3 and "Measured").

Per model: nodes (at every depth: If/Loop/Scan bodies and functions' included) and file bytes of
the input, of the `--target dml` output and of the `--target onnx` (portable) output, as written
by `result.save`; the lowered sites; and the standard nodes per site in the portable output:

* sites: the com.dmlgraph nodes of the dml output (one DIAGONAL_MATRIX1 / DIAGONAL_MATRIX each;
  a `chain` rewrite makes one site of two rewrites, so sites <= rewrites);
* expansion/site: (portable nodes - dml nodes + sites) / sites, the standard nodes that stand
  for one DML node. Exact: the two targets come from the same lowered graph and differ only in
  how each DML node is written (its size plumbing included on both);
* added/site: the portable output's nodes whose name is not in the input, / sites. Exact
  attribution by name (the export keeps the names of the nodes it does not touch; checked:
  added - removed = after - before, else the row says "estimate"), so it counts everything a
  site brought: the mask's nodes and its Shape/Gather/Concat plumbing.
* mask part / whole site (per site, as optimize and inspect report them: `dmlgraph.io.portable.MASK`):
  the nodes computing the band, and with them the one select applying it to the data; size plumbing
  in neither. The goal (issue 25, item 3) is on the mask part: at most 3.

The goals summary: models that grew (nodes, or file bytes past SLACK_BYTES of metadata) on either
target, and the sites whose mask part is over 3 standard nodes. Prints Markdown; `--json FILE` writes
the rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLACK_BYTES = 300  # "plus a few hundred bytes of metadata at most" (issue 25, item 3)
SITE_GOAL = 3  # standard nodes in the mask part of each lowered site in the portable output


@dataclass
class SizeRow:
    model: str
    nodes_before: int
    bytes_before: int
    nodes_dml: int | None = None
    bytes_dml: int | None = None
    nodes_onnx: int | None = None
    bytes_onnx: int | None = None
    rewrites: int = 0
    sites: int = 0
    expansion_per_site: float | None = None
    added_per_site: float | None = None
    attribution: str = ""  # "exact" or "estimate"
    note: str = ""
    site_nodes: list[tuple[int, int]] | None = None  # per site of the dml output: (mask part, whole site)

    def grew(self, target: str) -> bool | None:
        nodes, size = (self.nodes_dml, self.bytes_dml) if target == "dml" else (self.nodes_onnx, self.bytes_onnx)
        if nodes is None or size is None:
            return None
        return nodes > self.nodes_before or size > self.bytes_before + SLACK_BYTES


def model_paths() -> list[str]:
    """Every .onnx of models/ and models/synthetic/ (sorted; synthetic last)."""
    out = []
    for folder in ("models", os.path.join("models", "synthetic")):
        full = os.path.join(ROOT, folder)
        if os.path.isdir(full):
            out += sorted(os.path.join(full, f) for f in os.listdir(full) if f.endswith(".onnx"))
    return out


def _all_nodes(model: Any) -> list[Any]:
    from dmlgraph.rewrite.nested import all_nodes
    nodes = list(all_nodes(model.graph.node))
    for fn in model.functions:
        nodes += list(all_nodes(fn.node))
    return nodes


def measure(path: str, tmp: str) -> SizeRow:
    import onnx

    import dmlgraph
    name = os.path.relpath(path, os.path.join(ROOT, "models"))
    original = onnx.load(path)
    before = _all_nodes(original)
    row = SizeRow(name, len(before), os.path.getsize(path))
    outputs: dict[str, Any] = {}
    for target in ("dml", "onnx"):
        try:
            result = dmlgraph.optimize(path, target=target)
        except Exception as e:  # noqa: BLE001 - the row says so; the other target still runs
            row.note += f"{target}: optimize failed ({str(e)[:120]}); "
            continue
        out = os.path.join(tmp, f"{os.path.basename(path)}.{target}.onnx")
        size = result.save(out)
        nodes = _all_nodes(result.model)
        outputs[target] = nodes
        row.rewrites = len(result.rewrites)
        if target == "dml":
            row.nodes_dml, row.bytes_dml = len(nodes), size
            row.sites = sum(n.domain == "com.dmlgraph" for n in nodes)
            row.site_nodes = _site_nodes(result.model) if row.sites else None
        else:
            row.nodes_onnx, row.bytes_onnx = len(nodes), size
        os.remove(out)
    if row.sites and "dml" in outputs and "onnx" in outputs:
        row.expansion_per_site = (len(outputs["onnx"]) - len(outputs["dml"]) + row.sites) / row.sites
        known = {n.name for n in before}
        after_names = [n.name for n in outputs["onnx"]]
        added = sum(1 for n in after_names if not n or n not in known)
        removed = len(known - set(after_names))
        exact = len(known) == len(before) and added - removed == len(after_names) - len(before)
        if exact:
            row.added_per_site = added / row.sites
        else:  # an estimate: (portable - original + removed) / sites
            row.added_per_site = (len(after_names) - len(before) + removed) / row.sites
        row.attribution = "exact" if exact else "estimate"
    return row


def _site_nodes(model: Any) -> list[tuple[int, int]]:
    """(mask part, whole site) of each DML node of the main graph as the portable export writes it."""
    from dmlgraph.io import onnx_io
    from dmlgraph.ir.graph import DmlNode
    g = onnx_io.import_model(model)
    onnx_io.site_nodes(g)
    return [n.portable_nodes for n in g.topological_order() if isinstance(n, DmlNode) and n.portable_nodes]


def measure_all(paths: list[str] | None = None, log: Callable[..., None] = print) -> list[SizeRow]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="dmlgraph-sizes-") as tmp:
        for path in paths if paths is not None else model_paths():
            print(f"{os.path.relpath(path, ROOT)} ...", file=sys.stderr)
            try:
                rows.append(measure(path, tmp))
            except Exception as e:  # noqa: BLE001 - the row says so; the other models still run
                rows.append(SizeRow(os.path.relpath(path, os.path.join(ROOT, "models")), 0, os.path.getsize(path),
                                    note=f"failed: {str(e)[:160]}"))
    return rows


def _delta(before: int, after: int | None) -> str:
    if after is None:
        return "-"
    sign = "+" if after > before else ""
    return f"{after:,} ({sign}{after - before:,})" if after != before else f"{after:,} (=)"


def markdown(rows: list[SizeRow]) -> str:
    lines = ["| model | nodes | dml nodes | onnx nodes | bytes | dml bytes | onnx bytes | sites | onnx nodes / site: "
             "expansion, added | mask part / whole site |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per_site = "-" if r.expansion_per_site is None else f"{r.expansion_per_site:.1f}, {r.added_per_site:.1f}" + (
            "" if r.attribution == "exact" else " (est.)")
        lines.append(f"| {r.model} | {r.nodes_before:,} | {_delta(r.nodes_before, r.nodes_dml)} | "
                     f"{_delta(r.nodes_before, r.nodes_onnx)} | {r.bytes_before:,} | {_delta(r.bytes_before, r.bytes_dml)} | "
                     f"{_delta(r.bytes_before, r.bytes_onnx)} | {r.sites} | {per_site} | "
                     + (", ".join(f"{m}/{w}" for m, w in r.site_nodes) if r.site_nodes else "-") + " |"
                     + (f" {r.note.strip()}" if r.note else ""))
    return "\n".join(lines)


def summary(rows: list[SizeRow]) -> dict[str, Any]:
    """The goals: models that grew on each target (nodes, or bytes past SLACK_BYTES), sites over 3 nodes."""
    out: dict[str, Any] = {"models": len(rows)}
    for target in ("dml", "onnx"):
        grew = [r.model for r in rows if r.grew(target)]
        by_nodes = [r.model for r in rows if ((r.nodes_dml if target == "dml" else r.nodes_onnx) or 0) > r.nodes_before]
        by_bytes = [r.model for r in rows
                    if ((r.bytes_dml if target == "dml" else r.bytes_onnx) or 0) > r.bytes_before + SLACK_BYTES]
        out[target] = {"grew": grew, "grew_nodes": by_nodes, "grew_bytes": by_bytes,
                       "measured": sum(r.grew(target) is not None for r in rows)}
    with_sites = [r for r in rows if r.sites]
    out["sites"] = sum(r.sites for r in with_sites)
    out["models_with_sites"] = len(with_sites)
    counted = [c for r in with_sites for c in (r.site_nodes or [])]
    out["counted_sites"] = len(counted)
    out["over_site_goal"] = [r.model for r in with_sites if any(m > SITE_GOAL for m, _ in r.site_nodes or [])]
    out["mask_nodes"] = {str(k): sum(1 for m, _ in counted if m == k) for k in sorted({m for m, _ in counted})}
    out["site_nodes"] = {str(k): sum(1 for _, w in counted if w == k) for k in sorted({w for _, w in counted})}
    per = sorted(r.expansion_per_site for r in with_sites if r.expansion_per_site is not None)
    out["expansion_per_site_median"] = per[len(per) // 2] if per else None
    out["expansion_per_site_max"] = per[-1] if per else None
    added = sorted(r.added_per_site for r in with_sites if r.added_per_site is not None)
    out["added_per_site_median"] = added[len(added) // 2] if added else None
    out["added_per_site_max"] = added[-1] if added else None
    return out


def format_summary(s: dict[str, Any]) -> str:
    lines = []
    for target in ("dml", "onnx"):
        t = s[target]
        lines.append(f"- `--target {target}`: {len(t['grew'])} of {t['measured']} models grew "
                     f"({len(t['grew_nodes'])} in nodes, {len(t['grew_bytes'])} in file bytes past {SLACK_BYTES} of slack)"
                     + (f": {', '.join(t['grew'])}" if t["grew"] else ""))
    if s["models_with_sites"]:
        lines.append(f"- portable nodes per lowered site ({s['sites']} sites in {s['models_with_sites']} models): "
                     f"expansion median {s['expansion_per_site_median']:.1f}, max {s['expansion_per_site_max']:.1f}; "
                     f"added (with plumbing) median {s['added_per_site_median']:.1f}, max {s['added_per_site_max']:.1f}; "
                     f"mask part per site (nodes: sites) {s['mask_nodes']}, whole site with its select {s['site_nodes']}; "
                     f"{len(s['over_site_goal'])} of {s['models_with_sites']} models with a mask part over {SITE_GOAL}"
                     + (f" ({', '.join(s['over_site_goal'])})" if s["over_site_goal"] else ""))
    return "\n".join(lines)


def goal_rows(s: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(goal, measured, target, met) for the goals table."""
    rows: list[tuple[str, str, str, bool | None]] = []
    for target in ("dml", "onnx"):
        t = s[target]
        rows.append((f"models that grow on --target {target} (nodes, or bytes + {SLACK_BYTES})",
                     f"{len(t['grew'])} of {t['measured']} ({len(t['grew_nodes'])} in nodes, {len(t['grew_bytes'])} in bytes)",
                     "none",
                     not t["grew"] if t["measured"] else None))
    if s["models_with_sites"]:
        over = sum(v for k, v in s["mask_nodes"].items() if int(k) > SITE_GOAL)
        rows.append(("standard nodes in the mask part of each lowered site, portable output",
                     f"{over} of {s['counted_sites']} sites over {SITE_GOAL} (max {max(map(int, s['mask_nodes']), default=0)}"
                     f"; whole site with its select: max {max(map(int, s['site_nodes']), default=0)}; "
                     f"expansion incl. size plumbing median {s['expansion_per_site_median']:.1f})",
                     f"<= {SITE_GOAL}", not s["over_site_goal"]))
    return rows


def run(json_out: str | None = None, log: Callable[..., None] = print, paths: list[str] | None = None) -> list[SizeRow]:
    start = time.perf_counter()
    rows = measure_all(paths, log)
    s = summary(rows)
    log(markdown(rows))
    log("")
    log(format_summary(s))
    print(f"\n({len(rows)} models in {time.perf_counter() - start:.0f} s)", file=sys.stderr)
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"suite": "sizes", "slack_bytes": SLACK_BYTES, "rows": [asdict(r) for r in rows],
                       "summary": s}, f, indent=1)
        print(f"wrote {json_out}", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.size_table", description=(__doc__ or "").splitlines()[0])
    p.add_argument("models", nargs="*", help="model files (default: every .onnx of models/ and models/synthetic/)")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="also write the rows as JSON")
    args = p.parse_args(argv)
    run(args.json_out, paths=[os.path.abspath(m) for m in args.models] or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
