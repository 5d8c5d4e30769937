"""Models onnx's checker refuses and onnxruntime loads are taken (issue 26: run what onnxruntime runs).

A graph output declared with a type but no `shape` field fails onnx's checker ("Field 'shape' of
'type' is required") and loads in onnxruntime. dmlgraph takes such a model with a note, lowers it,
and holds what it writes to the input's standard: no new checker failure, and the portable output
loads in onnxruntime. A model both refuse stays refused. Also here: a Loop that runs no iteration
gives its scan outputs the body's rank after lowering, as onnxruntime does on the original.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import dmlgraph
from dmlgraph import pipeline
from dmlgraph.errors import ModelError
from dmlgraph.io.onnx_io import import_model
from dmlgraph.tools import cli


def _loop_model(declare_shape: bool) -> onnx.ModelProto:
    """A Loop whose body masks X with a Trilu of ones of X's shape; its scan output `ys` is
    declared with a type only (no shape field) unless `declare_shape`."""
    body = h.make_graph(
        [h.make_node("Shape", ["X"], ["sh"]),
         h.make_node("ConstantOfShape", ["sh"], ["ones"], value=h.make_tensor("v", T.FLOAT, [1], [1.0])),
         h.make_node("Trilu", ["ones"], ["tri"]), h.make_node("Mul", ["X", "tri"], ["y"]),
         h.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond", T.BOOL, [])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("y", T.FLOAT, None)])
    out = h.make_tensor_value_info("ys", T.FLOAT, ["n", "S", "S"] if declare_shape else None)
    g = h.make_graph([h.make_node("Loop", ["trip", ""], ["ys"], body=body, name="Loop_1")], "g",
                     [h.make_tensor_value_info("X", T.FLOAT, ["S", "S"]), h.make_tensor_value_info("trip", T.INT64, [])],
                     [out])
    return h.make_model(g, ir_version=10, opset_imports=[h.make_opsetid("", 17)])


def _feeds(trip: int) -> dict[str, np.ndarray]:
    return {"X": np.arange(9, dtype=np.float32).reshape(3, 3) - 4, "trip": np.array(trip, np.int64)}


def _ort(model: onnx.ModelProto | str, feeds: dict) -> np.ndarray:
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values, shapes and types (X * 0 is -0.0 for a negative X where the lowered band writes
    +0.0: the Mul's rewrite says it is not bit-exact)."""
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


def test_the_input_fails_onnx_checker_and_onnxruntime_runs_it():
    m = _loop_model(declare_shape=False)
    with pytest.raises(onnx.checker.ValidationError, match="shape"):
        onnx.checker.check_model(m)
    assert _ort(m, _feeds(2)).shape == (2, 3, 3)


@pytest.mark.parametrize("target", ["dml", "onnx"])
@pytest.mark.parametrize("declare_shape", [False, True])
def test_taken_lowered_and_written_as_onnxruntime_runs_it(target, declare_shape, tmp_path):
    src = str(tmp_path / "m.onnx")
    onnx.save(_loop_model(declare_shape), src)
    result = dmlgraph.optimize(src, target=target)
    assert result.rewrites, "the body's mask is lowered"
    notes = result.report["notes"]
    assert bool(notes) != declare_shape and all("onnxruntime loads it" in n for n in notes)
    out = str(tmp_path / "out.onnx")
    result.save(out)
    written = onnx.load(out)
    for trip in (0, 1, 3):  # (0: no iteration; the scan output is empty with the body's rank)
        want = _ort(src, _feeds(trip))
        got = _ort(out, _feeds(trip)) if target == "onnx" else \
            pipeline.run_graph(import_model(written), _feeds(trip))["ys"]
        assert _same(want, got), (trip, want.shape, got.shape)


def test_the_cli_says_what_it_took(tmp_path, capsys):
    src = str(tmp_path / "m.onnx")
    onnx.save(_loop_model(declare_shape=False), src)
    assert cli.main(["optimize", src, "-o", str(tmp_path / "o.onnx"), "--target", "onnx"]) == 0
    assert "note: the model fails onnx's checker" in capsys.readouterr().out
    assert cli.main(["optimize", src, "-o", str(tmp_path / "o2.onnx"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"]


def test_a_model_both_refuse_stays_refused(tmp_path):
    m = _loop_model(declare_shape=False)
    m.graph.node[0].attribute[0].g.node[3].op_type = "NoSuchOp"
    src = str(tmp_path / "m.onnx")
    onnx.save(m, src)
    with pytest.raises(ModelError, match="failed the ONNX checker.*") as e:
        dmlgraph.optimize(src)
    assert "onnxruntime does not load it either" in (e.value.hint or "")


def _dangling(m: onnx.ModelProto) -> onnx.ModelProto:
    broken = onnx.ModelProto()
    broken.CopyFrom(m)
    broken.graph.node[0].attribute[0].g.node[3].input[0] = "nowhere"
    return broken


@pytest.mark.parametrize("target", ["dml", "onnx"])
def test_an_output_worse_than_its_input_is_refused(target):
    checked = _loop_model(declare_shape=True)  # passes the checker: the output must too
    assert pipeline.worse_than_source(checked, checked, target, None) is None
    assert "fails onnx's checker" in (pipeline.worse_than_source(_dangling(checked), checked, target, None) or "")
    # Fails the checker, loads in onnxruntime: the portable output must load too. (On `dml`, whose
    # output onnxruntime cannot load, only a new first checker failure is seen.)
    source = _loop_model(declare_shape=False)
    assert pipeline.worse_than_source(source, source, target, None) is None
    if target == "onnx":
        assert "does not load in onnxruntime" in (pipeline.worse_than_source(_dangling(source), source, target, None)
                                                  or "")
