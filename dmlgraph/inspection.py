"""`dmlgraph inspect`: what is in a model, which subgraphs lower, to what, what that saves, and why not.

Shaped after polygraphy's `inspect capability` (operator, count, reason, node ranges) and onnxsim's
before/after table. `inspect_model` is a pure function returning a JSON-ready dict (schema in
docs/inspect.md, version `SCHEMA`); `format_text` and `to_dot` are its faces; `inspect_command`
is the CLI entry.

It works generically from the pass manager's result: every applied Match is one candidate row
(rule, covered nodes and initializers, the DmlNode in `captures["dml"]`), every declined Match one
row with its reason. Nothing here knows a particular rule.

Large models: the header reads metadata only (`tensor_nbytes` from dims/dtype or the stored
external `length`); external weights are never read for it. Rules may memory-map a constant they
analyse, as `optimize` would.
"""
from __future__ import annotations

import collections
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto

from dmlgraph import mask_census
from dmlgraph.dtypes import INT32_MAX, INT32_MIN, DmlDataType, onnx_type_name
from dmlgraph.errors import DmlgraphError
from dmlgraph.modelfile import atomic_writer, tensor_nbytes
from dmlgraph.nested import SCOPE, in_lowered_graph, nested_dml_nodes, qualified_name
from dmlgraph.ops import FeatureLevel, bind_range

SCHEMA = "dmlgraph.inspect/2"
PICTURE_MAX = 8           # the picture shows at most the top-left 8x8 corner of one slice
REPRESENTATIVE_DIM = 8    # symbolic dims take this size in a representative desc / picture

# Stable key sets (docs/inspect.md documents each; the tests pin them).
TOP_KEYS = ("schema", "model", "options", "inputs", "outputs", "ops", "initializers", "candidates",
            "declined", "masks", "missed", "totals")
MASK_KEYS = ("value", "producer", "op_type", "index", "shape", "found", "status", "rule", "reason")
CANDIDATE_KEYS = ("id", "rule", "description", "scope", "nodes", "initializers", "lowers_to", "exact", "saves",
                  "picture", "superseded_by", "in_lowered_graph")
DECLINED_KEYS = ("rule", "scope", "nodes", "initializers", "reason")


# ---- small helpers -----------------------------------------------------------------------------
def _progress_printer(enabled: bool):
    """Progress lines on stderr, only on a terminal (quiet when piped or with --json)."""
    if not enabled or not sys.stderr.isatty():
        return None
    start = time.perf_counter()
    return lambda msg: print(f"  .. [{time.perf_counter() - start:5.1f}s] {msg}", file=sys.stderr, flush=True)


def _dim(d):
    """A dim for JSON: int, symbolic name, or None (unknown)."""
    if isinstance(d, (int, np.integer)):
        return int(d)
    return d or None


def _shape(shape):
    return None if shape is None else [_dim(d) for d in shape]


def _shape_text(shape) -> str:
    if shape is None:
        return "(unknown rank)"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _bytes(n) -> str:
    from dmlgraph.report import _bytes as fmt
    return fmt(n)


def _json_safe(x):
    """numpy scalars -> Python; non-finite floats -> strings ("inf", "-inf", "nan") for strict JSON."""
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _scalar(v):
    v = np.asarray(v).reshape(-1)[0].item() if isinstance(v, (np.ndarray, np.generic)) else v
    return int(v) if isinstance(v, bool) else v


def _fmt_scalar(v) -> str:
    v = _scalar(v)
    if isinstance(v, float):
        if math.isfinite(v) and v.is_integer():
            return str(int(v))
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    return str(v)


def _bound_text(b: int) -> str:
    return {INT32_MIN: "INT32_MIN", INT32_MAX: "INT32_MAX"}.get(b, str(b))


def _sym_prod(factors):
    """Product of ints and symbolic names: an int when all are static, else e.g. '4*batch*seq*seq'."""
    c, syms = 1, []
    for f in factors:
        if isinstance(f, int):
            c *= f
        else:
            syms.append("?" if f is None else str(f))
    if not syms:
        return c
    return "*".join(([str(c)] if c != 1 else []) + syms)


# ---- header (metadata only) --------------------------------------------------------------------
def _value_info_rows(vis, skip=()):
    rows = []
    for vi in vis:
        if vi.name in skip:
            continue
        tp = vi.type
        if tp.HasField("tensor_type"):
            tt = tp.tensor_type
            shape = None
            if tt.HasField("shape"):
                shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
            rows.append({"name": vi.name, "type": onnx_type_name(tt.elem_type) if tt.elem_type else None,
                         "shape": shape})
        else:
            rows.append({"name": vi.name, "type": tp.WhichOneof("value") or None, "shape": None})
    return rows


def _is_external(t: TensorProto) -> bool:
    return t.HasField("data_location") and t.data_location == TensorProto.EXTERNAL


def _initializer_row(t: TensorProto) -> dict:
    row = {"name": t.name, "shape": [int(d) for d in t.dims], "type": onnx_type_name(t.data_type),
           "bytes": int(tensor_nbytes(t)), "storage": "external" if _is_external(t) else "inline",
           "location": None}
    if _is_external(t):
        row["location"] = next((e.value for e in t.external_data if e.key == "location"), None)
    return row


def _header(path: str, model: onnx.ModelProto, top: int) -> dict:
    mg = model.graph
    inits = [_initializer_row(t) for t in mg.initializer]
    ext = [r for r in inits if r["storage"] == "external"]
    names = {r["name"] for r in inits}
    opsets = {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import}
    hist = collections.Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
                               for n in mg.node)
    top_rows = sorted(inits, key=lambda r: (-r["bytes"], r["name"]))[:max(0, top)]
    return {
        "model": {
            "path": path, "file_bytes": os.path.getsize(path), "ir_version": int(model.ir_version),
            "opset_imports": dict(sorted(opsets.items())), "producer_name": model.producer_name,
            "producer_version": model.producer_version, "graph_name": mg.name, "nodes": len(mg.node),
            "external_data_files": sorted({r["location"] for r in ext if r["location"]}),
            "external_data_bytes": sum(r["bytes"] for r in ext),
        },
        "inputs": _value_info_rows(mg.input, skip=names),
        "outputs": _value_info_rows(mg.output),
        "ops": dict(sorted(hist.items())),
        "initializers": {
            "count": len(inits), "bytes": sum(r["bytes"] for r in inits),
            "inline_count": len(inits) - len(ext), "external_count": len(ext),
            "external_bytes": sum(r["bytes"] for r in ext), "top": top_rows,
        },
    }


# ---- one candidate ---------------------------------------------------------------------------
def _node_row(n, index: dict, m) -> dict:
    """A covered node; `index` is its position in the model (None: made by an earlier rewrite, or
    inside a body or function, whose nodes are named with their path: `Loop_1/body/Trilu_2`)."""
    return {"name": qualified_name(m, n), "op_type": n.op_type, "index": index.get(n.id)}


def _out_shape(dml):
    shape = dml.outputs[0].shape if dml.outputs and dml.outputs[0] is not None else None
    if shape is None and dml.static_shape is not None:
        shape = dml.static_shape
    return None if shape is None else tuple(shape)


def _is_static(shape) -> bool:
    return shape is not None and all(isinstance(d, (int, np.integer)) for d in shape)


def _bounds(dml) -> tuple[int | None, int | None]:
    """int64-space [begin, end) of the template (DIAGONAL_MATRIX: Offset, Offset + 1)."""
    if dml.kind == "DiagonalMatrix":
        return dml.begin, dml.begin + 1
    return dml.begin, dml.end


def _symbolic_desc(dml, out_shape, level: FeatureLevel) -> dict:
    """The desc with symbolic sizes (strides and byte counts as expressions); bounds unclamped."""
    from dmlgraph.binding import min_rank
    dtype = DmlDataType.from_onnx(dml.elem_type)
    elem = dtype.element_size
    rank = len(out_shape)
    dims = [_dim(d) for d in out_shape]
    if rank > 4:
        sizes, out_total = None, _sym_prod([elem] + dims)
    else:
        sizes = [1] * max(0, min_rank(dml, level) - rank) + dims
        out_total = _sym_prod([elem] + sizes)

    def total(expr):
        """DMLCalcBufferTensorSize rounds up to 4 bytes; a static factor divisible by 4 needs no roundup."""
        if isinstance(expr, int):
            return -(-expr // 4) * 4
        coeff = expr.split("*", 1)[0]
        return expr if coeff.isdigit() and int(coeff) % 4 == 0 else f"roundup({expr}, 4)"

    output = {"data_type": dtype.name, "flags": 0, "sizes": sizes, "strides": None,
              "total_bytes": total(out_total), "alignment": 0}
    begin, end = _bounds(dml)
    if dml.kind == "DiagonalMatrix":
        return {"operator": "DIAGONAL_MATRIX", "offset": begin, "value": float(_scalar(dml.value)),
                "output": output}
    inp = None
    x = dml.inputs[0]
    if x is not None:
        xs = list(x.shape) if x.shape is not None else list(out_shape)
        xs = [1] * (rank - len(xs)) + [_dim(d) for d in xs]
        strides = [0 if (xd == 1 and od != 1) else _sym_prod(xs[i + 1:]) for i, (xd, od) in enumerate(zip(xs, dims))]
        pad = len(sizes) - rank if sizes is not None else 0
        inp = {"data_type": dtype.name, "flags": 0, "sizes": sizes,
               "strides": None if sizes is None else [0] * pad + strides,
               "total_bytes": total(_sym_prod([elem] + xs)), "alignment": 0}
    return {"operator": "DIAGONAL_MATRIX1",
            "begin": INT32_MIN if begin is None else begin, "end": INT32_MAX if end is None else end,
            "value": _scalar(dml.value), "value_data_type": dtype.name, "input": inp, "output": output}


def _bound_desc(dml, out_shape, level: FeatureLevel) -> dict:
    """binding.node_desc at a static shape (symbolic input dims, if any, take REPRESENTATIVE_DIM)."""
    from dmlgraph.binding import node_desc
    x = dml.inputs[0]
    x_shape = None
    if x is not None and x.shape is not None:
        x_shape = tuple(int(d) if isinstance(d, (int, np.integer)) else REPRESENTATIVE_DIM for d in x.shape)
    return node_desc(dml, out_shape, x_shape, 0, level).to_dict()


def _lowers_to(dml, level: FeatureLevel) -> dict:
    begin, end = _bounds(dml)
    try:
        dtype_name = DmlDataType.from_onnx(dml.elem_type).name
    except DmlgraphError:
        dtype_name = None
    x, shape_in, k_in = (dml.inputs + [None, None, None])[:3]
    out_shape = _out_shape(dml)
    static = _is_static(out_shape)
    notes = []
    if k_in is not None:
        notes.append(f"k is the run-time input {k_in.name!r}: it shifts every bounded end; bounds here are "
                     "at k = 0")
    if begin is not None or end is not None:
        notes.append("bounded ends are clamped to [-H, W] when bound to a shape (same meaning, no int32 "
                     "overflow)")
    rec = {
        "operator": "DIAGONAL_MATRIX" if dml.kind == "DiagonalMatrix" else "DIAGONAL_MATRIX1",
        "node": dml.name,
        "begin": INT32_MIN if begin is None else begin, "begin_unbounded": begin is None,
        "end": INT32_MAX if end is None else end, "end_unbounded": end is None,
        "value": _scalar(dml.value), "value_data_type": dtype_name, "onnx_type": onnx_type_name(dml.elem_type),
        "has_input": x is not None, "input": None if x is None else x.name,
        "runtime_k": k_in is not None, "k_input": None if k_in is None else k_in.name,
        "runtime_shape": shape_in is not None, "shape_input": None if shape_in is None else shape_in.name,
        "output": {"name": dml.outputs[0].name, "shape": _shape(out_shape)},
        "shape_static": static,
        "desc": None, "desc_kind": None, "representative": None, "notes": notes,
    }
    if out_shape is None:
        notes.append("the output shape is unknown: no desc can be shown")
        return rec
    try:
        if static:
            rec["desc"], rec["desc_kind"] = _bound_desc(dml, out_shape, level), "exact"
        else:
            rec["desc"], rec["desc_kind"] = _symbolic_desc(dml, out_shape, level), "symbolic"
            notes.insert(0, "sizes are bound at run time; the symbolic desc shows them by name")
            subst = {}
            for d in out_shape:
                if not isinstance(d, (int, np.integer)):
                    subst[d or "?"] = REPRESENTATIVE_DIM
            rep_shape = tuple(int(d) if isinstance(d, (int, np.integer)) else REPRESENTATIVE_DIM for d in out_shape)
            rep = _bound_desc(dml, rep_shape, level)
            rec["representative"] = {"dims": subst, "shape": list(rep_shape), "desc": rep,
                                     "label": "representative only: symbolic dims set to "
                                              f"{REPRESENTATIVE_DIM}"}
    except DmlgraphError as e:
        notes.append(f"desc not available: {e}")
    return rec


def picture(dml) -> dict:
    """The top-left corner (up to 8x8) of one [H, W] slice, as the spec page draws its examples.

    Cells are the Value where the fill applies, else `x` (the input's value) or 0 without input.
    Bounds are clamped with the corner's H, W (ops.bind_range): same cells as the full matrix.
    A run-time k is drawn at k = 0.
    """
    shape = _out_shape(dml)
    hw = tuple(shape[-2:]) if shape is not None and len(shape) >= 2 else (None, None)
    h, w = (min(PICTURE_MAX, int(d)) if isinstance(d, (int, np.integer)) else PICTURE_MAX for d in hw)
    begin, end = _bounds(dml)
    b, e = bind_range(begin, end, 0, max(h, 1), max(w, 1))
    top_x = np.arange(w)[None, :] - np.arange(h)[:, None]
    use = (e >= b) ^ (top_x >= b) ^ (top_x < e)
    value = _fmt_scalar(dml.value)
    other = "x" if dml.inputs[0] is not None else "0"
    rows = [[value if u else other for u in row] for row in use.tolist()]
    representative = not all(isinstance(d, (int, np.integer)) for d in hw)
    return {"rows": rows, "height": h, "width": w, "of": [_dim(d) for d in hw],
            "representative": representative, "k": 0, "runtime_k": dml.inputs[2] is not None,
            "begin": b, "end": e,
            "legend": "x = the input's value" if dml.inputs[0] is not None else None}


def picture_text(p: dict, indent: str = "") -> list[str]:
    rows = p["rows"]
    if not rows or not rows[0]:
        return [indent + "[]"]
    width = max(len(c) for r in rows for c in r)
    full_w = p["of"][1] if isinstance(p["of"][1], int) else None
    full_h = p["of"][0] if isinstance(p["of"][0], int) else None
    more_cols = full_w is None or full_w > p["width"]
    more_rows = full_h is None or full_h > p["height"]
    lines = []
    for i, r in enumerate(rows):
        cells = ", ".join(c.rjust(width) for c in r) + (", ..." if more_cols else "")
        open_ = "[[" if i == 0 else " ["
        close = "]" + ("," if i < len(rows) - 1 or more_rows else "]")
        lines.append(indent + open_ + cells + close)
    if more_rows:
        lines.append(indent + " ...]")
    return lines


# ---- the whole inspection ----------------------------------------------------------------------
@dataclass
class Inspection:
    """The report dict plus the pre-rewrite graph snapshot that `to_dot` draws."""

    report: dict
    snapshot: dict = field(default_factory=dict)


def _snapshot(g) -> dict:
    nodes = [{"index": i, "name": n.name, "op_type": n.op_type,
              "inputs": [None if v is None else v.name for v in n.inputs],
              "outputs": [v.name for v in n.outputs]} for i, n in enumerate(g.nodes.values())]
    return {"name": g.info.graph_name, "nodes": nodes,
            "inputs": [(v.name, onnx_type_name(v.elem_type) if v.elem_type else "?", _shape(v.shape))
                       for v in g.inputs],
            "outputs": [(v.name, onnx_type_name(v.elem_type) if v.elem_type else "?", _shape(v.shape))
                        for v in g.outputs],
            "initializers": {name: _shape(v.shape) for name, v in g.initializers.items()}}


def _init_sizes(g) -> dict[str, int]:
    return {name: int(tensor_nbytes(v.initializer)) if v.initializer is not None else int(np.asarray(v.array).nbytes)
            for name, v in g.initializers.items()}


def _model_stats(model: onnx.ModelProto) -> dict:
    mg = model.graph
    ops = collections.Counter(n.op_type for n in mg.node)
    init_bytes = sum(int(tensor_nbytes(t)) for t in mg.initializer)
    # As api.graph_stats: Constant nodes store tensors too.
    const_bytes = sum(int(tensor_nbytes(a.t)) for n in mg.node if n.op_type == "Constant"
                      for a in n.attribute if a.name == "value")
    return {"nodes": len(mg.node), "ops": dict(sorted(ops.items())), "initializers": len(mg.initializer),
            "initializer_bytes": init_bytes, "constant_bytes": init_bytes + const_bytes,
            "file_bytes": int(model.ByteSize())}


def _rule_table(options) -> dict:
    from dmlgraph.rewrite import Options
    from passes import default_rules
    table = {}
    for opts in (Options(feature_level=options.feature_level), options):
        for r in default_rules(opts):
            table.setdefault(r.name, r)
    return table


def analyze(path: str, options=None, top: int = 10, target: str = "dml", progress=None) -> Inspection:
    """Everything `inspect` reports, plus the graph snapshot for DOT output."""
    from dmlgraph import api
    from dmlgraph.graph import DmlNode
    from dmlgraph.onnx_io import export_model
    from dmlgraph.rewrite import Options

    options = options or Options()
    if target not in ("dml", "onnx"):
        raise DmlgraphError(f"unknown target {target!r}", hint="use --target dml or --target onnx")
    if top < 0:
        raise DmlgraphError(f"--top {top} is negative", hint="pass --top 0 to list no initializers")
    say = progress or (lambda msg: None)
    say(f"loading {path}")
    model, g = api.load(path)
    report = _header(path, model, top)
    report["schema"] = SCHEMA
    report["options"] = {"feature_level": options.feature_level.label, "target": target,
                         "exact_only": bool(options.exact_only), "top": top}
    snapshot = _snapshot(g)
    index = {n.id: i for i, n in enumerate(g.nodes.values())}
    sizes = _init_sizes(g)
    shapes = {name: (_shape(v.shape), onnx_type_name(v.elem_type) if v.elem_type else None)
              for name, v in g.initializers.items()}
    before = api.graph_stats(g)
    sites = mask_census.take(g)
    original_dml = {n.id for n in g.nodes.values() if isinstance(n, DmlNode)}
    say(f"running rules on {before['nodes']} nodes (feature level {options.feature_level.label})")
    result = api.optimize_graph(g, options, progress)
    g.remove_dead()
    rules = _rule_table(options)
    report["masks"] = mask_census.classify(sites, g, result)
    report["missed"] = [r for r in report["masks"] if r["status"] == "missed"]

    say(f"describing {len(result.applied)} candidates")
    # What each match covers: its nodes, the constants it names, and the constants its covered nodes
    # read that are gone afterwards (a Where's fill value, an Equal's zero). A node or constant
    # covered by several candidates (shared shape plumbing) counts as "shared", never twice.
    # A constant some rule names (Match.initializers) belongs to those rules only: a later node that
    # reads a generator under the constant's old name did not remove the constant.
    named = {name for m in result.applied for name in m.initializers}
    covered_inits: list[list[str]] = []
    for m in result.applied:
        names = list(dict.fromkeys(m.initializers))
        for n in m.nodes:
            if n.id in index and n.id not in g.nodes:
                names += [v.name for v in n.inputs if v is not None and v.name in sizes and v.name not in named
                          and v.name not in g.initializers and v.name not in names]
        covered_inits.append(names)
    node_cover = collections.Counter(n.id for m in result.applied for n in {x.id: x for x in m.nodes}.values())
    init_cover = collections.Counter(name for names in covered_inits for name in names)
    candidates = []
    made_by: dict[tuple, int] = {}  # (scope, output value name) of a candidate's DML node -> candidate id
    for i, (m, init_names) in enumerate(zip(result.applied, covered_inits), 1):
        dml = m.captures.get("dml")
        rule = rules.get(m.rule)
        cov_inits = [{"name": name, "bytes": sizes.get(name, 0), "shape": shapes.get(name, (None, None))[0],
                      "type": shapes.get(name, (None, None))[1], "removed": name not in g.initializers}
                     for name in init_names]
        removed_nodes = {n.id for n in m.nodes if n.id in index and n.id not in g.nodes}
        # A later rule may absorb the DML node an earlier one made (cover it, or read its output).
        scope = m.captures.get(SCOPE)  # (a body's names are its own: looked up within it)
        for n in m.nodes:
            reads = [v.name for v in n.inputs if v is not None] + [v.name for v in n.outputs]
            for name in reads:
                j = made_by.get((scope, name))
                if j is not None and j != i and candidates[j - 1]["superseded_by"] is None:
                    candidates[j - 1]["superseded_by"] = i
        if isinstance(dml, DmlNode):
            made_by[scope, dml.outputs[0].name] = i
        gone = [r for r in cov_inits if r["removed"]]
        cand = {
            "id": i, "rule": m.rule, "description": rule.description if rule else "", "scope": scope,
            "nodes": [_node_row(n, index, m) for n in m.nodes],
            "initializers": cov_inits,
            "lowers_to": _lowers_to(dml, options.feature_level) if isinstance(dml, DmlNode) else None,
            "exact": {"bit_exact": bool(dml.exact) if isinstance(dml, DmlNode) else None,
                      "rule": rule.exact if rule else None},
            "saves": {"nodes": sum(1 for nid in removed_nodes if node_cover[nid] == 1),
                      "shared_nodes": sum(1 for nid in removed_nodes if node_cover[nid] > 1),
                      "initializers": sum(1 for r in gone if init_cover[r["name"]] == 1),
                      "initializer_bytes": sum(r["bytes"] for r in gone if init_cover[r["name"]] == 1),
                      "shared_initializer_bytes": sum(r["bytes"] for r in gone if init_cover[r["name"]] > 1),
                      "dml_nodes_added": 1 if isinstance(dml, DmlNode) else 0},
            "picture": picture(dml) if isinstance(dml, DmlNode) else None,
            "superseded_by": None,
            "in_lowered_graph": in_lowered_graph(m, g),
        }
        candidates.append(cand)
    report["candidates"] = candidates
    report["declined"] = [{"rule": m.rule, "scope": m.captures.get(SCOPE),
                           "nodes": [_node_row(n, index, m) for n in m.nodes],
                           "initializers": [{"name": name, "bytes": sizes.get(name, 0),
                                             "shape": shapes.get(name, (None, None))[0],
                                             "type": shapes.get(name, (None, None))[1]} for name in m.initializers],
                           "reason": m.reason} for m in result.declined]

    say(f"exporting for target {target}")
    exported = _model_stats(export_model(g, target))
    dml_now = [n for n in g.nodes.values() if isinstance(n, DmlNode)]
    removed = [nid for nid in index if nid not in g.nodes]
    kept = len(index) - len(removed)
    new_sizes = _init_sizes(g)
    gone_inits = [name for name in sizes if name not in new_sizes]
    new_inits = [name for name in new_sizes if name not in sizes]
    before_model = {"nodes": before["nodes"], "ops": before["ops"], "initializers": before["initializers"],
                    "initializer_bytes": before["initializer_bytes"],
                    "constant_bytes": before.get("constant_bytes", _model_stats(model)["constant_bytes"]),
                    "file_bytes": report["model"]["file_bytes"]}
    report["totals"] = {
        "target": target, "feature_level": options.feature_level.label,
        "candidates": len(candidates), "declined": len(report["declined"]),
        "rewrites": {k: v for k, v in result.counts.items()},
        "nodes_removed": len(removed),
        "nodes_added": exported["nodes"] - kept,
        "dml_nodes_added": sum(1 for n in dml_now if n.id not in original_dml),
        "nested_dml_nodes": len(nested_dml_nodes(result)),
        "initializers_removed": len(gone_inits),
        "initializer_bytes_removed": sum(sizes[name] for name in gone_inits),
        "initializers_added": len(new_inits),
        "initializer_bytes_added": sum(new_sizes[name] for name in new_inits),
        "before": before_model,
        "after": exported,
    }
    return Inspection(_json_safe(report), snapshot)


def inspect_model(path: str, options=None, top: int = 10, target: str = "dml", progress=None) -> dict:
    """The inspect report as a JSON-ready dict (schema: docs/inspect.md)."""
    return analyze(path, options, top, target, progress).report


# ---- text --------------------------------------------------------------------------------------
def _table(rows, headers, indent="  ") -> list[str]:
    cols = list(zip(*([headers] + rows))) if rows else [(h,) for h in headers]
    widths = [max(len(str(c)) for c in col) for col in cols]
    out = [indent + "  ".join(str(h).ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for r in rows:
        out.append(indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _nodes_text(nodes, inits=(), scope=None) -> str:
    """`Trilu 'name' #7` per node (#: position in the model; none for nodes an earlier rewrite made,
    nor for the nodes of a body or function, named with its path)."""
    parts = [n["op_type"] + (f" {n['name']!r}" if n["name"] else "")
             + (f" #{n['index']}" if n.get("index") is not None else "" if scope else " (from an earlier rewrite)")
             for n in nodes]
    parts += [f"constant {i['name']!r}" for i in inits]
    return ", ".join(parts) or "(none)"


def _desc_lines(desc: dict, indent: str) -> list[str]:
    lines = []
    if desc.get("operator") == "DIAGONAL_MATRIX":
        lines.append(f"{indent}DIAGONAL_MATRIX Offset {desc['offset']}, Value {_fmt_scalar(desc['value'])} (FLOAT)")
    else:
        lines.append(f"{indent}DIAGONAL_MATRIX1 DiagonalFillBegin {_bound_text(desc['begin'])}, "
                     f"DiagonalFillEnd {_bound_text(desc['end'])}, Value {_fmt_scalar(desc['value'])}, "
                     f"ValueDataType {desc['value_data_type']}")
    for role, key in (("InputTensor ", "input"), ("OutputTensor", "output")):
        if key not in desc:
            continue
        t = desc[key]
        if t is None:
            lines.append(f"{indent}  {role}: none")
            continue
        sizes = "folded at bind time (rank > 4)" if t["sizes"] is None else _shape_text(t["sizes"])
        strides = "packed" if t["strides"] is None else _shape_text(t["strides"])
        lines.append(f"{indent}  {role}: {t['data_type']} sizes {sizes} strides {strides} "
                     f"TotalTensorSizeInBytes {t['total_bytes']} alignment {t['alignment']} flags {t['flags']}")
    return lines


def format_text(r: dict) -> str:
    m = r["model"]
    init = r["initializers"]
    L = [f"model     {m['path']} ({_bytes(m['file_bytes'])}"
         + (f" + {_bytes(m['external_data_bytes'])} external data in {', '.join(m['external_data_files'])}"
            if m["external_data_files"] else "") + ")",
         f"format    IR {m['ir_version']}, opsets "
         + ", ".join(f"{d} {v}" for d, v in m["opset_imports"].items())
         + (f", producer {m['producer_name']} {m['producer_version']}".rstrip() if m["producer_name"] else ""),
         f"graph     {m['graph_name'] or '(unnamed)'}: {m['nodes']} nodes, {init['count']} initializers "
         f"({_bytes(init['bytes'])}; {init['external_count']} external)"]
    L.append("inputs:")
    L += _table([[v["name"], v["type"] or "?", _shape_text(v["shape"])] for v in r["inputs"]],
                ["name", "type", "shape"]) if r["inputs"] else ["  (none)"]
    L.append("outputs:")
    L += _table([[v["name"], v["type"] or "?", _shape_text(v["shape"])] for v in r["outputs"]],
                ["name", "type", "shape"]) if r["outputs"] else ["  (none)"]
    L.append("ops:      " + (", ".join(f"{k} {v}" for k, v in r["ops"].items()) or "(none)"))
    if init["top"]:
        L.append(f"largest initializers (top {len(init['top'])} of {init['count']}):")
        L += _table([[t["name"], _shape_text(t["shape"]), t["type"], _bytes(t["bytes"]),
                      t["storage"] + (f" ({t['location']})" if t["location"] else "")] for t in init["top"]],
                    ["name", "shape", "type", "bytes", "storage"])
    o = r["options"]
    L.append("")
    L.append(f"candidates (feature level {o['feature_level']}, target {o['target']}"
             + (", exact rewrites only" if o["exact_only"] else "")
             + f"): {len(r['candidates'])} lowered, {len(r['declined'])} declined")
    for c in r["candidates"]:
        L.append(f"[{c['id']}] {c['rule']}" + (f" in {c['scope']}" if c["scope"] else "") + ": "
                 + (_nodes_text(c["nodes"], (), c["scope"]) if c["nodes"] else _nodes_text([], c["initializers"])))
        if c["initializers"]:
            L.append("    constants: " + ", ".join(f"{i['name']} {_shape_text(i['shape'])} {i['type']} "
                                                   f"{_bytes(i['bytes'])}" for i in c["initializers"]))
        t = c["lowers_to"]
        if t is not None:
            b = _bound_text(t["begin"]) + (" (unbounded)" if t["begin_unbounded"] else "")
            e = _bound_text(t["end"]) + (" (unbounded)" if t["end_unbounded"] else "")
            extras = [f"input {t['input']!r}" if t["has_input"] else "no input"]
            if t["runtime_k"]:
                extras.append(f"run-time k {t['k_input']!r}")
            if t["runtime_shape"]:
                extras.append(f"run-time shape {t['shape_input']!r}")
            L.append(f"    lowers to {t['operator']}: Begin {b}, End {e}, Value {_fmt_scalar(t['value'])} "
                     f"({t['value_data_type']}), {', '.join(extras)}")
            L.append(f"    output {t['output']['name']!r} {t['onnx_type']} {_shape_text(t['output']['shape'])}"
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
                                                   f" (node {'bit-exact' if ex['bit_exact'] else 'not bit-exact'})"))
        s = c["saves"]
        shared = []
        if s["shared_nodes"]:
            shared.append(_plural(s["shared_nodes"], "node"))
        if s["shared_initializer_bytes"]:
            shared.append(_bytes(s["shared_initializer_bytes"]))
        L.append(f"    saves: {_plural(s['nodes'], 'node')}, {_plural(s['initializers'], 'initializer')} "
                 f"({_bytes(s['initializer_bytes'])})"
                 + (f", plus {' and '.join(shared)} shared with other candidates" if shared else "")
                 + f"; adds {_plural(s['dml_nodes_added'], 'DML node')}"
                 + (f" (absorbed by [{c['superseded_by']}])" if c["superseded_by"] else
                    " (absorbed by a later rewrite)" if c["lowers_to"] and not c["in_lowered_graph"] else ""))
        p = c["picture"]
        if p is not None:
            of = _shape_text(p["of"])
            what = f"top-left {p['height']}x{p['width']} of one {of} slice"
            if p["representative"]:
                what += f", symbolic sides drawn at {PICTURE_MAX}"
            if p["runtime_k"]:
                what += ", k = 0 shown"
            if p["legend"]:
                what += f"; {p['legend']}"
            L.append(f"    pattern ({what}):")
            L += picture_text(p, "      ")
    if r["declined"]:
        L.append("declined:")
        for d in r["declined"]:
            L.append(f"  {d['rule']}" + (f" in {d['scope']}" if d["scope"] else "")
                     + f": {_nodes_text(d['nodes'], d['initializers'], d['scope'])}: {d['reason']}")
    L += _census_text(r["masks"])
    t = r["totals"]
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
                 f"({_bytes(t['initializer_bytes_added'])})")
    if t["nested_dml_nodes"]:
        adds += (f"; and {_plural(t['nested_dml_nodes'], 'DML node')} inside bodies and functions"
                 + ("" if t["target"] == "dml" else ", written as standard ONNX nodes"))
    L.append(f"totals (target {t['target']}): optimize would remove {_plural(t['nodes_removed'], 'node')} and "
             f"{_plural(t['initializers_removed'], 'initializer')} ({_bytes(t['initializer_bytes_removed'])}), "
             f"{adds}")
    from dmlgraph.report import before_after_table
    L.append(before_after_table(t["before"], t["after"]))
    return "\n".join(L)


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
        L.append(f"  {m['status'].upper()} {m['value']!r} {_shape_text(m['shape'])} from {where}: {m['found']}; "
                 f"{m['reason']}")
    return L


# ---- DOT ---------------------------------------------------------------------------------------
_FILL = ["#ffd27f", "#9fd3ff", "#b9f0a8", "#f7b2d9", "#d6c4ff", "#ffe99a", "#a8ece6", "#ffc0a8"]


def _q(s) -> str:
    """A DOT double-quoted string."""
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(ins: Inspection) -> str:
    """Graphviz DOT of the model's graph (as imported, before rewrites), candidates highlighted.

    Each candidate is a filled cluster labelled `[id] rule -> OPERATOR`; declined nodes have a dashed
    red border and their reason as tooltip. Initializers appear only when a candidate covers them.
    """
    snap, r = ins.snapshot, ins.report
    by_index = {i: n for i, n in enumerate(snap["nodes"])}
    nid = lambda n: f"n{n['index']}"  # noqa: E731
    owner: dict[str, int] = {}
    cluster_nodes: dict[int, list[str]] = collections.defaultdict(list)
    cluster_inits: dict[int, list[str]] = collections.defaultdict(list)
    for c in r["candidates"]:
        for n in c["nodes"]:
            if n["index"] is not None and nid(by_index[n["index"]]) not in owner:
                owner[nid(by_index[n["index"]])] = c["id"]
                cluster_nodes[c["id"]].append(nid(by_index[n["index"]]))
        for i in c["initializers"]:
            key = f"init:{i['name']}"
            if i["name"] in snap["initializers"] and key not in owner:
                owner[key] = c["id"]
                cluster_inits[c["id"]].append(i["name"])
    declined = {}
    for d in r["declined"]:
        for n in d["nodes"]:
            if n["index"] is not None:
                declined.setdefault(nid(by_index[n["index"]]), d["reason"])
    small = len(snap["nodes"]) <= 300
    out = [f"digraph {_q(snap['name'] or 'graph')} {{",
           '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, labelloc=t, '
           + f"label={_q(os.path.basename(r['model']['path']) + ': ' + str(len(r['candidates'])) + ' candidates')}];",
           '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=10];',
           '  edge [fontname="Helvetica", fontsize=8, color="#777777"];']

    def node_stmt(n, indent="  "):
        key = nid(n)
        label = n["op_type"] + (f"\n{n['name']}" if n["name"] else "")
        attrs = [f"label={_q(label)}"]
        if key in owner:
            attrs.append(f'style="rounded,filled", fillcolor={_q(_FILL[(owner[key] - 1) % len(_FILL)])}')
        elif key in declined:
            attrs.append(f'style="rounded,dashed", color="#cc0000", tooltip={_q("declined: " + declined[key])}')
        return f"{indent}{_q(key)} [{', '.join(attrs)}];"

    def init_stmt(name, indent="  "):
        shape = snap["initializers"].get(name)
        return (f"{indent}{_q('init:' + name)} [shape=note, style=filled, fillcolor=\"#eeeeee\", "
                f"label={_q(name + chr(10) + _shape_text(shape))}];")

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
        if nid(n) not in owner:
            out.append(node_stmt(n))
    for i, (name, typ, shape) in enumerate(snap["inputs"]):
        out.append(f"  {_q('in:' + name)} [shape=ellipse, style=filled, fillcolor=\"#e8f0ff\", "
                   f"label={_q(name + chr(10) + typ + ' ' + _shape_text(shape))}];")
    for i, (name, typ, shape) in enumerate(snap["outputs"]):
        out.append(f"  {_q('out:' + name)} [shape=ellipse, style=filled, fillcolor=\"#e8ffe8\", "
                   f"label={_q(name + chr(10) + typ + ' ' + _shape_text(shape))}];")
    producer = {}
    for n in snap["nodes"]:
        for v in n["outputs"]:
            producer[v] = nid(n)
    inputs = {name for name, _, _ in snap["inputs"]}
    declared_inits = {f"init:{name}" for names in cluster_inits.values() for name in names}

    def source(v):
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
                out.append(f"  {_q(s)} -> {_q(nid(n))}" + (f" [label={_q(v)}];" if small else ";"))
    for name, _, _ in snap["outputs"]:
        s = source(name)
        if s is not None:
            out.append(f"  {_q(s)} -> {_q('out:' + name)};")
    out.append("}")
    return "\n".join(out) + "\n"


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
def inspect_command(args) -> int:
    from dmlgraph.rewrite import Options
    options = Options(feature_level=FeatureLevel.parse(getattr(args, "feature_level", "5_1")),
                      exact_only=bool(getattr(args, "exact", False)))
    as_json = bool(getattr(args, "json", False))
    progress = _progress_printer(not as_json)
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
        text = format_text(ins.report)
        written = [f for f in (dot_file, svg_file) if f]
        print(text + ("\nwrote " + ", ".join(written) if written else ""))
    if getattr(args, "fail_on_missed", False) and ins.report["missed"]:
        print(f"dmlgraph: {len(ins.report['missed'])} mask-like tensor(s) neither lowered nor declined "
              "(--fail-on-missed)", file=sys.stderr)
        return 1
    return 0
