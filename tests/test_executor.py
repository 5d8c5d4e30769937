"""The executor's fast path (shape constants kept per input-shape set, DML kernels prepared once)
against its simple path: bit for bit on the corpus, correct when shapes change, never fooled by a
shape that depends on input values."""
from __future__ import annotations

import glob
import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from dmlgraph import pipeline
from dmlgraph.io.onnx_io import import_model
from dmlgraph.ir.graph import DmlNode
from dmlgraph.rewrite import Options
from dmlgraph.runtime import executor
from dmlgraph.runtime.executor import Executor, shape_constants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = sorted(glob.glob(os.path.join(ROOT, "models", "*.onnx"))) + \
    [os.path.join(ROOT, "models", "synthetic", "causal_attention.onnx")]


def same_bits(a, b) -> bool:
    return pipeline.bitwise_equal(np.asarray(a), np.asarray(b))


def lowered(model):
    g = import_model(model)
    pipeline.optimize_graph(g, Options())
    return g


def _model(nodes, inputs, outputs, inits=()):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def _feeds(g, size: int, seed: int):
    dims = {d: size for v in g.inputs for d in (v.shape or ()) if isinstance(d, str)}
    dims.update({d: 2 for d in dims if "batch" in d.lower()})
    # a KV-cache model names the attention_mask length after the sum it is ("past_sequence + sequence")
    dims.update({d: sum(dims.get(p.strip(), size) for p in d.split("+")) for d in dims if "+" in d})
    feeds = pipeline.make_inputs(g, dims, seed=seed)
    # masks are 0/1 (OPT's positions are a CumSum of attention_mask, bounded by its table)
    return {k: v % 2 if k.endswith("attention_mask") else v for k, v in feeds.items()}


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: os.path.relpath(p, os.path.join(ROOT, "models")))
def test_fast_path_is_bit_exact_with_the_simple_path_on_the_corpus(path):
    g = pipeline.lower(path).graph
    fast, simple = Executor(g), Executor(g, fast=False)
    runs = [(5, 0), (5, 1), (9, 2), (5, 3), (9, 4), (9, 5)]  # a new shape, then back: the cache per shape
    seen = {}
    for size, seed in runs:
        feeds = _feeds(g, size, seed)
        shapes = tuple((k, v.shape, v.dtype.str) for k, v in sorted(feeds.items()))
        got, want = fast.run(feeds), simple.run(feeds)
        assert simple.last_path == "simple"
        assert fast.last_path == ("fast" if shapes in seen else "simple"), size
        seen[shapes] = feeds
        assert list(got) == list(want)
        for name in want:
            assert same_bits(got[name], want[name]), (name, size, seed)
    for feeds in seen.values():  # every shape set is still kept
        fast.run(feeds)
        assert fast.last_path == "fast"


with open(os.path.join(ROOT, "models", "expected.json")) as f:
    KV_MODELS = [e for e in json.load(f)["symbolic_models"] if "past_sequence" in e["dynamic_axes"]]


@pytest.mark.parametrize("entry", KV_MODELS, ids=lambda e: e["file"])
def test_kv_cache_input_sets_on_the_fast_path(entry):
    """The deployed KV-cache input sets (an empty past, a past, one decode step, a left-padded
    batch), interleaved and each run twice: from the second run on at a set's shapes the fast path
    serves it (twins without the shape constants, prepared kernels), bit for bit the simple path."""
    g = pipeline.lower(os.path.join(ROOT, "models", entry["file"])).graph
    fast, simple = Executor(g), Executor(g, fast=False)
    sets = {}
    for name, rel in entry["input_sets"].items():
        with np.load(os.path.join(ROOT, "models", rel)) as z:
            sets[name] = {k: z[k] for k in z.files}
    assert any(v.shape[2] > 0 for feeds in sets.values() for k, v in feeds.items() if k.startswith("past"))
    for name in list(sets) * 2:
        got, want = fast.run(sets[name]), simple.run(sets[name])
        assert list(got) == list(want)
        assert all(same_bits(got[k], want[k]) for k in want), name
    assert fast.last_path == "fast"
    assert len({tuple((k, v.shape, v.dtype.str) for k, v in sorted(f.items())) for f in sets.values()}) == len(sets)
    for feeds in sets.values():  # every set's shapes (each its own) are still kept
        fast.run(feeds)
        assert fast.last_path == "fast"


def test_the_demo_skips_the_generator_and_times_the_applied_mask():
    g = pipeline.lower(CORPUS[-1]).graph
    ex = Executor(g, 1)
    feeds = _feeds(g, 16, 0)
    ex.run(feeds)
    assert ex.timings["skipped"] == 0 and ex.timings["dml"] > 0
    ex.run(feeds)
    # eye (a generator sized by Shape(q)) and the Shape/Gather/Concat feeding it are shape
    # constants; the -inf mask applied to the scores still runs on its kernel, every time
    assert ex.last_path == "fast" and ex.timings["skipped"] == 1 and ex.timings["dml"] > 0
    assert 0 < ex.timings["dml"] + ex.timings["onnx"] <= ex.timings["total"]
    kinds = [type(s).__name__ for s in ex.fast_plan]
    assert kinds == ["Region", "DmlNode", "Region"]


def test_gpt2_runs_two_sessions_around_its_padded_mask_at_steady_state():
    """The causal-and-padding mask is one DIAGONAL_MATRIX1 reading the padding (data): it runs on
    its kernel between the session computing the padding and the rest (the causal generator it
    absorbed is gone)."""
    path = os.path.join(ROOT, "models", "gpt2_dynamo.onnx")
    g = pipeline.lower(path).graph
    ex = Executor(g, 1)
    feeds = _feeds(g, 8, 0)
    want = Executor(g, fast=False).run(feeds)
    ex.run(feeds)
    got = ex.run(feeds)
    assert [type(s).__name__ for s in ex.fast_plan] == ["Region", "DmlNode", "Region"]
    assert ex.timings["dml"] > 0
    assert all(same_bits(got[k], want[k]) for k in want)


def test_twins_run_without_the_shape_constants_and_hand_out_copies():
    """A region whose Shape reads a value it computes: the fast path's first run makes the twin
    (and runs the region once more, to keep the shape it reads), later ones run the twin (fewer
    nodes), feed it the kept shape, and hand out a copy of a graph output only a dropped node made.
    One-off runs make no twin."""
    inputs = [h.make_tensor_value_info("x", T.FLOAT, ["n", "m"])]
    nodes = [h.make_node("Relu", ["x"], ["y"]), h.make_node("Shape", ["y"], ["s"]),
             h.make_node("Reshape", ["y", "s"], ["z"]), h.make_node("Trilu", ["z"], ["out"], upper=1)]
    outputs = [h.make_tensor_value_info("out", T.FLOAT, None), h.make_tensor_value_info("s", T.INT64, None)]
    g = lowered(_model(nodes, inputs, outputs))
    ex, simple = Executor(g, 1), Executor(g, 1, fast=False)
    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    want = simple.run({"x": x})
    ex.run({"x": x})
    assert not any(isinstance(s, executor.Region) and s.twin is not None for s in ex.fast_plan)
    for _ in range(3):
        got = ex.run({"x": x})
        assert all(same_bits(got[k], want[k]) for k in want)
        got["s"][:] = 0  # the caller's copy
    assert ex.last_path == "fast"
    region = next(s for s in ex.fast_plan if isinstance(s, executor.Region) and s.twin is not None)
    assert len(region.twin.model.graph.node) < len(region.runner.model.graph.node)
    assert "s" in region.twin.input_names and "s" in region.runner.output_names


def _twins_after_fast_runs(g) -> bool:
    """Runs the fast path three times (each bit for bit the simple path); whether any region has a twin."""
    ex, feeds = Executor(g, 1), _feeds(g, 16, 0)
    want = Executor(g, 1, fast=False).run(feeds)
    for _ in range(3):
        got = ex.run(feeds)
        assert all(same_bits(got[k], want[k]) for k in want)
    assert ex.last_path == "fast"
    return any(s.twin is not None for s in ex.fast_plan if isinstance(s, executor.Region))


def test_regions_with_large_weights_get_no_twin(monkeypatch):
    """A twin would hold a second copy of its region's weights: above the limit, none is made."""
    g = pipeline.lower(CORPUS[-1]).graph
    assert _twins_after_fast_runs(g)
    monkeypatch.setattr(executor, "TWIN_MAX_WEIGHT_BYTES", 0)
    assert not _twins_after_fast_runs(g)


def test_a_twin_onnxruntime_refuses_leaves_the_region_as_it_is(monkeypatch):
    from dmlgraph.errors import DmlgraphError

    def refuse(self, region):
        raise DmlgraphError("onnxruntime cannot load the model")
    monkeypatch.setattr(Executor, "_twin", refuse)
    assert not _twins_after_fast_runs(pipeline.lower(CORPUS[-1]).graph)


def _reshaped_mask_model():
    """The mask's size comes from Reshape(x, s): same input shapes, different sizes per values of s."""
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [12]), h.make_tensor_value_info("s", T.INT64, [2])]
    nodes = [
        h.make_node("Reshape", ["x", "s"], ["y"]),
        h.make_node("Shape", ["y"], ["ys"]),
        h.make_node("ConstantOfShape", ["ys"], ["ones"], value=numpy_helper.from_array(np.array([1.0], np.float32))),
        h.make_node("Trilu", ["ones"], ["mask"], upper=1),  # a generator sized at run time
        h.make_node("Trilu", ["y"], ["upper"], upper=1),  # applied to data of a value-dependent shape
        h.make_node("EyeLike", ["y"], ["eye"]),
    ]
    outputs = [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("mask", "upper", "eye")]
    return _model(nodes, inputs, outputs)


def test_a_shape_that_depends_on_input_values_is_never_kept():
    g = lowered(_reshaped_mask_model())
    assert len([n for n in g.nodes.values() if isinstance(n, DmlNode)]) == 3
    assert not {"ys", "mask", "upper", "eye"} & shape_constants(g)
    ex = Executor(g)
    x = np.arange(12, dtype=np.float32) + 1
    for s in ([3, 4], [3, 4], [4, 3], [2, 6], [4, 3], [12, 1], [3, 4]):
        got = ex.run({"x": x, "s": np.array(s, np.int64)})
        y = x.reshape(s)
        assert same_bits(got["upper"], np.triu(y)), s
        assert same_bits(got["mask"], np.triu(np.ones(s, np.float32))), s
        assert same_bits(got["eye"], np.eye(*s, dtype=np.float32)), s
    assert ex.last_path == "fast"


def _eye_of_input_model():
    """Outputs that are shape constants only: an identity sized by x, and the size itself."""
    inputs = [h.make_tensor_value_info("x", T.FLOAT, ["n", "m"])]
    nodes = [h.make_node("EyeLike", ["x"], ["eye"], k=1), h.make_node("Shape", ["x"], ["xs"]),
             h.make_node("Identity", ["x"], ["same"])]
    outputs = [h.make_tensor_value_info("eye", T.FLOAT, ["n", "m"]), h.make_tensor_value_info("xs", T.INT64, [2]),
               h.make_tensor_value_info("same", T.FLOAT, ["n", "m"])]
    return _model(nodes, inputs, outputs)


def test_kept_outputs_are_handed_out_as_copies():
    g = lowered(_eye_of_input_model())
    assert {"eye", "xs"} <= shape_constants(g) and "same" not in shape_constants(g)
    ex = Executor(g)
    x = np.ones((3, 5), np.float32)
    first = ex.run({"x": x})
    first["eye"][...] = 7  # the caller owns what it gets
    for _ in range(3):
        got = ex.run({"x": x})
        got["eye"][...] = 7
        got["xs"][...] = 0
    got = ex.run({"x": x})
    assert ex.last_path == "fast"
    assert same_bits(got["eye"], np.eye(3, 5, 1, dtype=np.float32))
    assert got["xs"].tolist() == [3, 5] and got["eye"].flags.writeable


def test_new_shapes_and_eviction_stay_correct(monkeypatch):
    monkeypatch.setattr(executor, "CACHE_ENTRIES", 3)
    g = lowered(_eye_of_input_model())
    ex = Executor(g)
    kept: list[tuple[int, int]] = []  # the oracle: the 3 shape sets used last, least recent first
    for n, m in [(2, 3), (4, 4), (2, 3), (5, 1), (6, 2), (7, 3), (2, 3), (4, 4), (4, 4)]:
        got = ex.run({"x": np.zeros((n, m), np.float32)})
        assert same_bits(got["eye"], np.eye(n, m, 1, dtype=np.float32)) and got["xs"].tolist() == [n, m]
        assert ex.last_path == ("fast" if (n, m) in kept else "simple"), (n, m)  # at most 3 kept, LRU
        kept = [k for k in kept if k != (n, m)][-2:] + [(n, m)]
    assert ex.last_path == "fast"


def test_kept_bytes_are_bounded(monkeypatch):
    monkeypatch.setattr(executor, "CACHE_BYTES", 100)
    g = lowered(_eye_of_input_model())
    ex = Executor(g)
    for n in (3, 3, 4, 4, 20, 20):  # 20 x 20 float32 is over the budget: never kept
        got = ex.run({"x": np.zeros((n, n), np.float32)})
        assert same_bits(got["eye"], np.eye(n, n, 1, dtype=np.float32))
    assert ex.last_path == "simple" and ex.cache_bytes <= 100


def test_feeds_the_fast_path_does_not_take():
    g = lowered(_eye_of_input_model())
    ex = Executor(g)
    x = np.zeros((2, 2), np.float32)
    ex.run({"x": x})
    ex.run({"x": x.tolist()})  # not an ndarray: the simple path converts it as before
    assert ex.last_path == "simple"
    ex.run({"x": x, "unused": x})  # an extra name: the simple path
    assert ex.last_path == "simple"
    ex.run({"x": x})
    assert ex.last_path == "fast"


def test_random_ops_are_never_constants():
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [3, 3])]
    nodes = [h.make_node("Shape", ["x"], ["xs"]),
             h.make_node("RandomUniformLike", ["x"], ["r"]),
             h.make_node("Shape", ["r"], ["rs"]),  # its shape is x's: a constant
             h.make_node("Add", ["r", "x"], ["y"])]
    g = import_model(_model(nodes, inputs, [h.make_tensor_value_info("y", T.FLOAT, None),
                                            h.make_tensor_value_info("rs", T.INT64, None)]))
    const = shape_constants(g)
    assert "xs" in const and "r" not in const and "y" not in const and "rs" not in const


def test_a_feed_of_the_wrong_shape_still_gets_the_simple_paths_error():
    g = lowered(_eye_of_input_model())
    ex = Executor(g)
    ex.run({"x": np.zeros((2, 2), np.float32)})
    with pytest.raises(Exception):  # noqa: B017 - whichever error: the point is it raises
        ex.run({"y": np.zeros((2, 2), np.float32)})


@pytest.mark.parametrize("fast", [True, False])
def test_a_feed_for_a_baked_in_initializer_is_refused_not_ignored(fast):
    """An initializer that is also a graph input is baked into the Executor's plan: a feed for it
    would be ignored (the default used) on either path; it is refused, naming the way that honours it."""
    b = numpy_helper.from_array(np.array([1, 2], np.float32), "b")
    g = import_model(_model([h.make_node("Add", ["x", "b"], ["y"])],
                            [h.make_tensor_value_info(n, T.FLOAT, [2]) for n in ("x", "b")],
                            [h.make_tensor_value_info("y", T.FLOAT, [2])], [b]))
    ex = Executor(g, fast=fast)
    x = np.ones(2, np.float32)
    for _ in range(2):  # (the second run at these shapes takes the fast path)
        assert ex.run({"x": x})["y"].tolist() == [2, 3]
    feeds = {"x": x, "b": np.array([10, 20], np.float32)}
    for run in (ex.run, ex.run_traced):
        with pytest.raises(pipeline.DmlgraphError, match="replace initializers.*: b") as e:
            run(feeds)
        assert "pipeline.run_graph" in e.value.hint
    assert pipeline.run_graph(g, feeds)["y"].tolist() == [11, 21]


def _branches_with_int4_weights() -> onnx.ModelProto:
    """An If whose branches each run MatMulNBits (int4, accuracy_level 4) on weights of the main
    graph, then a Trilu the rules lower: the executor runs the branches itself."""
    k, n, block = 32, 8, 32
    rng = np.random.default_rng(0)
    weights = rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
    scales = (rng.random(n * k // block).astype(np.float32) + 0.5) * 0.1

    def branch(name: str, upper: int):
        return h.make_graph([
            h.make_node("MatMulNBits", ["x", "B", "S"], [f"{name}_y"], domain="com.microsoft",
                        K=k, N=n, bits=4, block_size=block, accuracy_level=4),
            h.make_node("Cast", [f"{name}_y"], [f"{name}_c"], to=T.FLOAT),
            h.make_node("Reshape", [f"{name}_c", "shape"], [f"{name}_m"]),
            h.make_node("Trilu", [f"{name}_m"], [f"{name}_out"], upper=upper)], name, [],
            [h.make_tensor_value_info(f"{name}_out", T.FLOAT, [2, 4])])

    g = h.make_graph([h.make_node("If", ["cond"], ["out"], then_branch=branch("then", 1),
                                  else_branch=branch("else", 0))], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, k]), h.make_tensor_value_info("cond", T.BOOL, [])],
                     [h.make_tensor_value_info("out", T.FLOAT, [2, 4])],
                     [numpy_helper.from_array(weights, "B"), numpy_helper.from_array(scales, "S"),
                      numpy_helper.from_array(np.array([2, 4], np.int64), "shape")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)],
                        ir_version=10)


@pytest.mark.parametrize("cond", [True, False])
def test_a_body_reads_enclosing_weights_as_constants(cond):
    """A body's session gets the enclosing graph's initializers as initializers, not as inputs:
    onnxruntime prepacks MatMulNBits' constant weights (accuracy_level 4 then quantizes the
    activations), so fed weights computed other numbers (Optimum's int4 merged decoder failed
    validate at every input set)."""
    model = _branches_with_int4_weights()
    x = np.random.default_rng(1).standard_normal((1, 32)).astype(np.float32) * 3
    result = pipeline.validate(model, None, {"x": x, "cond": np.array(cond)})
    assert len(pipeline.lower(model).rewrites) == 2
    assert result.ok and [o.detail for o in result.outputs] == ["bit-exact"]


def test_a_function_holding_dead_nodes_runs_around_them():
    """A local function computing a value nothing reads, then calling a function the rules lowered
    (so the executor runs its body itself): those dead nodes made an onnxruntime region with no
    output, which onnxruntime refuses ("At least one output should be requested"; the fuzzer of
    forms, seed 4343). A region nothing reads is dead code: not run."""
    inner = h.make_function("local", "masked", ["x"], ["y"], [
        h.make_node("Constant", [], ["ninf"], value=numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf")),
        h.make_node("Shape", ["x"], ["shape"]),
        h.make_node("ConstantOfShape", ["shape"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        h.make_node("Trilu", ["ones"], ["tri"], upper=0), h.make_node("Cast", ["tri"], ["band"], to=T.BOOL),
        h.make_node("Where", ["band", "x", "ninf"], ["y"])], [h.make_opsetid("", 17)])
    outer = h.make_function("local", "outer", ["m", "x"], ["y"], [
        h.make_node("Cast", ["m"], ["dead"], to=T.BOOL),
        h.make_node("masked", ["x"], ["y"], domain="local")], [h.make_opsetid("", 17), h.make_opsetid("local", 1)])
    model = h.make_model(h.make_graph([h.make_node("outer", ["m", "x"], ["y"], domain="local")], "g",
                                      [h.make_tensor_value_info("m", T.INT64, [1, "T"]),
                                       h.make_tensor_value_info("x", T.FLOAT, ["T", "T"])],
                                      [h.make_tensor_value_info("y", T.FLOAT, ["T", "T"])]),
                         opset_imports=[h.make_opsetid("", 17), h.make_opsetid("local", 1)], ir_version=10,
                         functions=[inner, outer])
    result = pipeline.lower(model)
    assert result.passes.applied  # (the inner function holds a DML node: the executor runs the bodies)
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    got = pipeline.run_graph(import_model(result.model), {"m": np.ones((1, 3), np.int64), "x": x})["y"]
    assert np.array_equal(got, np.where(np.tril(np.ones((3, 3), bool)), x, np.float32(-np.inf)))
