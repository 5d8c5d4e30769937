"""The mask census: every mask-like tensor of a model, and what the rules did with it.

`take` walks the graph as imported and finds the tensors built over an index grid; `classify` runs
after the rules and gives each mask one status: `lowered`, `declined` (with why) or `missed` (a gap
to report, never to hide). What counts as mask-like: docs/internals.md, mask_census.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import onnx

from dmlgraph.ir.band import index_vector, two_valued_matrix
from dmlgraph.ir.graph import DmlNode, Graph, Node, OnnxNode, Value

if TYPE_CHECKING:
    from dmlgraph.rewrite import PassResult

GRID_SOURCES = {"Range", "CumSum"}
GRID_OPS = {"Unsqueeze", "Squeeze", "Reshape", "Expand", "Flatten", "Transpose", "Identity", "Cast", "CastLike",
            "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Min", "Max", "Clip", "Gather", "GatherND", "GatherElements",
            "Slice", "Concat", "Tile", "Mod"}
COMPARISONS = {"Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal"}
ELEMENTWISE = COMPARISONS | {"Add", "Sub", "Mul", "Div", "Mod", "Min", "Max"}  # every operand is an element
MASK_VIEWS = {"Unsqueeze", "Squeeze", "Reshape", "Expand", "Flatten", "Transpose", "Identity", "Cast", "CastLike",
              "Not", "Slice", "Gather", "GatherND", "GatherElements", "Concat", "Tile", "Split"}
MASK_COMBINE = {"And", "Or", "Xor"}
STORED_LIMIT = 1 << 24  # bytes: larger stored tensors are weights, not read for the census


@dataclass
class MaskSite:
    """One mask-like tensor: its value, producer (None: a stored constant), and what makes it one."""

    value: str
    producer: str | None
    op_type: str
    index: int | None
    shape: list | None
    elem_type: int | None
    found: str
    parents: list[str]  # the mask-like tensors it is built from
    node_id: int | None = None
    outer: str | None = None  # an input it is built from that an enclosing scope computes (`hints`)
    data: bool = False  # built from the values (not the shape) of an input no hint describes


def _enclosing(graph: Graph) -> tuple[dict[str, Value], list[DmlNode], list[Value]]:
    """What a body reads of its enclosing scopes, as the census of the body alone sees it: their
    constants (initializers, Constant tensors), their static generators (a stored mask they
    lowered), and the rest, inputs; then the body's own inputs."""
    stored: dict[str, Value] = {}
    generators: list[DmlNode] = []
    inputs: list[Value] = list(graph.inputs)
    for name, v in graph.free_values().items() if graph.parent is not None else ():
        p = v.producer
        if graph.stored(v) or (isinstance(p, OnnxNode) and p.op_type == "Constant" and p.domain in ("", "ai.onnx")):
            stored[name] = v
        elif isinstance(p, DmlNode) and all(x is None for x in p.inputs) and p.static_shape is not None:
            generators.append(p)
        else:
            inputs.append(v)
    return stored, generators, inputs


def _const(graph: Graph, v: Value) -> np.ndarray | None:
    if v.name in graph.overridable_inputs:
        return None
    if graph.stored(v):
        t = v.initializer
        if v.array is not None:
            return v.array
        if t is None or t.data_location == onnx.TensorProto.EXTERNAL or t.ByteSize() > STORED_LIMIT:
            return None
        return onnx.numpy_helper.to_array(t)
    p = v.producer
    if isinstance(p, OnnxNode) and p.op_type == "Constant":
        for a in p.attributes:
            if a.name == "value" and a.t.ByteSize() <= STORED_LIMIT:
                return onnx.numpy_helper.to_array(a.t)
    return None


HINTS = ("shape", "grid", "mask")  # what an enclosing value a body reads is (`kinds`)


def take(graph: Graph, hints: dict[str, str] | None = None) -> list[MaskSite]:
    """Every mask-like tensor of `graph` (as imported), in graph order. `hints`: what the inputs of
    a body or function are in the enclosing scope (`kinds`: a size, an index grid, a mask)."""
    return _scan(graph, hints or {})[0]


def kinds(graph: Graph, hints: dict[str, str]) -> dict[str, str]:
    """The values of `graph` that are sizes (computed from shapes), index grids or masks (`hints`:
    its inputs', as `take`)."""
    _, grid, mask, shape_only = _scan(graph, hints)
    return dict.fromkeys(shape_only, "shape") | dict.fromkeys(grid, "grid") | dict.fromkeys(mask, "mask")


def _scan(graph: Graph, hints: dict[str, str]) -> tuple[list[MaskSite], set[str], dict[str, MaskSite], set[str]]:
    order = {n.id: i for i, n in enumerate(graph.nodes.values())}
    grid: set[str] = {name for name, kind in hints.items() if kind == "grid"}
    mask: dict[str, MaskSite] = {name: MaskSite(name, None, "input", None, None, None, "an enclosing mask", [])
                                 for name, kind in hints.items() if kind == "mask"}  # (parents, not sites)
    constant: set[str] = set(graph.initializers) - set(graph.overridable_inputs)
    shape_only: set[str] = {name for name, kind in hints.items() if kind == "shape"}  # from shapes and constants
    fed = {name: name for name in hints}  # value -> the hinted input it is built from
    stored, generators, inputs = _enclosing(graph)
    constant |= set(stored)
    data = {v.name for v in inputs if v.name not in hints}  # values read from unhinted inputs' values
    sites: list[MaskSite] = []

    def add(v: Value, n: Node | None, found: str, parents: list[str]) -> None:
        if v.shape is not None and len(v.shape) < 2:
            return
        site = MaskSite(v.name, None if n is None else n.name, "constant" if n is None else n.op_type,
                        None if n is None else order.get(n.id), None if v.shape is None else list(v.shape),
                        v.elem_type, found, parents, None if n is None else n.id, fed.get(v.name), v.name in data)
        mask[v.name] = site
        sites.append(site)

    for name in list(constant):
        v = stored.get(name) or graph.initializers[name]
        if v.shape is not None and len(v.shape) >= 2 and two_valued_matrix(_const(graph, v)):
            add(v, None, "a stored two-valued matrix", [])
    for d in generators:
        add(d.outputs[0], d, f"a {d.kind} node", [])
    for n in graph.topological_order():
        ins = [v for v in n.inputs if v is not None]
        names = [v.name for v in ins]
        op = n.op_type
        source = next((fed[x] for x in names if x in fed), None)
        if source is not None:
            fed.update(dict.fromkeys((v.name for v in n.outputs), source))
        if op not in ("Shape", "Size") and any(x in data for x in names):
            data.update(v.name for v in n.outputs)
        if isinstance(n, DmlNode):
            for v in n.outputs:
                add(v, n, f"a {n.kind} node", [x for x in names if x in mask])
            continue
        if op == "Constant" and n.outputs and two_valued_matrix(_const(graph, n.outputs[0])):
            add(n.outputs[0], n, "a stored two-valued matrix (Constant)", [])
            continue
        if op == "Constant":
            constant.update(v.name for v in n.outputs)
            continue
        if ins and all(x in constant for x in names):  # folds to a constant; may still be a mask
            constant.update(v.name for v in n.outputs)
        if op in ("Shape", "Size") or (ins and all(x in constant or x in shape_only for x in names)):
            shape_only.update(v.name for v in n.outputs)
        parents = [x for x in names if x in mask]
        grids = [x for x in names if x in grid] + _stored_grids(graph, n, constant)
        out = n.outputs[0] if n.outputs else None
        if out is None:
            continue
        if op == "EyeLike" or (op == "Trilu" and (names[0] in shape_only or names[0] in constant or parents
                                                   or names[0] in grid)):
            add(out, n, f"{op} of a tensor that holds no data", parents)
        elif op in COMPARISONS and grids:
            add(out, n, f"{op} of index grid {grids[0]!r}", parents)
        elif op in COMPARISONS and ins and all(x in constant for x in names) and out.shape is not None \
                and sum(not isinstance(d, int) or d >= 2 for d in out.shape) >= 2:
            # (TorchScript folds a static-shape export's Range grids into Constants: the comparison of
            # two such is the mask, a matrix it computes from constants at every run)
            add(out, n, f"{op} of constants", parents)
        elif op in COMPARISONS and parents:
            add(out, n, f"{op} of mask {parents[0]!r}", parents)
        elif parents and op in MASK_COMBINE:
            add(out, n, f"{op} of mask {parents[0]!r}", parents)
        elif parents and op in MASK_VIEWS:
            for v in n.outputs:
                add(v, n, f"{op} of mask {parents[0]!r}", parents)
        elif parents and op == "Where" and names[0] in mask and all(x in mask or x in constant for x in names[1:]):
            add(out, n, f"Where of mask {names[0]!r} between constants", parents)
        elif parents and op in ("Add", "Sub", "Mul", "Min", "Max") and all(x in mask or x in constant for x in names):
            add(out, n, f"{op} of mask {parents[0]!r} and a constant", parents)
        elif op in GRID_SOURCES or (grids and op in GRID_OPS):
            grid.update(v.name for v in n.outputs)
    return sites, grid, mask, shape_only


def _stored_grids(graph: Graph, n: Node, constant: set[str]) -> list[str]:
    """A stored arange (a Range of fixed sizes, folded) where `n` reads it as elements, beside a
    value computed at run time: an index grid (not an Unsqueeze's axes, nor a fold of constants)."""
    ins = [v for v in n.inputs if v is not None]
    if all(v.name in constant for v in ins):
        return []
    read = ins if n.op_type in ELEMENTWISE else ins[:1] if n.op_type in GRID_OPS else []
    return [v.name for v in read if v.name in constant and index_vector(_const(graph, v))]


def classify(sites: list[MaskSite], graph: Graph, result: PassResult) -> list[dict]:
    """Each site with its status after the rules ran on the same graph (`result`: a PassResult)."""
    applied: dict[object, str] = {}  # node id or initializer name -> the rule that covered it
    for m in result.applied:
        for n in m.nodes:
            applied.setdefault(n.id, m.rule)
        for name in m.initializers:
            applied.setdefault(name, m.rule)
    declined: dict[object, tuple[str, str, str | None]] = {}
    # A decline a later rewrite partly superseded (the band inside a cone lowered, the rest of the cone
    # not: Llama-4's chunks `(i // C) == (j // C)` next to the causal band) still says why for what it left.
    for m in [*result.declined, *result.superseded]:
        for n in m.nodes:
            declined.setdefault(n.id, (m.rule, n.name or n.op_type, m.reason))
        for name in m.initializers:
            declined.setdefault(name, (m.rule, name, m.reason))
    rows: list[dict] = []
    status: dict[str, dict] = {}
    roots: dict[str, tuple[str, str]] = {}  # a mask declined through its parents -> the declined root and why
    for s in sites:
        v = graph.find(s.value)
        p = v.producer if v is not None else None
        row = {"value": s.value, "producer": s.producer, "op_type": s.op_type, "index": s.index,
               "shape": s.shape, "found": s.found, "status": None, "rule": None, "reason": None, "scope": None}
        key = s.node_id if s.node_id is not None else s.value
        if v is not None and graph.is_outer(v) and not graph.uses_here(v):
            v = p = None  # (an enclosing value this body read and reads no more: absorbed, below)
        if isinstance(p, DmlNode) or key in applied:
            row.update(status="lowered", rule=applied.get(key) or getattr(p, "rule", None))
        elif key in declined and not (declined[key][0] == "data_mask" and s.outer is not None and not s.data):
            rule, node, reason = declined[key]
            row.update(status="declined", rule=rule, reason=f"{node!r}: {reason}")
        elif v is None or (p is None and s.value not in graph.initializers and s.producer is not None) \
                or (not v.uses and not graph.is_graph_output(v)):
            row.update(status="lowered", rule="absorbed", reason="no longer computed: a rewrite of what reads it "
                                                                 "absorbed it")
        else:
            upstream = next((status[x] for x in s.parents if status.get(x, {}).get("status") == "declined"), None)
            if upstream is not None:
                root, why = roots.get(upstream["value"], (upstream["value"], upstream["reason"]))
                roots[s.value] = (root, why)
                row.update(status="declined", rule=upstream["rule"], reason=f"built from {root!r}, declined: {why}")
            elif s.outer is not None:  # (also data_mask's "data" where it is only what the enclosing scope computes)
                row.update(status="declined", rule="outer_read", reason=(
                    f"it is built from {s.outer!r}, which the enclosing scope computes: the proof inside this "
                    "body or function sees it as an input of unknown content"))
            else:
                row.update(status="missed", reason="no rule lowered or declined it")
        status[s.value] = row
        rows.append(row)
    return rows


def body_census(graph: Graph, hints: dict[str, str]) -> Callable[[Graph, PassResult], list[dict]]:
    """The census of an If/Loop/Scan body or a local function (`dmlgraph.rewrite.nested.Census`):
    taken from `graph` before the rules, classified after them."""
    sites = take(graph, hints)
    return lambda after, result: classify(sites, after, result)
