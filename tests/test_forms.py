"""Mask forms seen in real exports (issue 26), each rebuilt from its form with onnx.helper, not copied
from a model: what it lowers to (before -> after in each docstring), and that the lowered model
equals onnxruntime on the original, on both targets, at several sizes."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from dmlgraph import api

NINF = np.float32(-np.inf)


def c(name: str, arr) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def vi(name: str, t: int, shape) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, t, shape)


def model(nodes, inputs, outputs, inits=(), functions=()) -> onnx.ModelProto:
    opsets = [h.make_opsetid("", 18)] + ([h.make_opsetid("local", 1)] if functions else [])
    m = h.make_model(h.make_graph(nodes, "form", inputs, outputs, list(inits)), opset_imports=opsets, ir_version=10,
                     functions=list(functions))
    onnx.checker.check_model(m, full_check=True)
    return m


GRID = [c("ax2", np.int64(2)), c("zero", np.int64(0)), c("one", np.int64(1)), c("a0", np.array([0])),
        c("a1", np.array([1])), c("ninf", NINF)]


def causal(p: str, x: str) -> list[onnx.NodeProto]:
    """`{p}keep` [S, S]: row i sees column j <= i, from Shape(x)[2] by Range/Unsqueeze/LessOrEqual."""
    return [h.make_node("Shape", [x], [p + "shape"]), h.make_node("Gather", [p + "shape", "ax2"], [p + "n"], axis=0),
            h.make_node("Range", ["zero", p + "n", "one"], [p + "r"]),
            h.make_node("Unsqueeze", [p + "r", "a0"], [p + "cols"]), h.make_node("Unsqueeze", [p + "r", "a1"], [p + "rows"]),
            h.make_node("LessOrEqual", [p + "cols", p + "rows"], [p + "keep"])]


def feeds(m: onnx.ModelProto, size: int, seed: int = 0, **given) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for i in m.graph.input:
        if i.name in given:
            out[i.name] = np.asarray(given[i.name])
            continue
        tt = i.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else size for d in tt.shape.dim]
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        out[i.name] = rng.random(shape) < 0.8 if dt == np.bool_ else \
            rng.standard_normal(shape).astype(dt) if dt.kind == "f" else rng.integers(0, size + 1, shape).astype(dt)
    return out


def assert_same(m: onnx.ModelProto, sizes=(1, 2, 3, 6), **given) -> None:
    """Both targets' lowered models give onnxruntime's outputs on the original, bit for bit."""
    want_session = ort.InferenceSession(m.SerializeToString())
    lowered = {t: api.optimize(m, target=t).model for t in ("dml", "onnx")}
    names = [o.name for o in m.graph.output]
    for size in sizes:
        f = feeds(m, size, size, **given)
        want = want_session.run(None, f)
        got_onnx = ort.InferenceSession(lowered["onnx"].SerializeToString()).run(None, f)
        got_dml = [api.run(lowered["dml"], f)[n] for n in names]
        for w, a, b in zip(want, got_onnx, got_dml):
            assert np.array_equal(w, a, equal_nan=True) and w.dtype == a.dtype, f"onnx target, size {size}"
            assert np.array_equal(w, b, equal_nan=True) and w.dtype == b.dtype, f"dml target, size {size}"


def dml_nodes(m: onnx.ModelProto) -> int:
    count = sum(n.op_type == "DiagonalMatrix1" for n in m.graph.node)
    for n in m.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                count += sum(x.op_type == "DiagonalMatrix1" for x in a.g.node)
    return count + sum(x.op_type == "DiagonalMatrix1" for f in m.functions for x in f.node)


def census(m: onnx.ModelProto, **kw) -> list[dict]:
    return api.inspect(m, **kw).report["masks"]


# ---- masks in If branches, Loop bodies and local functions ---------------------------------------
def if_model() -> onnx.ModelProto:
    then = h.make_graph(causal("t_", "x") + [h.make_node("Where", ["t_keep", "x", "ninf"], ["ty"])], "then", [],
                        [vi("ty", T.FLOAT, None)])
    other = h.make_graph([h.make_node("Trilu", ["x"], ["ey"], upper=0)], "else", [], [vi("ey", T.FLOAT, None)])
    return model([h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
                 [vi("x", T.FLOAT, [1, 2, "S", "S"]), vi("cond", T.BOOL, [])], [vi("y", T.FLOAT, [1, 2, "S", "S"])], GRID)


def test_mask_in_an_if_branch_reading_outer_values_lowers_and_is_counted():
    """An If branch (its outputs declared without a shape, as exporters write them) builds a causal
    mask from an outer value's shape and applies it. Before: the census did not look inside, and
    the Where was declined ("the rank of Where '' or of its band is unknown"). After: one
    DIAGONAL_MATRIX1 per branch, and the branch's mask is counted as lowered under its scope."""
    m = if_model()
    r = api.optimize(m)
    assert {(w.rule) for w in r.rewrites} == {"trilu", "mask_subgraph", "mask_where"}
    assert not [d for d in r.declined if "rank" in d.reason]
    assert dml_nodes(r.model) == 2
    rows = census(m)
    assert [(row["scope"], row["value"], row["status"]) for row in rows] == [("If/then_branch", "t_keep", "lowered")]
    for cond in (True, False):
        assert_same(m, cond=np.array(cond))


def loop_model() -> onnx.ModelProto:
    """Loop M times: acc += Where(causal(x), x, 0), the mask built in the body from the outer x."""
    body = h.make_graph(causal("b_", "x") + [h.make_node("Where", ["b_keep", "x", "zero_f"], ["masked"]),
                                             h.make_node("Add", ["acc", "masked"], ["acc_out"]),
                                             h.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
                        [vi("i", T.INT64, []), vi("cond_in", T.BOOL, []), vi("acc", T.FLOAT, None)],
                        [vi("cond_out", T.BOOL, []), vi("acc_out", T.FLOAT, None)])
    return model([h.make_node("Loop", ["trips", "", "acc0"], ["y"], body=body)],
                 [vi("x", T.FLOAT, [1, 2, "S", "S"]), vi("acc0", T.FLOAT, [1, 2, "S", "S"])],
                 [vi("y", T.FLOAT, [1, 2, "S", "S"])], GRID + [c("trips", np.int64(3)), c("zero_f", np.float32(0))])


def test_mask_in_a_loop_body_is_counted_and_lowered():
    """Before: a mask in a Loop body was neither counted nor missed. After: counted under
    `Loop/body`, lowered (it reads only the outer x's shape, the same every iteration)."""
    m = loop_model()
    rows = census(m)
    assert [(row["scope"], row["status"]) for row in rows] == [("Loop/body", "lowered")]
    assert dml_nodes(api.optimize(m).model) == 1
    assert_same(m)


def function_model() -> onnx.ModelProto:
    f = h.make_function("local", "CausalFill", ["fx"], ["fy"],
                        [h.make_node("Constant", [], ["ax2"], value=c("v", np.int64(2))),
                         h.make_node("Constant", [], ["zero"], value=c("v", np.int64(0))),
                         h.make_node("Constant", [], ["one"], value=c("v", np.int64(1))),
                         h.make_node("Constant", [], ["a0"], value=c("v", np.array([0]))),
                         h.make_node("Constant", [], ["a1"], value=c("v", np.array([1]))),
                         h.make_node("Constant", [], ["ninf"], value=c("v", NINF)),
                         *causal("f_", "fx"), h.make_node("Where", ["f_keep", "fx", "ninf"], ["fy"])],
                        opset_imports=[h.make_opsetid("", 18)])
    return model([h.make_node("CausalFill", ["x"], ["y"], domain="local")], [vi("x", T.FLOAT, [1, 2, "S", "S"])],
                 [vi("y", T.FLOAT, [1, 2, "S", "S"])], functions=[f])


def test_mask_in_a_local_function_is_counted_and_lowered():
    m = function_model()
    rows = census(m)
    assert [(row["scope"], row["status"]) for row in rows] == [("local::CausalFill", "lowered")]
    assert dml_nodes(api.optimize(m).model) == 1
    assert_same(m)


# ---- data-dependent masks: declined with the reason, never missed --------------------------------
def static_cache_model(in_if: bool = False) -> onnx.ModelProto:
    """transformers' static cache: `arange(T) <= cache_position[:, None]`, T the cache length."""
    nodes = [h.make_node("Shape", ["x"], ["shape"]), h.make_node("Gather", ["shape", "ax3"], ["t"], axis=0),
             h.make_node("Range", ["zero", "t", "one"], ["arange"]),
             h.make_node("Unsqueeze", ["cache_position", "a1"], ["positions"]),
             h.make_node("LessOrEqual", ["arange", "positions"], ["allowed"]),
             h.make_node("Where", ["allowed", "x", "ninf"], ["y"])]
    inputs = [vi("x", T.FLOAT, [1, 2, "S", "T"]), vi("cache_position", T.INT64, ["S"])]
    inits = GRID + [c("ax3", np.int64(3))]
    if in_if:
        nodes[-1].output[0] = "ty"
        then = h.make_graph(nodes, "then", [], [vi("ty", T.FLOAT, None)])
        other = h.make_graph([h.make_node("Identity", ["x"], ["ey"])], "else", [], [vi("ey", T.FLOAT, None)])
        nodes = [h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
        inputs.append(vi("cond", T.BOOL, []))
    return model(nodes, inputs, [vi("y", T.FLOAT, [1, 2, "S", "T"])], inits)


@pytest.mark.parametrize("in_if", [False, True], ids=["main", "if_branch"])
def test_static_cache_mask_is_declined_as_data_dependent(in_if):
    """Before: MISSED (and inspect --fail-on-missed failed). After: declined by `data_mask`, naming
    `cache_position`; nothing missed, and the model is left as it was."""
    m = static_cache_model(in_if)
    rows = census(m)
    assert [row["status"] for row in rows] == ["declined"]
    assert rows[0]["rule"] == "data_mask" and "'cache_position'" in rows[0]["reason"]
    assert rows[0]["scope"] == ("If/then_branch" if in_if else None)
    assert dml_nodes(api.optimize(m).model) == 0


def chunked_model(chunk: int = 4) -> onnx.ModelProto:
    """Llama-4 chunked attention, shape-only: causal and `(i // C) == (j // C)`."""
    nodes = causal("", "x") + [h.make_node("Div", ["rows", "chunk"], ["row_chunk"]),
                               h.make_node("Div", ["cols", "chunk"], ["col_chunk"]),
                               h.make_node("Equal", ["row_chunk", "col_chunk"], ["same_chunk"]),
                               h.make_node("And", ["same_chunk", "keep"], ["allowed"]),
                               h.make_node("Where", ["allowed", "x", "ninf"], ["y"])]
    return model(nodes, [vi("x", T.FLOAT, [1, 2, "S", "S"])], [vi("y", T.FLOAT, [1, 2, "S", "S"])],
                 GRID + [c("chunk", np.int64(chunk))])


def test_chunked_mask_is_declined_not_missed():
    """The causal band lowers and the And applies it to the chunk mask; the chunk mask (no band) was
    MISSED because the decline covering its cone also covered the And a later rewrite replaced. After:
    declined with the node that breaks the proof."""
    m = chunked_model()
    by_value = {row["value"]: row for row in census(m)}
    assert by_value["keep"]["status"] == "lowered"
    assert by_value["same_chunk"]["status"] == "declined" and "row_chunk" in by_value["same_chunk"]["reason"]
    assert not [row for row in by_value.values() if row["status"] == "missed"]
    assert_same(m, sizes=(1, 3, 4, 5, 9))


# ---- a tiny stored band that an application reads ------------------------------------------------
@pytest.mark.parametrize("n", [4, 8])
def test_tiny_stored_band_applied_by_where_lowers(n):
    """An 8x8 bool band (64 bytes) in Where(band, x, -inf). Before: declined, "the constant (64
    bytes) is not bigger than the node replacing it". After: the constant and the Where are one
    DIAGONAL_MATRIX1 of x."""
    m = model([h.make_node("Where", ["band", "x", "ninf"], ["y"])], [vi("x", T.FLOAT, [1, 2, n, n])],
              [vi("y", T.FLOAT, [1, 2, n, n])], [c("band", np.tril(np.ones((n, n), bool))), c("ninf", NINF)])
    r = api.optimize(m)
    assert [w.rule for w in r.rewrites] == ["stored_mask", "mask_where"] and not r.declined
    assert [n.op_type for n in r.model.graph.node] == ["DiagonalMatrix1"]
    assert not [t for t in r.model.graph.initializer if t.name == "band"]
    assert_same(m, sizes=(n,))


def test_tiny_stored_band_anded_with_padding_lowers():
    n = 8
    m = model([h.make_node("And", ["padding", "band"], ["y"])], [vi("padding", T.BOOL, [1, 1, n, n])],
              [vi("y", T.BOOL, [1, 1, n, n])], [c("band", np.tril(np.ones((n, n), bool)))])
    r = api.optimize(m)
    assert [n.op_type for n in r.model.graph.node] == ["DiagonalMatrix1"]
    assert_same(m, sizes=(n,))


def test_tiny_stored_band_read_by_anything_else_stays():
    """Read by a Reshape too, the band would stay a node of its own: declined as before."""
    n = 4
    m = model([h.make_node("Where", ["band", "x", "ninf"], ["w"]), h.make_node("Reshape", ["band", "flat"], ["z"])],
              [vi("x", T.FLOAT, [n, n]), vi("flat", T.INT64, [1])], [vi("w", T.FLOAT, [n, n]), vi("z", T.BOOL, [n * n])],
              [c("band", np.tril(np.ones((n, n), bool))), c("ninf", NINF)])
    r = api.optimize(m)
    assert [d.rule for d in r.declined] == ["stored_mask"] and "not bigger" in r.declined[0].reason


# ---- arithmetic blends of a 0/1 mask ----------------------------------------------------------------
def blend_model(n: int = 8) -> onnx.ModelProto:
    """GPT-1: `w * b + -1e4 * (1 - b)` with b a stored 0/1 lower-triangular float buffer."""
    nodes = [h.make_node("Mul", ["w", "b"], ["wb"]), h.make_node("Sub", ["one_f", "b"], ["not_b"]),
             h.make_node("Mul", ["not_b", "big"], ["fill"]), h.make_node("Add", ["wb", "fill"], ["y"])]
    return model(nodes, [vi("w", T.FLOAT, [1, 2, n, n])], [vi("y", T.FLOAT, [1, 2, n, n])],
                 [c("b", np.tril(np.ones((n, n), np.float32))[None, None]), c("one_f", np.float32(1)),
                  c("big", np.float32(-1e4))])


def test_blend_of_a_01_mask_is_one_node_with_its_exactness():
    """Before: two DIAGONAL_MATRIX1 nodes and an Add. After: one DIAGONAL_MATRIX1(w, Value -1e4)
    above the diagonal, stated equal for finite w (w = inf there gives NaN in the original); under
    --exact, declined with that reason."""
    m = blend_model()
    r = api.optimize(m)
    assert [n.op_type for n in r.model.graph.node] == ["DiagonalMatrix1"]
    assert r.rewrites[-1].rule == "mask_arith" and r.rewrites[-1].exact is False
    assert_same(m, sizes=(8,))
    exact = api.optimize(m, exact=True)
    assert any(d.rule == "mask_arith" and "--exact" in d.reason for d in exact.declined)
    assert "Add" in [n.op_type for n in exact.model.graph.node]


# ---- stacks of different bands, split back ---------------------------------------------------------
def stack_model() -> onnx.ModelProto:
    """A causal and a sliding-window mask (window 2) stacked along a batch axis, the stack's rows
    sliced (`[:, :, 0:]`), split back into one piece per layer, each And-ed
    with the padding and applied."""
    nodes = causal("", "x") + [
        h.make_node("Sub", ["rows", "cols"], ["dist"]), h.make_node("Less", ["dist", "two"], ["near"]),
        h.make_node("And", ["keep", "near"], ["window"]),
        h.make_node("Unsqueeze", ["keep", "a01"], ["causal4"]), h.make_node("Unsqueeze", ["window", "a01"], ["window4"]),
        h.make_node("Concat", ["causal4", "window4"], ["stack"], axis=0),
        h.make_node("Slice", ["stack", "start", "stop", "a2"], ["stack_rows"]),
        h.make_node("Split", ["stack_rows", "ones2"], ["full_mask", "window_mask"], axis=0)]
    outputs = []
    for piece in ("full_mask", "window_mask"):
        nodes += [h.make_node("And", [piece, "padding"], [piece + "_padded"]),
                  h.make_node("Where", [piece + "_padded", "x", "ninf"], [piece + "_y"])]
        outputs.append(vi(piece + "_y", T.FLOAT, [1, 2, "S", "S"]))
    return model(nodes, [vi("x", T.FLOAT, [1, 2, "S", "S"]), vi("padding", T.BOOL, [1, 1, 1, "S"])], outputs,
                 GRID + [c("two", np.int64(2)), c("a01", np.array([0, 1])), c("start", np.array([0])),
                         c("stop", np.array([2**62])), c("a2", np.array([2])), c("ones2", np.array([1, 1]))])


def test_stack_of_bands_split_back_lowers_each_piece():
    """Before: the Concat of two different bands was declined ("batch slices holding different
    bands") and each piece stayed a Where of an And. After: each piece is one DIAGONAL_MATRIX1 of
    the padding, and each application one more (the padded mask has data: two nodes a layer)."""
    m = stack_model()
    r = api.optimize(m)
    assert r.counts["split_of_concat"] == 1 and not [d for d in r.declined if "different bands" in d.reason]
    assert {n.op_type for n in r.model.graph.node} <= {"DiagonalMatrix1", "Shape", "Gather", "Concat", "Slice",
                                                       "Identity", "Equal", "Where", "Unsqueeze", "Reshape"}
    assert not [n for n in r.model.graph.node if n.op_type in ("Split", "Range", "Less", "LessOrEqual", "And")]
    assert_same(m, sizes=(1, 2, 3, 4, 7))


# ---- packed sequences -------------------------------------------------------------------------------
def packed_model() -> onnx.ModelProto:
    """transformers without an attention_mask: sequence ids from a CumSum over where position_ids
    restart, compared with themselves (same sequence), And-ed with the causal band."""
    nodes = causal("", "x") + [
        h.make_node("Equal", ["position_ids", "zero"], ["starts"]), h.make_node("Cast", ["starts"], ["starts_i"], to=T.INT64),
        h.make_node("CumSum", ["starts_i", "one"], ["sequence"]),
        h.make_node("Unsqueeze", ["sequence", "a2"], ["seq_q"]), h.make_node("Unsqueeze", ["sequence", "a1"], ["seq_k"]),
        h.make_node("Equal", ["seq_q", "seq_k"], ["same_sequence"]),
        h.make_node("Unsqueeze", ["same_sequence", "a1"], ["same4"]),
        h.make_node("And", ["same4", "keep"], ["allowed"]), h.make_node("Where", ["allowed", "x", "ninf"], ["y"])]
    return model(nodes, [vi("x", T.FLOAT, [2, 2, "S", "S"]), vi("position_ids", T.INT64, [2, "S"])],
                 [vi("y", T.FLOAT, [2, 2, "S", "S"])], GRID + [c("a2", np.array([2]))])


def test_packed_sequence_cone_declines_the_data_and_lowers_the_band():
    """Before: the sequence comparison was MISSED. After: declined by `data_mask` (its diagonal
    moves with position_ids), while the causal band lowers and the And applies it to it."""
    m = packed_model()
    by_value = {row["value"]: row for row in census(m)}
    assert by_value["same_sequence"]["status"] == "declined" and by_value["same_sequence"]["rule"] == "data_mask"
    assert "'position_ids'" in by_value["same_sequence"]["reason"]
    assert by_value["keep"]["status"] == "lowered" and by_value["allowed"]["status"] == "lowered"
    assert not [row for row in by_value.values() if row["status"] == "missed"]
    ids = np.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]], np.int64)
    assert_same(m, sizes=(6,), position_ids=ids)
