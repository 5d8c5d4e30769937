"""Shape inference: the forked data-propagation child gives what onnx gives in-process, and a
runaway data propagation costs a bounded wait instead of a hang."""
from __future__ import annotations

import glob
import os
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from benchmarks import pipeline as bench_pipeline
from dmlgraph.errors import ModelError
from dmlgraph.io import shape_inference
from dmlgraph.io.modelfile import iter_graphs, load_model, without_weights
from dmlgraph.process import process_wide

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with process_wide():
    needs_child = pytest.mark.skipif(not shape_inference.children_available(),
                                     reason="children run where the process can fork and has a second CPU")


CPP = onnx.onnx_cpp2py_export.shape_inference  # onnx's C++ inference, which every pass of ours calls


def declares_long_vector(model: onnx.ModelProto, stored: bool = False) -> bool:
    """The oracle of the guard: a 1-D value of `model` (at any depth) declared longer than data propagation
    may make; `stored`: or a 1-D initializer or Constant that long."""
    limit = shape_inference.MAX_DATA_PROP_LENGTH
    for g, _ in iter_graphs(model.graph):
        for vi in [*g.input, *g.output, *g.value_info]:
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == 1 and dims[0].dim_value > limit:
                return True
        if stored and (any(len(t.dims) == 1 and t.dims[0] > limit for t in g.initializer) or any(
                n.op_type == "Constant" and any((len(a.t.dims) == 1 and a.t.dims[0] > limit) or
                                                max(len(a.ints), len(a.floats)) > limit for a in n.attribute)
                for n in g.node)):
            return True
    return False


@pytest.fixture(autouse=True)
def _children_allowed():
    """These tests are about the child: run them as the CLI runs (children allowed)."""
    with process_wide():
        yield


@pytest.fixture(autouse=True)
def _child_for_small_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests use small models; the child path must still be the one they exercise."""
    monkeypatch.setattr(shape_inference, "CHILD_MIN_NODES", 0)


@needs_child
def test_small_models_are_inferred_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model (or control-flow body) below CHILD_MIN_NODES forks no child: a fork costs more."""
    monkeypatch.setattr(shape_inference, "CHILD_MIN_NODES", 200)
    started = []
    real_start = shape_inference._Child.start
    monkeypatch.setattr(shape_inference._Child, "start", lambda job: started.append(job) or real_start(job))
    small = bench_pipeline.blocks_model(2)
    in_process = shape_inference.start(small).value_types()
    assert not started
    monkeypatch.setattr(shape_inference, "CHILD_MIN_NODES", 0)
    assert shape_inference.start(small).value_types() == in_process  # same answer from a child
    assert len(started) == 1
    monkeypatch.setattr(shape_inference, "CHILD_MIN_NODES", 200)
    big = bench_pipeline.blocks_model(20)
    assert len(big.graph.node) >= 200
    shape_inference.start(big).value_types()
    assert len(started) == 2


def _types(model: onnx.ModelProto) -> list:
    return shape_inference.value_types(model)


def _long_vector_model() -> onnx.ModelProto:
    """A 1-D value just over the guard's limit that data propagation still gets through: the guard
    must pick the plain pass's shapes whichever answer comes first."""
    n = shape_inference.MAX_DATA_PROP_LENGTH + 1
    nodes = [h.make_node("Identity", ["x"], ["s"]), h.make_node("Cast", ["s"], ["c"], to=T.DOUBLE),
             h.make_node("Shape", ["c"], ["k"]), h.make_node("ConstantOfShape", ["k"], ["z"]),
             h.make_node("Relu", ["z"], ["y"])]
    # (x is declared [n] too: a declaration its input contradicts would be dropped, `_contradicted`)
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [n])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], value_info=[h.make_tensor_value_info("s", T.FLOAT, [n])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def _models():
    paths = sorted(glob.glob(os.path.join(ROOT, "models", "**", "*.onnx"), recursive=True))
    return [(os.path.relpath(p, ROOT), load_model(p)) for p in paths] + \
        [("blocks(40)", bench_pipeline.blocks_model(40)), ("long vector", _long_vector_model())]


@pytest.mark.parametrize("use_child", [True, False], ids=["child", "in-process"])
def test_both_paths_give_what_onnx_gives(use_child, monkeypatch):
    if use_child and not shape_inference.children_available():
        pytest.skip("children run where the process can fork and has a second CPU")
    monkeypatch.setattr(shape_inference, "USE_CHILD", use_child)
    models = _models()
    assert len(models) >= 20
    plain, full = (onnx.shape_inference.infer_shapes(models[-1][1], data_prop=d) for d in (False, True))
    assert _types(plain) != _types(full)  # (the long-vector model: the guard's choice shows)
    for name, m in models:
        view = without_weights(m, keep_dims=True)
        want = onnx.shape_inference.infer_shapes(view, data_prop=not declares_long_vector(
            onnx.shape_inference.infer_shapes(view)))
        assert shape_inference.start(m).value_types() == _types(want), name
        assert _types(shape_inference.infer_shapes(m)) == _types(want), name  # (the in-process function)


def _product_of_dims_model() -> onnx.ModelProto:
    """A 1-D length only data propagation computes (50000 * 50000 from Shape -> Gather -> Mul):
    the plain pass sees nothing long, and data propagation would make 2.5e9 dims."""
    c = lambda n, a: numpy_helper.from_array(np.asarray(a), n)
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("Gather", ["s", "i0"], ["a"], axis=0), h.make_node("Gather", ["s", "i1"], ["b"], axis=0),
             h.make_node("Mul", ["a", "b"], ["p"]), h.make_node("ConstantOfShape", ["p"], ["z"]),
             h.make_node("Cast", ["z"], ["y"], to=T.DOUBLE)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [50000, 50000])],
                     [h.make_tensor_value_info("y", T.DOUBLE, ["n"])],
                     [c("i0", np.array([0], np.int64)), c("i1", np.array([1], np.int64))])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


@needs_child
@pytest.mark.parametrize("limit", ["memory", "deadline"])
def test_runaway_data_propagation_is_stopped(limit, monkeypatch):
    m = _product_of_dims_model()
    if limit == "memory":
        monkeypatch.setattr(shape_inference, "CHILD_MEMORY", 256 << 20)
    else:  # (the memory cap, raised out of the way, would otherwise end it first)
        monkeypatch.setattr(shape_inference, "CHILD_MEMORY", 64 << 30)
        monkeypatch.setattr(shape_inference, "CHILD_SECONDS", 0.5)
    t0 = time.perf_counter()
    got = shape_inference.start(m).value_types()
    assert time.perf_counter() - t0 < 30  # a hang guard, not a speed test
    assert got == _types(onnx.shape_inference.infer_shapes(m))  # the plain pass's shapes


@pytest.mark.skipif(not hasattr(os, "sysconf"), reason="address-space caps are a POSIX measure")
@pytest.mark.parametrize("caps", [True, False], ids=["caps allowed", "no caps"])
def test_in_process_data_propagation_runs_under_the_memory_cap(caps, monkeypatch):
    """Without a child (a model below CHILD_MIN_NODES, or no fork), data propagation runs under the
    child's memory cap where the process owner allows caps (a runaway fails there as in a child),
    and the limit is restored after it."""
    import resource
    before = resource.getrlimit(resource.RLIMIT_AS)
    if before[0] != resource.RLIM_INFINITY:
        pytest.skip("an address-space limit is already set")
    monkeypatch.setattr(shape_inference, "USE_CHILD", False)
    real, seen = CPP.infer_shapes, []
    m = bench_pipeline.blocks_model(2)
    want = _types(onnx.shape_inference.infer_shapes(m, data_prop=True))

    class Recording:
        @staticmethod
        def infer_shapes(data, check_type, strict_mode, data_prop):
            if data_prop:
                seen.append(resource.getrlimit(resource.RLIMIT_AS)[0])
            return real(data, check_type, strict_mode, data_prop)

    monkeypatch.setattr(CPP, "infer_shapes", Recording.infer_shapes)
    with process_wide(memory_caps=caps):
        got = shape_inference.start(m).value_types()
    assert got == want
    assert len(seen) == 1 and (seen[0] != resource.RLIM_INFINITY) == caps
    assert resource.getrlimit(resource.RLIMIT_AS) == before


@pytest.mark.parametrize("use_child", [True, False], ids=["child", "in-process"])
@pytest.mark.parametrize("failing", ["data propagation", "both passes"])
def test_failing_inference_leaves_what_is_known(use_child, failing, monkeypatch):
    if use_child and not shape_inference.children_available():
        pytest.skip("children run where the process can fork and has a second CPU")
    monkeypatch.setattr(shape_inference, "USE_CHILD", use_child)
    real = CPP.infer_shapes

    class Failing:  # inference raises, as onnx's C++ does on some models
        @staticmethod
        def infer_shapes(data, check_type, strict_mode, data_prop):
            if data_prop or failing == "both passes":
                raise RuntimeError("inference failed")
            return real(data, check_type, strict_mode, data_prop)

    m = bench_pipeline.blocks_model(3)
    want = onnx.shape_inference.infer_shapes(m) if failing == "data propagation" else m  # plain, or as declared
    full = onnx.shape_inference.infer_shapes(m, data_prop=True)
    monkeypatch.setattr(CPP, "infer_shapes", Failing.infer_shapes)
    assert shape_inference.start(m).value_types() == _types(want)
    assert _types(full) != _types(want)


@needs_child
def test_the_child_answers_with_one_pass(monkeypatch):
    """The caller runs no inference when the child answers (blocks(40): data propagation's
    shapes); a declared long vector still gets the plain pass's shapes (the caller's path, plain
    pass first), and a type error is still a ModelError (the child asks the caller to retry)."""
    real = CPP.infer_shapes

    class Counting:  # (the child is forked after this patch: its calls are not counted here)
        calls = 0

        @staticmethod
        def infer_shapes(*args):
            Counting.calls += 1
            return real(*args)

    blocks = bench_pipeline.blocks_model(40)
    want = _types(onnx.shape_inference.infer_shapes(blocks, data_prop=True))
    monkeypatch.setattr(CPP, "infer_shapes", Counting.infer_shapes)
    assert shape_inference.start(blocks).value_types() == want
    assert Counting.calls == 0
    m = _long_vector_model()
    assert shape_inference.start(m).value_types() == _types(onnx.shape_inference.infer_shapes(m))
    bad = bench_pipeline.chain_model(3)
    bad.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array(0.0, np.float32), "k"))  # Trilu's k as float
    with pytest.raises(ModelError, match="type error"):
        shape_inference.start(bad).value_types()


@needs_child
@pytest.mark.parametrize("as_output", [True, False], ids=["graph output", "intermediate value"])
def test_a_long_vector_only_inference_computes_gets_the_plain_shapes(as_output):
    """Data propagation first (the child) finds the long vector the plain pass computes from a
    stored size, and answers with the plain pass's shapes, as the guard ahead of it would (the
    vector a graph output, or an intermediate value the child reads from its decoded types)."""
    n = shape_inference.MAX_DATA_PROP_LENGTH + 1
    nodes = [h.make_node("ConstantOfShape", ["size"], ["z"], value=numpy_helper.from_array(np.array([1], np.int64))),
             h.make_node("Cast", ["z"], ["c"], to=T.DOUBLE), h.make_node("Shape", ["x"], ["s"]),
             h.make_node("Mul", ["s", "c2"], ["y"])]
    outputs = [h.make_tensor_value_info("c", T.DOUBLE, None)] * as_output + [h.make_tensor_value_info("y", T.INT64, None)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["n"])], outputs,
                     [numpy_helper.from_array(np.array([n], np.int64), "size"),
                      numpy_helper.from_array(np.array([2], np.int64), "c2")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    assert not declares_long_vector(m, stored=True)
    inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    assert declares_long_vector(inferred)
    # (the child's test of a flat model reads the decoded types: they show it too)
    assert any(s is not None and len(s) == 1 and s[0] > shape_inference.MAX_DATA_PROP_LENGTH for _, _, s in _types(inferred))
    assert shape_inference.start(m).value_types() == _types(onnx.shape_inference.infer_shapes(m))


@needs_child
def test_a_file_is_inferred_beside_its_checks_and_a_failed_check_stops_the_child(tmp_path, monkeypatch):
    """`pipeline.load` forks the inference child once the file has parsed, before the checks (it infers
    while they run); the graph gets the same types, and a file that fails a check leaves no child."""
    from dmlgraph import pipeline
    from dmlgraph.io import modelfile
    model = bench_pipeline.blocks_model(3)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    events, pids = [], []
    real_start, real_check = shape_inference._Child.start, modelfile.check_model_proto

    def start(job):
        events.append("fork")
        child = real_start(job)
        pids.append(child.pid)
        return child
    monkeypatch.setattr(shape_inference._Child, "start", start)
    monkeypatch.setattr(modelfile, "check_model_proto", lambda *a, **k: events.append("check") or real_check(*a, **k))
    _, g = pipeline.load(str(path))
    assert events == ["fork", "check"]
    in_process = {name: (v.elem_type, v.shape) for name, v in pipeline.import_model(model).values.items()}
    assert {name: (v.elem_type, v.shape) for name, v in g.values.items()} == in_process
    model.graph.node[0].op_type = "NoSuchOp"  # fails onnx's checker
    onnx.save(model, path)
    with pytest.raises(ModelError, match="failed the ONNX checker"):
        pipeline.load(str(path))
    assert events[-2:] == ["fork", "check"]
    with pytest.raises(ChildProcessError):
        os.waitpid(pids[-1], os.WNOHANG)  # the child was stopped and reaped


def test_an_identity_of_a_shape_input_keeps_what_inference_reads_of_it():
    """onnx's inference reads Unsqueeze's axes (Reshape's shape, ...) only from a constant or the
    node making them, and neither passes an Identity: `Unsqueeze(x, Identity(axes))` had no rank,
    and neither had anything computed from it (TorchScript aliases and optimizers' leftovers write
    such Identity nodes; tests/mutations.py `insert_identities` lost 54 sites to it). The view
    reads through every Identity; the Identity's own output keeps its input's type."""
    g = h.make_graph([h.make_node("Identity", ["axes"], ["axes_id"]),
                      h.make_node("Identity", ["axes_id"], ["axes_id2"]),
                      h.make_node("Unsqueeze", ["x", "axes_id2"], ["u"]),
                      h.make_node("Shape", ["u"], ["s"]),
                      h.make_node("Identity", ["s"], ["s_id"]),
                      h.make_node("Reshape", ["x", "s_id"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["a", "b"])],
                     [h.make_tensor_value_info("y", T.FLOAT, [None] * 4)],
                     [numpy_helper.from_array(np.array([0, 3], np.int64), "axes")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(m, full_check=True)
    found = {name: shape for name, _, shape in shape_inference.inferred_value_types(m)}
    assert found["axes_id2"] == (2,)
    assert found["u"] == (1, "a", "b", 1)
    assert found["y"] == (1, "a", "b", 1)
    assert [n.input[:] for n in m.graph.node][2] == ["x", "axes_id2"]  # (the model itself is not changed)
    # The per-axis view the claim check reads (`axis_shapes`) too: without a rank there, a proof
    # was taken as leaning on a claimed name, and a Where of two [1] constants on the band got
    # the [1] shape of its constants (llama_sdpa_kv_ts with Identity inserted: a crash on dml).
    per_axis = shape_inference.axis_shapes(m, frozenset({"a"}))
    assert per_axis["u"] == (1, "a@x:0", "b", 1)


@pytest.mark.parametrize("declared", [["n"], [None], [2]])
def test_a_declaration_an_initializers_own_dims_contradict_is_dropped(declared):
    """value_info is a claim: one that declares an initializer `[1]` as `[n]` (a static dim made
    symbolic, or unknown, or another number) is contradicted by the tensor itself, where onnx's
    inference takes the declaration: a Concat of it had no length, and neither had an Expand
    target made of it (the dynamo exports' masks; tests/mutations.py `symbolic_dims`)."""
    g = h.make_graph([h.make_node("Shape", ["x"], ["s"]),
                      h.make_node("Concat", ["s", "one"], ["t"], axis=0),
                      h.make_node("Reshape", ["x", "t"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["a", "b"])],
                     [h.make_tensor_value_info("y", T.FLOAT, [None] * 3)],
                     [numpy_helper.from_array(np.array([1], np.int64), "one")],
                     value_info=[h.make_tensor_value_info("one", T.INT64, declared)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    found = {name: shape for name, _, shape in shape_inference.inferred_value_types(m)}
    assert found["t"] == (3,)
    assert found["y"] == ("a", "b", 1)


def test_a_dim_declared_unknown_is_what_inference_knows_of_it():
    """A declaration of a computed value with an unknown dim ([?] where the plain pass infers 3)
    claims less than inference proves. onnxslim declares some values twice, and the importer took
    the first declaration, unknown dim and all (mistral_sw4_kv_dynamo_slim with half its value_info
    dims unknown, tests/mutations.py `unknown_dims`: its mask Expand's target had no length). The
    view declares what the plain pass found there, and keeps the rest of the declaration (the dims
    inference cannot tell)."""
    g = h.make_graph([h.make_node("Shape", ["x"], ["s"]),
                      h.make_node("Concat", ["s", "one"], ["t"], axis=0),
                      h.make_node("Reshape", ["x", "t"], ["y"]),
                      h.make_node("Relu", ["y"], ["z"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["a", "b"])],
                     [h.make_tensor_value_info("z", T.FLOAT, [None] * 3)],
                     [numpy_helper.from_array(np.array([1], np.int64), "one")],
                     value_info=[h.make_tensor_value_info("t", T.INT64, [None]),
                                 h.make_tensor_value_info("t", T.INT64, [3]),
                                 h.make_tensor_value_info("y", T.FLOAT, [None, "b", None])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    from dmlgraph.io.onnx_io import import_model
    values = import_model(m).values
    assert values["t"].shape == (3,)
    assert values["y"].shape == ("a", "b", 1)


def test_a_dim_name_no_input_has_is_left_to_inference():
    """A declared dim name that mentions no input's dim name (`d_1`, onnx's own `unk__7` renamed)
    links values only as the exporter claims: two Reshapes of x to Shape(x), declared [d_1, d_2]
    and [d_3, d_4], are x's [batch, sequence] by data propagation, and their Add is too. Kept, the
    names won over what inference proves (onnx keeps a declared name) and the Add's sizes were
    unknown: modernbert_lw4_encoder_ts's dims_renamed mutant (inferred value_info, every dim name
    renamed) lost all 6 sites on `dml`. Names over the inputs' (`past_sequence + sequence`,
    dynamo's `batch*sequence`) stay."""
    n = h.make_node
    g = h.make_graph([n("Shape", ["x"], ["s"]), n("Reshape", ["x", "s"], ["y"]), n("Shape", ["x"], ["s2"]),
                      n("Reshape", ["x", "s2"], ["z"]), n("Add", ["y", "z"], ["w"]), n("Relu", ["w"], ["v"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["batch", "sequence"])],
                     [h.make_tensor_value_info("v", T.FLOAT, None)],
                     value_info=[h.make_tensor_value_info("y", T.FLOAT, ["d_1", "d_2"]),
                                 h.make_tensor_value_info("z", T.FLOAT, ["d_3", "d_4"]),
                                 h.make_tensor_value_info("w", T.FLOAT, ["batch*sequence", "sequence"])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10)
    found = {name: shape for name, _, shape in shape_inference.inferred_value_types(m)}
    assert found["y"] == found["z"] == ("batch", "sequence")
    assert found["w"] == ("batch*sequence", "sequence")  # (a name over the inputs' is kept: a claim, as today)
