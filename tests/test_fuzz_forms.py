"""The fuzzer of mask forms (`fuzz_forms.py`): a bounded run here, a long soak with `make fuzz`.

FUZZ_EXAMPLES sets the examples (default: a bounded run of the suite); FUZZ_FLAT=1 keeps the flat forms
only (no If/Loop/function container), whose share docs/limits.md reports. Each generated model must
optimize and inspect without a crash, give onnxruntime's outputs on both targets, and have every
band tensor the oracle finds lowered or declined with a reason. The soak prints the share lowered.
"""
from __future__ import annotations

import os

import fuzz_forms
import fuzz_opsets
import numpy as np
import onnx
import pytest
from fuzz_forms import Stats, check, form_models
from hypothesis import HealthCheck, given, settings
from onnx import TensorProto as T
from onnx import helper as h

from dmlgraph import api

SOAK = "FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "30"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not SOAK, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])
TOTAL = Stats()


def _flat(case) -> bool:
    return not case.model.functions and not any(n.op_type in ("If", "Loop", "Scan") for n in case.model.graph.node)


@SETTINGS
@given(form_models().filter(_flat) if os.environ.get("FUZZ_FLAT") else form_models())
def test_forms_lower_or_decline_and_match_onnxruntime(case):
    stats, problems = check(case)
    TOTAL.add(stats)
    assert not problems, f"{case.description}:\n" + "\n".join(problems[:10])


def test_report_share_lowered():
    """(Runs after the fuzz test in file order: prints what it saw; `make fuzz` shows it with -s.)"""
    print(f"\nfuzz_forms: {TOTAL.line()}")
    for reason, n in sorted(TOTAL.reasons.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  declined {n}x  {reason}")
    print(f"  known gaps: {TOTAL.gaps}")
    print(f"  {fuzz_opsets.line()}")
    # (any crash failed the fuzz test itself)
    assert TOTAL.wrong == 0 and TOTAL.crashes == 0 and fuzz_forms is not None


# ---- masks in bodies and functions that read outer values (the fuzzer's former `body_outer` gap) ----
def _model(nodes, inits, inputs, functions=()):
    out = h.make_tensor_value_info(nodes[-1].output[0], T.FLOAT, [1, 2, "S", "S"])
    opsets = [h.make_opsetid("", 18)] + ([h.make_opsetid("local", 1)] if functions else [])
    m = h.make_model(h.make_graph(nodes, "gap", inputs, [out], inits), opset_imports=opsets, ir_version=10,
                     functions=list(functions))
    onnx.checker.check_model(m, full_check=True)
    return m


X = h.make_tensor_value_info("x", T.FLOAT, [1, 2, "S", "S"])
COND = h.make_tensor_value_info("cond", T.BOOL, [])
I64 = lambda name, v: onnx.numpy_helper.from_array(np.array(v, np.int64), name)
NINF = onnx.numpy_helper.from_array(np.float32(-np.inf), "ninf")


def _grid_nodes():
    """cols <= rows over x's last axis, as main-graph nodes (the grids the body reads)."""
    return [h.make_node("Shape", ["x"], ["shape"]), h.make_node("Gather", ["shape", "three"], ["n"], axis=0),
            h.make_node("Range", ["zero", "n", "one"], ["r"]), h.make_node("Unsqueeze", ["r", "ax1"], ["rows"]),
            h.make_node("Unsqueeze", ["r", "ax0"], ["cols"])], \
        [I64("three", 3), I64("zero", 0), I64("one", 1), I64("ax1", [1]), I64("ax0", [0]), NINF]


def _census(model) -> dict[str, dict]:
    return {r["value"]: r for r in api.inspect(model).report["masks"]}


def _branches(then_nodes, out):
    then = h.make_graph(then_nodes, "then", [], [h.make_tensor_value_info(out, T.FLOAT, None)])
    other = h.make_graph([h.make_node("Identity", ["x"], ["y_else"])], "else", [],
                         [h.make_tensor_value_info("y_else", T.FLOAT, None)])
    return h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)


def _same_as_onnxruntime(m, feeds_of, allow_growth=False):
    """Both targets' outputs equal onnxruntime's on the original (bit for bit), at several sizes."""
    for target in ("dml", "onnx"):
        lowered = api.optimize(m, target=target, allow_growth=allow_growth).model
        onnx.checker.check_model(lowered, full_check=True)
        for n in (1, 2, 5):
            feeds = feeds_of(n)
            want = fuzz_forms.ort_session(m).run(None, feeds)[0]
            got = api.run(lowered, feeds)[m.graph.output[0].name] if target == "dml" else \
                fuzz_forms.ort_session(lowered).run(None, feeds)[0]
            np.testing.assert_array_equal(got, want)


def _x(n):
    return np.random.default_rng(n).standard_normal((1, 2, n, n)).astype(np.float32)


def test_if_branch_comparing_outer_grids_is_lowered():
    """The branch's proof sees the enclosing Range grids' definition (copied in, dropped again on write-back)."""
    nodes, inits = _grid_nodes()
    m = _model(nodes + [_branches([h.make_node("LessOrEqual", ["cols", "rows"], ["causal"]),
                                   h.make_node("Where", ["causal", "x", "ninf"], ["y_then"])], "y_then")],
               inits, [X, COND])
    assert _census(m)["causal"]["status"] == "lowered"
    written = api.optimize(m, target="dml").model
    assert [n.op_type for n in written.graph.node] == ["If"]  # (the grids went with the comparison)
    _same_as_onnxruntime(m, lambda n: {"x": _x(n), "cond": np.array(True)})


def test_if_branch_applying_an_outer_trilu_is_lowered():
    """A band the enclosing graph builds (Trilu of an outer shape) and the branch applies."""
    nodes = [h.make_node("Shape", ["x"], ["shape"]), h.make_node("Slice", ["shape", "two", "four"], ["matrix"]),
             h.make_node("ConstantOfShape", ["matrix"], ["ones"], value=onnx.numpy_helper.from_array(np.ones(1, np.float32))),
             h.make_node("Trilu", ["ones"], ["tri"], upper=0), h.make_node("Cast", ["tri"], ["band"], to=T.BOOL)]
    m = _model(nodes + [_branches([h.make_node("Where", ["band", "x", "ninf"], ["y_then"])], "y_then")],
               [I64("two", [2]), I64("four", [4]), NINF], [X, COND])
    written = api.optimize(m, target="dml")
    assert [r.rule for r in written.rewrites].count("mask_where") == 1
    _same_as_onnxruntime(m, lambda n: {"x": _x(n), "cond": np.array(True)})


def _loop(body_nodes, out):
    body = h.make_graph(body_nodes + [h.make_node("Identity", ["c_in"], ["c_out"])], "body",
                        [h.make_tensor_value_info("it", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
                         h.make_tensor_value_info("xin", T.FLOAT, [1, 2, "S", "S"])],
                        [h.make_tensor_value_info("c_out", T.BOOL, []),
                         h.make_tensor_value_info(out, T.FLOAT, [1, 2, "S", "S"])])
    return h.make_node("Loop", ["trips", "", "x"], ["y"], body=body)


def test_loop_body_comparing_outer_grids_is_lowered():
    nodes, inits = _grid_nodes()
    m = _model(nodes + [_loop([h.make_node("LessOrEqual", ["cols", "rows"], ["causal"]),
                               h.make_node("Where", ["causal", "xin", "ninf"], ["y_body"])], "y_body")],
               inits + [I64("trips", 2)], [X])
    assert _census(m)["causal"]["status"] == "lowered"
    _same_as_onnxruntime(m, lambda n: {"x": _x(n)})


def test_loop_body_mask_of_the_iteration_number_stays_declined():
    """Per iteration values stay declined (varying_masks), whatever the enclosing grids say."""
    nodes, inits = _grid_nodes()
    m = _model(nodes + [_loop([h.make_node("Add", ["rows", "it"], ["shifted"]),
                               h.make_node("LessOrEqual", ["cols", "shifted"], ["causal"]),
                               h.make_node("Where", ["causal", "xin", "ninf"], ["y_body"])], "y_body")],
               inits + [I64("trips", 2)], [X])
    row = _census(m)["causal"]
    assert row["status"] == "declined" and "iteration number" in row["reason"]
    assert api.optimize(m, target="dml").rewrites == []


@pytest.mark.parametrize("shift", ["it", "zero"])
def test_if_in_a_loop_body_sees_through_it_to_the_main_graph(shift):
    """An If in a Loop body compares main-graph grids shifted in the body: by the iteration number it
    stays declined, naming it; by a constant it is lowered (the cone is copied through both scopes)."""
    nodes, inits = _grid_nodes()
    inner = [h.make_node("LessOrEqual", ["cols", "rows_it"], ["causal"]),
             h.make_node("Where", ["causal", "xin", "ninf"], ["y_then"])]
    body = [h.make_node("Add", ["rows", shift], ["rows_it"]), _branches(inner, "y_then")]
    body[1].input[:] = ["cond"]
    body[1].attribute[0].g.node[0].input[:] = ["xin"]  # (the else branch passes the carried x on)
    body[1].output[:] = ["y_body"]
    m = _model(nodes + [_loop(body, "y_body")], inits + [I64("trips", 2)], [X, COND])
    row = _census(m)["causal"]
    if shift == "it":
        assert row["status"] == "declined" and "iteration number 'it'" in row["reason"]
    else:
        assert row["status"] == "lowered"
    _same_as_onnxruntime(m, lambda n: {"x": _x(n), "cond": np.array(True)})


def test_function_trilu_of_an_outer_shape_is_in_the_census():
    body = [h.make_node("Constant", [], ["two"], value=I64("two", [2])),
            h.make_node("Constant", [], ["four"], value=I64("four", [4])),
            h.make_node("Constant", [], ["ninf"], value=NINF),
            h.make_node("Slice", ["shape", "two", "four"], ["matrix"]),
            h.make_node("ConstantOfShape", ["matrix"], ["ones"], value=onnx.numpy_helper.from_array(np.ones(1, np.float32))),
            h.make_node("Trilu", ["ones"], ["tri"], upper=0), h.make_node("Cast", ["tri"], ["band"], to=T.BOOL),
            h.make_node("Where", ["band", "x", "ninf"], ["y"])]
    f = h.make_function("local", "masked", ["shape", "x"], ["y"], body, [h.make_opsetid("", 18)])
    m = _model([h.make_node("Shape", ["x"], ["shape"]), h.make_node("masked", ["shape", "x"], ["out"], domain="local")],
               [], [X], [f])
    assert _census(m)["band"]["status"] == "lowered"


@pytest.mark.parametrize("passed", ["x", "neg"])
def test_function_comparing_the_grids_it_is_passed(passed):
    """Grids the caller builds from Shape(x) are defined in the function when x is passed too (its
    calls prove it), so the band is lowered; built from the main-graph input x where only Neg(x) is
    passed, the grids are defined from x as a new formal (rewrite/call_leaves.py) and the band is
    lowered too (before: declined `outer_read` naming 'cols'); the DML node reads its sizes from
    the function's own x, so the new formal is not kept and the signature stays."""
    nodes, inits = _grid_nodes()
    body = [h.make_node("Constant", [], ["ninf"], value=NINF), h.make_node("LessOrEqual", ["cols", "rows"], ["causal"]),
            h.make_node("Where", ["causal", "x", "ninf"], ["y"])]
    f = h.make_function("local", "masked", ["rows", "cols", "x"], ["y"], body, [h.make_opsetid("", 18)])
    arg = "x" if passed == "x" else "neg"
    m = _model(nodes + [h.make_node("Neg", ["x"], ["neg"]),
                        h.make_node("masked", ["rows", "cols", arg], ["out"], domain="local")], inits, [X], [f])
    assert _census(m)["causal"]["status"] == "lowered"
    _same_as_onnxruntime(m, lambda n: {"x": _x(n)})
    [written] = api.optimize(m, target="dml").model.functions
    assert list(written.input) == ["rows", "cols", "x"]


def test_if_branch_reads_sizes_from_the_inputs_the_main_graph_would():
    """A whole KV-cache form in a branch, its padding's length misnamed S (it is T, as Optimum's merged
    decoders name it): the body's inputs keep the enclosing order, so the band's rows are read from
    x (as in the main graph), not from the padding that claims the same name."""
    i64 = [I64(n, v) for n, v in (("i2", 2), ("i3", 3), ("zero", 0), ("one", 1), ("a1", [1]), ("a0", [0]))]
    body = [h.make_node("Shape", ["x"], ["shape"]), h.make_node("Gather", ["shape", "i2"], ["s"], axis=0),
            h.make_node("Gather", ["shape", "i3"], ["t"], axis=0), h.make_node("Shape", ["past_key"], ["pshape"]),
            h.make_node("Gather", ["pshape", "i2"], ["p"], axis=0), h.make_node("Range", ["zero", "t", "one"], ["c"]),
            h.make_node("Range", ["zero", "s", "one"], ["r"]), h.make_node("Add", ["r", "p"], ["pos"]),
            h.make_node("Unsqueeze", ["pos", "a1"], ["rows"]), h.make_node("Unsqueeze", ["c", "a0"], ["cols"]),
            h.make_node("Less", ["cols", "rows"], ["cmp"]), h.make_node("And", ["cmp", "padding"], ["padded"]),
            h.make_node("Where", ["padded", "x", "ninf"], ["y_then"])]
    xs = [1, 2, "S", "T"]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, xs), h.make_tensor_value_info("padding", T.BOOL, [1, 1, 1, "S"]),
              h.make_tensor_value_info("past_key", T.FLOAT, [1, 1, "P", 1]), COND]
    m = h.make_model(h.make_graph([_branches(body, "y_then")], "g", inputs, [h.make_tensor_value_info("y", T.FLOAT, xs)],
                                  i64 + [NINF]), opset_imports=[h.make_opsetid("", 18)], ir_version=10)
    assert api.optimize(m, target="dml").rewrites

    def feeds(n):
        s, t = (1, n + 1) if n < 5 else (3, 5)
        rng = np.random.default_rng(n)
        return {"x": rng.standard_normal((1, 2, s, t)).astype(np.float32), "padding": rng.random((1, 1, 1, t)) < 0.7,
                "past_key": np.zeros((1, 1, t - s, 1), np.float32), "cond": np.array(True)}
    _same_as_onnxruntime(m, feeds)


def test_function_band_sliced_and_joined_writes_on_the_dml_target():
    """Inference inside a local function reads no value_info: the DML ops' schemas type their output."""
    body = [h.make_node("Constant", [], [n], value=I64(n, v)) for n, v in
            (("two", [2]), ("four", [4]), ("z", [0]), ("big", [2**62]), ("last", [-1]))] + \
        [h.make_node("Constant", [], ["ninf"], value=NINF), h.make_node("Shape", ["x"], ["shape"]),
         h.make_node("Slice", ["shape", "two", "four"], ["matrix"]),
         h.make_node("ConstantOfShape", ["matrix"], ["ones"], value=onnx.numpy_helper.from_array(np.ones(1, np.float32))),
         h.make_node("Trilu", ["ones"], ["tri"], upper=0), h.make_node("Cast", ["tri"], ["band"], to=T.BOOL),
         h.make_node("Slice", ["band", "z", "two", "last"], ["left"]),
         h.make_node("Slice", ["band", "two", "big", "last"], ["right"]),
         h.make_node("Concat", ["left", "right"], ["joined"], axis=-1),
         h.make_node("Where", ["joined", "x", "ninf"], ["y"])]
    f = h.make_function("local", "masked", ["x"], ["y"], body, [h.make_opsetid("", 18)])
    m = _model([h.make_node("masked", ["x"], ["out"], domain="local")], [], [X], [f])
    lowered = api.optimize(m, target="dml")
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5)).astype(np.float32)
    want = fuzz_forms.ort_session(m).run(None, {"x": x})[0]
    np.testing.assert_array_equal(api.run(lowered.model, {"x": x})["out"], want)


@pytest.mark.parametrize(("k", "static"), [(0, None), (2, 3), (2, 1), (-1, 12)])
def test_a_function_slicing_its_own_constant_buffer_is_lowered(k, static):
    """A local function holding a stored band as a Constant node, sliced to x's [S, S] and applied:
    the buffer is a stored matrix there too (found by the soak: the slices were missed). At S = 3
    a band of offset 2 sliced to [3, 3] is one value: the column slice is a view of the lowered
    rows (main: declined, "one value everywhere"), exact with the growth gate and without."""
    buffer = np.tril(np.ones((12, 12), bool), k)
    c = lambda name, v: h.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(v), name))
    body = [c("buffer", buffer), c("i2", np.int64(2)), c("zero", np.array([0], np.int64)),
            c("ax0", np.array([0], np.int64)), c("ax1", np.array([1], np.int64)),
            c("fill", np.float32(-np.inf)),
            h.make_node("Shape", ["x"], ["shape"]), h.make_node("Gather", ["shape", "i2"], ["s"]),
            h.make_node("Unsqueeze", ["s", "ax0"], ["s1"]),
            h.make_node("Slice", ["buffer", "zero", "s1", "ax0"], ["rows"]),
            h.make_node("Slice", ["rows", "zero", "s1", "ax1"], ["band"]),
            h.make_node("Where", ["band", "x", "fill"], ["out"])]
    fn = h.make_function("local", "Masked", ["x"], ["out"], body, [h.make_opsetid("", 18)])
    x = X if static is None else h.make_tensor_value_info("x", T.FLOAT, [1, 2, static, static])
    m = _model([h.make_node("Masked", ["x"], ["y"], domain="local")], [], [x], [fn])
    if static is not None:
        m.graph.output[0].type.tensor_type.shape.dim[2].dim_value = static
        m.graph.output[0].type.tensor_type.shape.dim[3].dim_value = static
    census = _census(m)
    assert census["rows"]["status"] != "missed"
    assert census["band"]["status"] == "lowered", census["band"]
    _same_as_onnxruntime(m, lambda n: {"x": _x(n if static is None else static)})
    if static is not None:
        _same_as_onnxruntime(m, lambda n: {"x": _x(static)}, allow_growth=True)


PAD = h.make_tensor_value_info("padding", T.BOOL, [1, 1, 1, "S"])


def _padded_band() -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`padded` = And(Trilu(ones [S, S], k=-3) as bool, padding): a band that holds data, which the
    seed-7 soak regressions below apply in several ways; (its nodes, their constants)."""
    nodes = [h.make_node("Shape", ["x"], ["shape"]),
             h.make_node("Slice", ["shape", "a2", "a4"], ["matrix"]),
             h.make_node("ConstantOfShape", ["matrix"], ["ones"], value=h.make_tensor("v", T.FLOAT, [1], [1.0])),
             h.make_node("Trilu", ["ones", "k"], ["tri"], upper=0), h.make_node("Cast", ["tri"], ["band"], to=T.BOOL),
             h.make_node("And", ["band", "padding"], ["padded"])]
    return nodes, [I64("a2", [2]), I64("a4", [4]), I64("k", -3)]


def _padding(n: int) -> np.ndarray:
    return np.arange(n).reshape(1, 1, 1, n) % 3 > 0


def test_a_blend_of_a_padded_mask_is_declined_not_missed():
    """GPT-1's blend `x * g + (1 - g) * -1e4` whose gate g holds the padding (Not(And(band, padding))
    cast to float): `1 - g` and its Mul are no fill of one DIAGONAL_MATRIX1 (g holds data) and are
    declined with that reason (found by the seed-7 soak: they were missed), and the rest lowers."""
    band, inits = _padded_band()
    nodes = [*band, h.make_node("Not", ["padded"], ["outside"]),
             h.make_node("Cast", ["outside"], ["gate"], to=T.FLOAT),
             h.make_node("Sub", ["one", "gate"], ["inv"]), h.make_node("Mul", ["inv", "big"], ["fill"]),
             h.make_node("Mul", ["x", "gate"], ["wx"]), h.make_node("Add", ["wx", "fill"], ["y"])]
    inits += [onnx.numpy_helper.from_array(np.float32(1), "one"), onnx.numpy_helper.from_array(np.float32(-1e4), "big")]
    m = _model(nodes, inits, [X, PAD])
    census = _census(m)
    assert census["inv"]["status"] == "declined" and "holds data" in census["inv"]["reason"]
    assert census["fill"]["status"] != "missed" and census["outside"]["status"] == "lowered"
    _same_as_onnxruntime(m, lambda n: {"x": _x(n), "padding": _padding(n)})


def test_a_transposed_padded_mask_lowers():
    """Transpose of And(band, padding) applied by a Where: the band over the transposed padding, its
    region mirrored (seed-7 soak: it was missed, then declined; passes/band_views.py)."""
    band, inits = _padded_band()
    nodes = [*band, h.make_node("Transpose", ["padded"], ["t"], perm=[0, 1, 3, 2]),
             h.make_node("Where", ["t", "x", "ninf"], ["y"])]
    m = _model(nodes, inits + [NINF], [X, PAD])
    census = _census(m)
    assert census["t"]["status"] == "lowered", census["t"]
    _same_as_onnxruntime(m, lambda n: {"x": _x(n), "padding": _padding(n)})


def test_a_claimed_window_select_keeps_the_output_rank():
    """An empty window (cols < rows and cols >= rows) selecting x or -inf, whose size S the inputs x
    and padding both claim: all -inf, a DML node of the constant fill with the node's [1, 2, S, S]
    sizes and the mask's [S, S]. The portable select's data takes the node's sizes first (seed-7
    soak: the written model had rank 2 and failed onnx's checker, exit 3)."""
    nodes = [h.make_node("Shape", ["x"], ["shape"]), h.make_node("Gather", ["shape", "i2"], ["s"]),
             h.make_node("Gather", ["shape", "i3"], ["t"]),
             h.make_node("Range", ["i0", "t", "i1"], ["cols"]), h.make_node("Range", ["i0", "s", "i1"], ["rows"]),
             h.make_node("Unsqueeze", ["rows", "a1"], ["rows2"]), h.make_node("Unsqueeze", ["cols", "a0"], ["cols2"]),
             h.make_node("Add", ["rows2", "i0"], ["shifted"]), h.make_node("Less", ["cols2", "shifted"], ["causal"]),
             h.make_node("Sub", ["rows2", "cols2"], ["dist"]), h.make_node("Less", ["dist", "i1"], ["near"]),
             h.make_node("And", ["causal", "near"], ["window"]),
             h.make_node("Where", ["window", "x", "ninf"], ["y"])]
    inits = [I64("i0", 0), I64("i1", 1), I64("i2", 2), I64("i3", 3), I64("a0", [0]), I64("a1", [1]), NINF]
    m = _model(nodes, inits, [X, PAD])
    _same_as_onnxruntime(m, lambda n: {"x": _x(n), "padding": np.ones((1, 1, 1, n), bool)})


def test_a_sliced_padded_mask_lowers():
    """Rows [1:] of And(band, padding) applied by a Where: the band over the padding, its bounds
    shifted by the rows' start (seed-7 soak: it was missed, then declined; passes/band_views.py)."""
    band, inits = _padded_band()
    nodes = [*band, h.make_node("Slice", ["padded", "a1", "a_1", "a2"], ["sliced"]),
             h.make_node("Where", ["sliced", "x", "ninf"], ["y"])]
    m = _model(nodes, inits + [I64("a1", [1]), I64("a_1", [2**62]), NINF], [X, PAD])
    m.graph.output[0].type.tensor_type.shape.dim[2].dim_param = "R"
    census = _census(m)
    assert census["sliced"]["status"] == "lowered", census["sliced"]
