"""The scope walk (`rewrite.nested.scopes`): every If/Loop/Scan body in the order the driver lowers
them (holders in graph order, attributes in order, each body followed by its own), through the body
Graphs the holders hold, with the paths reports use and what changes per iteration around each."""
from __future__ import annotations

from onnx import TensorProto as T
from onnx import helper as h
from test_outer_reads import _if, _model, _vi, loop_in_if, nested_if

from dmlgraph.io.onnx_io import import_model
from dmlgraph.rewrite.nested.scopes import scopes


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
