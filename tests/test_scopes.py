"""The scope walk (`rewrite.nested.scopes`): every If/Loop/Scan body in the order the driver lowers
them (holders in graph order, attributes in order, each body followed by its own), through the body
Graphs the holders hold, with the paths reports use and what changes per iteration around each."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from test_outer_reads import RELU, C, X, _branch, _if, _model, _vi, loop_in_if, nested_if

from dmlgraph.io.onnx_io import export_model, import_model
from dmlgraph.rewrite.nested.scopes import all_nodes, scopes


def test_bodies_in_lowering_order_with_their_paths():
    g = import_model(nested_if())
    found = [(s.path, s.label, s.holder.op_type) for s in scopes(g)]
    assert found == [("If/else_branch", "else_branch", "If"), ("If/then_branch", "then_branch", "If"),
                     ("If/then_branch/If/else_branch", "else_branch", "If"),
                     ("If/then_branch/If/then_branch", "then_branch", "If")]  # (attributes as the node has them)
    assert [s.path for s in scopes(g, recursive=False)] == ["If/else_branch", "If/then_branch"]


def test_each_scope_is_the_body_graph_its_holder_holds():
    g = import_model(loop_in_if())
    walked = list(scopes(g))
    for s in walked:
        assert s.graph is s.holder.bodies[s.label] and s.proto is s.graph.source
    assert [s.path for s in walked] == ["If/else_branch", "If/then_branch", "If/then_branch/Loop/body"]
    outer, inner = walked[1].graph, walked[2].graph
    assert inner is not None and outer is not None and inner.parent is outer


def test_what_changes_per_iteration_reaches_the_bodies_inside():
    """An If inside a Loop body reading the loop-carried value and a main-graph value: only the
    Loop body's formal inputs change per iteration around the If's branches."""
    inner = _if("cin", [h.make_node("Add", ["v", "x"], ["t"])], "t", [h.make_node("Neg", ["v"], ["e"])], "e", "v2")
    body = h.make_graph([inner, h.make_node("Identity", ["cin"], ["cout"])], "body",
                        [_vi("i", (), T.INT64), _vi("cin", (), T.BOOL), _vi("v")], [_vi("cout", (), T.BOOL), _vi("v2")])
    g = import_model(_model([h.make_node("Loop", ["M", "c", "x"], ["y"], body=body)], [_vi("x"), _vi("c", (), T.BOOL)],
                            [_vi("y")], [h.make_tensor("M", T.INT64, [], [3])]))
    walked = [(s.path, s.varying) for s in scopes(g)]
    carried = {"i": "the iteration number", "cin": "the loop condition", "v": "a loop-carried value"}
    assert walked == [("Loop/body", {}), ("Loop/body/If/else_branch", carried), ("Loop/body/If/then_branch", carried)]
    around = {"x": "a scanned slice", "z": "a scan state value"}  # (as if g were a Scan body: the Loop reads x, not z)
    assert [s.varying for s in scopes(g, "", around)] == [around, {"x": "a scanned slice"} | carried,
                                                          {"x": "a scanned slice"} | carried]


def _dead_read_in_body(depth: int) -> onnx.ModelProto:
    """Relu(x) -> r; an If whose then branch (or, `depth` 2, an If inside it) holds a dead Neg(r)."""
    inner = _branch([h.make_node("Neg", ["r"], ["n"]), h.make_node("Identity", ["x"], ["t"])], "t")
    if depth == 2:
        holder = h.make_node("If", ["c"], ["i"], then_branch=inner,
                             else_branch=_branch([h.make_node("Identity", ["x"], ["e2"])], "e2"))
        inner = _branch([holder], "i")
    other = _branch([h.make_node("Identity", ["x"], ["e"])], "e")
    return _model([h.make_node("Relu", ["x"], ["r"]), h.make_node("If", ["c"], ["y"], then_branch=inner, else_branch=other)],
                  [_vi("x"), _vi("c", (), T.BOOL)], [_vi("y")])


@pytest.mark.parametrize("depth", [1, 2])
def test_removing_a_body_node_drops_only_its_own_uses(depth):
    """A body's dead node read an enclosing value (listed under the holder, not under it): removing
    it leaves that value's other uses alone, the holder's use goes with the body's last read, the
    enclosing graph's clean-up then drops the producer, and the written model reads it nowhere."""
    g = import_model(_dead_read_in_body(depth))
    r = g.values["r"]
    walked = list(scopes(g))
    body = walked[-1].graph if depth == 2 else walked[1].graph
    assert body is not None and any(n.op_type == "Neg" for n in body.nodes.values())
    assert body.remove_dead() == 1
    holder = next(n for n in g.nodes.values() if n.op_type == "If")
    assert not any(u is holder for u, _ in r.uses) and r not in holder.outer
    assert g.remove_dead() == 1 and "Relu" not in {n.op_type for n in g.nodes.values()}
    written = export_model(g, "dml")
    onnx.checker.check_model(written, full_check=True)
    assert "Neg" not in {n.op_type for n in all_nodes(written.graph.node)}
    feeds = {"x": np.ones((2, 3), np.float32), "c": np.array(True)}
    out = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.array_equal(out[0], feeds["x"])


def test_removing_one_of_two_body_reads_keeps_the_holders_use():
    g = import_model(_dead_read_in_body(1))
    body = next(s.graph for s in scopes(g) if s.label == "then_branch")
    assert body is not None
    keep = next(n for n in body.nodes.values() if n.op_type == "Identity")
    neg = next(n for n in body.nodes.values() if n.op_type == "Neg")
    body.remove_node(keep)  # (reads x, an enclosing value too)
    holder = body.holder
    assert holder is not None and [v.name for v in holder.outer] == ["r", "x"]  # (x: the else branch reads it)
    body.remove_node(neg)
    assert [v.name for v in holder.outer] == ["x"] and not any(u is holder for u, _ in g.values["r"].uses)


def test_a_body_sees_its_scopes_through_the_edges():
    """What the rules ask of a body Graph about the values it reads of its scopes: an enclosing
    initializer is stored, its readers here are the body's own nodes (the enclosing value's uses
    list the holder), every scope's readers are visible, and a value replaced in the body's scope
    only moves the body's reads (`rewire_scope`): the enclosing graph keeps the old value."""
    then = [h.make_node("Add", ["r", "w"], ["t0"]), h.make_node("Mul", ["t0", "r"], ["t"])]
    model = _model([RELU, h.make_node("Neg", ["r"], ["n"]), _if("c", then, "t", [h.make_node("Identity", ["n"], ["e"])], "e")],
                   [X, C], [_vi("y"), _vi("n")], [h.make_tensor("w", T.FLOAT, [1], [2.0])])
    g = import_model(model)
    holder = next(n for n in g.nodes.values() if n.op_type == "If")
    body = holder.bodies["then_branch"]
    r, w = g.values["r"], g.values["w"]
    assert body.stored(w) and not body.stored(r) and not g.stored(r)
    assert {(n.op_type, i) for n, i in body.uses_here(r)} == {("Add", 0), ("Mul", 1)}
    assert {n.op_type for n, _ in r.uses} == {"Neg", "If"}  # (the enclosing graph counts the holder)
    assert {n.op_type for n in body.visible_readers(r)} == {"Add", "Mul", "Neg", "If"}
    neg = next(n for n in g.nodes.values() if n.op_type == "Neg")
    assert body.sees(neg) and not g.sees(next(iter(body.nodes.values())))
    new = body.value("r_here")
    body.rewire_scope(r, new)
    assert {(n.op_type, i) for n, i in new.uses} == {("Add", 0), ("Mul", 1)} and not body.uses_here(r)
    assert {n.op_type for n, _ in r.uses} == {"Neg"}  # (the branch reads it no more: the holder's use went)
