"""The one rewriter: it applies a rule's Replacement only when the graph stays valid, and rules
never touch the graph themselves."""
from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from dmlgraph.io.onnx_io import export_model, import_model
from dmlgraph.ir.graph import DmlNode, Graph, Node, OnnxNode
from dmlgraph.passes import default_phases, default_rules
from dmlgraph.rewrite import (
    Context,
    Match,
    Options,
    PassManager,
    Replacement,
    Rewriter,
    RewriteRefused,
    Rule,
    detached,
    detached_constant,
)


def _split_model() -> onnx.ModelProto:
    """x -> Split -> (a, b) -> Add -> y: a two-output producer whose outputs are both read."""
    nodes = [h.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2),
             h.make_node("Add", ["a", "b"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [4, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 4])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10)


def _relu(src: str, dst: str, g: Graph) -> OnnxNode:
    return OnnxNode(f"relu_{dst}", "Relu", [g.values[src]], [detached(dst, T.FLOAT, g.values[src].shape)])


def _state(g: Graph) -> tuple:
    return (sorted(g.values), [(n.op_type, [v.name if v else "" for v in n.inputs], [v.name for v in n.outputs])
                               for n in g.nodes.values()], sorted(g.initializers))


def test_a_multi_output_producer_rewritten_on_one_output_is_refused_and_the_graph_is_unchanged():
    g = import_model(_split_model())
    split = g.values["a"].producer
    new = OnnxNode("just_a", "Identity", [g.values["x"]], [detached("a", T.FLOAT, (2, 4))])
    before = _state(g)
    with pytest.raises(RewriteRefused, match="'b' without a producer"):
        Rewriter(g).apply(Replacement(nodes=[new], replaces=[(g.values["a"], new.outputs[0])], removes=[split]))
    assert _state(g) == before


def test_replacing_every_output_of_a_multi_output_producer_is_accepted():
    g = import_model(_split_model())
    split = g.values["a"].producer
    x = g.values["x"]
    na = OnnxNode("top", "Identity", [x], [detached("a_new", T.FLOAT, (2, 4))])
    nb = OnnxNode("bottom", "Identity", [x], [detached("b_new", T.FLOAT, (2, 4))])
    rw = Rewriter(g)
    rw.apply(Replacement(nodes=[na, nb], replaces=[(g.values["a"], na.outputs[0]), (g.values["b"], nb.outputs[0])],
                         removes=[split], rule="test"))
    assert g.values["a"].producer is na and g.values["b"].producer is nb  # names and uses kept
    assert na.outputs[0] is g.values["a"] and na.rule == "test"
    assert "a_new" not in g.values and rw.applied[-1].rule == "test"
    assert split.id not in g.nodes


def test_a_value_keeps_one_producer():
    g = import_model(_split_model())
    new = OnnxNode("again", "Identity", [g.values["x"]], [detached("y", T.FLOAT, (2, 4))])
    with pytest.raises(RewriteRefused, match="two producers"):
        Rewriter(g).apply(Replacement(nodes=[new], replaces=[(g.values["y"], new.outputs[0])]))
    writes_existing = OnnxNode("again", "Identity", [g.values["x"]], [g.values["a"]])
    with pytest.raises(RewriteRefused, match="already exists"):
        Rewriter(g).apply(Replacement(nodes=[writes_existing]))


def test_every_use_has_a_producer():
    g = import_model(_split_model())
    add = g.values["y"].producer
    reads_removed = OnnxNode("r", "Relu", [g.values["a"]], [detached("y2", T.FLOAT, (2, 4))])
    with pytest.raises(RewriteRefused, match="whose producer is removed"):
        Rewriter(g).apply(Replacement(nodes=[reads_removed], replaces=[(g.values["y"], reads_removed.outputs[0])],
                                      removes=[add, g.values["a"].producer]))
    reads_nothing = OnnxNode("r", "Relu", [detached("ghost")], [detached("y2", T.FLOAT, (2, 4))])
    with pytest.raises(RewriteRefused, match="nothing produces"):
        Rewriter(g).apply(Replacement(nodes=[reads_nothing], replaces=[(g.values["y"], reads_nothing.outputs[0])],
                                      removes=[add]))


def test_replaced_values_keep_their_type_and_static_shape_but_may_learn_a_symbolic_one():
    g = import_model(_split_model())
    add = g.values["y"].producer
    wrong_type = OnnxNode("c", "Cast", [g.values["a"]], [detached("c", T.INT64, (2, 4))])
    with pytest.raises(RewriteRefused, match="element type"):
        Rewriter(g).apply(Replacement(nodes=[wrong_type], replaces=[(g.values["y"], wrong_type.outputs[0])],
                                      removes=[add]))
    wrong_shape = OnnxNode("c", "Identity", [g.values["x"]], [detached("c", T.FLOAT, (4, 4))])
    with pytest.raises(RewriteRefused, match="shape"):
        Rewriter(g).apply(Replacement(nodes=[wrong_shape], replaces=[(g.values["y"], wrong_shape.outputs[0])],
                                      removes=[add]))
    g.values["y"].shape = ("unk__1", 4)
    ok = OnnxNode("c", "Relu", [g.values["a"]], [detached("c", T.FLOAT, (2, 4))])
    Rewriter(g).apply(Replacement(nodes=[ok], replaces=[(g.values["y"], ok.outputs[0])], removes=[add]))
    assert g.values["y"].shape == (2, 4) and g.values["y"].producer is ok


def test_new_values_and_constants_get_unique_names_and_dead_nodes_are_collected():
    g = import_model(_split_model())
    add = g.values["y"].producer
    k = detached_constant("a", np.float32(2))  # "a" is taken: renamed on adoption
    mid = OnnxNode("m", "Mul", [g.values["a"], k], [detached("b", T.FLOAT, (2, 4))])  # "b" is taken too
    out = OnnxNode("o", "Relu", [mid.outputs[0]], [detached("y", T.FLOAT, (2, 4))])
    rw = Rewriter(g)
    rw.apply(Replacement(nodes=[mid, out], initializers=[k], replaces=[(g.values["y"], out.outputs[0])],
                         removes=[add]))
    assert k.name != "a" and g.initializers[k.name] is k and g.values[k.name] is k
    assert mid.outputs[0].name != "b" and g.values[mid.outputs[0].name] is mid.outputs[0]
    assert g.values["b"].producer is not None and rw.collect_dead() == 0  # Split still feeds "a"
    model = export_model(g)
    onnx.checker.check_model(model, full_check=True)


def test_a_stored_constant_can_become_computed():
    arr = np.tril(np.ones((4, 4), np.float32))
    graph = h.make_graph([h.make_node("Mul", ["x", "m"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [4, 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, [4, 4])],
                         initializer=[onnx.numpy_helper.from_array(arr, "m")])
    g = import_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=10))
    m = g.values["m"]
    gen = DmlNode("gen", None, None, None, detached("m", T.FLOAT), elem_type=T.FLOAT, value=np.float32(1),
                  begin=None, end=1, static_shape=(4, 4))
    Rewriter(g).apply(Replacement(nodes=[gen], replaces=[(m, gen.outputs[0])]))
    assert "m" not in g.initializers and m.producer is gen and m.initializer is None and m.array is None


def test_the_pass_manager_records_a_refused_replacement_as_a_decline():
    g = import_model(_split_model())

    def match(ctx: Context, node: Node) -> Match:
        return Match("half_split", [node])

    def rewrite(ctx: Context, m: Match) -> Replacement:
        split = m.nodes[0]
        new = OnnxNode("top", "Identity", [split.inputs[0]], [detached("t", T.FLOAT, (2, 4))])
        return Replacement(nodes=[new], replaces=[(split.outputs[0], new.outputs[0])], removes=[split])

    result = PassManager([[Rule("half_split", ("Split",), match, rewrite)]]).run(g)
    assert result.counts == {"half_split": 0} and not result.applied
    assert len(result.declined) == 1 and "without a producer" in (result.declined[0].reason or "")
    assert g.values["b"].producer is not None


def _attention_like() -> onnx.ModelProto:
    """A Trilu mask and an EyeLike with a symbolic size: two rules, one needing a Shape node."""
    nodes = [h.make_node("Trilu", ["x"], ["t"], upper=0), h.make_node("EyeLike", ["t"], ["e"]),
             h.make_node("Add", ["t", "e"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["n", "n"])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["n", "n"])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10)


def test_rules_are_pure_the_rewriter_alone_changes_the_graph():
    g = import_model(_attention_like())
    ctx = Context(g, Options())
    for rule in default_rules():
        for node in list(g.nodes.values()):
            if node.op_type not in rule.anchors:
                continue
            m = rule.match(ctx, node)
            if m is None or m.declined:
                continue
            before = _state(g)
            replacement = rule.rewrite(ctx, m)
            assert _state(g) == before, f"{rule.name}'s rewrite changed the graph"
            Rewriter(g).apply(replacement)
    g.remove_dead()
    assert sorted(n.op_type for n in g.nodes.values()) == ["Add", "DiagonalMatrix1", "DiagonalMatrix1", "Shape"]
    onnx.checker.check_model(export_model(g, "onnx"), full_check=True)


def test_optimizing_keeps_the_imported_model_valid_and_does_not_touch_the_proto():
    model = _attention_like()
    kept = copy.deepcopy(model)
    g = import_model(model)
    PassManager(default_phases()).run(g)
    g.remove_dead()
    onnx.checker.check_model(export_model(g, "onnx"), full_check=True)
    assert model == kept
