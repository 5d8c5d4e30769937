"""Plain-text faces of the optimize and validate reports (the JSON is the report dict itself)."""
from __future__ import annotations

from collections import Counter

from dmlgraph.inspection import format_bytes
from dmlgraph.io.portable import ONE_OPERATOR


def before_after_table(before: dict, after: dict) -> str:
    rows = [("nodes", before["nodes"], after["nodes"])]
    if "nodes_all_scopes" in before and "nodes_all_scopes" in after and \
            (before["nodes_all_scopes"], after["nodes_all_scopes"]) != (before["nodes"], after["nodes"]):
        rows.append(("  with bodies, functions", before["nodes_all_scopes"], after["nodes_all_scopes"]))
    rows += [("initializers", before["initializers"], after["initializers"]),
             ("initializer bytes", format_bytes(before["initializer_bytes"]), format_bytes(after["initializer_bytes"])),
             ("constant bytes", format_bytes(before["constant_bytes"]), format_bytes(after["constant_bytes"]))]
    if "file_bytes" in before and "file_bytes" in after:
        rows.append(("file bytes", format_bytes(before["file_bytes"]), format_bytes(after["file_bytes"])))
    ops = sorted(set(before["ops"]) | set(after["ops"]))
    rows += [(f"  {op}", before["ops"].get(op, 0), after["ops"].get(op, 0)) for op in ops
             if before["ops"].get(op, 0) != after["ops"].get(op, 0)]
    w = max(len(r[0]) for r in rows)
    lines = [f"{'':{w}}  {'before':>12}  {'after':>12}"]
    lines += [f"{name:{w}}  {str(b):>12}  {str(a):>12}" for name, b, a in rows]
    return "\n".join(lines)


def optimize_text(r: dict, verbose: bool = False) -> str:
    """A summary: rewrites per rule, declines grouped by reason, the before/after table. `verbose`
    also lists every rewrite and every decline (thousands of lines on a big model)."""
    lines = [f"target {r['target']}, feature level {r['feature_level']}"
             + (", exact rewrites only" if r["exact_only"] else "")]
    lines += [f"note: {note}" for note in r.get("notes", ())]
    applied = {k: v for k, v in r["rewrites"].items() if v}
    if applied:
        w = max(len(k) for k in applied)
        lines.append(f"rewrites ({sum(applied.values())}):")
        lines += [f"  {k:{w}}  {v:>6}" for k, v in applied.items()]
        loose = Counter(rec["rule"] for rec in r["lowered"] if rec.get("exact") is False)
        if loose:
            lines.append("  not bit-exact (equal values; --exact keeps only bit-exact rewrites): "
                         + ", ".join(f"{rule} x{n}" for rule, n in loose.items()))
    else:
        lines.append(f"rewrites: none (`dmlgraph inspect {r['model']}` lists what was found and why it was not lowered)")
    if verbose:
        lines += [f"  [{rec['rule']}] {_names(rec)} -> {_dml_text(rec['dml'])}" for rec in r["lowered"] if rec.get("dml")]
    if r["declined"]:
        lines.append(f"not lowered ({len(r['declined'])}):")
        if verbose:
            lines += [f"  [{rec['rule']}] {_names(rec)}: {rec['reason']}" for rec in r["declined"]]
        else:
            groups = Counter((rec["rule"], rec["reason"]) for rec in r["declined"])
            lines += [f"  [{rule}] x{n}: {reason}" for (rule, reason), n in groups.most_common()]
            lines.append("  (-v lists each)")
    if r.get("portable"):
        lines += portable_lines(r["portable"])
    lines.append(before_after_table(r["before"], r["after"]))
    if "output" in r:
        data = r.get("external_data")
        lines.append(f"wrote {r['output']}" + (f" and its weights, {data} ({format_bytes(r['after']['data_file_bytes'])})"
                                               if data else ""))
    return "\n".join(lines)


def portable_lines(p: dict) -> list[str]:
    """How many sites run as one DIAGONAL_MATRIX1 where the portable output runs, and the others."""
    lines = [f"portable form: {p['one_operator']} of {p['sites']} sites are one Trilu or EyeLike (one "
             "DIAGONAL_MATRIX1 on onnxruntime's DML provider, triangular in WebNN)"]
    lines += [f"  x{n}: {form}" for form, n in p["forms"].items() if form not in ONE_OPERATOR]
    if p.get("mask_nodes"):
        lines.append("  standard nodes per site (size plumbing not counted): mask part " + _counts(p["mask_nodes"])
                     + "; whole site, with the select applying it to the data, " + _counts(p["site_nodes"]))
    return lines


def _counts(hist: dict) -> str:
    return ", ".join(f"{n} ({c} site{'s' if c != 1 else ''})" for n, c in hist.items())


def _names(rec: dict) -> str:
    return ", ".join(f"{n['op_type']} {n['name']!r}" for n in rec["nodes"])


def _dml_text(d: dict) -> str:
    return (f"{d['op']}(begin={d['begin']}, end={d['end']}, value={d['value']}"
            f"{', input' if d['has_input'] else ''}{', runtime k' if d['runtime_k'] else ''})")


def validate_text(r: dict) -> str:
    lines = ["inputs: " + ", ".join(f"{k}{v}" for k, v in r["inputs"].items()),
             "rewrites: " + (", ".join(f"{k} x{v}" for k, v in r["rewrites"].items() if v) or "none")]
    for title, rows in (("rewritten tensors", r["tensors"]), ("model outputs", r["outputs"])):
        lines.append(f"{title}:" + ("" if rows else " none"))
        for row in rows:
            mark = "ok  " if row["match"] else "FAIL"
            lines.append(f"  {mark} {row['name']} {row['dtype']}{row['shape']}: {row['detail']}")
    lines.append("PASS: matches onnxruntime on the original model" if r["ok"] else "FAIL: outputs differ")
    return "\n".join(lines)
