"""Slices of a stored causal buffer as TorchScript exports them (issue 26), rebuilt from the form:
bounds from Shape -> Gather -> Unsqueeze -> Concat chains (`bias[:, :, past:past+S, :past+S]`),
with the model's input dims unnamed (TorchScript's default) or named. Before: the unnamed case was
declined ("an input feeding the mask has an unknown shape"); now each unnamed input dim gets a name
of its own for the proof (`shape_inference.input_dims`), and the lowered model reads it at run time.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import dmlgraph


def c(name: str, arr) -> onnx.TensorProto:
    return nh.from_array(np.asarray(arr), name)
def torch_slice_model(dims="unnamed", form="bounds", n=64):
    """GPT-2 style stored causal buffer sliced by Shape->Gather->Unsqueeze->Concat bounds, applied by Where."""
    if dims == "unnamed":
        b = s = p = None
    else:
        b, s, p = "batch", "seq", "past"
    nodes = [h.make_node("Shape", ["input_ids"], ["ids_shape"]), h.make_node("Gather", ["ids_shape", "one"], ["S"], axis=0),
             h.make_node("Shape", ["past_key"], ["pk_shape"]), h.make_node("Gather", ["pk_shape", "two"], ["P"], axis=0),
             h.make_node("Add", ["P", "S"], ["Tt"]),
             h.make_node("Unsqueeze", ["P", "a0"], ["P1"]), h.make_node("Unsqueeze", ["Tt", "a0"], ["T1"]),
             h.make_node("Unsqueeze", ["S", "a0"], ["S1"])]
    if form == "bounds":  # bias[:, :, past:past+S, :past+S]
        nodes += [h.make_node("Concat", ["P1", "zero1"], ["starts"], axis=0),
                  h.make_node("Concat", ["T1", "T1"], ["ends"], axis=0),
                  h.make_node("Slice", ["bias", "starts", "ends", "ax23"], ["mask"])]
    elif form == "negative":  # bias[:, :, :T, :T][:, :, -S:]
        nodes += [h.make_node("Concat", ["T1", "T1"], ["ends"], axis=0),
                  h.make_node("Slice", ["bias", "zero2", "ends", "ax23"], ["full"]),
                  h.make_node("Neg", ["S1"], ["negS"]),
                  h.make_node("Slice", ["full", "negS", "big", "ax2"], ["mask"])]
    elif form == "last":  # bias[:, :, :T, :T][:, :, -1:] (decode step, S = 1)
        nodes += [h.make_node("Concat", ["T1", "T1"], ["ends"], axis=0),
                  h.make_node("Slice", ["bias", "zero2", "ends", "ax23"], ["full"]),
                  h.make_node("Slice", ["full", "neg1", "big", "ax2"], ["mask"])]
    nodes += [h.make_node("Cast", ["input_ids"], ["idf"], to=T.FLOAT), h.make_node("Unsqueeze", ["idf", "ax13"], ["id4"]),
              h.make_node("Mul", ["id4", "qw"], ["q"]), h.make_node("Mul", ["id4", "kw"], ["knew"]),
              h.make_node("Concat", ["past_key", "knew"], ["keys"], axis=2),
              h.make_node("Transpose", ["keys"], ["kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["q", "kt"], ["scores"]),
              h.make_node("Where", ["mask", "scores", "neg"], ["y"])]
    inits = [c("one", np.int64(1)), c("two", np.int64(2)), c("a0", np.array([0])), c("zero1", np.array([0])),
             c("zero2", np.array([0, 0])), c("ax23", np.array([2, 3])), c("ax2", np.array([2])),
             c("big", np.array([2**62])), c("neg1", np.array([-1])), c("ax13", np.array([1, 3])),
             c("neg", np.float32(-1e4)), c("bias", np.tril(np.ones((n, n), bool))[None, None]),
             c("qw", np.linspace(0.1, 0.8, 8, dtype=np.float32).reshape(1, 2, 1, 4)),
             c("kw", np.linspace(-0.5, 0.5, 8, dtype=np.float32).reshape(1, 2, 1, 4))]
    inputs = [h.make_tensor_value_info("input_ids", T.INT64, [b, s]),
              h.make_tensor_value_info("past_key", T.FLOAT, [b, 2, p, 4])]
    g = h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info("y", T.FLOAT, [b, 2, s, None])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(m, full_check=True)
    return m

def feeds(s, past, b=2):
    rng = np.random.default_rng(s * 10 + past)
    return {"input_ids": rng.integers(0, 5, (b, s)).astype(np.int64),
            "past_key": rng.standard_normal((b, 2, past, 4)).astype(np.float32)}


SIZES = {"bounds": [(3, 0), (3, 4), (1, 5), (2, 62)], "negative": [(3, 0), (3, 4), (1, 5), (2, 62)],
         "last": [(1, 0), (1, 5), (1, 63)]}  # (sequence, past), past + S up to the buffer


def sites(m: onnx.ModelProto) -> list[tuple[str, str | None]]:
    return [(x["status"], x.get("reason")) for x in dmlgraph.inspect(m).report["masks"]]


@pytest.mark.parametrize("dims", ["unnamed", "named"])
@pytest.mark.parametrize("form", ["bounds", "last"])
def test_torchscript_slice_of_a_stored_buffer_lowers(dims, form):
    """bounds: before, declined where dims are unnamed; last (`[-1:]` of the buffer sliced to T):
    before, declined (a slice of a clamped size), now a clamped row offset."""
    m = torch_slice_model(dims, form)
    assert all(status == "lowered" for status, _ in sites(m)), sites(m)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for target in ("dml", "onnx"):
        r = dmlgraph.optimize(m, target=target, allow_growth=True)
        assert r.counts["mask_subgraph"] == 1, target
        assert [i.type for i in r.model.graph.input] == [i.type for i in m.graph.input]  # still unnamed
        for s, past in SIZES[form]:
            f = feeds(s, past)
            assert np.array_equal(dmlgraph.run(r.model, f)["y"], session.run(None, f)[0]), (target, s, past)


def range_model(start: str) -> onnx.ModelProto:
    """causal [T, T] from Range(T) comparisons (T = past + S), rows sliced [start:] (start = -S or -1)."""
    nodes = [h.make_node("Shape", ["input_ids"], ["ids_shape"]), h.make_node("Gather", ["ids_shape", "one"], ["S"], axis=0),
             h.make_node("Shape", ["past_key"], ["pk_shape"]), h.make_node("Gather", ["pk_shape", "two"], ["P"], axis=0),
             h.make_node("Add", ["P", "S"], ["Tt"]), h.make_node("Unsqueeze", ["S", "a0"], ["S1"]),
             h.make_node("Range", ["zero", "Tt", "one"], ["r"]), h.make_node("Unsqueeze", ["r", "a0"], ["cols"]),
             h.make_node("Unsqueeze", ["r", "a1"], ["rows"]), h.make_node("LessOrEqual", ["cols", "rows"], ["full"])]
    if start == "S":
        nodes += [h.make_node("Neg", ["S1"], ["negS"]), h.make_node("Slice", ["full", "negS", "big", "a0"], ["mask"])]
    else:
        nodes += [h.make_node("Slice", ["full", "neg1", "big", "a0"], ["mask"])]
    nodes += [h.make_node("Cast", ["input_ids"], ["idf"], to=T.FLOAT), h.make_node("Unsqueeze", ["idf", "ax13"], ["id4"]),
              h.make_node("Mul", ["id4", "qw"], ["q"]), h.make_node("Mul", ["id4", "kw"], ["knew"]),
              h.make_node("Concat", ["past_key", "knew"], ["keys"], axis=2),
              h.make_node("Transpose", ["keys"], ["kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["q", "kt"], ["scores"]),
              h.make_node("Where", ["mask", "scores", "neg"], ["y"])]
    inits = [c("one", np.int64(1)), c("two", np.int64(2)), c("zero", np.int64(0)), c("a0", np.array([0])),
             c("a1", np.array([1])),
             c("big", np.array([2**62])), c("neg1", np.array([-1])), c("ax13", np.array([1, 3])),
             c("neg", np.float32(-1e4)),
             c("qw", np.linspace(0.1, 0.8, 8, dtype=np.float32).reshape(1, 2, 1, 4)),
             c("kw", np.linspace(-0.5, 0.5, 8, dtype=np.float32).reshape(1, 2, 1, 4))]
    inputs = [h.make_tensor_value_info("input_ids", T.INT64, ["b", "s"]),
              h.make_tensor_value_info("past_key", T.FLOAT, ["b", 2, "p", 4])]
    g = h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info("y", T.FLOAT, ["b", 2, "s", None])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(m, full_check=True)
    return m



def test_row_slice_from_the_end_of_a_computed_band():
    """`[-1:]` of a causal [T, T] built by Range comparisons: before, declined ("a slice bound that
    may be negative": T - 1 at T = 0); now max(T - 1, 0), as ONNX clamps it. `[-S:]` (ONNX keeps the
    whole axis at S = 0) lowers too: the Where applies it to scores of S rows, empty at S = 0 wherever
    onnxruntime runs it."""
    m = range_model("1")
    assert [status for status, _ in sites(m)] == ["lowered", "lowered"], sites(m)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for target in ("dml", "onnx"):
        r = dmlgraph.optimize(m, target=target, allow_growth=True)
        assert r.counts["mask_subgraph"] == 1, target
        for past in (0, 4, 9):
            f = feeds(1, past)
            assert np.array_equal(dmlgraph.run(r.model, f)["y"], session.run(None, f)[0]), (target, past)
    # [-S:] lowers where its Where applies it to scores of S rows (docs/masks.md, "Rows [-S:]")
    m = range_model("S")
    assert [status for status, _ in sites(m)] == ["lowered", "lowered"], sites(m)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for target in ("dml", "onnx"):
        r = dmlgraph.optimize(m, target=target, allow_growth=True)
        for s, past in ((1, 0), (1, 4), (3, 0), (3, 9), (0, 1), (0, 0)):
            f = feeds(s, past)
            assert np.array_equal(dmlgraph.run(r.model, f)["y"], session.run(None, f)[0]), (target, s, past)
