"""Models of older opsets: the new standard nodes (the rules' size plumbing, the portable forms)
are written in the model's own opset (`dmlgraph.ir.opset`), so the output passes onnx's checker
and loads in onnxruntime as its input did. Shape's start/end is opset 15's, Unsqueeze/Squeeze
axes as an input opset 13's: exporters (Optimum's defaults, TorchScript's opset_version=14) still
write opset 14 models.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import defs, numpy_helper
from onnx import helper as h

import dmlgraph
from dmlgraph.ir.graph import OnnxNode, Value
from dmlgraph.ir.opset import legalize
from dmlgraph.rewrite import detached, detached_constant

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ops whose schema changed between opset 14 and 17 by added types or attributes only: a model that
# uses none of the additions means the same at opset 14 (Shape: without start/end).
COMPATIBLE = {"Where", "LessOrEqual", "GreaterOrEqual", "Shape", "Identity", "If", "Loop", "Pow"}
# TorchScript exports of the corpus whose ops all mean the same at opset 14: decoders with a KV
# cache and a padding mask (the rules' `Shape(start)` plumbing), a sliding window, the portable
# `Shape(x, start=-2)` sizes, stored and sliced triangles.
RELABELED = ["llama_kv_ts", "mistral_sw4_ts", "t5_decoder_kv_ts", "sliced_double_causal_ts", "trilu_past_ts",
             "split_concat_tril_ts", "stored_tril_past_ts"]
DIMS = {"batch": 2, "sequence": 3, "past_sequence": 4, "past_sequence + sequence": 7, "seq": 5, "s": 5,
        "encoder_sequence": 6}


def _relabeled(name: str, opset: int) -> onnx.ModelProto:
    m = onnx.load(os.path.join(ROOT, "models", f"{name}.onnx"))
    cur = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    for n in m.graph.node:
        if n.op_type == "Shape":
            assert not any(a.name in ("start", "end") for a in n.attribute)
        elif n.op_type not in COMPATIBLE:
            assert defs.get_schema(n.op_type, opset).since_version == defs.get_schema(n.op_type, cur).since_version, n.op_type
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = opset
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("target", ["dml", "onnx"])
@pytest.mark.parametrize("name", RELABELED)
def test_torchscript_decoders_at_opset_14_lower_and_stay_valid(name, target):
    """Before: optimize stopped with "the model to be written fails the ONNX checker
    (Unrecognized attribute: start for operator Shape)" on every one of these."""
    m = _relabeled(name, 14)
    r = dmlgraph.optimize(m, target=target)
    assert r.counts == dmlgraph.optimize(os.path.join(ROOT, "models", f"{name}.onnx"), target=target).counts
    onnx.checker.check_model(r.model, full_check=True)
    if target == "onnx":
        ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {d.dim_param for vi in m.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}
    assert dmlgraph.validate(m, r, dims={k: v for k, v in DIMS.items() if k in names}).ok


def _causal(opset: int) -> onnx.ModelProto:
    """Range grids compared, applied by Where: Unsqueeze's axes as an input from opset 13, else an attribute."""
    ax = (lambda name, a: h.make_node("Unsqueeze", ["r", name], [f"u{a}"])) if opset >= 13 else \
        (lambda name, a: h.make_node("Unsqueeze", ["r"], [f"u{a}"], axes=[a]))
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "i2"], ["n"], axis=0),
             h.make_node("Range", ["zero", "n", "one"], ["r"]), ax("ax0", 0), ax("ax1", 1),
             h.make_node("Less", ["u0", "u1"], ["keep"]),  # (LessOrEqual is opset 12's)
             h.make_node("Where", ["keep", "x", "ninf"], ["y"])]
    c = numpy_helper.from_array
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, "s", "s"])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 2, "s", "s"])],
                     [c(np.array(2, np.int64), "i2"), c(np.array(0, np.int64), "zero"), c(np.array(1, np.int64), "one"),
                      c(np.array([0]), "ax0"), c(np.array([1]), "ax1"), c(np.array(-np.inf, np.float32), "ninf")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=7)
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("opset", range(11, 18))
def test_a_causal_mask_at_every_opset_from_11(opset):
    """dml lowers at every opset; onnx where Trilu exists (14 on; before, the site is declined
    with the reason, never written invalid)."""
    m = _causal(opset)
    for target in ("dml", "onnx"):
        r = dmlgraph.optimize(m, target=target)
        lowered = sum(r.counts.values())
        assert lowered == (2 if target == "dml" or opset >= 14 else 0)
        onnx.checker.check_model(r.model, full_check=True)
        x = np.random.default_rng(0).standard_normal((1, 2, 5, 5)).astype(np.float32)
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        if target == "onnx":
            got = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
            assert got[0].tobytes() == want[0].tobytes()
        else:
            assert dmlgraph.validate(m, r, {"x": x}).ok


def _shape_node(start: int | None, end: int | None) -> tuple[OnnxNode, Value]:
    x = Value("x", T.FLOAT, ("a", "b", "c", "d"))
    out = detached("hw", T.INT64)
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    return OnnxNode("", "Shape", [x], [out], [h.make_attribute(k, v) for k, v in attrs.items()]), x


@pytest.mark.parametrize("start,end", [(-2, None), (0, 2), (1, -1), (None, 3), (-10, 10)])
def test_legalize_writes_shape_bounds_as_a_slice_before_opset_15(start, end):
    """Shape(x, start, end) of opset 15 against Shape(x) then Slice, as legalize writes it for 14."""
    n, x = _shape_node(start, end)
    nodes: list = [n]
    inits: list = []
    assert legalize(nodes, inits, 14) is None
    assert [k.op_type for k in nodes] == ["Shape", "Slice"] and not any(a.name in ("start", "end") for a in nodes[0].attributes)
    data = np.zeros((2, 3, 4, 5), np.float32)
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    want = ort.InferenceSession(h.make_model(h.make_graph(
        [h.make_node("Shape", ["x"], ["hw"], **attrs)], "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4, 5])],
        [h.make_tensor_value_info("hw", T.INT64, None)]), opset_imports=[h.make_opsetid("", 15)], ir_version=10)
        .SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": data})[0]
    protos = [h.make_node(k.op_type, [v.name for v in k.inputs], [v.name for v in k.outputs]) for k in nodes]
    got = ort.InferenceSession(h.make_model(h.make_graph(
        protos, "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4, 5])], [h.make_tensor_value_info("hw", T.INT64, None)],
        [numpy_helper.from_array(v.array, v.name) for v in inits]), opset_imports=[h.make_opsetid("", 14)],
        ir_version=10).SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": data})[0]
    assert got.tolist() == want.tolist()
    nodes, inits = [_shape_node(start, end)[0]], []
    assert legalize(nodes, inits, 15) is None and len(nodes) == 1 and not inits  # (opset 15 has it)


def test_legalize_writes_unsqueeze_axes_as_an_attribute_before_opset_13():
    x = Value("x", T.INT64, (3,))
    axes = detached_constant("axes", np.array([1]))
    computed = Value("computed", T.INT64, (1,))
    for opset, want in ((12, ["x"]), (13, ["x", "axes"])):
        n = OnnxNode("", "Unsqueeze", [x, axes], [detached("u", T.INT64)])
        nodes, inits = [n], [axes]
        assert legalize(nodes, inits, opset) is None
        assert [v.name for v in n.inputs] == want and len(inits) == len(want) - 1
        assert [a.ints for a in n.attributes if a.name == "axes"] == ([[1]] if opset == 12 else [])
    n = OnnxNode("", "Squeeze", [x, computed], [detached("s", T.INT64)])
    assert "computed axes" in (legalize([n], [], 12) or "")
