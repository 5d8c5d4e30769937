"""Constant masks, mask-building subgraphs, mask application and chain fusion, each checked
against onnxruntime on the original model at several sizes."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from test_apply import check

from dmlgraph import pipeline
from dmlgraph.io.onnx_io import export_model, import_model
from dmlgraph.ir.graph import DmlNode
from dmlgraph.passes.apply import complement, union
from dmlgraph.rewrite import Context, Options, Replacement, Rewriter

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def model_of(nodes, inputs, outputs, inits=(), opset=18):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(m)
    return m


def c(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def lower(model, **opts):
    g = import_model(model)
    result = pipeline.optimize_graph(g, Options(**opts))
    return g, result


def applied(result):
    return {k: v for k, v in result.counts.items() if v}


def scores_feeds(*seqs, batch=2, heads=2, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((batch, heads, s, s)).astype(np.float32)} for s in seqs]


X_SYM = h.make_tensor_value_info("x", T.FLOAT, ["B", "H", "S", "S"])
def Y(shape=("B", "H", "S", "S")):
    return h.make_tensor_value_info("y", T.FLOAT, list(shape))


# ---- interval algebra ---------------------------------------------------------------------------
def test_region_union_and_complement():
    assert union((None, 0), (2, None)) == (2, 0)             # tril(triu(x, ...)): inverted
    assert union((None, 3), (2, None)) == (None, None)        # overlapping: everything
    assert union((0, 1), (1, 2)) == (0, 2)
    assert union((0, 1), (3, 4)) is None                      # two separate bands: not one node
    assert complement((None, 1)) == (1, None)
    assert complement((0, 3)) == (3, 0)
    assert complement((3, 0)) == (0, 3)
    assert complement((None, None)) == (0, 0)
    assert complement((5, 5)) == (None, None)


# ---- stored masks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["neg_inf", "bool", "ones_tril", "minus_10000", "eye", "band_int64"])
def test_stored_mask_becomes_generator(kind):
    s = 32
    r, col = np.indices((s, s))
    top = col - r
    masks = {
        "neg_inf": np.where(top > 0, -np.inf, 0).astype(np.float32)[None, None],
        "bool": (top <= 0)[None, None],
        "ones_tril": (top <= 0).astype(np.float32),
        "minus_10000": np.where(top > 0, -10000.0, 1.0).astype(np.float32),  # else-part nonzero
        "eye": np.eye(s, dtype=np.float32),
        "band_int64": ((top <= 0) & (top > -4)).astype(np.int64),
    }
    mask = masks[kind]
    x = h.make_tensor_value_info("x", T.FLOAT, [2, 2, s, s])
    if mask.dtype == np.bool_:
        nodes = [h.make_node("Where", ["mask", "x", "fill"], ["y"])]
        inits = [c("mask", mask), c("fill", np.float32(-1e9))]
    elif mask.dtype == np.int64:
        nodes = [h.make_node("Cast", ["mask"], ["mf"], to=T.FLOAT), h.make_node("Mul", ["x", "mf"], ["y"])]
        inits = [c("mask", mask)]
    else:
        nodes = [h.make_node("Add", ["x", "mask"], ["y"])]
        inits = [c("mask", mask)]
    model = model_of(nodes, [x], [Y([2, 2, s, s])], inits)
    g, result = lower(model)
    assert "mask" not in g.initializers
    assert result.counts["stored_mask"] + result.counts["mask_subgraph"] == 1
    init_bytes = pipeline.graph_stats(g)["initializer_bytes"]
    assert init_bytes < 64, "the mask constant left the model"
    check(model, g, [{"x": np.random.default_rng(1).standard_normal((2, 2, s, s)).astype(np.float32)}],
                exact=kind != "band_int64")


def test_constant_node_mask_and_threshold():
    s = 16
    mask = np.triu(np.full((s, s), -np.inf, np.float32), 1)
    model = model_of([h.make_node("Constant", [], ["mask"], value=c("m", mask)),
                      h.make_node("Add", ["x", "mask"], ["y"])],
                     [h.make_tensor_value_info("x", T.FLOAT, [s, s])], [Y([s, s])])
    g, result = lower(model)
    assert result.counts["stored_mask"] == 1
    check(model, g, [{"x": np.ones((s, s), np.float32)}])
    g, result = lower(model, min_mask_bytes=10**6)
    assert not result.counts["stored_mask"] and "not bigger" in result.declined[0].reason


def test_non_band_constants_are_left_alone():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((8, 8)).astype(np.float32)
    almost = np.tril(np.ones((8, 8), np.float32))
    almost[5, 1] = 0  # one hole: not a band
    model = model_of([h.make_node("MatMul", ["x", "w"], ["t"]), h.make_node("Mul", ["t", "almost"], ["y"])],
                     [h.make_tensor_value_info("x", T.FLOAT, [8, 8])], [Y([8, 8])], [c("w", weight), c("almost", almost)])
    g, result = lower(model)
    assert not any(isinstance(n, DmlNode) for n in g.nodes.values())
    assert set(g.initializers) == {"w", "almost"}


# ---- mask-building subgraphs (symbolic sequence length) -------------------------------------------
def range_mask_nodes(compare="LessOrEqual", window=None):
    """cols <op> rows (+ an optional sliding window), as exporters build it from Shape(x)."""
    nodes = [
        h.make_node("Shape", ["x"], ["shp"]),
        h.make_node("Gather", ["shp", "two"], ["seq"], axis=0),
        h.make_node("Range", ["zero", "seq", "one"], ["idx"]),
        h.make_node("Unsqueeze", ["idx", "ax0"], ["cols"]),
        h.make_node("Unsqueeze", ["idx", "ax1"], ["rows"]),
        h.make_node(compare, ["cols", "rows"], ["causal"]),
    ]
    if window is not None:
        nodes += [h.make_node("Sub", ["rows", "cols"], ["dist"]),
                  h.make_node("Less", ["dist", "win"], ["near"]),
                  h.make_node("And", ["causal", "near"], ["allowed"])]
    else:
        nodes.append(h.make_node("Identity", ["causal"], ["allowed"]))
    inits = [c("two", np.int64(2)), c("zero", np.int64(0)), c("one", np.int64(1)), c("ax0", np.array([0])),
             c("ax1", np.array([1])), c("neg", np.float32(-np.inf))]
    if window is not None:
        inits.append(c("win", np.int64(window)))
    return nodes, inits


@pytest.mark.parametrize("compare,window", [("LessOrEqual", None), ("Less", None), ("LessOrEqual", 3),
                                            ("GreaterOrEqual", None)])
def test_range_mask_subgraph_becomes_one_node(compare, window):
    nodes, inits = range_mask_nodes(compare, window)
    nodes.append(h.make_node("Where", ["allowed", "x", "neg"], ["y"]))
    model = model_of(nodes, [X_SYM], [Y()], inits)
    g, result = lower(model)
    assert applied(result) == {"mask_subgraph": 1, "mask_where": 1}
    ops = {n.op_type for n in g.nodes.values()}
    assert not ops & {"Range", "LessOrEqual", "Less", "Where", "And", "Unsqueeze"}, ops
    assert sum(isinstance(n, DmlNode) for n in g.nodes.values()) == 1
    check(model, g, scores_feeds(1, 2, 5, 9, 17))


def test_range_mask_with_constant_attribute_forms_lowers_like_initializers():
    """Constant nodes written with value_float / value_int / value_ints (the dynamo exporter's and
    onnxsim's forms) hold float32 / int64 values: a value_float fill read as float64 declined the
    Where ("a branch of type float64 in an output of type float32"; tests/mutations.py)."""
    nodes, inits = range_mask_nodes()
    forms = {"neg": ("value_float", float("-inf")), "two": ("value_int", 2), "ax0": ("value_ints", [0])}
    consts = [h.make_node("Constant", [], [k], **{a: v}) for k, (a, v) in forms.items()]
    nodes = consts + nodes + [h.make_node("Where", ["allowed", "x", "neg"], ["y"])]
    model = model_of(nodes, [X_SYM], [Y()], [t for t in inits if t.name not in forms])
    g, result = lower(model)
    assert applied(result) == {"mask_subgraph": 1, "mask_where": 1}
    check(model, g, scores_feeds(1, 5, 9))


def test_mask_anded_with_padding_lowers_into_one_node_with_the_padding_as_input():
    nodes, inits = range_mask_nodes()
    nodes += [h.make_node("Cast", ["pad"], ["padb"], to=T.BOOL),
              h.make_node("Unsqueeze", ["padb", "ax12"], ["pad4"]),
              h.make_node("And", ["allowed", "pad4"], ["both"]),
              h.make_node("Where", ["both", "x", "neg"], ["y"])]
    inits.append(c("ax12", np.array([1, 2])))
    model = model_of(nodes, [X_SYM, h.make_tensor_value_info("pad", T.INT64, ["B", "S"])], [Y()], inits)
    g, result = lower(model)
    assert applied(result) == {"mask_subgraph": 1, "mask_bool": 1, "mask_where": 1}
    assert "And" not in {n.op_type for n in g.nodes.values()}
    assert sum(isinstance(n, DmlNode) for n in g.nodes.values()) == 1
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((2, 2, s, s)).astype(np.float32),
              "pad": (rng.random((2, s)) < 0.7).astype(np.int64)} for s in (3, 8)]
    check(model, g, feeds)


def padded_expanded_mask():
    """A causal band And a padding mask, expanded to [B, 1, S, S] as TorchScript writes it, applied
    to x and made SDPA's bias (the padded-mask tests')."""
    nodes, inits = range_mask_nodes()
    nodes += [h.make_node("Cast", ["pad"], ["padb"], to=T.BOOL),
              h.make_node("Unsqueeze", ["padb", "ax12"], ["pad4"]),
              h.make_node("And", ["allowed", "pad4"], ["both"]),
              # TorchScript's expand(batch, 1, S, S): Where(Equal(sizes, -1), ones, sizes), which
              # onnx's data propagation does not pass (the Expand's output dims are unk__)
              h.make_node("Shape", ["pad"], ["ps"]),
              h.make_node("Gather", ["ps", "zero"], ["b"], axis=0),
              h.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
              h.make_node("Unsqueeze", ["seq", "ax0"], ["s1"]),
              h.make_node("Concat", ["b1", "one1", "s1", "s1"], ["sizes"], axis=0),
              h.make_node("Equal", ["sizes", "minus1"], ["keep"]),
              h.make_node("Where", ["keep", "ones4", "sizes"], ["target"]),
              h.make_node("Expand", ["both", "target"], ["wide"]),
              h.make_node("Where", ["wide", "x", "neg"], ["y"]),
              h.make_node("Where", ["wide", "zero1", "neg1"], ["bias"])]  # (SDPA's bias: no data)
    inits += [c("ax12", np.array([1, 2])), c("one1", np.array([1])), c("minus1", np.int64(-1)),
              c("ones4", np.ones(4, np.int64)), c("zero1", np.zeros(1, np.float32)),
              c("neg1", np.full(1, -np.inf, np.float32))]
    outputs = [Y(), h.make_tensor_value_info("bias", T.FLOAT, ["B", 1, "S", "S"])]
    inputs = [X_SYM, h.make_tensor_value_info("pad", T.INT64, ["B", "S"])]
    return model_of(nodes, inputs, outputs, inits)


def test_a_padded_mask_read_through_identities_lowers_as_without_them():
    """An Identity on every edge of the mask's cone (TorchScript's aliases, optimizers' leftovers;
    tests/mutations.py `insert_identities`): each is the value it copies, for onnx's inference
    (an Identity of Unsqueeze's axes left the And without a rank) and for every rule reading a
    constant or walking producers (`ir.graph.copied`: an Identity of Unsqueeze's axes left the
    padding's sizes untraced, so the Expand of the band was not proved to keep its matrix)."""
    plain = padded_expanded_mask()
    with_ids = []
    for n in plain.graph.node:
        n = onnx.NodeProto.FromString(n.SerializeToString())
        for k, name in enumerate(n.input):
            with_ids.append(h.make_node("Identity", [name], [f"{name}_id{len(with_ids)}"]))
            n.input[k] = with_ids[-1].output[0]
        with_ids.append(n)
    model = onnx.ModelProto()
    model.CopyFrom(plain)
    del model.graph.node[:]
    model.graph.node.extend(with_ids)
    assert applied(lower(plain)[1]) == {"mask_subgraph": 1, "mask_bool": 1, "mask_view": 1, "mask_where": 2}
    g, result = lower(model)
    assert {k: v for k, v in applied(result).items() if k != "mask_view"} == \
        {"mask_subgraph": 1, "mask_bool": 1, "mask_where": 2}
    assert "And" not in {n.op_type for n in g.nodes.values()}
    assert sum(isinstance(n, DmlNode) for n in g.nodes.values()) == 2
    export_model(g)  # (a claim read where the per-axis view had no rank gave the bias a [1] static shape)
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.standard_normal((2, 2, s, s)).astype(np.float32),
              "pad": (rng.random((2, s)) < 0.7).astype(np.int64)} for s in (1, 3, 8)]
    check(model, g, feeds)


def test_mask_depending_on_values_is_not_lowered():
    """A 'mask' computed from input values is data: it must never become a generator."""
    model = model_of([h.make_node("Trilu", ["x"], ["t"], upper=0),
                      h.make_node("Greater", ["t", "zero"], ["pos"]),
                      h.make_node("Where", ["pos", "x", "neg"], ["y"])],
                     [X_SYM], [Y()], [c("zero", np.float32(0)), c("neg", np.float32(-1))])
    g, result = lower(model)
    assert not result.counts["mask_subgraph"]
    assert result.counts["trilu"] == 1
    # (the Greater and Where of the Trilu of x lower onto it, each reading x: a band on data)
    assert all(n.inputs and n.inputs[0] is not None for n in g.nodes.values() if isinstance(n, DmlNode))
    check(model, g, scores_feeds(4, 7))


def test_mask_with_large_constants_is_proved_not_sampled():
    """A window of 100000 is as easy to prove as one of 3: the bounds are exact expressions."""
    nodes, inits = range_mask_nodes("LessOrEqual", window=100000)
    nodes.append(h.make_node("Where", ["allowed", "x", "neg"], ["y"]))
    model = model_of(nodes, [X_SYM], [Y()], inits)
    g, result = lower(model)
    assert result.counts["mask_subgraph"] == 1
    (dml,) = [n for n in g.nodes.values() if isinstance(n, DmlNode)]
    assert (dml.begin, dml.end) == (1, -99999)  # -inf outside [-99999, 1): an inverted range
    check(model, g, scores_feeds(3))


def test_static_shape_subgraph_is_evaluated():
    s = 6
    ones = h.make_node("ConstantOfShape", ["shape"], ["ones"], value=c("v", np.array([1.0], np.float32)))
    model = model_of([ones, h.make_node("Trilu", ["ones", "k"], ["band"], upper=1),
                      h.make_node("Mul", ["x", "band"], ["y"])],
                     [h.make_tensor_value_info("x", T.FLOAT, [s, s])], [Y([s, s])],
                     [c("shape", np.array([s, s])), c("k", np.int64(-1))])
    g, result = lower(model)
    assert applied(result) == {"mask_subgraph": 1, "mask_arith": 1}
    check(model, g, [{"x": np.arange(s * s, dtype=np.float32).reshape(s, s)}], exact=False)


# ---- mask application -------------------------------------------------------------------------
def test_mul_and_add_masks_are_equal_for_finite_inputs_and_declined_with_exact():
    nodes, inits = range_mask_nodes()
    nodes += [h.make_node("Cast", ["allowed"], ["keep"], to=T.FLOAT), h.make_node("Mul", ["x", "keep"], ["y"])]
    model = model_of(nodes, [X_SYM], [Y()], inits)
    g, result = lower(model)
    assert result.counts["mask_arith"] == 1
    (dml,) = [n for n in g.nodes.values() if isinstance(n, DmlNode)]
    assert not dml.exact
    check(model, g, [{"x": np.abs(f["x"]) + 1} for f in scores_feeds(3, 6)])  # positive: no -0.0
    g, result = lower(model, exact_only=True)
    assert not result.counts["mask_arith"]
    assert any("--exact" in m.reason for m in result.declined)
    check(model, g, scores_feeds(3, 6))


def test_additive_minus_10000_mask_stays_a_generator():
    nodes, inits = range_mask_nodes()
    nodes += [h.make_node("Where", ["allowed", "zero_f", "big_neg"], ["bias"]), h.make_node("Add", ["x", "bias"], ["y"])]
    inits += [c("zero_f", np.float32(0)), c("big_neg", np.float32(-10000))]
    model = model_of(nodes, [X_SYM], [Y()], inits)
    g, result = lower(model)
    assert applied(result) == {"mask_subgraph": 1}
    assert "Add" in {n.op_type for n in g.nodes.values()}
    check(model, g, scores_feeds(2, 5))


def test_tril_of_triu_fuses_into_one_inverted_node():
    model = model_of([h.make_node("Trilu", ["x", "a"], ["t1"], upper=1),
                      h.make_node("Trilu", ["t1", "b"], ["y"], upper=0)],
                     [X_SYM], [Y()], [c("a", np.int64(-1)), c("b", np.int64(2))])
    g, result = lower(model)
    assert result.counts["chain"] == 1
    (dml,) = [n for n in g.nodes.values() if isinstance(n, DmlNode)]
    assert (dml.begin, dml.end) == (3, -1)  # zero outside [-1, 3): an inverted range
    check(model, g, scores_feeds(1, 4, 7))


def test_optimize_is_idempotent_on_mask_models():
    nodes, inits = range_mask_nodes("LessOrEqual", 3)
    nodes.append(h.make_node("Where", ["allowed", "x", "neg"], ["y"]))
    model = model_of(nodes, [X_SYM], [Y()], inits)
    g, _ = lower(model)
    once = export_model(g).SerializeToString(deterministic=True)
    g2, result = lower(onnx.load_from_string(once))
    assert not any(result.counts.values())
    assert export_model(g2).SerializeToString(deterministic=True) == once


def test_wide_hidden_dim_feeding_the_shape_still_lowers():
    """A static dim beyond the evaluation limit that is not a side of the mask (a hidden size of
    16384 read by Shape) must not block the rewrite: only the mask's own sides are sampled."""
    nodes, inits = range_mask_nodes()
    nodes[0] = h.make_node("Shape", ["hidden"], ["shp"])
    inits[0] = c("two", np.int64(1))  # seq is axis 1 of hidden [B, S, 16384]
    nodes.append(h.make_node("Where", ["allowed", "x", "neg"], ["y"]))
    hidden = h.make_tensor_value_info("hidden", T.FLOAT, ["B", "S", 16384])
    model = model_of(nodes, [X_SYM, hidden], [Y()], inits)
    g, result = lower(model)
    assert applied(result) == {"mask_subgraph": 1, "mask_where": 1}, [m.reason for m in result.declined]
    rng = np.random.default_rng(0)
    check(model, g, [{"x": rng.standard_normal((1, 2, s, s)).astype(np.float32),
                            "hidden": np.zeros((1, s, 16384), np.float32)} for s in (3, 6)])


# ---- regressions found in review: each was a rewrite that changed outputs or the interface ----------
def _validate_equal(model):
    g, result = lower(model, min_mask_bytes=0)  # small masks too, so every rule gets its chance
    check(model, g, [{"x": np.random.default_rng(5).standard_normal((8, 8)).astype(np.float32) * 30}])
    return g, result


def test_row_mask_is_not_a_band_of_a_matrix():
    model = model_of([h.make_node("Equal", ["row", "zero"], ["keep"]), h.make_node("Where", ["keep", "x", "c"], ["y"])],
                     [h.make_tensor_value_info("x", T.FLOAT, [8, 8])], [Y([8, 8])],
                     [c("row", np.where(np.arange(8) > 2, -1.0, 0.0).astype(np.float32)[None, :]),
                      c("zero", np.float32(0)), c("c", np.float32(-5))])
    g, result = _validate_equal(model)
    assert not result.counts["mask_where"]


def test_constant_of_higher_rank_keeps_broadcasting():
    model = model_of([h.make_node("Where", ["mask", "x", "c"], ["y"])],
                     [h.make_tensor_value_info("x", T.FLOAT, [8, 8])], [Y([1, 8, 8])],
                     [c("mask", np.tril(np.ones((8, 8), bool))), c("c", np.full((1, 1, 1), -5, np.float32))])
    g, result = _validate_equal(model)
    assert result.counts["mask_where"] == 1  # at the broadcast shape [1, 8, 8] (checked against onnxruntime)


def test_additive_lowest_mask_is_not_treated_as_absorbing():
    lowest = np.finfo(np.float16).min
    model = model_of([h.make_node("Cast", ["x"], ["xh"], to=T.FLOAT16), h.make_node("Add", ["xh", "mask"], ["y"])],
                     [h.make_tensor_value_info("x", T.FLOAT, [8, 8])], [h.make_tensor_value_info("y", T.FLOAT16, [8, 8])],
                     [c("mask", np.triu(np.full((8, 8), lowest, np.float16), 1))])
    g, result = _validate_equal(model)
    assert not result.counts["mask_arith"] and result.counts["stored_mask"] == 1


def test_initializer_that_is_also_an_input_is_not_a_constant():
    mask = np.triu(np.full((8, 8), -np.inf, np.float32), 1)
    model = model_of([h.make_node("Add", ["x", "m"], ["y"])],
                     [h.make_tensor_value_info("x", T.FLOAT, [8, 8]), h.make_tensor_value_info("m", T.FLOAT, [8, 8])],
                     [Y([8, 8])], [c("m", mask)])
    g, result = lower(model)
    assert not any(result.counts.values())
    assert [i.name for i in export_model(g).graph.input] == ["x", "m"]


# ---- fast paths against their simple oracles --------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def test_export_writes_nodes_as_read_with_their_current_value_names():
    """A node's proto goes out as read (node metadata included: exporters put namespaces and stack
    traces there), with the new input names once a rule rewired it, and with the names import gave
    unused outputs (else the written model would read the old value)."""
    nodes = [h.make_node("Relu", ["x"], ["a"], name="r1"), h.make_node("Neg", ["x"], ["b"], name="n"),
             h.make_node("Relu", ["a"], ["y"], name="r2"),
             h.make_node("Dropout", ["x"], ["d", ""], name="drop")]
    for n in nodes:
        n.metadata_props.add(key="namespace", value=f"block/{n.name}")
    m = h.make_model(h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                                  [h.make_tensor_value_info("y", T.FLOAT, [2]), h.make_tensor_value_info("d", T.FLOAT, [2])]),
                     opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    g = import_model(m)
    g.replace_uses(g.values["a"], g.values["b"])
    out = {n.name: n for n in export_model(g).graph.node}
    assert list(out["r2"].input) == ["b"] and list(out["r1"].input) == ["x"]
    assert out["drop"].output[0] == "d" and out["drop"].output[1] in g.values
    assert {n: [(p.key, p.value) for p in out[n].metadata_props] for n in out} == \
        {n.name: [("namespace", f"block/{n.name}")] for n in nodes}


def test_size_plumbing_lookup_finds_a_live_twin_after_the_indexed_node_is_removed():
    from dmlgraph.passes import sizes as masks
    m = h.make_model(h.make_graph(
        [h.make_node("Shape", ["x"], ["s1"], name="a"), h.make_node("Shape", ["x"], ["s2"], name="b")], "g",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [h.make_tensor_value_info("s1", T.INT64, [2]), h.make_tensor_value_info("s2", T.INT64, [2])]),
        opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    g = import_model(m)
    x, ctx = g.values["x"], Context(g)
    assert masks.existing_size_node(ctx, "Shape", [x], None) is g.values["s1"]  # the first one, indexed
    g.remove_node(g.values["s1"].producer)
    assert masks.existing_size_node(ctx, "Shape", [x], None) is g.values["s2"]  # its live twin
    g.remove_node(g.values["s2"].producer)
    assert masks.existing_size_node(ctx, "Shape", [x], None) is None
    assert masks.existing_size_node(ctx, "Gather", [x], 0) is None


def test_size_nodes_are_reused_while_alive_and_remade_once_removed():
    from dmlgraph.passes.sizes import Made, SizeBuilder
    from dmlgraph.passes.symbolic import Lin
    m = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
                                  [h.make_tensor_value_info("x", T.FLOAT, ["a", "b"])],
                                  [h.make_tensor_value_info("y", T.FLOAT, ["a", "b"])]),
                     opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    g = import_model(m)
    x = g.values["x"]
    dims = [Lin.sym("b"), Lin.sym("b")]
    rewriter, ctx = Rewriter(g), Context(g)

    def sizes_for(hint):
        made = Made()
        out = SizeBuilder(ctx, [x], made).vector(dims, hint)
        rewriter.apply(Replacement(nodes=made.nodes, initializers=made.initializers))
        return out, made.nodes

    sizes, new = sizes_for("m1")
    assert [n.op_type for n in new] == ["Shape", "Gather", "Concat"]  # the second dim b reuses the first
    again, new = sizes_for("m2")
    assert again is sizes and new == []  # the copies of a mask share them
    g.remove_node(sizes.producer)  # (as remove_dead does once nothing reads it)
    remade, new = sizes_for("m3")
    assert remade is not sizes and [n.op_type for n in new] == ["Concat"]  # Shape and Gather still live
    assert remade.producer.inputs[0].producer.op_type == "Gather"


# ---- the stored-mask pre-filter never turns away a band ----------------------------------------

from dmlgraph.ir.band import analyze_band, diagonal_use_mask  # noqa: E402
from dmlgraph.ir.graph import Value  # noqa: E402
from dmlgraph.passes import stored_masks  # noqa: E402

_DTYPES = [np.float32, np.float16, np.float64, np.bool_, np.int8, np.int32, np.int64, np.uint8, np.uint16]


@settings(max_examples=300, deadline=None)
@given(h=st.integers(1, 24), w=st.integers(1, 40), batch=st.integers(1, 3), dtype=st.sampled_from(_DTYPES),
       begin=st.integers(-30, 30), width=st.integers(0, 40), band=st.booleans(),
       values=st.lists(st.integers(0, 3), min_size=2, max_size=2), seed=st.integers(0, 2**16))
def test_first_row_prefilter_agrees_with_band_analysis(h, w, batch, dtype, begin, width, band, values, seed):
    if band:
        use = diagonal_use_mask(h, w, begin, begin + width)
        arr = np.where(use, dtype(values[0]), dtype(values[1])).astype(dtype)
    else:  # weights, or small-integer noise that is sometimes banded by chance
        rng = np.random.default_rng(seed)
        arr = rng.integers(-2, 3, (h, w)).astype(dtype) if seed % 2 else rng.standard_normal((h, w)).astype(dtype)
    arr = np.broadcast_to(arr, (batch, h, w)).copy()
    v = Value("w", shape=arr.shape)
    v.initializer = numpy_helper.from_array(arr, "w")
    if stored_masks.first_row_varies(v):
        assert analyze_band(arr) is None
    if band:
        assert not stored_masks.first_row_varies(v)
