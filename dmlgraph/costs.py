"""What a lowering costs against its input: nodes at every depth, bytes, and the kernels
onnxruntime runs, per model (`growth`) and per site (`site_costs`), so the pipeline can decline
the sites that would make the written model bigger or slower than the one it came from (issue
25; docs/portable.md, "The no-growth rule" and "Kernels")."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx

from dmlgraph.rewrite import Match
from dmlgraph.rewrite.nested import SCOPE, body_path

GROWTH_DECLINE = "would add "  # how a site declined for growth is told (`growth_reason`)
KERNEL_DECLINE = "would run "  # how a site declined for its kernels is told (`kernel_reason`)
# What a model may gain in bytes besides its nodes: the provenance metadata (`stamp`) and the
# opset import of the com.dmlgraph domain.
GROWTH_ALLOWANCE = 512
STAMP = "dmlgraph."  # the provenance keys (`pipeline.stamp`), which growth does not count
_BOOL_OUT = {"Not", "And", "Or", "Xor", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "IsNaN", "IsInf"}


def kernel_reason(cost: tuple[float, float, str, float]) -> str:
    n = math.ceil(cost[3] - 1e-9)
    return f"{KERNEL_DECLINE}{n} more onnxruntime kernel{'s' if n > 1 else ''} on target onnx than the input: {cost[2]}"


def growing_sites(source: onnx.ModelProto, model: onnx.ModelProto, sites: list[Match],
                  target: str) -> list[tuple[Match, str]]:
    """The lowered sites of `model` that make it bigger than `source` on their own (a node more,
    what they share counted in part, or bytes past GROWTH_ALLOWANCE), each with the reason to
    decline it."""
    return [(m, growth_reason(c, target)) for m, c in zip(sites, site_costs(source, model, sites))
            if c is not None and (c[0] >= 1 or c[1] > GROWTH_ALLOWANCE)]


def growth_reason(cost: tuple[float, float, str, float], target: str) -> str:
    nodes, size, what = math.ceil(cost[0] - 1e-9), math.ceil(cost[1]), cost[2]
    if nodes > 0:
        saves = f" (it would save {-size} bytes; --allow-growth writes it)" if size < 0 else ""
        return f"{GROWTH_DECLINE}{nodes} node{'s' if nodes > 1 else ''} on target {target}: {what}{saves}"
    return f"{GROWTH_DECLINE}{size} bytes on target {target}: {what}"


class _Scope:
    """One graph of a model (the main graph or a body), as `site_costs` reads it."""

    def __init__(self, graph: onnx.GraphProto, prefix: str, same: dict[str, bytes] | None = None) -> None:
        self.prefix = prefix  # (keys of two scopes' nodes differ)
        self.nodes = _producers(graph)
        self.run = run_time_nodes(graph)
        self.inits = {t.name: t for t in graph.initializer}
        self.sigs = _signatures(graph, same)
        self.have = set(self.sigs.values())

    def cone(self, out: str, other: set[bytes]) -> dict[str, Any]:
        """The nodes and constants `out` is computed from that the other model does not compute
        (a value of an enclosing scope stops it: the enclosing graph's, not the site's)."""
        found: dict[str, Any] = {}
        stack = [out]
        while stack:
            name = stack.pop()
            if name != out and self.sigs.get(name) in other:
                continue  # (the other model computes the same: a node both have, maybe under other names)
            n = self.nodes.get(name)
            if n is None:
                if name in self.inits:
                    found[f"{self.prefix}i:{name}"] = self.inits[name]
                continue
            key = f"{self.prefix}n:{n.output[0]}"
            if key in found or (name != out and self.sigs.get(n.output[0]) in other):
                continue
            found[key] = n
            stack.extend(i for i in n.input if i)
        return found


def _bodies(graph: onnx.GraphProto, prefix: str = "") -> dict[str, onnx.GraphProto]:
    """Every If/Loop/Scan body of `graph` at any depth by its path as nested reports scopes
    (`If_3/then_branch`, `Loop_1/body/If_2/else_branch`). A walk of protos, not `nested.scopes`:
    it reads the written models, which are no Graphs."""
    found: dict[str, onnx.GraphProto] = {}
    for n in graph.node:
        for a in n.attribute:
            bodies = [(a.name, a.g)] if a.type == onnx.AttributeProto.GRAPH else \
                [(f"{a.name}[{j}]", b) for j, b in enumerate(a.graphs)] if a.type == onnx.AttributeProto.GRAPHS else []
            for label, b in bodies:
                path = body_path(prefix, n, label)
                found[path] = b
                found |= _bodies(b, path + "/")
    return found


def site_costs(source: onnx.ModelProto, model: onnx.ModelProto,
               sites: list[Match]) -> list[tuple[float, float, str, float] | None]:
    """What each lowered site adds to its graph of `model` over `source`, as (nodes, bytes, which
    ops for which, kernels): the nodes and constants `model` has that the site's output is computed
    from and `source` does not have, less the nodes and constants `source` had for it that `model`
    no longer has (nodes are nodes on both targets, as in `growth`); kernels counts only the nodes
    onnxruntime runs (`run_time_nodes`: not folded when it loads the model). What several sites
    share is split among them. A site in an If/Loop/Scan body is counted in that body, as one in
    the main graph (a costly site in one branch is declined alone); None for a site in a function
    (or a body no longer found at its path)."""
    # A site's output computes what it replaced (the rewrite's proof): the sites after it in a
    # scope stop there, as at any value both models compute (not in the nodes it replaced).
    replaced: dict[str, set[str]] = {}
    for m in sites:
        if m.replacement is not None:
            replaced.setdefault(str(m.captures.get(SCOPE) or ""), set()).update(
                old.name for old, _ in m.replacement.replaces)
    scopes: dict[str, tuple[_Scope, _Scope] | None] = {}
    s_bodies: dict[str, onnx.GraphProto] | None = None
    m_bodies: dict[str, onnx.GraphProto] | None = None

    def scope(path: str) -> tuple[_Scope, _Scope] | None:
        nonlocal s_bodies, m_bodies
        if path not in scopes:
            if not path:
                s, m = source.graph, model.graph
            else:
                if s_bodies is None or m_bodies is None:
                    s_bodies, m_bodies = _bodies(source.graph), _bodies(model.graph)
                s, m = s_bodies.get(path), m_bodies.get(path)  # type: ignore[assignment]
            if s is None or m is None:
                scopes[path] = None
            else:
                prefix = path + ":" if path else ""
                src = _Scope(s, prefix)
                same = {o: src.sigs[o] for o in replaced.get(path, ()) if o in src.sigs}
                scopes[path] = src, _Scope(m, prefix, same)
        return scopes[path]

    cones: list[tuple[dict[str, Any], dict[str, Any], _Scope, _Scope] | None] = []
    for m in sites:
        pair = scope(str(m.captures.get(SCOPE) or ""))
        if pair is None:
            cones.append(None)
            continue
        src, out = pair
        outs = [old.name for old, _ in m.replacement.replaces] if m.replacement is not None else []
        outs = [o for o in outs if o in out.nodes and (o in src.nodes or o in src.inits)]  # (a stored mask: an initializer)
        if not outs:
            cones.append(None)
            continue
        added: dict[str, Any] = {}
        gone: dict[str, Any] = {}
        for o in outs:
            added |= out.cone(o, src.have)
            gone |= src.cone(o, out.have)
        cones.append((added, gone, src, out))
    shared = Counter(k for c in cones if c is not None for part in c[:2] for k in part)
    costs: list[tuple[float, float, str, float] | None] = []
    for c in cones:
        if c is None:
            costs.append(None)
            continue
        added, gone, s_scope, m_scope = c

        def count(items: dict[str, Any]) -> float:
            """Nodes, split among their sites."""
            return sum(1 / shared[k] for k, v in items.items() if isinstance(v, onnx.NodeProto))

        def size(items: dict[str, Any]) -> float:
            return sum(v.ByteSize() / shared[k] for k, v in items.items())

        def kernels(items: dict[str, Any], run: set[str]) -> float:
            return sum(1 / shared[k] for k, v in items.items() if isinstance(v, onnx.NodeProto) and v.output[0] in run)

        costs.append((count(added) - count(gone), size(added) - size(gone),
                      f"writes {_ops(added)} for {_ops(gone)}",
                      kernels(added, m_scope.run) - kernels(gone, s_scope.run)))
    return costs


def run_time_nodes(graph: onnx.GraphProto) -> set[str]:
    """The first outputs of the nodes onnxruntime runs (an estimate of its graph optimizations): not
    computed from constants alone (folded when it loads the model), not a no-op (Identity, Dropout,
    a Cast to the type it has: removed), not a Not whose readers are Where conditions (fused)."""
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    types |= {t.name: t.data_type for t in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
        if n.output and n.op_type in _BOOL_OUT:
            types.setdefault(n.output[0], onnx.TensorProto.BOOL)
        elif n.output and n.op_type == "Cast":
            types.setdefault(n.output[0], next((a.i for a in n.attribute if a.name == "to"), 0))

    def noop(n: onnx.NodeProto) -> bool:
        return n.op_type in ("Identity", "Dropout") or n.op_type == "Cast" and bool(n.input) and \
            types.get(n.input[0], -1) == next((a.i for a in n.attribute if a.name == "to"), -2)

    def conditions(v: str) -> bool:
        return all(r.op_type == "Where" and r.input[0] == v and v not in r.input[1:] or noop(r) and conditions(r.output[0])
                   for r in readers.get(v, []))

    known = {t.name for t in graph.initializer} | {""}
    run: set[str] = set()
    for n in graph.node:  # (in graph order)
        if all(i in known for i in n.input) and not any(a.type in (onnx.AttributeProto.GRAPH,
                                                                   onnx.AttributeProto.GRAPHS) for a in n.attribute):
            known.update(n.output)
        elif n.output and not noop(n) and not (n.op_type == "Not" and readers.get(n.output[0])
                                               and conditions(n.output[0])):
            run.add(n.output[0])
    return run


def _ops(items: dict[str, Any]) -> str:
    ops = Counter(v.op_type if isinstance(v, onnx.NodeProto) else "stored matrix" if len(v.dims) >= 2 else "constant"
                  for v in items.values())
    return ", ".join(f"{op}" if c == 1 else f"{c} {op}{'s' if op in ('constant', 'stored matrix') else ''}"
                     for op, c in sorted(ops.items())) or "nothing"


def same_computation(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """`a` and `b` have the same nodes computing the same values, their names aside (`_signatures`)."""
    if len(a.graph.node) != len(b.graph.node) or a.functions != b.functions:
        return False
    sa, sb = _signatures(a.graph), _signatures(b.graph)
    return Counter(sa[o] for n in a.graph.node for o in n.output if o) == \
        Counter(sb[o] for n in b.graph.node for o in n.output if o) and \
        [sa.get(o.name) for o in a.graph.output] == [sb.get(o.name) for o in b.graph.output]


def _signatures(graph: onnx.GraphProto, same: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """Each value of the graph by what computes it, not by its name: a digest of its node's op,
    attributes and inputs' digests (a small constant by its content, a graph input or big constant
    by its name), so that two models' values of one digest are the same computation; `same`: the
    digests of values known to compute what the other model's do (lowered sites)."""
    import hashlib

    sigs: dict[str, bytes] = {}
    for t in graph.initializer:
        if t.ByteSize() <= 1024 and not t.external_data:
            sigs[t.name] = _content(onnx.numpy_helper.to_array(t))
        else:
            sigs[t.name] = hashlib.sha1(b"i" + t.name.encode()).digest()
    for n in graph.node:  # (in graph order: an input's producer comes first)
        value = _constant_value(n)
        if value is not None and value.nbytes <= 1024:  # (a Constant node is its initializer's twin)
            sigs[n.output[0]] = _content(value)
            continue
        h = hashlib.sha1(f"{n.domain}:{n.op_type}".encode())
        for a in n.attribute:
            h.update(a.SerializeToString())
        for i in n.input:
            h.update(sigs.get(i) or hashlib.sha1(b"i" + i.encode()).digest())
        for k, o in enumerate(n.output):
            if o:
                sigs[o] = (same or {}).get(o) or hashlib.sha1(h.digest() + bytes([k % 256])).digest()
    return sigs


def _content(a: np.ndarray) -> bytes:
    """A small constant's digest: its dtype, shape and values (however the tensor stores them)."""
    import hashlib
    data = str(a.tolist()).encode() if a.dtype == object else np.ascontiguousarray(a).tobytes()
    return hashlib.sha1(b"c" + f"{a.dtype.str}{a.shape}".encode() + data).digest()


_CONSTANT_DTYPES = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
                    "value_ints": np.int64}


def _constant_value(n: onnx.NodeProto) -> np.ndarray | None:
    """The value of a standard Constant node holding a number tensor, else None."""
    if n.op_type != "Constant" or n.domain not in ("", "ai.onnx") or len(n.attribute) != 1 or len(n.output) != 1:
        return None
    a = n.attribute[0]
    if a.name == "value":
        return None if a.t.data_type == onnx.TensorProto.STRING or a.t.external_data else \
            onnx.numpy_helper.to_array(a.t)
    dtype = _CONSTANT_DTYPES.get(a.name)
    return None if dtype is None else np.asarray(onnx.helper.get_attribute_value(a), dtype)


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in graph.node for o in n.output if o}


def all_nodes(model: onnx.ModelProto) -> int:
    """Nodes at every depth: the main graph, If/Loop/Scan bodies and local functions."""
    def count(nodes: Iterable[onnx.NodeProto]) -> int:
        total = 0
        for n in nodes:
            total += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    total += count(a.g.node)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    total += sum(count(b.node) for b in a.graphs)
        return total
    return count(model.graph.node) + sum(count(f.node) for f in model.functions)


def unstamped_bytes(model: onnx.ModelProto) -> int:
    return model.ByteSize() - sum(p.ByteSize() + 2 for p in model.metadata_props if p.key.startswith(STAMP))


def growth(source: onnx.ModelProto, model: onnx.ModelProto) -> str | None:
    """How `model` is bigger than `source` (more nodes at any depth, or more bytes than the
    provenance allows), or None. Nodes are nodes on both targets (issue 25: node count and file
    bytes <= the input's): a stored matrix traded for its generator (one DML node on `dml`,
    ConstantOfShape + Trilu on `onnx`) is a node more, so that site is declined with its numbers
    (how many bytes it would save included) and `--allow-growth` writes it."""
    n0, n1 = all_nodes(source), all_nodes(model)
    b0, b1 = unstamped_bytes(source), unstamped_bytes(model)
    if n1 > n0 or b1 > b0 + GROWTH_ALLOWANCE:
        return f"nodes {n0} -> {n1}, bytes {b0} -> {b1}"
    return None
