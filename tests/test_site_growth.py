"""No growth, decided per site: a site whose lowering would grow the written model on the target is
declined with what it would add, and the other sites of the model are kept (`pipeline.lower`)."""
from __future__ import annotations

import glob
import os
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import dmlgraph
from dmlgraph import pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "models", "synthetic", "causal_attention.onnx")


def _same_outputs(path: str, model: onnx.ModelProto, feeds: dict) -> bool:
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    return all(a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(want, got))


def test_the_demo_keeps_the_site_that_does_not_grow_it_on_onnx():
    """Lowering both sites of the demo model on the portable target writes 15 nodes for 14: the
    Where's band is declined (it costs the most), the EyeLike site is kept."""
    r = dmlgraph.optimize(DEMO, target="onnx")
    assert r.rewrites and r.after["nodes"] <= r.before["nodes"]
    growing = [d for d in r.declined if d.reason.startswith(pipeline.GROWTH_DECLINE)]
    assert [d.rule for d in growing] == ["mask_where"]
    assert "on target onnx" in growing[0].reason and "1 node" in growing[0].reason
    assert not [d for d in r.declined if d.reason.startswith("not written")]
    assert r.report["declined_for_growth"] == 1
    assert pipeline.growth(onnx.load(DEMO), r.model) is None
    assert dmlgraph.validate(DEMO, r).ok
    # --allow-growth still writes every site.
    assert len(dmlgraph.optimize(DEMO, target="onnx", allow_growth=True).rewrites) > len(r.rewrites)


def test_inspect_names_the_sites_optimize_declines_for_growth():
    t = dmlgraph.inspect(DEMO, target="onnx").totals
    assert [d["nodes"][0]["op_type"] for d in t["declined_for_growth"]] == ["Where"]
    assert t["optimize_writes_lowered"] and t["grows"]
    assert dmlgraph.inspect(DEMO, target="dml").totals["declined_for_growth"] == []


# Models the whole-model decision kept unlowered, now lowered but for their growing sites.
# (split_concat_tril_dynamo on onnx grew before its band was built at the matrix size: now every
# site is kept.)
PARTLY = [("nanogpt_dynamo", "dml", True), ("nanogpt_dynamo", "onnx", True), ("split_concat_tril_dynamo", "dml", True),
          ("split_concat_tril_dynamo", "onnx", False), ("stored_tril_past_dynamo", "dml", True),
          ("stored_tril_past_ts", "onnx", True), ("t5_decoder_kv_dynamo", "dml", True),
          ("t5_decoder_kv_dynamo", "onnx", True)]


@pytest.mark.parametrize(("name", "target", "declines"), PARTLY)
def test_a_growing_site_is_declined_and_the_others_kept(name, target, declines):
    path = os.path.join(ROOT, "models", f"{name}.onnx")
    r = dmlgraph.optimize(path, target=target)
    growing = [d for d in r.declined if d.reason.startswith(pipeline.GROWTH_DECLINE)]
    assert r.rewrites and bool(growing) == declines and all(f"on target {target}" in d.reason for d in growing)
    assert pipeline.growth(onnx.load(path, load_external_data=False), r.model) is None
    feeds = sorted(glob.glob(os.path.join(ROOT, "models", "inputs", name, "*.npz")))
    for f in feeds:
        if target == "onnx":
            assert _same_outputs(path, r.model, dict(np.load(f))), f
        assert dmlgraph.validate(path, r, dict(np.load(f))).ok, f
    if not feeds:
        assert dmlgraph.validate(path, r).ok


def test_site_costs_match_values_by_their_computation_not_their_names():
    """Two models computing the same Shape -> Gather under other names have no cost between them;
    the node that differs is counted once on each side."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    def model(names: tuple[str, str, str], op: str) -> onnx.ModelProto:
        s, i, d = names
        g = h.make_graph([h.make_node("Shape", ["x"], [s]), h.make_node("Gather", [s, i], [d]),
                          h.make_node(op, [d, d], ["y"])], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [2, 3])], [h.make_tensor_value_info("y", T.INT64, [])],
                         [numpy_helper.from_array(np.array(1, np.int64), i)])
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])

    site = SimpleNamespace(replacement=SimpleNamespace(replaces=[(SimpleNamespace(name="y"), None)]))  # (a Match)
    costs = pipeline.site_costs(model(("s", "i", "d"), "Add"), model(("s2", "j", "e"), "Mul"), [site])  # type: ignore[list-item]
    assert costs[0] is not None and costs[0][0] == 0 and costs[0][2] == "writes Mul for Add"
