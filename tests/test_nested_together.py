"""The bodies of one graph imported together (`nested.import_together`: one model, one shape
inference, then split) lower exactly as each imported alone: the same written model, byte for
byte, and the same report. Where they cannot share a model, each is imported alone."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from benchmarks.pipeline import nested_model
from dmlgraph import pipeline
from dmlgraph.io.shape_inference import CHILD_MIN_NODES
from dmlgraph.rewrite import body_reuse, nested


def _vi(name: str, elem=T.FLOAT, shape=None) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, shape)


def _const(name: str, value, dtype=np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype), name)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    m = h.make_model(h.make_graph(nodes, "m", inputs, outputs, list(inits)),
                     opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(m, full_check=True)
    return m


def _if(name: str, cond: str, out: str, then: onnx.GraphProto, els: onnx.GraphProto) -> onnx.NodeProto:
    return h.make_node("If", [cond], [out], then_branch=then, else_branch=els, name=name)


def _branch(name: str, nodes, out: str, shape, inits=()) -> onnx.GraphProto:
    return h.make_graph(nodes, name, [], [_vi(out, shape=shape)], list(inits))


def stored_mask_model() -> onnx.ModelProto:
    """A stored causal mask of the main graph read by four branches (a constant each copies in), and
    a Trilu with the main graph's k in each."""
    mask = numpy_helper.from_array(np.tril(np.ones((4, 4), bool)), "M")
    nodes = []
    for i in range(2):
        then = _branch(f"t{i}", [h.make_node("Where", ["M", "X", f"t{i}_ninf"], [f"t{i}_o"])], f"t{i}_o", [4, 4],
                       [_const(f"t{i}_ninf", -np.inf, np.float32)])
        els = _branch(f"e{i}", [h.make_node("Trilu", ["X", "k"], [f"e{i}_o"], upper=0)], f"e{i}_o", [4, 4])
        nodes.append(_if(f"If_{i}", "c", f"Y{i}", then, els))
    return _model(nodes, [_vi("X", shape=[4, 4]), _vi("c", T.BOOL, [])],
                  [_vi("Y0", shape=[4, 4]), _vi("Y1", shape=[4, 4])], [mask, _const("k", 1)])


def deep_model() -> onnx.ModelProto:
    """If branches holding If nodes of their own, each branch a Trilu of X."""
    def inner(p: str) -> onnx.NodeProto:
        return _if(f"{p}_if", "c", f"{p}_o",
                   _branch(f"{p}_t", [h.make_node("Trilu", ["X"], [f"{p}_to"], upper=1)], f"{p}_to", ["S", "S"]),
                   _branch(f"{p}_e", [h.make_node("Trilu", ["X"], [f"{p}_eo"], upper=0)], f"{p}_eo", ["S", "S"]))
    outer = _if("If_0", "c", "Y", _branch("a", [inner("a")], "a_o", ["S", "S"]),
                _branch("b", [inner("b")], "b_o", ["S", "S"]))
    return _model([outer], [_vi("X", shape=["S", "S"]), _vi("c", T.BOOL, [])], [_vi("Y", shape=["S", "S"])])


def colliding_model() -> onnx.ModelProto:
    """Both branches define `t` (ONNX allows it in sibling scopes): they cannot share a model."""
    then = _branch("then", [h.make_node("Trilu", ["X"], ["t"], upper=1), h.make_node("Neg", ["t"], ["o1"])],
                   "o1", ["S", "S"])
    els = _branch("else", [h.make_node("Trilu", ["X"], ["t"], upper=0), h.make_node("Abs", ["t"], ["o2"])],
                  "o2", ["S", "S"])
    return _model([_if("If_0", "c", "Y", then, els)], [_vi("X", shape=["S", "S"]), _vi("c", T.BOOL, [])],
                  [_vi("Y", shape=["S", "S"])])


def annotated_model() -> onnx.ModelProto:
    """A branch annotates the enclosing X (value_info): the bodies are imported alone."""
    then = _branch("then", [h.make_node("Trilu", ["X"], ["t_o"], upper=1)], "t_o", ["S", "S"])
    then.value_info.append(_vi("X", shape=["S", "S"]))
    els = _branch("else", [h.make_node("Trilu", ["X"], ["e_o"], upper=0)], "e_o", ["S", "S"])
    return _model([_if("If_0", "c", "Y", then, els)], [_vi("X", shape=["S", "S"]), _vi("c", T.BOOL, [])],
                  [_vi("Y", shape=["S", "S"])])


def unnamed_output_model() -> onnx.ModelProto:
    """A branch leaves an output unnamed (Dropout's mask): the bodies are imported alone."""
    then = _branch("then", [h.make_node("Dropout", ["X"], ["v", ""]), h.make_node("Slice", ["v", "t0", "t2", "t1"], ["t_s"]),
                            h.make_node("Trilu", ["t_s"], ["t_o"])],
                   "t_o", ["S", 2], [_const("t0", [0]), _const("t2", [2]), _const("t1", [1])])
    els = _branch("else", [h.make_node("Slice", ["X", "s0", "s2", "s1"], ["e_s"]),
                           h.make_node("Trilu", ["e_s"], ["e_o"], upper=0)], "e_o", ["S", 2],
                  [_const("s0", [0]), _const("s2", [2]), _const("s1", [1])])
    return _model([_if("If_0", "c", "Y", then, els)], [_vi("X", shape=["S", "S"]), _vi("c", T.BOOL, [])],
                  [_vi("Y", shape=["S", 2])])


def large_branches_model() -> onnx.ModelProto:
    """Branches large enough that each alone is inferred in a child under a deadline: imported alone."""
    def branch(p: str, upper: int) -> onnx.GraphProto:
        nodes = [h.make_node("Trilu", ["X"], [f"{p}0"], upper=upper)]
        nodes += [h.make_node("Neg", [f"{p}{i}"], [f"{p}{i + 1}"]) for i in range(CHILD_MIN_NODES)]
        return _branch(p, nodes, f"{p}{CHILD_MIN_NODES}", ["S", "S"])
    return _model([_if("If_0", "c", "Y", branch("a", 1), branch("b", 0))],
                  [_vi("X", shape=["S", "S"]), _vi("c", T.BOOL, [])], [_vi("Y", shape=["S", "S"])])


def loops_model() -> onnx.ModelProto:
    """Two Loop nodes whose bodies take loop-carried values (formal inputs typed from each node)."""
    nodes = []
    for i in range(2):
        body = h.make_graph([h.make_node("Trilu", [f"s{i}"], [f"t{i}"], upper=i),
                             h.make_node("Add", [f"t{i}", "X"], [f"s{i}_out"]),
                             h.make_node("Identity", [f"c{i}"], [f"c{i}_out"])],
                            f"body{i}", [_vi(f"n{i}", T.INT64, []), _vi(f"c{i}", T.BOOL, []), _vi(f"s{i}", shape=["S", "S"])],
                            [_vi(f"c{i}_out", T.BOOL, []), _vi(f"s{i}_out", shape=["S", "S"])])
        nodes.append(h.make_node("Loop", ["trip", "", "X"], [f"Y{i}"], body=body, name=f"Loop_{i}"))
    return _model(nodes, [_vi("X", shape=["S", "S"]), _vi("trip", T.INT64, [])],
                  [_vi("Y0", shape=["S", "S"]), _vi("Y1", shape=["S", "S"])])


CASES = {  # name -> (model, whether some bodies are imported together)
    "many If nodes": (lambda: nested_model(40), True),
    "stored mask read by four branches": (stored_mask_model, True),
    "If in If": (deep_model, True),
    "sibling names collide": (colliding_model, False),
    "a branch annotates X": (annotated_model, False),
    "unnamed output": (unnamed_output_model, False),
    "large branches": (large_branches_model, False),
    "two Loop bodies": (loops_model, True),
}


def _optimized(model: onnx.ModelProto) -> tuple[bytes, str]:
    result = pipeline.lower(model)
    assert result.model is not None
    return result.model.SerializeToString(), json.dumps(result.report, sort_keys=True, default=str)


@pytest.mark.parametrize("case", CASES)
def test_together_lowers_exactly_as_alone(case, monkeypatch):
    build, shared = CASES[case]
    monkeypatch.setattr(body_reuse, "ENABLED", False)  # (else the bodies that repeat are not imported at all)
    calls = []
    together = nested.import_together

    def spy(info, specs):
        made = together(info, specs)
        calls.append(made is not None)
        return made

    monkeypatch.setattr(nested.bodies, "import_together", spy)
    ours = _optimized(build())
    assert any(calls) == shared
    monkeypatch.setattr(nested.bodies, "import_together", lambda info, specs: None)
    assert _optimized(build()) == ours
