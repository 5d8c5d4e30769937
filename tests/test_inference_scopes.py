"""Each If in a scope of its own (`inference_scopes`) gives what onnx's own inference gives: the
main graph's types byte for byte (fresh `unk__N` names included) in every mode the import and
the full check use, the same errors in strict mode, the branches' types from `bodies_model`; and
the import and the written model are the same either way, on the nested corpus and on generated
models. Every written model still passes onnx's real full check."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import test_nested
import test_nested_together
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from onnx.onnx_cpp2py_export import shape_inference as cpp
from test_shape_inference import declares_long_vector

from benchmarks.pipeline import nested_model
from dmlgraph import pipeline
from dmlgraph.errors import InternalError
from dmlgraph.io import inference_scopes, saving, shape_inference
from dmlgraph.io.modelfile import iter_graphs
from dmlgraph.io.onnx_io import import_model

MODES = {"plain, type check": (True, False, False), "plain": (False, False, False),
         "data propagation, type check": (True, False, True), "strict (full check)": (True, True, False)}


def _vi(name: str, shape=None, elem=T.FLOAT) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, shape)


def _const(name: str, value, dtype=np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype), name)


SHAPES = [["B", "S", "S"], [None, None, None], None, ["B", "S", None], [2, "S", "S"]]


def _branch(rng: np.random.Generator, p: str, cur: str, depth: int) -> tuple[onnx.GraphProto, list]:
    """One branch reading `cur` (and the main graph's `shape`, `k`, `c`), of a random kind."""
    kind = rng.choice(["trilu", "reshape", "reduce", "nonzero", "const", "nested", "unsqueeze"][:7 if depth < 2 else 5])
    out, inits = f"{p}_o", []
    if kind == "trilu":
        nodes = [h.make_node("Trilu", [cur, "k"], [out], upper=int(rng.integers(2)))]
    elif kind == "reshape":  # (data propagation: its shape is the main graph's Shape)
        nodes = [h.make_node("Relu", [cur], [f"{p}_r"]), h.make_node("Reshape", [f"{p}_r", "shape"], [out])]
    elif kind == "reduce":  # a dim the other branch may not share: the If's output gets a fresh one
        inits = [_const(f"{p}_ax", [int(rng.integers(1, 3))])]
        nodes = [h.make_node("ReduceSum", [cur, f"{p}_ax"], [out], keepdims=1)]
    elif kind == "nonzero":  # a dim only known at run time, named inside the branch
        nodes = [h.make_node("NonZero", [cur], [f"{p}_nz"]), h.make_node("Cast", [f"{p}_nz"], [f"{p}_f"], to=T.FLOAT),
                 h.make_node("Unsqueeze", [f"{p}_f", "ax0"], [out])]
    elif kind == "const":
        nodes = [h.make_node("Constant", [], [f"{p}_v"], value=numpy_helper.from_array(np.full((1, 1, 1), 0.5, np.float32))),
                 h.make_node("Add", [cur, f"{p}_v"], [out])]
    elif kind == "unsqueeze":
        nodes = [h.make_node("Unsqueeze", [cur, "ax0"], [f"{p}_u"]), h.make_node("Squeeze", [f"{p}_u", "ax0"], [out])]
    else:
        then, _ = _branch(rng, f"{p}_t", cur, depth + 1)
        els, _ = _branch(rng, f"{p}_e", cur, depth + 1)
        nodes = [h.make_node("If", ["c"], [out], then_branch=then, else_branch=els)]
    shape = SHAPES[int(rng.integers(len(SHAPES)))] if rng.random() < 0.5 else None
    return h.make_graph(nodes, p, [], [_vi(out, shape)], inits), nodes


def generated_model(seed: int, n_ifs: int = 8) -> onnx.ModelProto:
    """n_ifs If nodes in a chain (each reads the previous one's result), with random branches, some
    main values annotated, and sometimes an op without a schema or a type error on the way."""
    rng = np.random.default_rng(seed)
    nodes = [h.make_node("Shape", ["X"], ["shape"])]
    annotations = []
    cur = "X"
    for i in range(n_ifs):
        then, _ = _branch(rng, f"i{i}t", cur, 0)
        els, _ = _branch(rng, f"i{i}e", cur, 0)
        nodes.append(h.make_node("If", ["c"], [f"i{i}"], name=f"If_{i}", then_branch=then, else_branch=els))
        op = rng.choice(["Relu", "Neg", "Custom", "Trilu"], p=[0.4, 0.4, 0.1, 0.1])
        if op == "Custom":  # no schema: onnx stops reporting errors of the main graph's later nodes
            nodes.append(h.make_node("Custom", [f"i{i}"], [f"r{i}"], domain="x.custom"))
        elif op == "Trilu":
            nodes.append(h.make_node("Trilu", [f"i{i}", "k"], [f"r{i}"]))
        else:
            nodes.append(h.make_node(str(op), [f"i{i}"], [f"r{i}"]))
        if rng.random() < 0.3:
            annotations.append(_vi(f"r{i}", SHAPES[int(rng.integers(len(SHAPES)))]))
        cur = f"r{i}"
    inits = [_const("k", 0), _const("ax0", [0])]
    if rng.random() < 0.1:
        inits[0] = _const("k", 0.0, np.float32)  # a type error (Trilu's k), where a Trilu reads it
    g = h.make_graph(nodes, "g", [_vi("X", ["B", "S", "S"]), _vi("c", [], T.BOOL)], [_vi(cur, [None, None, None])],
                     inits, value_info=annotations)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("x.custom", 1)], ir_version=10)


def _infer(data: bytes, mode: tuple) -> onnx.ModelProto | str:
    try:
        return onnx.ModelProto.FromString(cpp.infer_shapes(data, *mode))
    except Exception as e:  # noqa: BLE001 - compared: both raise or neither
        return type(e).__name__


def _fresh_names_normalized(types: dict) -> dict:
    def norm(tp: onnx.TypeProto) -> bytes:
        tp = onnx.TypeProto.FromString(tp.SerializeToString())
        for d in tp.tensor_type.shape.dim:
            if d.dim_param.startswith("unk__"):
                d.dim_param = "unk__"
        return tp.SerializeToString()
    return {name: norm(tp) for name, tp in types.items()}


def _body_types(model: onnx.ModelProto, include_main: bool) -> dict:
    graphs = list(iter_graphs(model.graph))
    return {vi.name: vi.type for g, _ in (graphs if include_main else graphs[1:]) for vi in g.value_info}


def assert_same_inference(model: onnx.ModelProto) -> None:
    """Every mode: both raise, or the main graphs' types are equal byte for byte; and the branches,
    inferred together from the scoped plain pass's types, get the types the whole inference gives them."""
    s = inference_scopes.scoped(model, always=True)
    assert s is not None
    direct, scoped = model.SerializeToString(), s.model.SerializeToString()
    for mode in MODES.values():
        a, b = _infer(direct, mode), _infer(scoped, mode)
        assert isinstance(a, str) == isinstance(b, str), (mode, a, b)
        if not isinstance(a, str):
            assert isinstance(b, onnx.ModelProto)
            assert a.graph.value_info == b.graph.value_info, mode
            assert a.graph.output == b.graph.output, mode
            assert shape_inference.value_types(a) == shape_inference.value_types(b), mode
    whole, plain = _infer(direct, MODES["plain"]), _infer(scoped, MODES["plain"])
    if isinstance(whole, str) or isinstance(plain, str):
        return
    bodies = _infer(s.bodies_model(plain).SerializeToString(), MODES["plain"])
    assert not isinstance(bodies, str)
    want = _fresh_names_normalized(_body_types(whole, include_main=False))
    got = _fresh_names_normalized(_body_types(bodies, include_main=True))
    assert want == {name: got[name] for name in want}


@pytest.mark.parametrize("seed", range(40))
def test_generated_models_infer_the_same(seed):
    assert_same_inference(generated_model(seed))


def _corpus() -> dict[str, onnx.ModelProto]:
    models = {f"nested.{name}": build() for name, (build, _, _) in test_nested.CASES.items()}
    models |= {f"together.{name}": build() for name, (build, _) in test_nested_together.CASES.items()}
    models["bench nested 40"] = nested_model(40)
    return models


@pytest.mark.parametrize("name", sorted(_corpus()))
def test_corpus_infers_the_same(name):
    """Every graph of the corpus with an If in it (a Loop body's graph as the import sees it)."""
    model = _corpus()[name]
    for g, _ in iter_graphs(model.graph):
        if inference_scopes.scoped(_as_model(model, g), always=True) is not None:
            assert_same_inference(_as_model(model, g))


def _as_model(model: onnx.ModelProto, g: onnx.GraphProto) -> onnx.ModelProto:
    """`g` as the main graph of a model, its outer reads as typed inputs (as `nested` imports a body)."""
    if g is model.graph:
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.CopyFrom(g)
    whole = onnx.shape_inference.infer_shapes(model)
    known = {vi.name: vi for sub, _ in iter_graphs(whole.graph) for vi in [*sub.input, *sub.value_info, *sub.output]}
    defined = {o for sub, _ in iter_graphs(g) for n in sub.node for o in n.output} | {vi.name for vi in g.input}
    reads = dict.fromkeys(x for sub, _ in iter_graphs(g) for n in sub.node for x in n.input if x and x not in defined)
    m.graph.input.extend(known[x] for x in reads if x in known)
    m.graph.initializer.extend(t for t in model.graph.initializer if t.name in reads)
    return m


def _graph_types(model: onnx.ModelProto) -> list:
    g = import_model(model)
    return [(name, v.elem_type, v.shape) for name, v in g.values.items()]


@pytest.mark.parametrize("name", sorted(_corpus()) + ["generated 3", "generated 11"])
def test_import_and_written_model_are_the_same_either_way(name, tmp_path, monkeypatch):
    """The import's types of every value, and the written model byte for byte, with every If
    scoped (from one If in a graph of any size) and none; the written model passes onnx's real full check."""
    model = _corpus()[name] if not name.startswith("generated") else _checked(generated_model(int(name.split()[1])))
    src = str(tmp_path / "m.onnx")
    onnx.save(model, src)
    results = []
    for least in (1, 10**9):
        monkeypatch.setattr(inference_scopes, "MIN_IFS", least)
        monkeypatch.setattr(inference_scopes, "MIN_NODES", least)
        out = str(tmp_path / f"out{least}.onnx")
        pipeline.lower(src).save(out)
        with open(out, "rb") as f:
            results.append((_graph_types(model), f.read()))
    assert results[0] == results[1]
    onnx.checker.check_model(onnx.load(out), full_check=True)


def _checked(model: onnx.ModelProto) -> onnx.ModelProto:
    """A generated model onnx's full check accepts (the custom op removed, k an int)."""
    for n in model.graph.node:
        if n.domain == "x.custom":
            n.op_type, n.domain = "Relu", ""
    model.graph.initializer[0].CopyFrom(_const("k", 0))
    onnx.checker.check_model(model, full_check=True)
    return model


def test_bench_model_is_scoped_and_its_write_passes_the_full_check(tmp_path):
    model = nested_model(2 * inference_scopes.MIN_NODES)
    assert inference_scopes.scoped(model) is not None
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "out.onnx")
    onnx.save(model, src)
    pipeline.lower(src).save(out)
    written = onnx.load(out)
    assert inference_scopes.scoped(written) is not None  # (the write's check ran scoped)
    onnx.checker.check_model(written, full_check=True)


@pytest.mark.parametrize("weights", [False, True])
def test_the_full_check_fails_where_onnx_fails(weights):
    """A branch whose declared output disagrees with what it computes (rank 2 declared, 3 made):
    onnx's full check and `check_for_save` both refuse the model; fixed, both accept it. (`weights`:
    a large initializer, which the check leaves out of the view it infers.)"""
    model = nested_model(2 * inference_scopes.MIN_NODES)
    if weights:
        model.graph.initializer.append(numpy_helper.from_array(np.zeros(1 << 15, np.float32), "w"))
    branch = model.graph.node[6].attribute[0].g
    branch.output[0].CopyFrom(_vi(branch.output[0].name, ["S", "S"]))
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.checker.check_model(model, full_check=True)
    assert inference_scopes.scoped(model) is not None
    with pytest.raises(InternalError, match="fails the ONNX checker"):
        saving.check_for_save(model)
    branch.output[0].CopyFrom(_vi(branch.output[0].name, ["batch", "seq", "seq"]))
    onnx.checker.check_model(model, full_check=True)
    saving.check_for_save(model)


def _with_ifs(n: int, then: onnx.GraphProto | None = None) -> onnx.ModelProto:
    model = nested_model(4 * n)
    if then is not None:
        model.graph.node[0].attribute[0].g.CopyFrom(then)
    return model


def test_what_is_not_scoped(monkeypatch):
    """A small graph, few If nodes; branches that share a name, annotate or output an outer value,
    declare an `unk__` dim, read a function attribute; a Loop in the main graph; ir_version 3."""
    assert inference_scopes.scoped(nested_model(2 * inference_scopes.MIN_NODES - 4)) is None
    assert inference_scopes.scoped(nested_model(2 * inference_scopes.MIN_NODES)) is not None
    monkeypatch.setattr(inference_scopes, "MIN_NODES", 0)
    assert inference_scopes.scoped(_with_ifs(inference_scopes.MIN_IFS - 1)) is None
    assert inference_scopes.scoped(_with_ifs(inference_scopes.MIN_IFS)) is not None
    same_name = h.make_graph([h.make_node("Trilu", ["x", "k"], ["i1_then"])], "t", [], [_vi("i1_then")])
    outer_output = h.make_graph([], "t", [], [_vi("x")])
    annotated = h.make_graph([h.make_node("Trilu", ["x", "k"], ["t0"])], "t", [], [_vi("t0")],
                             value_info=[_vi("x", ["batch", "seq", "seq"])])
    fresh_dim = h.make_graph([h.make_node("Trilu", ["x", "k"], ["t0"])], "t", [], [_vi("t0", ["unk__3", 1, 1])])
    ref = h.make_node("Trilu", ["x", "k"], ["t0"])
    ref.attribute.add(name="upper", ref_attr_name="up", type=onnx.AttributeProto.INT)
    ref_attr = h.make_graph([ref], "t", [], [_vi("t0")])
    for then in (same_name, outer_output, annotated, fresh_dim, ref_attr):
        assert inference_scopes.scoped(_with_ifs(20, then)) is None
    loop = _with_ifs(20)
    loop.graph.node.append(h.make_node("Loop", ["", "cond"], [], body=h.make_graph([], "b", [_vi("n", [], T.INT64), _vi(
        "go", [], T.BOOL)], [_vi("go", [], T.BOOL)])))
    assert inference_scopes.scoped(loop) is None
    old = _with_ifs(20)
    old.ir_version = 3
    assert inference_scopes.scoped(old) is None


def test_a_long_vector_in_a_branch_gets_the_plain_shapes(monkeypatch):
    """A branch flattens a [1, 1024, 1024] value (a 1-D value over the data-propagation limit that
    only the branch's inference finds): scoped or not, the import gets the plain pass's types
    (the main graph's Reshape by a Shape stays unknown), and the bodies are not imported together."""
    monkeypatch.setattr(inference_scopes, "MIN_NODES", 0)
    model = nested_model(4 * 20)
    model.graph.input[0].CopyFrom(_vi("x", [1, 1024, 1024]))
    then = model.graph.node[0].attribute[0].g
    then.initializer.append(_const("flat", [-1]))
    then.node.append(h.make_node("Reshape", ["x", "flat"], ["long"]))
    model.graph.node.extend([h.make_node("Shape", ["x"], ["xs"]), h.make_node("Reshape", ["r19", "xs"], ["y"])])
    assert declares_long_vector(onnx.shape_inference.infer_shapes(model))
    main = onnx.shape_inference.infer_shapes(model).graph.value_info
    assert all(d.dim_value <= shape_inference.MAX_DATA_PROP_LENGTH for vi in main for d in vi.type.tensor_type.shape.dim)
    assert inference_scopes.scoped(model) is not None
    unscoped = shape_inference.inferred_value_types(model, scope=False)
    assert ("y", T.FLOAT, ("unk__0", "unk__1", "unk__2")) in unscoped  # (data propagation: (1, 1024, 1024))
    assert shape_inference.inferred_value_types(model) == unscoped
    assert shape_inference.whole_value_types(model) is None
