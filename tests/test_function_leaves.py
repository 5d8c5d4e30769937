"""A local function given `p = Gather(Shape(past), 2)` that its calls compute from a main-graph
input they do not pass (issue 26, the fuzzer of forms' `outer_read`).

Where every call reads the Shape of the same main-graph input, the function takes that input as a
new formal appended after its own, `p` is defined from it inside, and every call passes it
(`rewrite/call_leaves.py`). Each form is built with onnx.helper; outputs equal onnxruntime's bit for
bit at sizes around every constant on both targets; what cannot be given a leaf keeps its decline
and its bytes.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from dmlgraph import pipeline
from dmlgraph.io.onnx_io import DOMAIN
from dmlgraph.rewrite.nested import all_nodes
from tests.test_function_args import OPSET, _apply, _band, _function, assert_same_outputs, lowered_in_function

X = [1, 2, "S", "T"]
PAST = [1, 1, "P", 1]


def _kv_body(k: int = 0) -> list[onnx.NodeProto]:
    """rows p..p+s, cols 0..p+s, `cols <= rows + k` (the fuzzer's KV form)."""
    return [h.make_node("Add", ["p", "s"], ["total"])] + _band("p", "total", "total", k) + _apply()


def _sizes(past: str, x: str, suffix: str = "") -> list[onnx.NodeProto]:
    return [h.make_node("Shape", [past], [f"psh{suffix}"]), h.make_node("Gather", [f"psh{suffix}", "i2"], [f"p{suffix}"]),
            h.make_node("Shape", [x], [f"sh{suffix}"]), h.make_node("Gather", [f"sh{suffix}", "i2"], [f"s{suffix}"])]


def _model(nodes, body, inputs, outputs=("Y",)) -> onnx.ModelProto:
    g = h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info(o, T.FLOAT, X) for o in outputs],
                     [numpy_helper.from_array(np.array(2, np.int64), "i2")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", OPSET), h.make_opsetid("local", 1)], ir_version=10,
                     functions=[_function(["x", "p", "s"], body)])
    onnx.checker.check_model(m, full_check=True)
    return m


def _vi(name: str, shape, t=T.FLOAT) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, t, shape)


def fuzzer_form(k: int = 0) -> onnx.ModelProto:
    """F(x, p, s), p from Shape(past_key), which the call does not pass."""
    return _model(_sizes("past_key", "X") + [h.make_node("F", ["X", "p", "s"], ["Y"], domain="local", name="call")],
                  _kv_body(k), [_vi("X", X), _vi("past_key", PAST)])


def two_calls(k: int = 1) -> onnx.ModelProto:
    """Two calls, both reading p from the same past_key (the second on Neg(X), its s from Neg(X))."""
    nodes = _sizes("past_key", "X") + [h.make_node("F", ["X", "p", "s"], ["Y"], domain="local", name="call_1"),
                                       h.make_node("Neg", ["X"], ["X2"]), h.make_node("Shape", ["X2"], ["sh2"]),
                                       h.make_node("Gather", ["sh2", "i2"], ["s2"]),
                                       h.make_node("F", ["X2", "p", "s2"], ["Y2"], domain="local", name="call_2")]
    return _model(nodes, _kv_body(k), [_vi("X", X), _vi("past_key", PAST)], outputs=("Y", "Y2"))


def call_in_if(k: int = -1) -> onnx.ModelProto:
    """The call is in an If branch that reads the main graph's X, p and s; past_key is read by nothing
    in the branch before."""
    then = h.make_graph([h.make_node("F", ["X", "p", "s"], ["y_then"], domain="local", name="call")], "then", [],
                        [_vi("y_then", X)])
    other = h.make_graph([h.make_node("Identity", ["X"], ["y_else"])], "else", [], [_vi("y_else", X)])
    return _model(_sizes("past_key", "X") + [h.make_node("If", ["cond"], ["Y"], then_branch=then, else_branch=other)],
                  _kv_body(k), [_vi("X", X), _vi("past_key", PAST), _vi("cond", [], T.BOOL)])


def call_in_loop(k: int = 0) -> onnx.ModelProto:
    """The call is in a Loop body (one trip, X carried), p and s computed in the body from past_key
    and the carried x."""
    body = h.make_graph(_sizes("past_key", "xc") + [h.make_node("F", ["xc", "p", "s"], ["xo"], domain="local"),
                                                     h.make_node("Identity", ["c"], ["co"])], "body",
                        [_vi("it", [], T.INT64), _vi("c", [], T.BOOL), _vi("xc", X)],
                        [_vi("co", [], T.BOOL), _vi("xo", X)])
    trips = h.make_node("Constant", [], ["trips"], value=numpy_helper.from_array(np.array(1, np.int64), "trips"))
    return _model([trips, h.make_node("Loop", ["trips", "", "X"], ["Y"], body=body)], _kv_body(k),
                  [_vi("X", X), _vi("past_key", PAST)])


FORMS = {"call_in_loop": (call_in_loop, [0]),
         "fuzzer_form": (fuzzer_form, [0]), "shifted": (lambda: fuzzer_form(2), [2]), "two_calls": (two_calls, [1]),
         "call_in_if": (call_in_if, [-1])}


def _calls(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in all_nodes(model.graph.node) if n.domain == "local"]


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("target", ["dml", "onnx"])
def test_a_size_read_from_an_input_the_call_does_not_pass_lowers(form, target):
    build, constants = FORMS[form]
    original = build()
    model = lowered_in_function(original, target).model
    [f], [before] = model.functions, original.functions
    # one new formal, appended; every call passes past_key after its own arguments
    assert list(f.input[:3]) == list(before.input) and len(f.input) == 4 and list(f.output) == list(before.output)
    assert all(list(n.input) == list(b.input) + ["past_key"] for n, b in zip(_calls(model), _calls(original)))
    assert len(_calls(model)) == len(_calls(original))
    assert len([n for n in all_nodes(f.node) if n.domain == DOMAIN]) == (1 if target == "dml" else 0)
    assert_same_outputs(original, model, target, constants, [0, 1, 3], lambda s, p, rng: _feeds(original, s, p, rng),
                        form)


def _feeds(model: onnx.ModelProto, s: int, p: int, rng) -> dict[str, np.ndarray]:
    feeds = {"X": rng.standard_normal((1, 2, s, s + p)).astype(np.float32),
             "past_key": rng.standard_normal((1, 1, p, 1)).astype(np.float32)}
    if "cond" in [vi.name for vi in model.graph.input]:
        feeds["cond"] = np.array(True)
    return feeds


def test_calls_reading_different_inputs_keep_their_outer_read():
    """call_1 reads p from past_a, call_2 from past_b: no leaf is common, the band stays declined
    `outer_read` naming `p`, the function and the calls as they were."""
    nodes = _sizes("past_a", "X") + [h.make_node("F", ["X", "p", "s"], ["Y"], domain="local", name="call_1"),
                                     h.make_node("Shape", ["past_b"], ["pshb"]), h.make_node("Gather", ["pshb", "i2"], ["pb"]),
                                     h.make_node("F", ["X", "pb", "s"], ["Y2"], domain="local", name="call_2")]
    model = _model(nodes, _kv_body(), [_vi("X", X), _vi("past_a", PAST), _vi("past_b", PAST)], outputs=("Y", "Y2"))
    for target in ("dml", "onnx"):
        result = pipeline.lower(model, target=target, census=True)
        assert result.model.functions[0].SerializeToString() == model.functions[0].SerializeToString()
        assert _calls(result.model) == _calls(model)
        rows = [r for r in result.passes.census if r["scope"] == "local::F" and r["status"] != "lowered"]
        assert rows and {r["rule"] for r in rows} == {"outer_read"} and all("'p'" in r["reason"] for r in rows), rows


def test_a_function_called_from_a_function_gets_no_leaf():
    """G(x, p, s) calls F(x, p, s); G's own p is read from past_key by the main graph. Inside G no
    main-graph input is visible, so F keeps its decline, and both functions their bytes."""
    g_fn = h.make_function("local", "G", ["x", "p", "s"], ["y"],
                           [h.make_node("F", ["x", "p", "s"], ["y"], domain="local")],
                           [h.make_opsetid("", OPSET), h.make_opsetid("local", 1)])
    model = _model(_sizes("past_key", "X") + [h.make_node("G", ["X", "p", "s"], ["Y"], domain="local", name="call")],
                   _kv_body(), [_vi("X", X), _vi("past_key", PAST)])
    model.functions.insert(0, g_fn)
    onnx.checker.check_model(model, full_check=True)
    result = pipeline.lower(model, census=True)
    assert [f.SerializeToString() for f in result.model.functions] == [f.SerializeToString() for f in model.functions]
    rows = [r for r in result.passes.census if r["scope"] == "local::F" and r["status"] != "lowered"]
    assert rows and {r["rule"] for r in rows} == {"outer_read"}, rows


def test_a_function_with_nothing_to_lower_keeps_its_signature_and_calls():
    """p from past_key is only data in the function (added to x): the prelude is built, nothing of
    the function's own lowers, so it is written as it was and the call passes no new argument."""
    body = [h.make_node("Cast", ["p"], ["pf"], to=T.FLOAT), h.make_node("Add", ["x", "pf"], ["y"])]
    model = _model(_sizes("past_key", "X") + [h.make_node("F", ["X", "p", "s"], ["Y"], domain="local", name="call")],
                   body, [_vi("X", X), _vi("past_key", PAST)])
    for target in ("dml", "onnx"):
        result = pipeline.lower(model, target=target)
        assert result.model.functions[0].SerializeToString() == model.functions[0].SerializeToString()
        assert _calls(result.model) == _calls(model)
