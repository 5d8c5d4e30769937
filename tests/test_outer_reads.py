"""Bodies that read enclosing values by name (outer-scope reads), run as onnxruntime runs them.

Issue 28 class 1 / issue 26: an If, nested If, Loop or Scan body (or a function's If) reading a value
a main-graph node computes. The executor's regions passed only values read as node inputs on to
later steps, so after lowering a value read only by a body was never a session output: "At least
one output should be requested" (exit 2), or KeyError (exit 3) when the region had other outputs.
Each form below is run on the original and on both targets, and compared with onnxruntime on the
original, bit for bit.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import dmlgraph
from dmlgraph.tools import cli

F = T.FLOAT


def _vi(name: str, shape=("a", "b"), elem=F) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, list(shape))


def _model(nodes, inputs, outputs, inits=(), functions=()) -> onnx.ModelProto:
    opsets = [h.make_opsetid("", 17)] + ([h.make_opsetid("local", 1)] if functions else [])
    m = h.make_model(h.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=opsets,
                     ir_version=10, functions=list(functions))
    onnx.checker.check_model(m, full_check=True)
    return m


def _branch(nodes, out: str) -> onnx.GraphProto:
    return h.make_graph(nodes, "branch", [], [_vi(out)])


X, C = _vi("x"), _vi("c", (), T.BOOL)
RELU = h.make_node("Relu", ["x"], ["r"])  # the main-graph value the bodies read


def _if(cond: str, then_nodes, then_out: str, else_nodes, else_out: str, out: str = "y") -> onnx.NodeProto:
    return h.make_node("If", [cond], [out], then_branch=_branch(then_nodes, then_out),
                       else_branch=_branch(else_nodes, else_out))


def if_computed() -> onnx.ModelProto:
    """The smallest case: Relu(x) -> r; If(c): Trilu(r) / Identity(r)."""
    return _model([RELU, _if("c", [h.make_node("Trilu", ["r"], ["t"])], "t", [h.make_node("Identity", ["r"], ["e"])], "e")],
                  [X, C], [_vi("y")])


def if_input_and_initializer() -> onnx.ModelProto:
    return _model([_if("c", [h.make_node("Mul", ["x", "w"], ["m"]), h.make_node("Trilu", ["m"], ["t"])], "t",
                       [h.make_node("Identity", ["x"], ["e"])], "e")],
                  [X, C], [_vi("y")], [h.make_tensor("w", F, [1], [2.0])])


def if_cond_and_reads_computed() -> onnx.ModelProto:
    """The region making r has other outputs (the condition); a second If reads r and the first If's output."""
    return _model([RELU, h.make_node("ReduceSum", ["r"], ["s"], keepdims=0), h.make_node("Greater", ["s", "z"], ["cc"]),
                   _if("cc", [h.make_node("Trilu", ["r"], ["t"])], "t", [h.make_node("Neg", ["r"], ["e"])], "e", "y1"),
                   _if("c", [h.make_node("Trilu", ["y1"], ["t3"], upper=0)], "t3",
                       [h.make_node("Add", ["y1", "r"], ["e3"])], "e3")],
                  [X, C], [_vi("y")], [h.make_tensor("z", F, [], [1.0])])


def nested_if() -> onnx.ModelProto:
    """An inner If reads a main-graph value (r), a main-graph condition (c2) and its outer branch's value (q)."""
    inner = _if("c2", [h.make_node("Trilu", ["r"], ["t2"])], "t2", [h.make_node("Add", ["r", "q"], ["e2"])], "e2", "i")
    return _model([RELU, h.make_node("Not", ["c"], ["c2"]),
                   _if("c", [h.make_node("Neg", ["x"], ["q"]), inner], "i",
                       [h.make_node("Trilu", ["r"], ["e"], upper=0)], "e")],
                  [X, C], [_vi("y")])


def loop() -> onnx.ModelProto:
    body = h.make_graph([h.make_node("Trilu", ["r"], ["t"]), h.make_node("Add", ["v", "t"], ["v2"]),
                         h.make_node("Identity", ["cin"], ["cout"]), h.make_node("Mul", ["t", "x"], ["s"])], "body",
                        [_vi("i", (), T.INT64), _vi("cin", (), T.BOOL), _vi("v")],
                        [_vi("cout", (), T.BOOL), _vi("v2"), _vi("s")])
    return _model([RELU, h.make_node("Loop", ["M", "c", "x"], ["y", "ys"], body=body)],
                  [X, C], [_vi("y"), _vi("ys", ("n", "a", "b"))], [h.make_tensor("M", T.INT64, [], [3])])


def scan() -> onnx.ModelProto:
    body = h.make_graph([h.make_node("Trilu", ["r"], ["t"]), h.make_node("Add", ["s", "xs"], ["u"]),
                         h.make_node("Add", ["u", "t"], ["u2"]), h.make_node("Mul", ["u2", "w"], ["s2"]),
                         h.make_node("Trilu", ["u"], ["o"], upper=0)], "body",
                        [_vi("s"), _vi("xs")], [_vi("s2"), _vi("o")])
    return _model([RELU, h.make_node("Unsqueeze", ["x", "ax"], ["x3"]), h.make_node("Concat", ["x3", "x3"], ["xx"], axis=0),
                   h.make_node("Scan", ["x", "xx"], ["y", "ys"], body=body, num_scan_inputs=1)],
                  [X], [_vi("y"), _vi("ys", ("n", "a", "b"))],
                  [h.make_tensor("ax", T.INT64, [1], [0]), h.make_tensor("w", F, [1], [0.5])])


def loop_in_if() -> onnx.ModelProto:
    body = h.make_graph([h.make_node("Trilu", ["r"], ["t"]), h.make_node("Add", ["v", "t"], ["v2"]),
                         h.make_node("Add", ["v2", "q"], ["v3"]), h.make_node("Identity", ["cin"], ["cout"])], "body",
                        [_vi("i", (), T.INT64), _vi("cin", (), T.BOOL), _vi("v")], [_vi("cout", (), T.BOOL), _vi("v3")])
    loop_node = h.make_node("Loop", ["M", "", "x"], ["lo"], body=body)
    return _model([RELU, _if("c", [h.make_node("Neg", ["r"], ["q"]), loop_node], "lo",
                             [h.make_node("Identity", ["r"], ["e"])], "e")],
                  [X, C], [_vi("y")], [h.make_tensor("M", T.INT64, [], [2])])


def function_if() -> onnx.ModelProto:
    """A local function whose If reads a value the function computes."""
    f = h.make_function("local", "F", ["a", "k"], ["o"], [
        h.make_node("Relu", ["a"], ["t"]),
        _if("k", [h.make_node("Trilu", ["t"], ["z"])], "z", [h.make_node("Identity", ["t"], ["z2"])], "z2", "o")],
        [h.make_opsetid("", 17)])
    return _model([h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("F", ["s", "c"], ["y"], domain="local")],
                  [X, C], [_vi("y")], functions=[f])


def if_calls_functions() -> onnx.ModelProto:
    """torch.cond's form: each branch calls a local function on main-graph values."""
    ft = h.make_function("local", "T", ["a"], ["o"], [h.make_node("Trilu", ["a"], ["o"])], [h.make_opsetid("", 17)])
    fe = h.make_function("local", "E", ["a"], ["o"], [h.make_node("Neg", ["a"], ["o"])], [h.make_opsetid("", 17)])
    return _model([RELU, _if("c", [h.make_node("T", ["r"], ["t"], domain="local")], "t",
                             [h.make_node("E", ["r"], ["e"], domain="local")], "e")],
                  [X, C], [_vi("y")], functions=[ft, fe])


FORMS = [if_computed, if_input_and_initializer, if_cond_and_reads_computed, nested_if, loop, scan, loop_in_if,
         function_if, if_calls_functions]


def _feeds(m: onnx.ModelProto, cond: bool) -> dict[str, np.ndarray]:
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)}
    if any(i.name == "c" for i in m.graph.input):
        feeds["c"] = np.array(cond)
    return feeds


@pytest.mark.parametrize("target", [None, "dml", "onnx"])
@pytest.mark.parametrize("cond", [True, False])
@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.__name__)
def test_bodies_reading_enclosing_values_run_as_onnxruntime(form, cond, target):
    m = form()
    feeds = _feeds(m, cond)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    if target is not None:
        result = dmlgraph.optimize(m, target=target)
        assert sum(result.counts.values()) >= 1  # a body's Trilu was lowered: its body is run by the executor
        m = result.model
    got = dmlgraph.run(m, feeds)
    for w, o in zip(want, m.graph.output):
        assert w.shape == got[o.name].shape and w.dtype == got[o.name].dtype
        assert np.array_equal(w.view(np.uint8), got[o.name].view(np.uint8)), o.name


@pytest.mark.parametrize("form", [if_computed, if_cond_and_reads_computed, scan], ids=lambda f: f.__name__)
def test_commands_on_the_smallest_forms(form, tmp_path):
    """Before: run/validate/dxdispatch of the lowered If exited 2 ('At least one output should be
    requested'); validate exited 3 (KeyError) where the region making r had another output."""
    m = form()
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "low.onnx")
    onnx.save(m, src)
    np.savez(tmp_path / "in.npz", **_feeds(m, True))
    inputs = ["--inputs", str(tmp_path / "in.npz")]
    assert cli.main(["validate", src, *inputs]) == 0
    assert cli.main(["optimize", src, "-o", out]) == 0
    assert cli.main(["run", out, *inputs]) == 0
    assert cli.main(["dxdispatch", out, *inputs, "-o", str(tmp_path / "dx")]) == 0


def test_a_value_a_body_reads_has_the_holder_among_its_uses():
    """What a body reads of the enclosing graph is an edge: the value's uses list the holder (made
    after the holder in an unsorted graph too), the body's node reads the enclosing Value itself,
    a rewiring moves the body's read and the holder's use to the new value, and removing the
    holder removes the use."""
    from dmlgraph.io.onnx_io import import_model
    from dmlgraph.ir.graph import BODY_READ

    then = _branch([h.make_node("Identity", ["m"], ["t"])], "t")
    other = _branch([h.make_node("Neg", ["m"], ["e"])], "e")
    nodes = [h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             h.make_node("Relu", ["x"], ["m"])]  # (the body's value is made after the If)
    m = h.make_model(h.make_graph(nodes, "g", [_vi("x"), h.make_tensor_value_info("c", T.BOOL, [])],
                                  [_vi("y")]), opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    g = import_model(m)
    holder = next(n for n in g.nodes.values() if n.op_type == "If")
    read = g.values["m"]
    assert holder.outer == [read] and (holder, BODY_READ) in read.uses
    assert g.reads(holder)[-1] is read and g.body_reads() == {"m"}
    then_node = next(iter(holder.bodies["then_branch"].nodes.values()))
    assert then_node.inputs[0] is read and (then_node, 0) not in read.uses
    assert holder.bodies["then_branch"].holder is holder and holder.bodies["else_branch"].parent is g
    x = g.values["x"]
    g.replace_uses(read, x)
    assert not read.uses and (holder, BODY_READ) in x.uses and then_node.inputs[0] is x
    assert holder.outer == [x] and g.body_reads() == {"x"}
    assert [n.input[0] for a in holder.attributes for n in a.g.node] == ["x", "x"]  # (what export writes)
    g.remove_node(holder)
    assert not any(n is holder for n, _ in x.uses)


def test_a_rewired_read_deep_in_bodies_is_written_with_the_new_name():
    """A value read two scopes down (the Loop inside loop_in_if's If) replaced in the main graph, as
    a rule rewiring its readers would: every body reads the new Value, the written model names it
    at both depths, drops the old producer, loads in onnxruntime, passes the checker and computes
    what the model with the replacement written by hand computes."""
    from dmlgraph.io.onnx_io import export_model, import_model

    m = loop_in_if()
    g = import_model(m)
    holder = next(n for n in g.nodes.values() if n.op_type == "If")
    loop_node = next(n for n in holder.bodies["then_branch"].nodes.values() if n.op_type == "Loop")
    trilu = next(n for n in loop_node.bodies["body"].nodes.values() if n.op_type == "Trilu")
    r, x = g.values["r"], g.values["x"]
    assert trilu.inputs[0] is r and loop_node.bodies["body"].parent is holder.bodies["then_branch"]
    g.replace_uses(r, x)
    g.remove_dead()
    assert trilu.inputs[0] is x and holder.outer == [g.values["M"], x] and not r.uses
    written = export_model(g)
    assert [n.op_type for n in written.graph.node] == ["If"]  # (the Relu nothing reads now is gone)
    onnx.checker.check_model(written, full_check=True)
    by_hand = onnx.ModelProto()
    by_hand.CopyFrom(m)
    del by_hand.graph.node[0]  # (the Relu)
    for sub in [by_hand.graph.node[0].attribute[0].g, by_hand.graph.node[0].attribute[1].g]:
        for node in list(sub.node) + [y for n in sub.node for a in n.attribute for y in a.g.node]:
            node.input[:] = ["x" if i == "r" else i for i in node.input]
    feeds = _feeds(m, True)
    want = ort.InferenceSession(by_hand.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert written.graph.node[0].SerializeToString() == by_hand.graph.node[0].SerializeToString()
    assert np.array_equal(want[0], got[0])


@pytest.mark.parametrize("form", [if_computed, loop, loop_in_if], ids=lambda f: f.__name__)
def test_the_executor_runs_the_body_graphs_the_node_holds(form):
    """The executor runs a lowered body as the Graph its node holds (the one import built), not a
    Graph imported again from the body's proto; each enclosing value it reads is the outer Value."""
    from dmlgraph.io.onnx_io import import_model
    from dmlgraph.runtime.control_flow import HostStep
    from dmlgraph.runtime.executor import Executor

    m = form()
    lowered = dmlgraph.optimize(m, target="dml").model
    g = import_model(lowered)
    ex = Executor(g)
    feeds = _feeds(m, True)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ex.run(feeds)
    assert np.array_equal(want[0], got[m.graph.output[0].name])
    steps = [s for s in ex.steps if isinstance(s, HostStep)]
    assert steps
    for step in steps:
        for attr in step.node.bodies:
            sub = step.executor(attr)  # (made by the run above; the same one again)
            assert sub.graph is step.node.bodies[attr]
            assert all(g.find(name) is v for name, v in sub.graph.free_values().items() if name in g.values)


def test_a_rewired_read_of_a_dml_node_in_a_body_is_written_with_the_new_name():
    """The same through a DML node a lowering put into a body (its proto's inputs map to the
    node's from the first, DiagonalMatrix's from the second): the written body reads the new value
    and runs as the model reading it from the start."""
    from dmlgraph.io.onnx_io import DOMAIN, export_model, import_model

    g = import_model(dmlgraph.optimize(if_computed(), target="dml").model)
    holder = next(n for n in g.nodes.values() if n.op_type == "If")
    g.replace_uses(g.values["r"], g.values["x"])
    g.remove_dead()
    written = export_model(g)
    then = next(a.g for a in written.graph.node[-1].attribute if a.name == "then_branch")
    assert [list(n.input) for n in then.node if n.domain == DOMAIN] == [["x"]]
    assert [n.op_type for n in written.graph.node] == ["If"] and holder.outer == [g.values["x"]]
    feeds = _feeds(if_computed(), True)
    assert np.array_equal(dmlgraph.run(written, feeds)["y"], np.triu(feeds["x"]))
