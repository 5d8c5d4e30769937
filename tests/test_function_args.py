"""Masks inside local functions built from the sizes the caller passes (issue 26).

A function given `x` and `s = Gather(Shape(x), 2)` sees `s` as an input of unknown content unless
its calls define it: where every call computes an argument alike from the call's other arguments
and constants (`nested.functions.CallSites.definitions`), the function's graph computes that formal from the
others (a prelude), so the proof sees `Gather(Shape(x), 2)`. Each form below is built with
onnx.helper: lowered on both targets inside the function, signature and calls unchanged, outputs
equal to onnxruntime's at sizes around every constant; what cannot be defined keeps its decline.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from dmlgraph import pipeline
from dmlgraph.io.onnx_io import DOMAIN, import_model
from dmlgraph.rewrite.nested import PRELUDE_PREFIX, all_nodes

OPSET = 18
X_SHAPE = [1, 2, "S", "S"]


def _c(name: str, value, dtype=np.int64) -> onnx.NodeProto:
    return h.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype), name))


def _band(rows_from: str, rows_to: str, cols_to: str, k: int, out: str = "m") -> list[onnx.NodeProto]:
    """`cols <= rows + k` over Range grids (rows rows_from..rows_to, cols 0..cols_to)."""
    return [_c("zero", 0), _c("one", 1), _c("ax0", [0]), _c("ax1", [1]), _c("k", k),
            h.make_node("Range", [rows_from, rows_to, "one"], ["rows"]),
            h.make_node("Range", ["zero", cols_to, "one"], ["cols"]),
            h.make_node("Add", ["rows", "k"], ["shifted"]),
            h.make_node("Unsqueeze", ["shifted", "ax1"], ["r2"]),
            h.make_node("Unsqueeze", ["cols", "ax0"], ["c2"]),
            h.make_node("LessOrEqual", ["c2", "r2"], [out])]


def _apply(mask: str = "m") -> list[onnx.NodeProto]:
    return [_c("ninf", -np.inf, np.float32), h.make_node("Where", [mask, "x", "ninf"], ["y"])]


def _function(inputs: list[str], nodes: list[onnx.NodeProto]) -> onnx.FunctionProto:
    return h.make_function("local", "F", inputs, ["y"], nodes, [h.make_opsetid("", OPSET)])


def _model(nodes, functions, inputs=None, outputs=("Y",), inits=()) -> onnx.ModelProto:
    inputs = inputs or [h.make_tensor_value_info("X", T.FLOAT, X_SHAPE)]
    g = h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info(o, T.FLOAT, X_SHAPE) for o in outputs],
                     [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in inits])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", OPSET), h.make_opsetid("local", 1)], ir_version=10,
                     functions=functions)
    onnx.checker.check_model(m, full_check=True)
    return m


def _sizes(x: str, suffix: str = "") -> list[onnx.NodeProto]:
    """The caller's size reads: s = Gather(Shape(x), 2), t = Gather(Shape(x), 3) (TorchScript's form)."""
    return [h.make_node("Shape", [x], [f"sh{suffix}"]),
            h.make_node("Gather", [f"sh{suffix}", "i2"], [f"s{suffix}"]),
            h.make_node("Gather", [f"sh{suffix}", "i3"], [f"t{suffix}"])]


def causal_s_t(k: int = 0) -> onnx.ModelProto:
    """F(x, s, t): rows Range(s), cols Range(t), `cols <= rows + k`; a value inside named like a
    prelude value (fresh names skip it)."""
    body = _band("zero", "s", "t", k) + _apply() + [h.make_node("Identity", ["x"], [f"{PRELUDE_PREFIX}0"])]
    return _model(_sizes("X") + [h.make_node("F", ["X", "s", "t"], ["Y"], domain="local", name="call")],
                  [_function(["x", "s", "t"], body)], inits=[("i2", 2), ("i3", 3)])


def shape_vector() -> onnx.ModelProto:
    """F(x, shape): the whole Shape(x) passed; the function gathers its sizes itself (k = -1)."""
    body = [_c("j2", 2), h.make_node("Gather", ["shape", "j2"], ["n"])] + _band("zero", "n", "n", -1) + _apply()
    return _model([h.make_node("Shape", ["X"], ["shape"]),
                   h.make_node("F", ["X", "shape"], ["Y"], domain="local", name="call")],
                  [_function(["x", "shape"], body)])


def identity_of_x() -> onnx.ModelProto:
    """The caller passes Identity(X) and sizes read from X itself (the fuzzer's `xin`), two calls
    with the same cones (k = 2)."""
    body = _band("zero", "s", "t", 2) + _apply()
    calls = [h.make_node("Identity", ["X"], ["xin"]), h.make_node("Neg", ["X"], ["X2"]),
             h.make_node("F", ["xin", "s", "t"], ["Y"], domain="local", name="call_1")] + _sizes("X2", "2") + \
        [h.make_node("F", ["X2", "s2", "t2"], ["Y2"], domain="local", name="call_2")]
    return _model(_sizes("X") + calls, [_function(["x", "s", "t"], body)], outputs=("Y", "Y2"),
                  inits=[("i2", 2), ("i3", 3)])


def kv_cache() -> onnx.ModelProto:
    """F(x, past, p, s): rows p..p+s, cols 0..p+s with p = Gather(Shape(past), 2) (a KV cache's past
    length; x [1, 2, S, P + S])."""
    body = [h.make_node("Add", ["p", "s"], ["total"])] + _band("p", "total", "total", 0) + _apply()
    x_shape = [1, 2, "S", "T"]
    inputs = [h.make_tensor_value_info("X", T.FLOAT, x_shape), h.make_tensor_value_info("past", T.FLOAT, [1, 1, "P", 1])]
    nodes = [h.make_node("Shape", ["past"], ["psh"]), h.make_node("Gather", ["psh", "i2"], ["p"]),
             h.make_node("Shape", ["X"], ["sh"]), h.make_node("Gather", ["sh", "i2"], ["s"]),
             h.make_node("F", ["X", "past", "p", "s"], ["Y"], domain="local", name="call")]
    g = h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info("Y", T.FLOAT, x_shape)],
                     [numpy_helper.from_array(np.array(2, np.int64), "i2")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", OPSET), h.make_opsetid("local", 1)], ir_version=10,
                     functions=[_function(["x", "past", "p", "s"], body)])
    onnx.checker.check_model(m, full_check=True)
    return m


def call_in_if() -> onnx.ModelProto:
    """The call is inside an If branch that reads the main graph's X and its sizes."""
    body = _band("zero", "s", "t", 1) + _apply()
    then = h.make_graph([h.make_node("F", ["X", "s", "t"], ["y_then"], domain="local", name="call")], "then", [],
                        [h.make_tensor_value_info("y_then", T.FLOAT, X_SHAPE)])
    other = h.make_graph([h.make_node("Identity", ["X"], ["y_else"])], "else", [],
                         [h.make_tensor_value_info("y_else", T.FLOAT, X_SHAPE)])
    return _model(_sizes("X") + [h.make_node("If", ["cond"], ["Y"], then_branch=then, else_branch=other)],
                  [_function(["x", "s", "t"], body)],
                  [h.make_tensor_value_info("X", T.FLOAT, X_SHAPE), h.make_tensor_value_info("cond", T.BOOL, [])],
                  inits=[("i2", 2), ("i3", 3)])


FORMS = {"causal_s_t": (causal_s_t, [0]), "shifted_s_t": (lambda: causal_s_t(-2), [-2]),
         "shape_vector": (shape_vector, [-1]), "identity_of_x": (identity_of_x, [2]), "kv_cache": (kv_cache, [0]),
         "call_in_if": (call_in_if, [1])}


def _feeds(model: onnx.ModelProto, s: int, p: int, rng) -> dict[str, np.ndarray]:
    names = [vi.name for vi in model.graph.input]
    t = s + p if "past" in names else s
    feeds = {"X": rng.standard_normal((1, 2, s, t)).astype(np.float32)}
    if "past" in names:
        feeds["past"] = rng.standard_normal((1, 1, p, 1)).astype(np.float32)
    if "cond" in names:
        feeds["cond"] = np.array(True)
    return feeds


def _ort(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("target", ["dml", "onnx"])
def test_sizes_the_caller_passes_lower_inside_the_function(form, target):
    build, constants = FORMS[form]
    original = build()
    # (the portable form of kv_cache's shifted band is bigger than its Range cone: growth allowed here)
    result = lowered_in_function(original, target)
    model = result.model
    assert result.passes.applied and {m.captures.get("scope") for m in result.passes.applied} == {"local::F"}
    [f], [before] = model.functions, original.functions
    assert (list(f.input), list(f.output)) == (list(before.input), list(before.output))
    assert [n for n in model.graph.node if n.domain == "local"] == [n for n in original.graph.node if n.domain == "local"]
    dml = [n for n in all_nodes(f.node) if n.domain == DOMAIN]
    assert len(dml) == (1 if target == "dml" else 0)
    if target == "dml":
        assert len(f.node) < len(before.node)  # (the kept prelude nodes included)
    pasts = [0, 1, 3] if "past" in [vi.name for vi in original.graph.input] else [0]
    assert_same_outputs(original, model, target, constants, pasts, lambda s, p, rng: _feeds(original, s, p, rng),
                        form)


def lowered_in_function(original: onnx.ModelProto, target: str) -> pipeline.OptimizeResult:
    """`original` lowered with growth allowed; the written model passes the full check and every
    mask the census finds in function F is lowered."""
    result = pipeline.lower(original, pipeline.make_options(allow_growth=True), target=target, census=True)
    onnx.checker.check_model(result.model, full_check=True)
    rows = [r for r in result.passes.census if r["scope"] == "local::F"]
    assert rows and all(r["status"] == "lowered" for r in rows), rows
    return result


def assert_same_outputs(original: onnx.ModelProto, model: onnx.ModelProto, target: str, constants: list[int],
                        pasts: list[int], feeds_of, label: str) -> None:
    """`model` (run by onnxruntime on onnx, dmlgraph's executor on dml) gives `original`'s outputs
    bit for bit at S around every constant and each past length; `feeds_of(s, p, rng)` makes the feeds."""
    rng = np.random.default_rng(0)
    for s in sorted({1, 2, 3} | {abs(c) + e for c in constants for e in (-1, 0, 1, 2) if abs(c) + e > 0}):
        for p in pasts:
            feeds = feeds_of(s, p, rng)
            want = _ort(original, feeds)
            got = _ort(model, feeds) if target == "onnx" else \
                [pipeline.run_graph(import_model(model), feeds)[o.name] for o in model.graph.output]
            assert all(w.tobytes() == g.tobytes() for w, g in zip(want, got)), (label, s, p)


def test_calls_computing_an_input_differently_define_nothing():
    """Two calls, one passing dim 2 as `s`, the other dim 3: `s` stays an input of unknown content,
    and the mask built from it is declined with a reason, the function left as it was."""
    body = _band("zero", "s", "t", 0) + _apply()
    nodes = _sizes("X") + [h.make_node("F", ["X", "s", "t"], ["Y"], domain="local", name="call_1"),
                           h.make_node("Neg", ["X"], ["X2"]), h.make_node("Shape", ["X2"], ["sh2"]),
                           h.make_node("Gather", ["sh2", "i3"], ["s2"]), h.make_node("Gather", ["sh2", "i3"], ["t2"]),
                           h.make_node("F", ["X2", "s2", "t2"], ["Y2"], domain="local", name="call_2")]
    model = _model(nodes, [_function(["x", "s", "t"], body)], outputs=("Y", "Y2"), inits=[("i2", 2), ("i3", 3)])
    for target in ("dml", "onnx"):
        result = pipeline.lower(model, target=target, census=True)
        assert not result.passes.applied
        assert result.model.functions[0].SerializeToString() == model.functions[0].SerializeToString()
        rows = [r for r in result.passes.census if r["scope"] == "local::F"]
        assert rows and all(r["status"] == "declined" and r["reason"] for r in rows), rows
        assert "'s'" in rows[0]["reason"]


def test_a_cone_reading_a_value_not_passed_keeps_its_outer_read():
    """`p = Gather(Shape(past), 2)` where `past` is not an argument and no main-graph input (a
    Neg of one; test_function_leaves.py: an input is passed as a new argument): `p` cannot be
    defined, and the band built from it is declined `outer_read`."""
    body = [h.make_node("Add", ["p", "s"], ["total"])] + _band("p", "total", "total", 0) + _apply()
    inputs = [h.make_tensor_value_info("X", T.FLOAT, [1, 2, "S", "T"]),
              h.make_tensor_value_info("past_in", T.FLOAT, [1, 1, "P", 1])]
    nodes = [h.make_node("Neg", ["past_in"], ["past"]),
             h.make_node("Shape", ["past"], ["psh"]), h.make_node("Gather", ["psh", "i2"], ["p"]),
             h.make_node("Shape", ["X"], ["sh"]), h.make_node("Gather", ["sh", "i2"], ["s"]),
             h.make_node("F", ["X", "p", "s"], ["Y"], domain="local", name="call")]
    g = h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info("Y", T.FLOAT, [1, 2, "S", "T"])],
                     [numpy_helper.from_array(np.array(2, np.int64), "i2")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", OPSET), h.make_opsetid("local", 1)], ir_version=10,
                         functions=[_function(["x", "p", "s"], body)])
    result = pipeline.lower(model, census=True)
    assert result.model.functions[0].SerializeToString() == model.functions[0].SerializeToString()
    rows = [r for r in result.passes.census if r["scope"] == "local::F" and r["status"] != "lowered"]
    assert rows and {r["rule"] for r in rows} == {"outer_read"} and all("'p'" in r["reason"] for r in rows), rows


@pytest.mark.parametrize("passed", ["size", "mask"])
def test_a_function_with_nothing_to_lower_is_written_as_it_was(passed):
    """The calls define `s` (or the mask `m` the caller builds from Range grids), the prelude is built
    (and the mask in it lowered), but nothing of the function's own is lowered: its bytes are the
    input's (the prelude never reaches the output)."""
    if passed == "size":
        caller = _sizes("X")
        body = [h.make_node("Cast", ["s"], ["sf"], to=T.FLOAT), h.make_node("Add", ["x", "sf"], ["y"])]
    else:
        caller = _sizes("X") + _band("zero", "s", "t", 0)
        body = [h.make_node("Cast", ["m"], ["mf"], to=T.FLOAT), h.make_node("ReduceSum", ["mf"], ["count"], keepdims=0),
                h.make_node("Mul", ["x", "count"], ["y"])]
    arg = "s" if passed == "size" else "m"
    model = _model(caller + [h.make_node("F", ["X", arg], ["Y"], domain="local", name="call")],
                   [_function(["x", arg], body)], inits=[("i2", 2), ("i3", 3)])
    for target in ("dml", "onnx"):
        result = pipeline.lower(model, target=target)
        assert result.model.functions[0].SerializeToString() == model.functions[0].SerializeToString()
        assert not any(m.captures.get("lowered") for m in result.passes.applied if m.captures.get("scope"))


def test_calls_under_another_opset_define_nothing():
    """The caller's cone is copied into the function: where the function imports another ONNX opset
    (whose ops may read their inputs differently), its inputs stay undefined."""
    model = causal_s_t()
    model.functions[0].opset_import[0].version = 17
    onnx.checker.check_model(model, full_check=True)
    result = pipeline.lower(model, census=True)
    assert not result.passes.applied
    assert result.model.functions[0].SerializeToString() == model.functions[0].SerializeToString()


def test_a_grid_compared_with_data_stays_a_data_mask():
    """`Range(p) <= pos[:, None]` in a function, `p` from a value the call does not pass, `pos` data
    (a static cache's `cache_position`): the decline stays data_mask (the diagonal moves with `pos`),
    not outer_read."""
    body = [_c("zero", 0), _c("one", 1), _c("ax0", [0]), _c("ax1", [1]),
            h.make_node("Range", ["zero", "p", "one"], ["cols"]), h.make_node("Unsqueeze", ["cols", "ax0"], ["c2"]),
            h.make_node("Unsqueeze", ["pos", "ax1"], ["r2"]), h.make_node("LessOrEqual", ["c2", "r2"], ["m"])] + _apply()
    inputs = [h.make_tensor_value_info("X", T.FLOAT, [1, 2, "S", "P"]), h.make_tensor_value_info("pos", T.INT64, ["S"]),
              h.make_tensor_value_info("past", T.FLOAT, [1, 1, "P", 1])]
    nodes = [h.make_node("Shape", ["past"], ["psh"]), h.make_node("Gather", ["psh", "i2"], ["p"]),
             h.make_node("F", ["X", "p", "pos"], ["Y"], domain="local", name="call")]
    g = h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info("Y", T.FLOAT, [1, 2, "S", "P"])],
                     [numpy_helper.from_array(np.array(2, np.int64), "i2")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", OPSET), h.make_opsetid("local", 1)], ir_version=10,
                         functions=[_function(["x", "p", "pos"], body)])
    rows = [r for r in pipeline.lower(model, census=True).passes.census if r["scope"] == "local::F"]
    assert rows and {r["rule"] for r in rows} == {"data_mask"}, rows


def test_a_function_called_by_a_function_is_defined_through_it():
    """Main calls G(X, s) with s = Gather(Shape(X), 2); G calls F(x, s, s): G's `s` is defined from
    its `x` (in G's prelude), so F's arguments trace to G's `x` and F's `s` and `t` are defined too.
    F is lowered, G written as it was."""
    g_fn = h.make_function("local", "G", ["x", "s"], ["y"],
                           [h.make_node("F", ["x", "s", "s"], ["y"], domain="local")],
                           [h.make_opsetid("", OPSET), h.make_opsetid("local", 1)])
    f_fn = _function(["x", "s", "t"], _band("zero", "s", "t", 0) + _apply())
    model = _model(_sizes("X") + [h.make_node("G", ["X", "s"], ["Y"], domain="local", name="call")],
                   [g_fn, f_fn], inits=[("i2", 2), ("i3", 3)])
    for target in ("dml", "onnx"):
        result = pipeline.lower(model, target=target)
        assert {m.captures.get("scope") for m in result.passes.applied} == {"local::F"}
        g_out, f_out = result.model.functions
        assert g_out.SerializeToString() == g_fn.SerializeToString()
        assert len([n for n in f_out.node if n.domain == DOMAIN]) == (target == "dml")
        for s in (1, 2, 4):
            feeds = {"X": np.random.default_rng(s).standard_normal((1, 2, s, s)).astype(np.float32)}
            want = _ort(model, feeds)[0]
            got = _ort(result.model, feeds)[0] if target == "onnx" else \
                pipeline.run_graph(import_model(result.model), feeds)["Y"]
            assert want.tobytes() == got.tobytes()
