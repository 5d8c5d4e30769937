"""`dmlgraph inspect`: what is in a model, which subgraphs lower, to what, what that saves, and why not.

`inspect_model` is a pure function returning a JSON-ready dict (schema in docs/inspect.md); every
applied or declined Match is one row, so nothing here knows a particular rule, and external weights
are never read for the header. More: docs/internals.md, inspection.py.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
import sys
import time
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import onnx
from onnx import TensorProto

from dmlgraph import mask_census, pipeline
from dmlgraph.errors import DmlgraphError
from dmlgraph.io.modelfile import tensor_nbytes
from dmlgraph.ir.dtypes import INT32_MAX, INT32_MIN, DmlDataType, onnx_type_name
from dmlgraph.ir.graph import DmlNode
from dmlgraph.ir.ops import FeatureLevel, bind_range
from dmlgraph.pipeline import IN_MEMORY, ModelLike
from dmlgraph.rewrite import Options
from dmlgraph.rewrite.nested import SCOPE, in_lowered_graph, nested_dml_nodes, qualified_name
from dmlgraph.runtime.binding import min_rank, node_desc

if TYPE_CHECKING:
    from dmlgraph.ir.graph import Dim, Graph, Node
    from dmlgraph.pipeline import OptimizeResult
    from dmlgraph.rewrite import Match, PassResult

Progress = Callable[[str], None]

SCHEMA = "dmlgraph.inspect/3"
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
def progress_printer(enabled: bool) -> Progress | None:
    """Progress lines on stderr, only on a terminal (quiet when piped or with --json)."""
    if not enabled or not sys.stderr.isatty():
        return None
    start = time.perf_counter()
    return lambda msg: print(f"  .. [{time.perf_counter() - start:5.1f}s] {msg}", file=sys.stderr, flush=True)


def _dim(d: Dim | np.integer) -> int | str | None:
    """A dim for JSON: int, symbolic name, or None (unknown)."""
    if isinstance(d, (int, np.integer)):
        return int(d)
    return d or None


def _shape(shape: Iterable[Dim | np.integer] | None) -> list[int | str | None] | None:
    return None if shape is None else [_dim(d) for d in shape]


def shape_text(shape: Iterable[object] | None) -> str:
    if shape is None:
        return "(unknown rank)"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def format_bytes(n: float) -> str:
    """A byte count as people read it: 512 B, 1.5 KiB, 3.0 MiB."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _json_safe(x: Any) -> Any:
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


def _scalar(v: Any) -> Any:
    v = np.asarray(v).reshape(-1)[0].item() if isinstance(v, (np.ndarray, np.generic)) else v
    return int(v) if isinstance(v, bool) else v


def fmt_scalar(v: Any) -> str:
    v = _scalar(v)
    if isinstance(v, float):
        if math.isfinite(v) and v.is_integer():
            return str(int(v))
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    return str(v)


def bound_text(b: int) -> str:
    return {INT32_MIN: "INT32_MIN", INT32_MAX: "INT32_MAX"}.get(b, str(b))


def _sym_prod(factors: Iterable[int | str | None]) -> int | str:
    """Product of ints and symbolic names: an int when all are static, else e.g. '4*batch*seq*seq'
    (a name that is an expression, as exporters write `past + seq`, in parentheses)."""
    c, syms = 1, []
    for f in factors:
        if isinstance(f, int):
            c *= f
        else:
            name = "?" if f is None else str(f)
            syms.append(name if re.fullmatch(r"[\w.:?]+", name) else f"({name})")
    if not syms:
        return c
    return "*".join(([str(c)] if c != 1 else []) + syms)


# ---- header (metadata only) --------------------------------------------------------------------
def _value_info_rows(vis: Iterable[onnx.ValueInfoProto], skip: Container[str] = ()) -> list[dict[str, Any]]:
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


def _header(path: str | None, model: onnx.ModelProto, top: int) -> dict:
    """`path`: None for a model given in memory (its size is then its serialized size)."""
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
            "path": path if path is not None else IN_MEMORY,
            "file_bytes": os.path.getsize(path) if path is not None else model.ByteSize(),
            "ir_version": int(model.ir_version),
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
def _node_row(n: Node, index: dict, m: Match) -> dict:
    """A covered node; `index` is its position in the model (None: made by an earlier rewrite, or
    inside a body or function, whose nodes are named with their path: `Loop_1/body/Trilu_2`)."""
    return {"name": qualified_name(m, n), "op_type": n.op_type, "index": index.get(n.id)}


def _out_shape(dml: DmlNode) -> tuple[Dim, ...] | None:
    shape = dml.outputs[0].shape if dml.outputs and dml.outputs[0] is not None else None
    if shape is None and dml.static_shape is not None:
        shape = dml.static_shape
    return None if shape is None else tuple(shape)


def _is_static(shape: Iterable[object] | None) -> bool:
    return shape is not None and all(isinstance(d, (int, np.integer)) for d in shape)


def _bounds(dml: DmlNode) -> tuple[int | None, int | None]:
    """int64-space [begin, end) of the template (DIAGONAL_MATRIX: Offset, Offset + 1)."""
    if dml.kind == "DiagonalMatrix":
        assert dml.begin is not None  # (DIAGONAL_MATRIX's Offset)
        return dml.begin, dml.begin + 1
    return dml.begin, dml.end


def _symbolic_desc(dml: DmlNode, out_shape: tuple[Dim, ...], level: FeatureLevel) -> dict:
    """The desc with symbolic sizes (strides and byte counts as expressions); bounds unclamped."""
    dtype = DmlDataType.from_onnx(dml.elem_type)
    elem = dtype.element_size
    rank = len(out_shape)
    dims = [_dim(d) for d in out_shape]
    if rank > 4:
        sizes, out_total = None, _sym_prod([elem] + dims)
    else:
        sizes = [1] * max(0, min_rank(dml, level) - rank) + dims
        out_total = _sym_prod([elem] + sizes)

    def total(expr: int | str) -> int | str:
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
    inp: dict[str, Any] | None = None
    x = dml.inputs[0]
    if x is not None:
        x_dims = list(x.shape) if x.shape is not None else list(out_shape)
        xs = [1] * (rank - len(x_dims)) + [_dim(d) for d in x_dims]
        strides = [0 if (xd == 1 and od != 1) else _sym_prod(xs[i + 1:]) for i, (xd, od) in enumerate(zip(xs, dims))]
        pad = len(sizes) - rank if sizes is not None else 0
        inp = {"data_type": dtype.name, "flags": 0, "sizes": sizes,
               "strides": None if sizes is None else [0] * pad + strides,
               "total_bytes": total(_sym_prod([elem] + xs)), "alignment": 0}
    return {"operator": "DIAGONAL_MATRIX1",
            "begin": INT32_MIN if begin is None else begin, "end": INT32_MAX if end is None else end,
            "value": _scalar(dml.value), "value_data_type": dtype.name, "input": inp, "output": output}


def _bound_desc(dml: DmlNode, out_shape: tuple[int, ...], level: FeatureLevel) -> dict:
    """binding.node_desc at a static shape (symbolic input dims, if any, take REPRESENTATIVE_DIM)."""
    x = dml.inputs[0]
    x_shape = None
    if x is not None and x.shape is not None:
        x_shape = tuple(int(d) if isinstance(d, (int, np.integer)) else REPRESENTATIVE_DIM for d in x.shape)
    return node_desc(dml, out_shape, x_shape, 0, level).to_dict()


def _lowers_to(dml: DmlNode, level: FeatureLevel) -> dict:
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
            rec["desc"], rec["desc_kind"] = _bound_desc(dml, cast("tuple[int, ...]", out_shape), level), "exact"
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


def picture(dml: DmlNode) -> dict:
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
    value = fmt_scalar(dml.value)
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


def _snapshot(g: Graph) -> dict:
    nodes = [{"index": i, "name": n.name, "op_type": n.op_type,
              "inputs": [None if v is None else v.name for v in n.inputs],
              "outputs": [v.name for v in n.outputs]} for i, n in enumerate(g.nodes.values())]
    return {"name": g.info.graph_name, "nodes": nodes,
            "inputs": [(v.name, onnx_type_name(v.elem_type) if v.elem_type else "?", _shape(v.shape))
                       for v in g.inputs],
            "outputs": [(v.name, onnx_type_name(v.elem_type) if v.elem_type else "?", _shape(v.shape))
                        for v in g.outputs],
            "initializers": {name: _shape(v.shape) for name, v in g.initializers.items()}}


def _init_sizes(g: Graph) -> dict[str, int]:
    return {name: int(tensor_nbytes(v.initializer)) if v.initializer is not None else int(np.asarray(v.array).nbytes)
            for name, v in g.initializers.items()}


def _model_stats(model: onnx.ModelProto) -> dict:
    mg = model.graph
    ops = collections.Counter(n.op_type for n in mg.node)
    init_bytes = sum(int(tensor_nbytes(t)) for t in mg.initializer)
    # As pipeline.graph_stats: Constant nodes store tensors too.
    const_bytes = sum(int(tensor_nbytes(a.t)) for n in mg.node if n.op_type == "Constant"
                      for a in n.attribute if a.name == "value")
    return {"nodes": len(mg.node), "ops": dict(sorted(ops.items())), "initializers": len(mg.initializer),
            "initializer_bytes": init_bytes, "constant_bytes": init_bytes + const_bytes,
            "file_bytes": int(model.ByteSize())}


def _rule_table() -> dict:
    from dmlgraph.passes import default_rules
    return {r.name: r for r in default_rules()}


def analyze(source: ModelLike, options: Options | None = None, top: int = 10, target: str = "dml",
            progress: Progress | None = None) -> Inspection:
    """Everything `inspect` reports, plus the graph snapshot for DOT output (`source`: a path or
    a ModelProto, which is only read)."""

    options = options or Options()
    pipeline.check_target(target)
    if isinstance(top, bool) or not isinstance(top, int):
        raise DmlgraphError(f"top {top!r} is not an int", hint="pass top=0 or more")
    if top < 0:
        raise DmlgraphError(f"--top {top} is negative", hint="pass --top 0 to list no initializers")
    say = progress or (lambda msg: None)
    source = pipeline.as_model(source)
    path = None if isinstance(source, onnx.ModelProto) else source
    say(f"loading {path or IN_MEMORY}")
    seen: dict[str, Any] = {}

    def loaded(model: onnx.ModelProto, g: Graph) -> None:  # the graph as imported, before any rule
        seen.update(model=model, snapshot=_snapshot(g), index={n.id: i for i, n in enumerate(g.nodes.values())},
                    sizes=_init_sizes(g), sites=mask_census.take(g),
                    shapes={name: (_shape(v.shape), onnx_type_name(v.elem_type) if v.elem_type else None)
                            for name, v in g.initializers.items()},
                    original_dml={n.id for n in g.nodes.values() if isinstance(n, DmlNode)})
        say(f"running rules on {len(g.nodes)} nodes (feature level {options.feature_level.label})")

    # Every candidate the rules find, and separately whether `optimize` would write it (it keeps the
    # input where the lowering would grow the model on this target, unless asked to allow that).
    lowered = pipeline.lower(source, dataclasses.replace(options, allow_growth=True), target, progress,
                             loaded=loaded, check=False, census=True, explain_growth=True)
    grows = lowered.report["grows"] if lowered.rewrites else None
    g, result = lowered.graph, lowered.passes
    snapshot, index, sizes, shapes = seen["snapshot"], seen["index"], seen["sizes"], seen["shapes"]
    report = _header(path, seen["model"], top)
    report["schema"] = SCHEMA
    report["options"] = {"feature_level": options.feature_level.label, "target": target,
                         "exact_only": bool(options.exact_only), "top": top}
    report["masks"] = mask_census.classify(seen["sites"], g, result) + result.census
    report["missed"] = [r for r in report["masks"] if r["status"] == "missed"]

    say(f"describing {len(result.applied)} candidates")
    candidates = _candidate_rows(result, g, index, sizes, shapes, options, [r.exact for r in lowered.rewrites])
    report["candidates"] = candidates
    report["declined"] = _declined_rows(result, index, sizes, shapes)

    say(f"exporting for target {target}")
    report["totals"] = _totals(lowered, seen, report, target, options, grows)
    return Inspection(_json_safe(report), snapshot)


def _candidate_rows(result: PassResult, g: Graph, index: dict[int, int], sizes: dict[str, int],
                    shapes: dict[str, tuple], options: Options, written: list[bool]) -> list[dict[str, Any]]:
    """One row per applied Match: what it covers, what it lowers to, what it saves (`written`: per
    Match, whether what the target writes is bit-exact, as optimize reports it)."""
    rules = _rule_table()
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
    candidates: list[dict[str, Any]] = []
    made_by: dict[tuple, int] = {}  # (scope, output value name) of a candidate's DML node -> candidate id
    for i, (m, init_names) in enumerate(zip(result.applied, covered_inits), 1):
        dml = m.dml
        rule = rules.get(m.rule)
        cov_inits: list[dict[str, Any]] = [
            {"name": name, "bytes": sizes.get(name, 0), "shape": shapes.get(name, (None, None))[0],
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
                      "rule": rule.exact if rule else None,
                      "written": written[i - 1] if len(written) == len(result.applied) else None},
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
    return candidates


def _declined_rows(result: PassResult, index: dict[int, int], sizes: dict[str, int],
                   shapes: dict[str, tuple]) -> list[dict[str, Any]]:
    return [{"rule": m.rule, "scope": m.captures.get(SCOPE),
             "nodes": [_node_row(n, index, m) for n in m.nodes],
             "initializers": [{"name": name, "bytes": sizes.get(name, 0), "shape": shapes.get(name, (None, None))[0],
                               "type": shapes.get(name, (None, None))[1]} for name in m.initializers],
             "reason": m.reason} for m in result.declined]


def _totals(lowered: OptimizeResult, seen: dict[str, Any], report: dict[str, Any], target: str, options: Options,
            grows: str | None) -> dict[str, Any]:
    """What `optimize` would do for the target: nodes and constants removed and added, before/after."""
    g, result, before = lowered.graph, lowered.passes, lowered.before
    growing = lowered.report.get("site_growth", []) if grows else []  # (the sites optimize declines)
    sizes, original_dml = seen["sizes"], seen["original_dml"]
    exported = _model_stats(lowered.model)
    dml_now = [n for n in g.nodes.values() if isinstance(n, DmlNode)]
    # A source node is kept when the written model has it (same op, same outputs): the clean-up
    # folds nodes besides the rewrites (a TorchScript export's Constants), so counting the IR graph
    # alone made `nodes_added` negative (-208 on llama_kv_ts).
    def signatures(m: onnx.ModelProto) -> collections.Counter:
        return collections.Counter((n.op_type, n.domain, tuple(n.output)) for n in m.graph.node)
    kept = sum((signatures(seen["model"]) & signatures(lowered.model)).values())
    new_sizes = _init_sizes(g)
    gone_inits = [name for name in sizes if name not in new_sizes]
    new_inits = [name for name in new_sizes if name not in sizes]
    before_model = {"nodes": before["nodes"], "ops": before["ops"], "initializers": before["initializers"],
                    "initializer_bytes": before["initializer_bytes"],
                    "constant_bytes": before.get("constant_bytes", _model_stats(seen["model"])["constant_bytes"]),
                    "file_bytes": report["model"]["file_bytes"]}
    return {
        "target": target, "feature_level": options.feature_level.label,
        "grows": grows, "optimize_writes_lowered": bool(lowered.rewrites) and (
            grows is None or options.allow_growth or bool(lowered.report.get("writes_lowered"))),
        "declined_for_growth": [] if options.allow_growth else growing,
        "portable": lowered.report.get("portable"),
        "candidates": len(report["candidates"]), "declined": len(report["declined"]),
        "rewrites": {k: v for k, v in result.counts.items()},
        "nodes_removed": before["nodes"] - kept,
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


def inspect_model(path: str, options: Options | None = None, top: int = 10, target: str = "dml",
                  progress: Progress | None = None) -> dict:
    """The inspect report as a JSON-ready dict (schema: docs/inspect.md)."""
    return analyze(path, options, top, target, progress).report
