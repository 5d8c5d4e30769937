"""The lowering pipeline end to end: import, Trilu/EyeLike rules, executor, export targets, validation."""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases
from onnx.reference import ReferenceEvaluator

from dmlgraph import pipeline
from dmlgraph.io.onnx_io import DOMAIN, export_model, import_model
from dmlgraph.ir.graph import DmlNode
from dmlgraph.ir.ops import FeatureLevel
from dmlgraph.rewrite import Options
from dmlgraph.runtime.executor import Executor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "models", "synthetic", "causal_attention.onnx")

ALL_TYPES = [T.FLOAT, T.FLOAT16, T.DOUBLE, T.INT8, T.INT16, T.INT32, T.INT64, T.UINT8, T.UINT16,
             T.UINT32, T.UINT64, T.BOOL]


def lower(model: onnx.ModelProto, level="5_1"):
    g = import_model(model)
    result = pipeline.optimize_graph(g, Options(feature_level=FeatureLevel.parse(level)))
    return g, result


def dml_nodes(g):
    return [n for n in g.nodes.values() if isinstance(n, DmlNode)]


def same_bits(a, b):
    return pipeline.bitwise_equal(np.asarray(a), np.asarray(b))


def one_node(op, elem_type, shape, *, trilu_k=None, k_input=False, out_type=None, **attrs):
    """A one-node model; `trilu_k` becomes the k input (an initializer, or a graph input)."""
    k = trilu_k
    inputs = [h.make_tensor_value_info("x", elem_type, shape)]
    names, inits = ["x"], []
    if k is not None:
        if k_input:
            inputs.append(h.make_tensor_value_info("k", T.INT64, []))
        else:
            inits.append(numpy_helper.from_array(np.array(k, np.int64), "k"))
        names.append("k")
    node = h.make_node(op, names, ["y"], **attrs)
    g = h.make_graph([node], "g", inputs, [h.make_tensor_value_info("y", out_type or elem_type, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def random_array(rng, elem_type, shape):
    dt = h.tensor_dtype_to_np_dtype(elem_type)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(dt)
    return (rng.standard_normal(shape) * 10).astype(dt)


def reference(model, feeds):
    """onnx.reference: the ground truth that has every type (onnxruntime lacks int8 Trilu, ...)."""
    return ReferenceEvaluator(model).run(None, feeds)


# ---- ONNX conformance cases ----------------------------------------------------------------
CASES = [c for c in collect_testcases(None) if c.name.startswith(("test_tril", "test_triu", "test_eyelike"))]


def test_conformance_cases_are_all_there():
    assert len(CASES) == 21


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance_case(case):
    g, result = lower(case.model)
    inputs, outputs = case.data_sets[0]
    feeds = {i.name: arr for i, arr in zip(case.model.graph.input, inputs)}
    zero_size = any(0 in arr.shape for arr in inputs)
    if zero_size:
        assert not dml_nodes(g)
        assert any("zero-size" in m.reason for m in result.declined)
    else:
        assert len(dml_nodes(g)) == 1 and not any(n.op_type in ("Trilu", "EyeLike") for n in g.nodes.values())
    got = Executor(g).run(feeds)
    for o, expected in zip(case.model.graph.output, outputs):
        assert same_bits(got[o.name], expected), case.name


# ---- randomized one-node models ----------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elem_type=st.sampled_from(ALL_TYPES), rank=st.integers(2, 6), data=st.data(),
       upper=st.integers(0, 1),
       k=st.one_of(st.none(), st.integers(-8, 8), st.sampled_from([2**31 - 1, -2**31, 2**31, -2**31 - 1,
                                                                     2**62, -2**62, 2**63 - 1, -2**63])),
       k_input=st.booleans(), symbolic=st.booleans())
def test_trilu_matches_reference(elem_type, rank, data, upper, k, k_input, symbolic):
    shape = data.draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank).map(tuple))
    decl = [f"d{i}" for i in range(rank)] if symbolic else list(shape)
    model = one_node("Trilu", elem_type, decl, trilu_k=k, k_input=k_input and k is not None, upper=upper)
    g, _ = lower(model)
    assert len(dml_nodes(g)) == 1, "every Trilu of a DML type and non-zero shape lowers"
    rng = np.random.default_rng(abs(hash((shape, k))) % 2**32)
    feeds = {"x": random_array(rng, elem_type, shape)}
    if k_input and k is not None:
        feeds["k"] = np.array(k, np.int64)
    got = Executor(g).run(feeds)["y"]
    x = feeds["x"]
    kk = 0 if k is None else k
    rows, cols = np.indices(shape[-2:])
    keep = (cols - rows >= kk) if upper else (cols - rows <= kk)
    expected = np.where(keep, x, np.zeros((), x.dtype))
    assert same_bits(got, expected)


@settings(max_examples=40, deadline=None)
@given(elem_type=st.sampled_from(ALL_TYPES), h_=st.integers(1, 6), w_=st.integers(1, 6),
       k=st.one_of(st.integers(-7, 7), st.sampled_from([2**40, -2**40, 2**31, -2**31])),
       with_dtype=st.booleans(), symbolic=st.booleans())
def test_eyelike_matches_numpy(elem_type, h_, w_, k, with_dtype, symbolic):
    in_type = T.FLOAT if with_dtype else elem_type
    attrs = {"k": k} | ({"dtype": elem_type} if with_dtype else {})
    model = one_node("EyeLike", in_type, ["H", "W"] if symbolic else [h_, w_], out_type=elem_type, **attrs)
    g, _ = lower(model)
    assert len(dml_nodes(g)) == 1
    x = random_array(np.random.default_rng(0), in_type, (h_, w_))
    got = Executor(g).run({"x": x})["y"]
    expected = np.eye(h_, w_, k=max(min(k, w_), -h_), dtype=h.tensor_dtype_to_np_dtype(elem_type))
    assert same_bits(got, expected)


def test_onnxruntime_agrees_where_it_has_kernels():
    """Where onnxruntime has a kernel, the executor's result equals onnxruntime's on the original."""
    rng = np.random.default_rng(1)
    for elem_type in (T.FLOAT, T.DOUBLE, T.INT64, T.INT32, T.FLOAT16):
        for upper in (0, 1):
            model = one_node("Trilu", elem_type, ["a", "b", "c"], trilu_k=1, k_input=True, upper=upper)
            x = random_array(rng, elem_type, (2, 4, 6))
            feeds = {"x": x, "k": np.array(-2, np.int64)}
            expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
            g, _ = lower(model)
            assert same_bits(Executor(g).run(feeds)["y"], expected)


# ---- rules decline with a reason ----------------------------------------------------------------
def test_bfloat16_trilu_is_declined_with_reason():
    g, result = lower(one_node("Trilu", T.BFLOAT16, [4, 4]))
    assert not dml_nodes(g)
    assert "BFLOAT16" in result.declined[0].reason


def test_eyelike_below_5_1_uses_diagonal_matrix_where_the_level_allows():
    model = one_node("EyeLike", T.FLOAT, [3, 4], k=1)
    g, _ = lower(model, "4_0")
    (n,) = dml_nodes(g)
    assert n.kind == "DiagonalMatrix"
    assert same_bits(Executor(g).run({"x": np.zeros((3, 4), np.float32)})["y"], np.eye(3, 4, 1, dtype=np.float32))
    g, _ = lower(one_node("EyeLike", T.FLOAT, [3, 4]), "2_0")  # padded to 4-D: 2_0 supports float32 4-D
    assert dml_nodes(g)[0].kind == "DiagonalMatrix"
    g, result = lower(one_node("EyeLike", T.INT64, [3, 4]), "4_0")
    assert not dml_nodes(g) and "INT64" in result.declined[0].reason
    g, result = lower(one_node("Trilu", T.FLOAT, [3, 4]), "4_0")
    assert not dml_nodes(g) and "5_1" in result.declined[0].reason


def test_trilu_k_not_integer_scalar_is_declined():
    model = one_node("Trilu", T.FLOAT, [3, 3])
    model.graph.node[0].input.append("k")
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 2], np.int64), "k"))
    g, result = lower(model)
    assert not dml_nodes(g) and "integer scalar" in result.declined[0].reason


# ---- export targets -----------------------------------------------------------------------
def test_round_trip_without_passes_is_equivalent():
    model = onnx.load(DEMO)
    out = export_model(import_model(model))
    onnx.checker.check_model(out, full_check=True)
    feeds = pipeline.make_inputs(import_model(model), {"batch": 2, "seq": 5})
    a = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    b = ort.InferenceSession(out.SerializeToString()).run(None, feeds)
    assert all(same_bits(x, y) for x, y in zip(a, b))
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("target", ["dml", "onnx"])
def test_export_targets_are_checker_valid_and_run(target, tmp_path):
    model = onnx.load(DEMO)
    g, result = lower(model)
    applied = {k: v for k, v in result.counts.items() if v}
    assert applied == {"mask_subgraph": 2, "mask_where": 1}, applied
    assert not {"Trilu", "EyeLike", "Where", "ConstantOfShape"} & {n.op_type for n in g.nodes.values()}
    out = export_model(g, target)
    onnx.checker.check_model(out, full_check=True)
    domains = {n.domain for n in out.graph.node}
    assert (DOMAIN in domains) == (target == "dml")
    for seq in (3, 9):
        feeds = pipeline.make_inputs(g, {"batch": 2, "seq": seq}, seed=seq)
        expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        if target == "onnx":
            got = ort.InferenceSession(out.SerializeToString()).run(None, feeds)
        else:
            reimported = import_model(out)
            assert len(dml_nodes(reimported)) == 2  # the causal generator fused into the Where
            res = Executor(reimported).run(feeds)
            got = [res[o.name] for o in out.graph.output]
        for e, x in zip(expected, got):
            np.testing.assert_allclose(x, e, rtol=1e-6, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(elem_type=st.sampled_from(ALL_TYPES), upper=st.integers(0, 1), k=st.integers(-6, 6),
       k_input=st.booleans())
def test_portable_export_runs_in_plain_onnxruntime(elem_type, upper, k, k_input):
    """The `onnx` target uses only ops onnxruntime's CPU provider has, for every DML type."""
    model = one_node("Trilu", elem_type, ["H", "W"], trilu_k=k, k_input=k_input, upper=upper)
    g, _ = lower(model)
    out = export_model(g, "onnx")
    x = random_array(np.random.default_rng(k + 10), elem_type, (4, 5))
    feeds = {"x": x} | ({"k": np.array(k, np.int64)} if k_input else {})
    got = ort.InferenceSession(out.SerializeToString()).run(None, feeds)[0]
    expected = reference(model, feeds)[0]
    assert same_bits(got, expected)


def test_optimizing_twice_changes_nothing():
    g, _ = lower(onnx.load(DEMO))
    first = export_model(g).SerializeToString(deterministic=True)
    g2, result = lower(onnx.load_from_string(first))
    assert not any(result.counts.values())
    assert export_model(g2).SerializeToString(deterministic=True) == first


# ---- validation ------------------------------------------------------------------------------
def test_validate_demo_model_bit_exact():
    for seq in (4, 11):
        report = pipeline.validate(DEMO, dims={"batch": 2, "seq": seq}).report
        assert report["ok"], report
        assert all(r["detail"] == "bit-exact" for r in report["outputs"] + report["tensors"])
        assert sorted(r["name"] for r in report["tensors"]) == ["eye", "masked_scores"]
        assert {k: v for k, v in report["rewrites"].items() if v} == {"mask_subgraph": 2, "mask_where": 1}


def test_the_summary_counts_the_nodes_of_bodies_too():
    """An Optimum merged decoder is one If in its main graph: `nodes 1 -> 1` said nothing changed
    while its branches shrank. The report carries `nodes_all_scopes` and the table shows it."""
    from dmlgraph.tools.report import before_after_table

    def branch(name: str) -> onnx.GraphProto:
        nodes = [h.make_node("Shape", ["x"], [f"{name}_s"]),
                 h.make_node("ConstantOfShape", [f"{name}_s"], [f"{name}_ones"],
                             value=h.make_tensor("v", T.FLOAT, [1], [1.0])),
                 h.make_node("Trilu", [f"{name}_ones"], [f"{name}_tril"], upper=0),
                 h.make_node("Mul", [f"{name}_tril", "x"], [f"{name}_y"])]
        return h.make_graph(nodes, name, [], [h.make_tensor_value_info(f"{name}_y", T.FLOAT, None)])
    g = h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=branch("t"), else_branch=branch("e"))], "g",
                     [h.make_tensor_value_info("c", T.BOOL, []), h.make_tensor_value_info("x", T.FLOAT, ["s", "s"])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["s", "s"])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    r = pipeline.lower(m, target="dml")
    before, after = r.report["before"], r.report["after"]
    assert (before["nodes"], after["nodes"]) == (1, 1)
    assert before["nodes_all_scopes"] == 9 and after["nodes_all_scopes"] < 9
    assert "with bodies, functions" in before_after_table(before, after)
