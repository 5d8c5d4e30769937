"""dmlgraph as an onnx-ir pass: both targets inside a PassManager, equal to onnxruntime on the original.

torch is not installed here; `ONNXProgram.model` is an `onnx_ir.Model`, so docs/api.md's calls are
made on an `onnx_ir.Model` loaded from a file instead.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxruntime as ort
import pytest

import dmlgraph
from dmlgraph import pipeline
from dmlgraph.integrations.onnx_ir import LowerToDiagonalMatrix
from dmlgraph.io.onnx_io import import_model
from dmlgraph.runtime.executor import Executor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["gpt2_dynamo.onnx", "mistral_sw4_dynamo.onnx", "trilu_offsets_dynamo.onnx", "eye_static8_dynamo.onnx",
          "const_causal256_dynamo.onnx", "nanogpt_ts.onnx"]


def _feeds(path: str) -> dict:
    _, g = pipeline.load(path)
    dims = {d: 2 if "batch" in d.lower() else 7 for v in g.inputs for d in (v.shape or ()) if isinstance(d, str)}
    return pipeline.make_inputs(g, dims, seed=3)


def _run(model: ir.Model, feeds: dict, target: str, base_dir: str | None = None) -> list[np.ndarray]:
    proto = ir.to_proto(model)
    if target == "onnx":  # standard ops only: plain onnxruntime runs it
        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    g = import_model(proto, base_dir)  # external data is found relative to base_dir
    out = Executor(g).run(feeds)
    return [out[v.name] for v in g.outputs]


def _assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype.kind == "f":  # several sessions: onnxruntime's reductions may differ in the last bit
            np.testing.assert_allclose(a, b, rtol=pipeline.OUTPUT_RTOL, atol=pipeline.OUTPUT_ATOL)
        else:
            assert np.array_equal(a, b)


@pytest.mark.parametrize("target", ["dml", "onnx"])
@pytest.mark.parametrize("name", MODELS)
def test_both_targets_in_a_pass_manager_equal_onnxruntime_on_the_original(name, target):
    path = os.path.join(ROOT, "models", name)
    feeds = _feeds(path)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    model = ir.load(path)
    before = ir.to_proto(model).SerializeToString(deterministic=True)
    lower = LowerToDiagonalMatrix(target=target)
    manager = ir.passes.PassManager([lower, common_passes.RemoveUnusedNodesPass()], steps=3)
    result = manager(model)
    assert result.model is not model
    assert ir.to_proto(model).SerializeToString(deterministic=True) == before  # a functional pass
    # Modified unless the lowering would grow the model on this target (declined, as `optimize` does)
    assert result.modified == bool(sum(dmlgraph.optimize(path, target=target).counts.values()))
    if not result.modified:
        return
    assert not lower(result.model).modified  # a fixed point: the manager's early stop can work
    proto = ir.to_proto(result.model)
    onnx.checker.check_model(proto, full_check=True)
    domains = {n.domain for n in proto.graph.node}
    assert ("com.dmlgraph" in domains) == (target == "dml")
    _assert_same(_run(result.model, feeds, target), want)


def test_the_readme_calls_on_an_ir_model(tmp_path):
    path = os.path.join(ROOT, "models", "gpt2_dynamo.onnx")
    model = ir.load(path)  # stands in for onnx_program.model
    result = LowerToDiagonalMatrix()(model)
    ir.save(result.model, str(tmp_path / "lowered.onnx"))
    _, g = pipeline.load(str(tmp_path / "lowered.onnx"))  # dmlgraph's loader runs the ONNX checker
    assert pipeline.graph_stats(g)["dml_nodes"] == 1
    feeds = _feeds(path)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    out = Executor(g).run(feeds)
    _assert_same([out[v.name] for v in g.outputs], want)


def test_nothing_to_lower_is_no_change():
    result = LowerToDiagonalMatrix()(ir.load(os.path.join(ROOT, "models", "bert_dynamo.onnx")))
    assert not result.modified


def test_exact_keeps_only_bit_exact_rewrites():
    path = os.path.join(ROOT, "models", "trilu_offsets_dynamo.onnx")
    loose, exact = LowerToDiagonalMatrix(), LowerToDiagonalMatrix(exact=True)
    loose(ir.load(path))
    exact(ir.load(path))
    assert loose.counts["mask_arith"] >= 1 and exact.counts["mask_arith"] == 0


def test_external_weights_stay_where_they_are(tmp_path):
    src = onnx.load(os.path.join(ROOT, "models", "const_causal256_dynamo.onnx"))
    path = str(tmp_path / "m.onnx")
    onnx.save(src, path, save_as_external_data=True, location="m.data", size_threshold=1024)
    model = ir.load(path)
    result = LowerToDiagonalMatrix(allow_growth=True)(model)  # (the generator is a node more than the matrix)
    assert result.modified and "causal_mask" not in result.model.graph.initializers  # lowered away
    kept = result.model.graph.initializers["val_0"].const_value
    assert isinstance(kept, ir.ExternalTensor) and kept is model.graph.initializers["val_0"].const_value
    feeds = _feeds(path)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    _assert_same(_run(result.model, feeds, "dml", str(tmp_path)), want)


def test_an_unknown_target_is_refused():
    with pytest.raises(dmlgraph.DmlgraphError, match="unknown target .directml."):
        LowerToDiagonalMatrix(target="directml")
