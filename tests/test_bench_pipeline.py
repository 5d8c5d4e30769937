"""`python -m benchmarks pipeline` (smoke only: no timing asserts) and the fast paths it measures, each
checked against the simple computation it replaces."""
from __future__ import annotations

import json
import os
import random

import networkx as nx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from benchmarks import pipeline as bench_pipeline
from dmlgraph import pipeline
from dmlgraph.io.onnx_io import import_model
from dmlgraph.ir.graph import DmlNode, OnnxNode
from dmlgraph.passes import data_free, default_phases, masks
from dmlgraph.rewrite import Context, Options, PassManager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW_KEYS = {"case", "ours", "baseline", "ratio", "unit", "target", "met", "note", "extra", "floor"}


def test_quick_bench_writes_rows(tmp_path):
    out = tmp_path / "bench.json"
    rows = bench_pipeline.run(quick=True, json_out=str(out), log=lambda *a: None)
    data = json.loads(out.read_text())
    assert data["quick"] is True and len(data["rows"]) == len(rows) >= 3
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
    cases = " ".join(r["case"] for r in data["rows"])
    assert "optimize per node" in cases and "throughput" in cases and "run " in cases
    assert "vs onnxruntime load (fresh processes)" in cases and "--help" in cases
    for shape in ("long chain", "wide fan-out", "many small mask cones", "nested subgraphs", "identical layers"):
        assert shape in cases
    assert "peak RSS" not in cases  # the memory case is skipped with --quick
    floors = {r["case"].split(",")[0].split(" (")[0]: r["floor"] for r in data["rows"] if r["floor"] is not None}
    assert "optimize throughput" in floors and floors["optimize models/llama_kv_ts.onnx vs onnxruntime load"] > 0
    assert sum(case.startswith("marginal rate") for case in floors) >= 1  # (a quick run's timer may not resolve all)
    table = bench_pipeline.table(rows)
    assert table.splitlines()[0].split() == ["case", "ours", "baseline", "ratio", "floor", "unit", "target", "met"]


def test_onnx_floor_runs_onnx_calls_only_and_fails_as_the_check_does(tmp_path):
    path = str(tmp_path / "m.onnx")
    onnx.save(bench_pipeline.chain_model(16), path)
    result = pipeline.lower(path, bench_pipeline.GROW)
    bench_pipeline.onnx_floor(path, result)()
    result.model.graph.node[0].input[0] = "nowhere"  # the floor runs the output's full check
    with pytest.raises(Exception, match="fails the ONNX checker"):
        bench_pipeline.onnx_floor(path, result)()


def test_cli_entry_points(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(bench_pipeline, "run", lambda quick, json_out: calls.append((quick, json_out)))
    from benchmarks.__main__ import main
    assert main(["pipeline", "--quick", "--json", str(tmp_path / "x.json")]) == 0
    assert bench_pipeline.main(["--quick"]) == 0
    assert calls == [(True, str(tmp_path / "x.json")), (True, None)]


def test_rates_count_the_nodes_of_bodies_too():
    """nested_model(n): n/4 If nodes and their Relus in the main graph, a one-node body per branch."""
    assert bench_pipeline.nodes_at_every_depth(bench_pipeline.nested_model(40)) == 40
    assert pipeline.lower(bench_pipeline.nested_model(40), bench_pipeline.GROW).before["nodes"] == 20  # (the main graph's)
    assert bench_pipeline.nodes_at_every_depth(bench_pipeline.chain_model(50)) == 50


def test_blocks_model_is_valid_and_fully_lowered(tmp_path):
    model = bench_pipeline.blocks_model(4)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "blocks.onnx"
    onnx.save(model, path)
    result = pipeline.lower(str(path), bench_pipeline.GROW)
    assert result.passes.counts["mask_subgraph"] == 4 and result.passes.counts["mask_where"] == 4
    assert pipeline.validate(str(path), dims={"batch": 2, "seq": 7}).ok


# ---- the mask-subgraph verdict cache --------------------------------------------------------
def _count_evaluations(monkeypatch) -> list:
    """Counts the proofs made (one symbolic analysis per distinct mask structure)."""
    calls = []
    real = masks.symbolic_verdict

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(masks, "symbolic_verdict", counting)
    return calls


def _lowered(g) -> list[tuple]:
    return sorted((n.outputs[0].name, n.begin, n.end, np.asarray(n.value).item(), n.static_shape)
                  for n in g.nodes.values() if isinstance(n, DmlNode))


def _set_trilu_k(model: onnx.ModelProto, block: int, k: int) -> onnx.ModelProto:
    for i, t in enumerate(model.graph.initializer):
        if t.name == f"b{block}_k":
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(np.array(k, np.int64), t.name))
    return model


def test_identical_mask_copies_share_one_evaluation(monkeypatch):
    calls = _count_evaluations(monkeypatch)
    g = import_model(bench_pipeline.blocks_model(4))  # blocks 0, 2: Trilu masks; 1, 3: Range masks
    pipeline.optimize_graph(g, Options())
    # Two distinct structures, each proved once (not once per copy).
    assert len(calls) == 2
    assert len(_lowered(g)) == 4


def test_copies_differing_in_a_constant_do_not_share(monkeypatch):
    calls = _count_evaluations(monkeypatch)
    g = import_model(_set_trilu_k(bench_pipeline.blocks_model(4), 2, 1))
    pipeline.optimize_graph(g, Options())
    assert len(calls) == 3  # block 2's Trilu k differs from block 0's: its own proof
    ends = {name: (b, e) for name, b, e, *_ in _lowered(g)}
    assert ends["b0_masked"] != ends["b2_masked"]


@pytest.mark.parametrize("k", [0, 1])
def test_shared_verdicts_give_what_proving_each_copy_gives(monkeypatch, k):
    model = _set_trilu_k(bench_pipeline.blocks_model(4), 2, k)
    cached = import_model(model)
    pipeline.optimize_graph(cached, Options())
    fresh = iter(range(10**9))  # every subgraph its own signature: nothing shared, each copy proven
    real = masks.cone_signature
    monkeypatch.setattr(masks, "cone_signature", lambda *args: (real(*args), next(fresh)))
    oracle = import_model(model)
    pipeline.optimize_graph(oracle, Options())
    assert _lowered(cached) == _lowered(oracle)


def test_signature_sees_dims_types_and_wiring():
    g = import_model(bench_pipeline.blocks_model(4))
    sig = {}
    for block in (1, 3):
        target = g.values[f"b{block}_mask"]
        nodes, inputs = data_free.ancestors(target)
        sig[block] = masks.cone_signature(g, nodes, inputs, target, ["batch", "seq"])
    assert sig[1] == sig[3]
    target = g.values["b1_mask"]
    nodes, inputs = data_free.ancestors(target)
    renamed = list(inputs[0].shape)
    inputs[0].shape = ("seq2",) + tuple(renamed[1:])
    assert masks.cone_signature(g, nodes, inputs, target, ["batch", "seq"]) != sig[1]  # the proof names its dims
    inputs[0].shape = tuple(renamed)
    inputs[0].elem_type = onnx.TensorProto.DOUBLE
    assert masks.cone_signature(g, nodes, inputs, target, ["batch", "seq"]) != sig[1]


# ---- incremental data-freeness vs a fresh walk ---------------------------------------------------
def _eligible(n) -> bool:
    """The definition: a deterministic standard ONNX op without subgraphs, or a lowered mask."""
    if isinstance(n, DmlNode):
        return n.kind == "DiagonalMatrix1"
    return isinstance(n, OnnxNode) and n.domain in ("", "ai.onnx") and n.op_type not in data_free.NONDETERMINISTIC \
        and not n.has_subgraph


def _reference_free(g) -> dict[str, bool]:
    """The definition, walked in dependency order: free value -> index_only (the oracle for both
    DataFree's own walk, which goes in insertion order, and its incremental updates)."""
    status = {}
    over = set(g.overridable_inputs)
    const = {name: data_free.DataFree(g).index_only(v) for name, v in g.initializers.items() if name not in over}
    for n in g.topological_order():
        ins = [x for x in n.inputs if x is not None]
        if not _eligible(n):
            continue
        if n.op_type in data_free.SHAPE_OPS:
            status.update((v.name, True) for v in n.outputs)
        elif all(x.name in status or x.name in const for x in ins):
            index = n.op_type in data_free.INDEX_OPS and all(status.get(x.name, const.get(x.name)) for x in ins)
            status.update((v.name, index) for v in n.outputs)
    return status


def _fresh_equals(g, df) -> None:
    fresh = data_free.DataFree(g)
    reference = _reference_free(g)
    for v in g.values.values():
        assert df.is_free(v) == fresh.is_free(v) == (v.name in reference or v.name in g.initializers and
                                                     v.name not in g.overridable_inputs), v.name
        assert df.index_only(v) == fresh.index_only(v), v.name
        if v.name in reference:
            assert df.index_only(v) == reference[v.name], v.name


@pytest.mark.parametrize("path", ["blocks"] + [os.path.join(ROOT, "models", f) for f in
                                  sorted(os.listdir(os.path.join(ROOT, "models"))) if f.endswith(".onnx")],
                         ids=os.path.basename)
def test_mask_subgraph_candidates_hold_every_node_it_matches(path):
    """The rule is offered only DataFree's frontier; offering every node (its anchor "*") must find
    nothing more."""
    g = import_model(bench_pipeline.blocks_model(6)) if path == "blocks" else pipeline.load(path)[1]
    ctx = Context(g)
    frontier = set(masks.MASK_SUBGRAPH.candidates(ctx))
    matched = {n for n in list(g.nodes.values()) if masks.MASK_SUBGRAPH.match(ctx, n) is not None}
    assert matched <= frontier
    assert len(frontier) < len(g.nodes)
    if path == "blocks":
        assert len(matched) == 6  # one mask per block


def test_data_free_walk_settles_nodes_read_before_their_producer():
    """DataFree walks in insertion order; a producer moved after its readers (as rewrites leave a
    graph) must still make them free."""
    g = import_model(bench_pipeline.blocks_model(3))
    for name in ("b1_shape", "b2_shape"):  # Shape(x): every mask node of the block reads it
        node = g.values[name].producer
        g.remove_node(node)
        g.add_node(node)
    assert list(g.nodes.values())[-1].op_type == "Shape"
    df = data_free.DataFree(g)
    _fresh_equals(g, df)
    assert df.index_only(g.values["b1_mask"]) and df.index_only(g.values["b2_mask"])


MODELS = [os.path.join(ROOT, "models", "synthetic", "causal_attention.onnx")] + \
    sorted(p for p in (os.path.join(ROOT, "models", f) for f in os.listdir(os.path.join(ROOT, "models")))
           if p.endswith(".onnx"))[:6]


@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_incremental_data_free_matches_a_fresh_walk(path, monkeypatch):
    _, g = pipeline.load(path)
    checked = []
    real = masks.MASK_SUBGRAPH.rewrite

    def checking(ctx, m):
        out = real(ctx, m)
        _fresh_equals(ctx.graph, data_free.data_free_of(ctx))
        checked.append(1)
        return out

    monkeypatch.setattr(masks.MASK_SUBGRAPH, "rewrite", checking)
    df = data_free.DataFree(g)  # the run's analysis, seeded so that it can be read after the run
    PassManager(default_phases(), Options()).run(g, shared=[df])
    g.remove_dead()
    df.update()
    _fresh_equals(g, df)


def test_incremental_data_free_on_the_bench_model():
    g = import_model(bench_pipeline.blocks_model(6))
    df = data_free.DataFree(g)
    result = PassManager(default_phases(), Options()).run(g, shared=[df])
    assert result.counts["mask_subgraph"] > 0
    df.update()  # (from the change log: not rebuilt)
    _fresh_equals(g, df)


# ---- topological order vs networkx ----------------------------------------------------------------
def _nx_order(g):
    ids = nx.lexicographical_topological_sort(g.to_networkx(), key=lambda nid: g.nodes[nid].place)
    return [g.nodes[i] for i in ids]


@pytest.mark.parametrize("seed", range(5))
def test_topological_order_matches_networkx(seed):
    g = import_model(bench_pipeline.blocks_model(3))
    assert g.topological_order() == _nx_order(g)  # already ordered: the fast path
    rng = random.Random(seed)
    items = list(g.nodes.items())
    rng.shuffle(items)  # insertion order no longer a dependency order
    g.nodes = dict(items)
    assert g.topological_order() == _nx_order(g)
    pipeline.optimize_graph(g, Options())  # rewrites append nodes whose consumers came earlier
    assert g.topological_order() == _nx_order(g)


@pytest.mark.parametrize("seed", range(40))
def test_topological_order_of_random_dags_matches_networkx(seed):
    """Random DAGs added in a random order (most out of dependency order): the scan with a heap for
    late nodes gives networkx's lexicographic order."""
    from dmlgraph.ir.graph import Graph, OnnxNode
    rng = random.Random(seed)
    g = Graph()
    values = [g.value("x0"), g.value("x1")]
    g.inputs = list(values)
    made = []
    for i in range(rng.randint(1, 60)):
        out = g.value(f"v{i}")
        made.append(OnnxNode(f"n{i}", "Add", rng.sample(values, min(len(values), rng.randint(0, 3))), [out]))
        values.append(out)
    if seed % 2:
        rng.shuffle(made)
    else:  # the shape rewrites leave: a run in order, then nodes appended whose readers came earlier
        cut = rng.randint(0, len(made))
        made = made[:cut] + rng.sample(made[cut:], len(made) - cut)
    for n in made:
        g.add_node(n)
    assert g.topological_order() == _nx_order(g)


def test_constant_digests_tell_types_dims_and_storage_apart():
    """Equal digests must mean equal constants: raw bytes alone are not enough (type and dims
    count), and a typed-field tensor is hashed by value."""
    from onnx import helper as oh
    g = import_model(bench_pipeline.blocks_model(1))
    tensors = [numpy_helper.from_array(np.array([1, 0], np.int32), "a"),
               numpy_helper.from_array(np.array([1], np.int64), "b"),           # same 8 bytes, other type
               numpy_helper.from_array(np.array([[1, 0]], np.int32), "c"),      # same bytes, other dims
               oh.make_tensor("d", onnx.TensorProto.INT32, [2], [1, 0]),        # same value, typed field
               numpy_helper.from_array(np.array([1, 0], np.int32), "e")]        # same as "a"
    digests = {}
    for t in tensors:
        v = g.value(t.name)
        v.initializer, v.elem_type, v.shape = t, t.data_type, tuple(t.dims)
        g.initializers[t.name] = v
        digests[t.name] = masks.value_digest(g, v)
    assert len({digests[n] for n in "abcd"}) == 4
    assert digests["a"] == digests["e"]


@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_op_index_follows_the_graph_through_every_rewrite(path):
    """Graph.by_op (which the pass manager reads its candidates from) names exactly the live nodes
    of each op type, in the graph's order."""
    _, g = pipeline.load(path)
    pipeline.optimize_graph(g, Options())
    g.remove_dead()
    for op, nodes in g.by_op.items():
        assert list(nodes.values()) == [n for n in g.nodes.values() if n.op_type == op], op
    assert sum(len(d) for d in g.by_op.values()) == len(g.nodes)


def _dead_count(g) -> int:
    """The oracle of a full walk from the graph outputs (a graph without subgraphs): the nodes no
    output depends on, and the initializers no live node reads."""
    live, stack = set(), [v.producer for v in g.outputs if v.producer is not None]
    while stack:
        n = stack.pop()
        if n.id not in live:
            live.add(n.id)
            stack.extend(v.producer for v in n.inputs if v is not None and v.producer is not None)
    unread = [name for name in g.initializers if g.values[name] not in g.outputs
              and not any(c.id in live for c in g.values[name].consumers)]
    return len(g.nodes) - len(live) + len(unread)


def test_remove_dead_returns_at_once_only_when_nothing_changed():
    g = import_model(bench_pipeline.blocks_model(2))
    pipeline.optimize_graph(g, Options())  # (its sweeps remove what they leave dead)
    assert g.remove_dead() == 0 and _dead_count(g) == 0  # the quick answer is the full walk's
    last = g.outputs[0].producer
    g.outputs = [last.inputs[0]]  # the last Add no longer reaches an output
    assert g.remove_dead() >= 1 and last.id not in g.nodes
    g.add_initializer(g.fresh_value("unused"), np.zeros(2, np.float32))
    assert g.remove_dead() == 0 and "unused" not in g.initializers
    assert g.remove_dead() == 0 and _dead_count(g) == 0


@pytest.mark.parametrize("build", [bench_pipeline.chain_model, bench_pipeline.fanout_model, bench_pipeline.nested_model])
def test_graph_shape_models_are_valid_and_lowered(build, tmp_path):
    """The graph-shape benchmark models pass the checker, and their Trilus are lowered (inside the
    If branches too)."""
    model = build(64)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    result = pipeline.lower(str(path), bench_pipeline.GROW)
    assert result.passes.counts.get("trilu", 0) > 0
