"""Plain-text faces of the optimize and validate reports (the JSON is the report dict itself)."""
from __future__ import annotations


def _bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def before_after_table(before: dict, after: dict) -> str:
    rows = [("nodes", before["nodes"], after["nodes"]),
            ("initializers", before["initializers"], after["initializers"]),
            ("initializer bytes", _bytes(before["initializer_bytes"]), _bytes(after["initializer_bytes"])),
            ("constant bytes", _bytes(before["constant_bytes"]), _bytes(after["constant_bytes"]))]
    if "file_bytes" in before and "file_bytes" in after:
        rows.append(("file bytes", _bytes(before["file_bytes"]), _bytes(after["file_bytes"])))
    ops = sorted(set(before["ops"]) | set(after["ops"]))
    rows += [(f"  {op}", before["ops"].get(op, 0), after["ops"].get(op, 0)) for op in ops
             if before["ops"].get(op, 0) != after["ops"].get(op, 0)]
    w = max(len(r[0]) for r in rows)
    lines = [f"{'':{w}}  {'before':>12}  {'after':>12}"]
    lines += [f"{name:{w}}  {str(b):>12}  {str(a):>12}" for name, b, a in rows]
    return "\n".join(lines)


def optimize_text(r: dict) -> str:
    lines = [f"target {r['target']}, feature level {r['feature_level']}"
             + (", exact rewrites only" if r["exact_only"] else "")]
    applied = {k: v for k, v in r["rewrites"].items() if v}
    lines.append("lowered: " + (", ".join(f"{k} x{v}" for k, v in applied.items()) or "nothing"))
    for rec in r["lowered"]:
        d = rec.get("dml") or {}
        names = ", ".join(f"{n['op_type']} {n['name']!r}" for n in rec["nodes"])
        if d:
            lines.append(f"  [{rec['rule']}] {names} -> {d['op']}(begin={d['begin']}, end={d['end']}, "
                         f"value={d['value']}{', input' if d['has_input'] else ''}"
                         f"{', runtime k' if d['runtime_k'] else ''})")
    if r["declined"]:
        lines.append("not lowered:")
        for rec in r["declined"]:
            names = ", ".join(f"{n['op_type']} {n['name']!r}" for n in rec["nodes"])
            lines.append(f"  [{rec['rule']}] {names}: {rec['reason']}")
    lines.append(before_after_table(r["before"], r["after"]))
    if "output" in r:
        lines.append(f"wrote {r['output']}")
    return "\n".join(lines)


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
