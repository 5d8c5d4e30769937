"""The fuzzers' opset draw: a generated opset-18 model at opset 14, 15, 16, 17 or 18.

Exporters still write opsets 14-16 (Optimum's older defaults, TorchScript's opset_version=14).
`at_opset` converts a drawn model with onnx's own `version_converter`; the converter is not
dmlgraph's, so a conversion that fails, fails onnx's checker, that onnxruntime refuses, or that
computes other bits than the opset-18 model at the fuzzer's feeds is discarded: the draw keeps
the opset-18 model (the bounded runs stay deterministic and take the same examples).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import version_converter

OPSETS = (14, 15, 16, 17, 18)
COUNTS: Counter = Counter()  # ("kept" | "discarded", opset) -> draws; the soaks print it
REASONS: Counter = Counter()  # why draws were discarded (the first line of the error)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# Ops whose schemas from opset 14 to 18 differ only by added types or attributes (onnx's converter
# has no down-adapter for them: "No Adapter From Version $16 for Identity"): the converter steps over
# them, onnx's checker then holds each to the target opset's schema (Shape's start/end before 15, a
# bfloat16 Where before 16, a body's ReduceMax with axes as an input before 18: discarded).
SAME_MEANING = {"GreaterOrEqual", "LessOrEqual", "Identity", "If", "Loop", "Scan", "LeakyRelu", "PRelu", "Pow",
                "Shape", "Where"}
_HIDDEN = "fuzz.same_meaning"


def _nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    out: list[onnx.NodeProto] = []

    def walk(nodes) -> None:
        for n in nodes:
            out.append(n)
            for a in n.attribute:
                for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    walk(g.node)
    walk(model.graph.node)
    for f in model.functions:
        walk(f.node)
    return out


def _shape_bounds_as_slice(graph: onnx.GraphProto) -> None:
    """Shape(x, start, end) (opset 15) as Shape(x) then Slice(start, end), onnx's definition of the
    bounds (the converter has no down-adapter for them), in `graph` (main graph only)."""
    out: list[onnx.NodeProto] = []
    for n in graph.node:
        bounds = {a.name: a.i for a in n.attribute if a.name in ("start", "end")}
        if n.op_type != "Shape" or n.domain not in ("", "ai.onnx") or not bounds:
            out.append(n)
            continue
        whole, lo, hi = (f"{n.output[0]}__{k}" for k in ("whole", "start", "end"))
        graph.initializer.extend([onnx.numpy_helper.from_array(np.array([bounds.get("start", 0)], np.int64), lo),
                                  onnx.numpy_helper.from_array(np.array([bounds.get("end", 2**62)], np.int64), hi)])
        out += [onnx.helper.make_node("Shape", [n.input[0]], [whole]),
                onnx.helper.make_node("Slice", [whole, lo, hi], [n.output[0]], name=n.name)]
    del graph.node[:]
    graph.node.extend(out)


def convert(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`model` at `opset` by onnx's converter (its ir_version kept), checked by onnx's checker."""
    hidden = onnx.ModelProto()
    hidden.CopyFrom(model)
    if opset < 15:
        _shape_bounds_as_slice(hidden.graph)
    for n in _nodes(hidden):
        if n.domain in ("", "ai.onnx") and n.op_type in SAME_MEANING:
            n.domain = _HIDDEN
    hidden.opset_import.append(onnx.helper.make_opsetid(_HIDDEN, 1))
    out = version_converter.convert_version(hidden, opset)
    if not out.functions:  # (the converter drops local functions: theirs as they were, held to `opset` below)
        out.functions.extend(hidden.functions)
    for n in _nodes(out):
        if n.domain == _HIDDEN:
            n.domain = ""
    kept = [o for o in out.opset_import if o.domain != _HIDDEN]  # (and the imports the converter drops)
    kept += [o for o in model.opset_import if o.domain not in {k.domain for k in kept}]
    del out.opset_import[:]
    out.opset_import.extend(kept)
    for f in out.functions:
        for o in f.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = opset
    out.ir_version = model.ir_version
    onnx.checker.check_model(out, full_check=True)
    return out


def at_opset(models: list[onnx.ModelProto], opset: int,
             feeds: Iterable[dict[str, np.ndarray]] | Callable[[onnx.ModelProto], Iterable[dict]]) -> list[onnx.ModelProto]:
    """`models` (opset 18; the first is compared) converted to `opset`, or `models` themselves when
    any conversion fails or the first converted computes differently from the first at `feeds` (those
    the original runs; at one at least). `feeds` may be a function of the model (the inputs it takes)."""
    if opset == 18:
        return models
    try:
        out = [convert(m, opset) for m in models]
        before, after = _session(models[0]), _session(out[0])
        sets = feeds(models[0]) if callable(feeds) else feeds
        compared = 0
        for f in sets:
            try:
                want = before.run(None, f)
            except Exception:  # noqa: BLE001 - a set the original refuses says nothing
                continue
            got = after.run(None, f)
            if not all(_same(a, b) for a, b in zip(want, got)):
                raise ValueError("the converted model computes differently")
            compared += 1
        if not compared:
            raise ValueError("onnxruntime ran the original at none of the feeds")
    except Exception as e:  # noqa: BLE001 - onnx's converter, not ours: the draw keeps opset 18
        COUNTS["discarded", opset] += 1
        REASONS[str(e).strip().splitlines()[0][:120]] += 1
        return models
    COUNTS["kept", opset] += 1
    return out


def line() -> str:
    """'opset 14: 40 kept, 3 discarded; ...' for the soaks."""
    return "; ".join(f"opset {o}: {COUNTS['kept', o]} kept, {COUNTS['discarded', o]} discarded"
                     for o in OPSETS if o != 18) + "".join(f"\n    discarded {n}x: {r}" for r, n in REASONS.most_common(8))
