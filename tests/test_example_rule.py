"""docs/api.md's example rule, written against the rule API, runs with the built-in rules."""
from __future__ import annotations

import importlib.util
import os

import onnx
from onnx import TensorProto as T
from onnx import helper as h

import dmlgraph
from dmlgraph.io.onnx_io import export_model, import_model
from dmlgraph.passes import default_phases
from dmlgraph.rewrite import Options, PassManager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example():
    spec = importlib.util.spec_from_file_location("abs_generator", os.path.join(ROOT, "docs", "examples",
                                                                                 "abs_generator.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_rule_folds_abs_into_the_generator_bit_exactly():
    nodes = [h.make_node("EyeLike", ["x"], ["eye"], k=-1), h.make_node("Abs", ["eye"], ["abseye"]),
             h.make_node("Add", ["x", "abseye"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["n", "n"])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["n", "n"])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=10)
    g = import_model(model)
    result = PassManager([*default_phases(), [_example().RULE]], Options()).run(g)
    g.remove_dead()
    assert result.counts["eyelike"] == 1 and result.counts["abs_generator"] == 1
    assert sorted(n.op_type for n in g.nodes.values()) == ["Add", "DiagonalMatrix1", "Shape"]
    lowered = export_model(g)
    onnx.checker.check_model(lowered, full_check=True)
    check = dmlgraph.validate(model, lowered, dims={"n": 6})
    assert check.ok and check.exact and [t.name for t in check.tensors] == ["abseye"]
