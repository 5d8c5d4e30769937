"""load -> passes -> export / run / validate, as plain functions (the CLI is a thin face on these)."""
from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field

import numpy as np
import onnx

from dmlgraph.errors import DmlgraphError
from dmlgraph.executor import Executor, numpy_dtype
from dmlgraph.graph import DmlNode, Graph
from dmlgraph.modelfile import load_model, save_model, tensor_nbytes
from dmlgraph.onnx_io import export_model, import_model
from dmlgraph.rewrite import Options, PassManager, PassResult


def load(path: str) -> tuple[onnx.ModelProto, Graph]:
    """Read a model safely (external data stays on disk) and import it."""
    model = load_model(path)
    return model, import_model(model, os.path.dirname(os.path.abspath(path)))


def graph_stats(g: Graph) -> dict:
    """Node count, op histogram and initializer bytes: the numbers of a before/after table."""
    ops = collections.Counter(n.op_type for n in g.nodes.values())
    init_bytes = sum(tensor_nbytes(v.initializer) if v.initializer is not None else int(v.array.nbytes)
                     for v in g.initializers.values())
    # Constant nodes store tensors too (TorchScript exports put masks there).
    const_bytes = sum(tensor_nbytes(a.t) for n in g.nodes.values() if n.op_type == "Constant"
                      for a in getattr(n, "attributes", ()) if a.name == "value")
    return {"nodes": len(g.nodes), "ops": dict(sorted(ops.items())), "initializers": len(g.initializers),
            "initializer_bytes": init_bytes, "constant_bytes": init_bytes + const_bytes,
            "dml_nodes": sum(isinstance(n, DmlNode) for n in g.nodes.values())}


def node_label(n) -> dict:
    return {"name": n.name, "op_type": n.op_type}


def match_record(m, with_reason: bool = False) -> dict:
    rec = {"rule": m.rule, "nodes": [node_label(n) for n in m.nodes]}
    if with_reason:
        rec["reason"] = m.reason
    return rec


def optimize_graph(g: Graph, options: Options, progress=None) -> PassResult:
    from passes import default_rules  # the one place where core and passes meet
    return PassManager(default_rules(options), options).run(g, progress)


@dataclass
class OptimizeResult:
    graph: Graph
    passes: PassResult
    before: dict
    after: dict
    model: onnx.ModelProto | None = None
    report: dict = field(default_factory=dict)


def optimize(path: str, options: Options | None = None, target: str = "dml", progress=None) -> OptimizeResult:
    options = options or Options()
    _, g = load(path)
    before = graph_stats(g)
    result = optimize_graph(g, options, progress)
    g.remove_dead()
    model = export_model(g, target)
    # The numbers describe the file written: the portable target expands each DML node.
    after = graph_stats(g) if target == "dml" else graph_stats(import_model(model))
    report = {
        "model": path, "target": target, "feature_level": options.feature_level.label,
        "exact_only": options.exact_only,
        "rewrites": result.counts,
        "lowered": [match_record(m) | {"dml": _dml_summary(m)} for m in result.applied],
        "declined": [match_record(m, True) for m in result.declined],
        "before": before, "after": after,
    }
    return OptimizeResult(g, result, before, after, model, report)


def _dml_summary(m) -> dict | None:
    dml = m.captures.get("dml")
    if dml is None:
        return None
    return {"op": dml.kind, "begin": dml.begin, "end": dml.end, "value": np.asarray(dml.value).item(),
            "has_input": dml.inputs[0] is not None, "runtime_k": dml.inputs[2] is not None}


def write(result: OptimizeResult, out: str, input_path: str, in_place: bool = False) -> int:
    """Save atomically; returns the written file's size in bytes."""
    save_model(result.model, out, input_path=input_path, in_place=in_place,
               base_dir=os.path.dirname(os.path.abspath(input_path)))
    return os.path.getsize(out)


# ---- running and validation ------------------------------------------------------------------
def parse_dims(items) -> dict[str, int]:
    dims = {}
    for item in items or ():
        name, sep, size = item.partition("=")
        if not sep or not size.strip().isdigit():
            raise DmlgraphError(f"--dim {item!r} is not NAME=SIZE", hint="for example --dim sequence=16")
        dims[name.strip()] = int(size)
    return dims


def make_inputs(g: Graph, dims: dict[str, int] | None = None, seed: int = 0, default_dim: int = 4) -> dict:
    """Random inputs from the graph's input types; symbolic dims from `dims` (else `default_dim`)."""
    rng = np.random.default_rng(seed)
    dims = dims or {}
    feeds = {}
    for v in g.inputs:
        if v.elem_type is None or v.shape is None:
            raise DmlgraphError(f"input {v.name!r} has no known type or shape",
                                hint="pass real inputs with --inputs IN.npz")
        shape = tuple(d if isinstance(d, int) else dims.get(d, default_dim) if d else default_dim
                      for d in v.shape)
        dt = numpy_dtype(v.elem_type)
        if dt == np.bool_:
            arr = rng.random(shape) < 0.5
        elif np.issubdtype(dt, np.integer):
            arr = rng.integers(0, 4, shape).astype(dt)
        else:
            arr = rng.standard_normal(shape).astype(dt)
        feeds[v.name] = arr
    return feeds


def load_inputs(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise DmlgraphError(f"inputs file {path} does not exist") from None
    except Exception as e:  # noqa: BLE001 - any unreadable npz is the same user error
        raise DmlgraphError(f"cannot read inputs {path}: {e}", hint="give an .npz made by numpy.savez") from None


def run_graph(g: Graph, feeds: dict, threads: int | None = None) -> dict[str, np.ndarray]:
    return Executor(g, threads).run(feeds)


def bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape, dtype and bits (so -0.0 != 0.0 and NaN payloads count)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        u = np.dtype(f"u{a.dtype.itemsize}")
        return np.array_equal(np.ascontiguousarray(a).view(u), np.ascontiguousarray(b).view(u))
    return np.array_equal(a, b)


# Float outputs downstream of a rewrite may differ in the last bits: onnxruntime's reductions
# (LayerNorm, Softmax) take other SIMD paths when the graph runs as several sessions. The rewrites
# themselves are checked bit for bit on the tensors they produce; outputs get this tolerance.
OUTPUT_RTOL, OUTPUT_ATOL = 1e-5, 1e-6


def _compare_one(name: str, e, g, exact: bool, tolerance: bool) -> dict:
    e = np.asarray(e)
    row = {"name": name, "shape": list(e.shape), "dtype": str(e.dtype)}
    if g is None:
        return row | {"match": False, "detail": "missing from the lowered model"}
    g = np.asarray(g)
    if bitwise_equal(e, g):
        return row | {"match": True, "detail": "bit-exact"}
    if e.shape != g.shape or e.dtype != g.dtype:
        return row | {"match": False, "detail": f"shape/dtype differ: {list(g.shape)} {g.dtype}"}
    if not exact and np.array_equal(e, g, equal_nan=e.dtype.kind == "f"):
        return row | {"match": True, "detail": "equal values (signed zeros or NaN payloads differ)"}
    if tolerance and e.dtype.kind == "f" and np.allclose(g, e, rtol=OUTPUT_RTOL, atol=OUTPUT_ATOL, equal_nan=True):
        err = float(np.nanmax(np.abs(g.astype(np.float64) - e)))
        return row | {"match": True, "detail": f"within rtol {OUTPUT_RTOL:g} (max abs diff {err:.3g})"}
    return row | {"match": False, "detail": f"{int(np.sum(e != g))} of {e.size} elements differ"}


def validate(path: str, options: Options | None = None, feeds: dict | None = None,
             dims: dict | None = None, seed: int = 0) -> dict:
    """Lower in memory, run both on the same inputs, compare.

    Every rewritten tensor keeps its name, so each DML node's output is compared with the same
    tensor of the original model: bit for bit for exact rules, as values for the rules that are
    only equal for finite inputs. Model outputs must then match bit-exactly or within OUTPUT_RTOL.
    onnxruntime's graph optimizations are off on both sides so its fusions don't blur the check.
    """
    options = options or Options()
    _, original = load(path)
    feeds = feeds if feeds is not None else make_inputs(original, dims, seed)
    _, lowered = load(path)
    result = optimize_graph(lowered, options)
    dml = [n for n in lowered.nodes.values() if isinstance(n, DmlNode)]
    rewritten = [n.outputs[0].name for n in dml if n.outputs[0].name in original.values]
    output_names = [v.name for v in original.outputs]
    for g in (original, lowered):  # expose the rewritten tensors as extra outputs on both sides
        g.outputs = g.outputs + [g.values[name] for name in rewritten if not g.is_graph_output(g.values[name])]
    expected = Executor(original, optimize=False).run(feeds)
    got = Executor(lowered, optimize=False).run(feeds)
    exact = {n.outputs[0].name: n.exact for n in dml}
    tensors = [_compare_one(name, expected[name], got.get(name), exact[name], False) for name in rewritten]
    outputs = [_compare_one(name, expected[name], got.get(name), all(exact.values()), True) for name in output_names]
    return {"model": path, "inputs": {k: list(v.shape) for k, v in feeds.items()},
            "rewrites": result.counts, "exact": all(exact.values()), "tensors": tensors, "outputs": outputs,
            "ok": all(r["match"] for r in tensors + outputs)}
