"""How an inspection reads: the text report, the Graphviz DOT drawing (and SVG), and the
`dmlgraph inspect` command that prints or writes them. The findings are `dmlgraph.inspection`'s.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

from dmlgraph.errors import DmlgraphError
from dmlgraph.inspection import (
    PICTURE_MAX,
    Inspection,
    analyze,
    bound_text,
    fmt_scalar,
    format_bytes,
    picture_text,
    progress_printer,
    shape_text,
)
from dmlgraph.io.saving import atomic_writer
from dmlgraph.pipeline import make_options
from dmlgraph.tools.report import before_after_table, portable_lines


# ---- text --------------------------------------------------------------------------------------
def _table(rows: list[list[Any]], headers: Sequence[Any], indent: str = "  ") -> list[str]:
    cols = list(zip(*([headers] + rows))) if rows else [(h,) for h in headers]
    widths = [max(len(str(c)) for c in col) for col in cols]
    out = [indent + "  ".join(str(h).ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for r in rows:
        out.append(indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


SHOWN = 8  # the nodes and constants of a candidate listed one by one; more are summed up (-v lists each)


def _nodes_text(nodes: Iterable[dict[str, Any]], inits: Iterable[dict[str, Any]] = (), scope: Any = None,
                every: bool = False) -> str:
    """`Trilu 'name' #7` per node (#: position in the model; none for nodes an earlier rewrite made,
    nor for the nodes of a body or function, named with its path); past `SHOWN` (unless `every`),
    the count per op and the last node in the model's order."""
    def one(n: dict[str, Any]) -> str:
        return n["op_type"] + (f" {n['name']!r}" if n["name"] else "") \
            + (f" #{n['index']}" if n.get("index") is not None else "" if scope else " (from an earlier rewrite)")
    nodes, inits = list(nodes), list(inits)
    if not every and len(nodes) + len(inits) > SHOWN and nodes:
        ops = collections.Counter(n["op_type"] for n in nodes)
        last = max(nodes, key=lambda n: -1 if n.get("index") is None else n["index"])
        text = f"{_plural(len(nodes), 'node')} up to {one(last)} (" \
            + ", ".join(f"{count} {op}" for op, count in ops.most_common()) + ")"
        return text + (f" and {_plural(len(inits), 'constant')}" if inits else "")
    parts = [one(n) for n in nodes] + [f"constant {i['name']!r}" for i in inits]
    return ", ".join(parts) or "(none)"


def _desc_lines(desc: dict, indent: str) -> list[str]:
    lines = []
    if desc.get("operator") == "DIAGONAL_MATRIX":
        lines.append(f"{indent}DIAGONAL_MATRIX Offset {desc['offset']}, Value {fmt_scalar(desc['value'])} (FLOAT)")
    else:
        lines.append(f"{indent}DIAGONAL_MATRIX1 DiagonalFillBegin {bound_text(desc['begin'])}, "
                     f"DiagonalFillEnd {bound_text(desc['end'])}, Value {fmt_scalar(desc['value'])}, "
                     f"ValueDataType {desc['value_data_type']}")
    for role, key in (("InputTensor ", "input"), ("OutputTensor", "output")):
        if key not in desc:
            continue
        t = desc[key]
        if t is None:
            lines.append(f"{indent}  {role}: none")
            continue
        sizes = "folded at bind time (rank > 4)" if t["sizes"] is None else shape_text(t["sizes"])
        strides = "packed" if t["strides"] is None else shape_text(t["strides"])
        lines.append(f"{indent}  {role}: {t['data_type']} sizes {sizes} strides {strides} "
                     f"TotalTensorSizeInBytes {t['total_bytes']} alignment {t['alignment']} flags {t['flags']}")
    return lines


def format_text(r: dict, every: bool = False) -> str:
    """The text report of an inspection: the model, its candidates, declines, census and totals
    (`every`: each node of a candidate or decline, not their sum)."""
    L = _header_text(r)
    o = r["options"]
    L.append("")
    L.append(f"candidates (feature level {o['feature_level']}, target {o['target']}"
             + (", exact rewrites only" if o["exact_only"] else "")
             + f"): {len(r['candidates'])} lowered, {len(r['declined'])} declined")
    for c in r["candidates"]:
        L += _candidate_text(c, every)
    if r["declined"]:
        L.append("declined:")
        for d in r["declined"]:
            L.append(f"  {d['rule']}" + (f" in {d['scope']}" if d["scope"] else "")
                     + f": {_nodes_text(d['nodes'], d['initializers'], d['scope'], every)}: {d['reason']}")
    L += _census_text(r["masks"])
    L += _totals_text(r["totals"])
    return "\n".join(L)


def _header_text(r: dict) -> list[str]:
    m = r["model"]
    init = r["initializers"]
    L = [f"model     {m['path']} ({format_bytes(m['file_bytes'])}"
         + (f" + {format_bytes(m['external_data_bytes'])} external data in {', '.join(m['external_data_files'])}"
            if m["external_data_files"] else "") + ")",
         f"format    IR {m['ir_version']}, opsets "
         + ", ".join(f"{d} {v}" for d, v in m["opset_imports"].items())
         + (f", producer {m['producer_name']} {m['producer_version']}".rstrip() if m["producer_name"] else ""),
         f"graph     {m['graph_name'] or '(unnamed)'}: {m['nodes']} nodes, {init['count']} initializers "
         f"({format_bytes(init['bytes'])}; {init['external_count']} external)"]
    L.append("inputs:")
    L += _table([[v["name"], v["type"] or "?", shape_text(v["shape"])] for v in r["inputs"]],
                ["name", "type", "shape"]) if r["inputs"] else ["  (none)"]
    L.append("outputs:")
    L += _table([[v["name"], v["type"] or "?", shape_text(v["shape"])] for v in r["outputs"]],
                ["name", "type", "shape"]) if r["outputs"] else ["  (none)"]
    L.append("ops:      " + (", ".join(f"{k} {v}" for k, v in r["ops"].items()) or "(none)"))
    if init["top"]:
        L.append(f"largest initializers (top {len(init['top'])} of {init['count']}):")
        L += _table([[t["name"], shape_text(t["shape"]), t["type"], format_bytes(t["bytes"]),
                      t["storage"] + (f" ({t['location']})" if t["location"] else "")] for t in init["top"]],
                    ["name", "shape", "type", "bytes", "storage"])
    return L


def _candidate_text(c: dict, every: bool = False) -> list[str]:
    L: list[str] = []
    nodes = _nodes_text(c["nodes"], (), c["scope"], every) if c["nodes"] else \
        _nodes_text([], c["initializers"], every=every)
    L.append(f"[{c['id']}] {c['rule']}" + (f" in {c['scope']}" if c["scope"] else "") + ": " + nodes)
    if c["initializers"]:
        L.append("    constants: " + ", ".join(f"{i['name']} {shape_text(i['shape'])} {i['type']} "
                                               f"{format_bytes(i['bytes'])}" for i in c["initializers"]))
    t = c["lowers_to"]
    if t is not None:
        b = bound_text(t["begin"]) + (" (unbounded)" if t["begin_unbounded"] else "")
        e = bound_text(t["end"]) + (" (unbounded)" if t["end_unbounded"] else "")
        extras = [f"input {t['input']!r}" if t["has_input"] else "no input"]
        if t["runtime_k"]:
            extras.append(f"run-time k {t['k_input']!r}")
        if t["runtime_shape"]:
            extras.append(f"run-time shape {t['shape_input']!r}")
        L.append(f"    lowers to {t['operator']}: Begin {b}, End {e}, Value {fmt_scalar(t['value'])} "
                 f"({t['value_data_type']}), {', '.join(extras)}")
        L.append(f"    output {t['output']['name']!r} {t['onnx_type']} {shape_text(t['output']['shape'])}"
                 + ("" if t["shape_static"] else ": sizes bound at run time"))
        if t["desc"] is not None:
            L.append(f"    desc ({'exact' if t['desc_kind'] == 'exact' else 'symbolic sizes'}):")
            L += _desc_lines(t["desc"], "      ")
        rep = t["representative"]
        if rep is not None:
            dims = ", ".join(f"{k}={v}" for k, v in rep["dims"].items())
            L.append(f"    representative desc at {dims} (illustration only; real sizes come at run time):")
            L += _desc_lines(rep["desc"], "      ")
        for note in t["notes"]:
            L.append(f"    note: {note}")
    ex = c["exact"]
    L.append(f"    exact: {ex['rule'] or '?'}" + ("" if ex["bit_exact"] is None else
                                               f" (node {'bit-exact' if ex['bit_exact'] else 'not bit-exact'})")
             + ("" if ex["written"] is not False or not ex["bit_exact"] else
                "; the target's form is not bit-exact (equal values: a -0.0 or float16 NaN payload may change; "
                "--exact keeps only bit-exact forms)"))
    s = c["saves"]
    shared = []
    if s["shared_nodes"]:
        shared.append(_plural(s["shared_nodes"], "node"))
    if s["shared_initializer_bytes"]:
        shared.append(format_bytes(s["shared_initializer_bytes"]))
    L.append(f"    saves: {_plural(s['nodes'], 'node')}, {_plural(s['initializers'], 'initializer')} "
             f"({format_bytes(s['initializer_bytes'])})"
             + (f", plus {' and '.join(shared)} shared with other candidates" if shared else "")
             + f"; adds {_plural(s['dml_nodes_added'], 'DML node')}"
             + (f" (absorbed by [{c['superseded_by']}])" if c["superseded_by"] else
                " (absorbed by a later rewrite)" if c["lowers_to"] and not c["in_lowered_graph"] else ""))
    p = c["picture"]
    if p is not None:
        of = shape_text(p["of"])
        what = f"top-left {p['height']}x{p['width']} of one {of} slice"
        if p["representative"]:
            what += f", symbolic sides drawn at {PICTURE_MAX}"
        if p["runtime_k"]:
            what += ", k = 0 shown"
        if p["legend"]:
            what += f"; {p['legend']}"
        L.append(f"    pattern ({what}):")
        L += picture_text(p, "      ")
    return L


def _totals_text(t: dict) -> list[str]:
    L: list[str] = []
    L.append("")
    if t["target"] == "dml":
        helpers = t["nodes_added"] - t["dml_nodes_added"]
        adds = f"add {_plural(t['dml_nodes_added'], 'DML node')}" + (
            f" and {_plural(helpers, 'helper node')} (run-time shapes)" if helpers > 0 else "")
    else:
        adds = (f"add {_plural(t['dml_nodes_added'], 'generator')} written as "
                f"{_plural(t['nodes_added'], 'standard ONNX node')}")
    if t["initializers_added"]:
        adds += (f", and {_plural(t['initializers_added'], 'initializer')} "
                 f"({format_bytes(t['initializer_bytes_added'])})")
    if t["nested_dml_nodes"]:
        adds += (f"; and {_plural(t['nested_dml_nodes'], 'DML node')} inside bodies and functions"
                 + ("" if t["target"] == "dml" else ", written as standard ONNX nodes"))
    if t.get("portable"):
        L += portable_lines(t["portable"])
    if t.get("declined_for_growth"):
        L.append(f"optimize declines {_plural(len(t['declined_for_growth']), 'site')} on target {t['target']}, "
                 f"where lowering every site would grow the model ({t['grows']}); --allow-growth writes them:")
        L += [f"  {', '.join(n['name'] or n['op_type'] for n in d['nodes'])}: {d['reason']}"
              for d in t["declined_for_growth"]]
    # (the totals and the table lower every candidate: with sites declined for growth, that is
    # what --allow-growth writes, not what a plain optimize does)
    who = "optimize --allow-growth" if t.get("declined_for_growth") else "optimize"
    L.append(f"totals (target {t['target']}): {who} would remove {_plural(t['nodes_removed'], 'node')} and "
             f"{_plural(t['initializers_removed'], 'initializer')} ({format_bytes(t['initializer_bytes_removed'])}), "
             f"{adds}")
    L.append(before_after_table(t["before"], t["after"]))
    return L


def _census_text(masks: list[dict]) -> list[str]:
    """The mask census: counts per status, then every mask that was declined or missed."""
    counts = collections.Counter(m["status"] for m in masks)
    L = [f"mask-like tensors: {len(masks)} ({counts['lowered']} lowered, {counts['declined']} declined, "
         f"{counts['missed']} missed)"]
    for m in masks:
        if m["status"] == "lowered":
            continue
        where = f"{m['op_type']} {m['producer']!r}" + (f" #{m['index']}" if m["index"] is not None else "") \
            if m["producer"] is not None else "constant"
        L.append(f"  {m['status'].upper()} {m['value']!r} {shape_text(m['shape'])} from {where}: {m['found']}; "
                 f"{m['reason']}")
    return L


# ---- DOT ---------------------------------------------------------------------------------------
_FILL = ["#ffd27f", "#9fd3ff", "#b9f0a8", "#f7b2d9", "#d6c4ff", "#ffe99a", "#a8ece6", "#ffc0a8"]


def _q(s: object) -> str:
    """A DOT double-quoted string."""
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(ins: Inspection) -> str:
    """Graphviz DOT of the model's graph (as imported, before rewrites), candidates highlighted.

    Each candidate is a filled cluster labelled `[id] rule -> OPERATOR`; declined nodes have a dashed
    red border and their reason as tooltip. Initializers appear only when a candidate covers them.
    """
    snap, r = ins.snapshot, ins.report
    by_index = {i: n for i, n in enumerate(snap["nodes"])}
    owner, cluster_nodes, cluster_inits, declined = _dot_owners(snap, r)
    small = len(snap["nodes"]) <= 300
    out = [f"digraph {_q(snap['name'] or 'graph')} {{",
           '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, labelloc=t, '
           + f"label={_q(os.path.basename(r['model']['path']) + ': ' + str(len(r['candidates'])) + ' candidates')}];",
           '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=10];',
           '  edge [fontname="Helvetica", fontsize=8, color="#777777"];']

    def node_stmt(n: dict[str, Any], indent: str = "  ") -> str:
        key = _nid(n)
        label = n["op_type"] + (f"\n{n['name']}" if n["name"] else "")
        attrs = [f"label={_q(label)}"]
        if key in owner:
            attrs.append(f'style="rounded,filled", fillcolor={_q(_FILL[(owner[key] - 1) % len(_FILL)])}')
        elif key in declined:
            attrs.append(f'style="rounded,dashed", color="#cc0000", tooltip={_q("declined: " + declined[key])}')
        return f"{indent}{_q(key)} [{', '.join(attrs)}];"

    def init_stmt(name: str, indent: str = "  ") -> str:
        shape = snap["initializers"].get(name)
        return (f"{indent}{_q('init:' + name)} [shape=note, style=filled, fillcolor=\"#eeeeee\", "
                f"label={_q(name + chr(10) + shape_text(shape))}];")

    for c in r["candidates"]:
        if not cluster_nodes[c["id"]] and not cluster_inits[c["id"]]:
            continue
        op = c["lowers_to"]["operator"] if c["lowers_to"] else "?"
        color = _FILL[(c["id"] - 1) % len(_FILL)]
        out.append(f"  subgraph {_q('cluster_c' + str(c['id']))} {{")
        out.append(f"    label={_q('[' + str(c['id']) + '] ' + c['rule'] + ' -> ' + op)};")
        out.append(f'    style="rounded,filled"; fillcolor="#fafafa"; color={_q(color)}; penwidth=2;')
        for key in cluster_nodes[c["id"]]:
            out.append(node_stmt(by_index[int(key[1:])], "    "))
        for name in cluster_inits[c["id"]]:
            out.append(init_stmt(name, "    "))
        out.append("  }")
    for n in snap["nodes"]:
        if _nid(n) not in owner:
            out.append(node_stmt(n))
    for name, typ, shape in snap["inputs"]:
        out.append(f"  {_q('in:' + name)} [shape=ellipse, style=filled, fillcolor=\"#e8f0ff\", "
                   f"label={_q(name + chr(10) + typ + ' ' + shape_text(shape))}];")
    for name, typ, shape in snap["outputs"]:
        out.append(f"  {_q('out:' + name)} [shape=ellipse, style=filled, fillcolor=\"#e8ffe8\", "
                   f"label={_q(name + chr(10) + typ + ' ' + shape_text(shape))}];")
    out += _dot_edges(snap, {f"init:{name}" for names in cluster_inits.values() for name in names}, small)
    out.append("}")
    return "\n".join(out) + "\n"

def _nid(n: dict[str, Any]) -> str:
    return f"n{n['index']}"


def _dot_owners(snap: dict, r: dict) -> tuple[dict[str, int], dict[int, list[str]], dict[int, list[str]], dict[str, str]]:
    """Which candidate owns each drawn node and initializer (the first that covers it), the nodes
    and initializers of each candidate's cluster, and the declined nodes with their reasons."""
    by_index = {i: n for i, n in enumerate(snap["nodes"])}
    owner: dict[str, int] = {}
    cluster_nodes: dict[int, list[str]] = collections.defaultdict(list)
    cluster_inits: dict[int, list[str]] = collections.defaultdict(list)
    for c in r["candidates"]:
        for n in c["nodes"]:
            if n["index"] is not None and _nid(by_index[n["index"]]) not in owner:
                owner[_nid(by_index[n["index"]])] = c["id"]
                cluster_nodes[c["id"]].append(_nid(by_index[n["index"]]))
        for i in c["initializers"]:
            key = f"init:{i['name']}"
            if i["name"] in snap["initializers"] and key not in owner:
                owner[key] = c["id"]
                cluster_inits[c["id"]].append(i["name"])
    declined: dict[str, str] = {}
    for d in r["declined"]:
        for n in d["nodes"]:
            if n["index"] is not None:
                declined.setdefault(_nid(by_index[n["index"]]), d["reason"])
    return owner, cluster_nodes, cluster_inits, declined


def _dot_edges(snap: dict, declared_inits: set[str], small: bool) -> list[str]:
    """The edges: each node input from its producer, a graph input or a drawn initializer."""
    out: list[str] = []
    producer = {}
    for n in snap["nodes"]:
        for v in n["outputs"]:
            producer[v] = _nid(n)
    inputs = {name for name, _, _ in snap["inputs"]}

    def source(v: str) -> str | None:
        if v in producer:
            return producer[v]
        if v in inputs:
            return "in:" + v
        if "init:" + v in declared_inits:
            return "init:" + v
        return None

    for n in snap["nodes"]:
        for v in n["inputs"]:
            s = source(v) if v else None
            if s is not None:
                out.append(f"  {_q(s)} -> {_q(_nid(n))}" + (f" [label={_q(v)}];" if small else ";"))
    for name, _, _ in snap["outputs"]:
        s = source(name)
        if s is not None:
            out.append(f"  {_q(s)} -> {_q('out:' + name)};")
    return out


def render_svg(dot_path: str, svg_path: str) -> None:
    exe = shutil.which("dot")
    if exe is None:
        raise DmlgraphError("cannot write the SVG: Graphviz is not installed (no `dot` program on PATH)",
                            hint="install graphviz (e.g. apt-get install graphviz), or write the graph with "
                                 "--dot FILE and render it elsewhere: dot -Tsvg FILE -o OUT.svg")
    try:
        proc = subprocess.run([exe, "-Tsvg", dot_path, "-o", svg_path], capture_output=True, text=True,
                              timeout=300)
    except subprocess.TimeoutExpired:
        raise DmlgraphError("Graphviz `dot` took more than 5 minutes to lay out the graph",
                            hint="the graph is very large; render the --dot file with `sfdp` instead") from None
    if proc.returncode != 0:
        raise DmlgraphError(f"Graphviz `dot` failed ({proc.returncode}): {proc.stderr.strip()[:500]}")


def _write_text(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise DmlgraphError(f"cannot write {path}: the folder {folder} does not exist")
    with atomic_writer(path) as f:
        f.write(text.encode("utf-8"))


# ---- CLI entry ---------------------------------------------------------------------------------
def inspect_command(args: argparse.Namespace) -> int:
    options = make_options(feature_level=getattr(args, "feature_level", "5_1"), exact=bool(getattr(args, "exact", False)))
    as_json = bool(getattr(args, "json", False))
    progress = progress_printer(not as_json)
    ins = analyze(args.model, options, getattr(args, "top", 10), getattr(args, "target", "dml"), progress)
    dot_file, svg_file = getattr(args, "dot", None), getattr(args, "svg", None)
    if svg_file and shutil.which("dot") is None:
        render_svg("", svg_file)  # raises the not-installed error before anything is written
    if dot_file or svg_file:
        dot = to_dot(ins)
        if dot_file:
            _write_text(dot_file, dot)
        if svg_file:
            if dot_file:
                render_svg(dot_file, svg_file)
            else:
                with tempfile.TemporaryDirectory(prefix="dmlgraph-dot-") as tmp:
                    p = os.path.join(tmp, "graph.dot")
                    _write_text(p, dot)
                    render_svg(p, svg_file)
    if as_json:
        print(json.dumps(ins.report, indent=2, sort_keys=True, allow_nan=False))
    else:
        text = format_text(ins.report, bool(getattr(args, "verbose", False)))
        written = [f for f in (dot_file, svg_file) if f]
        print(text + ("\nwrote " + ", ".join(written) if written else ""))
    if getattr(args, "fail_on_missed", False) and ins.report["missed"]:
        print(f"dmlgraph: {len(ins.report['missed'])} mask-like tensor(s) neither lowered nor declined "
              "(--fail-on-missed)", file=sys.stderr)
        return 1
    return 0
