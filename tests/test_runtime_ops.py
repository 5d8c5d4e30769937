"""Default-domain ops that onnxruntime defines and onnx does not (issue 26).

onnxruntime's transformer optimizer writes SimplifiedLayerNormalization in the default domain;
onnxruntime loads such a model, onnx's checker refuses it ("No Op registered"). dmlgraph checks what
onnx can check and accepts what onnxruntime accepts: the model loads, runs, lowers (both targets)
and validates, and the output loads in onnxruntime. Ops onnxruntime refuses there too
(SkipLayerNormalization, which it defines only in com.microsoft; an unknown op) stay refused.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import dmlgraph
from dmlgraph.tools import cli

F = T.FLOAT


def _norm(op: str, x: str, out: str) -> onnx.NodeProto:
    extra = {"axis": -1} if op == "SimplifiedLayerNormalization" else {}
    return h.make_node(op, [x, *([x] if op == "SkipLayerNormalization" else []), "w"], [out], epsilon=1e-5, **extra)


def _model(op: str, where: str) -> onnx.ModelProto:
    """op normalizes x, then a Trilu (ones of x's shape) masks it; `where`: the op is in the main
    graph or in an If branch."""
    norm = _norm(op, "x", "n")
    if where == "if":
        norm = h.make_node("If", ["c"], ["n"],
                           then_branch=h.make_graph([_norm(op, "x", "t")], "then", [],
                                                    [h.make_tensor_value_info("t", F, None)]),
                           else_branch=h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [],
                                                    [h.make_tensor_value_info("e", F, None)]))
    nodes = [norm, h.make_node("Shape", ["x"], ["sh"]),
             h.make_node("ConstantOfShape", ["sh"], ["ones"], value=h.make_tensor("v", F, [1], [1.0])),
             h.make_node("Trilu", ["ones"], ["tri"], upper=0), h.make_node("Mul", ["n", "tri"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", F, ["s", 4]), h.make_tensor_value_info("c", T.BOOL, [])],
                     [h.make_tensor_value_info("y", F, ["s", 4])], [h.make_tensor("w", F, [4], [1, 2, 3, 4])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


FEEDS = {"x": np.arange(16, dtype=np.float32).reshape(4, 4) - 5, "c": np.array(True)}


# (not in a local function: onnxruntime 1.32 itself crashes loading that form)
@pytest.mark.parametrize("where", ["main", "if"])
def test_an_op_onnxruntime_defines_in_the_default_domain_is_accepted(where, tmp_path):
    m = _model("SimplifiedLayerNormalization", where)
    with pytest.raises(onnx.checker.ValidationError, match="No Op registered"):
        onnx.checker.check_model(m)  # (before: dmlgraph refused it with this message, exit 2)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, FEEDS)[0]
    src = str(tmp_path / "m.onnx")
    onnx.save(m, src)
    np.savez(tmp_path / "in.npz", **FEEDS)
    assert np.array_equal(dmlgraph.run(src, FEEDS)["y"], want)
    assert cli.main(["validate", src, "--inputs", str(tmp_path / "in.npz")]) == 0
    for target in ("dml", "onnx"):
        out = str(tmp_path / f"{target}.onnx")
        assert cli.main(["optimize", src, "-o", out, "--target", target]) == 0
        assert sum(dmlgraph.optimize(src, target=target, allow_growth=True).counts.values()) >= 1
        assert np.array_equal(dmlgraph.run(out, FEEDS)["y"], want)
        if target == "onnx":  # the output loads in onnxruntime, as its input did
            got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, FEEDS)[0]
            assert np.array_equal(got, want)


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "NotAnOp"])
def test_an_op_onnxruntime_refuses_in_the_default_domain_stays_refused(op, tmp_path, capsys):
    m = _model(op, "main")
    with pytest.raises(Exception, match="INVALID_GRAPH"):
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    src = str(tmp_path / "m.onnx")
    onnx.save(m, src)
    assert cli.main(["run", src]) == 2
    assert f"No Op registered for {op}" in capsys.readouterr().err


def test_an_op_onnx_defines_only_at_a_later_opset_is_onnxruntimes_before_it(tmp_path):
    """onnxruntime's transformer optimizer writes LayerNormalization (onnx's from opset 17,
    onnxruntime's from 1) into opset 14 models. The input was taken with a note, but the `dml`
    output failed the same check and onnxruntime cannot load DML nodes: validate and run refused
    it ("No Op registered for LayerNormalization with domain_version of 14")."""
    ones = h.make_tensor("v", F, [1], [1.0])
    nodes = [h.make_node("LayerNormalization", ["x", "g", "b"], ["xn"], axis=-1, epsilon=1e-5),
             h.make_node("Shape", ["x"], ["s"]), h.make_node("ConstantOfShape", ["s"], ["ones"], value=ones),
             h.make_node("Trilu", ["ones"], ["tri"], upper=0), h.make_node("Mul", ["xn", "tri"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", F, ["s", "s"])], [h.make_tensor_value_info("y", F, ["s", "s"])],
                     [h.make_tensor("g", F, [5], [1.0] * 5), h.make_tensor("b", F, [5], [0.0] * 5)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 14)], ir_version=10)
    with pytest.raises(onnx.checker.ValidationError, match="No Op registered for LayerNormalization"):
        onnx.checker.check_model(m)
    feeds = {"x": np.random.default_rng(0).standard_normal((5, 5)).astype(np.float32)}
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for target in ("dml", "onnx"):
        r = dmlgraph.optimize(m, target=target)
        assert sum(r.counts.values()) >= 1 and not r.report["notes"]
        assert dmlgraph.validate(m, r, feeds).ok
        assert np.array_equal(dmlgraph.run(r.model, feeds)["y"], want)
