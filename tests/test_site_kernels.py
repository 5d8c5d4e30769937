"""On `--target onnx` a site whose standard form runs more onnxruntime kernels than what it
replaces is declined, named (issue 25 item 4): a stored triangle sliced at run time is two Slices
in onnxruntime, its generator a ConstantOfShape, a Trilu and their sizes."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import dmlgraph
from dmlgraph import costs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLICED = ["split_concat_tril_dynamo", "split_concat_tril_ts", "stored_tril_past_ts"]


def _kernels(model: onnx.ModelProto | str) -> int:
    """Nodes of onnxruntime's optimized model (ORT_ENABLE_ALL, CPU), as benchmarks/portable.py counts."""
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        opts.optimized_model_filepath = os.path.join(tmp, "o.onnx")
        ort.InferenceSession(model if isinstance(model, str) else model.SerializeToString(), opts,
                             providers=["CPUExecutionProvider"])
        return len(onnx.load(opts.optimized_model_filepath, load_external_data=False).graph.node)


@pytest.mark.parametrize("name", SLICED)
def test_a_site_costing_kernels_is_declined_on_onnx_only(name):
    path = os.path.join(ROOT, "models", f"{name}.onnx")
    kept = dmlgraph.optimize(path, target="onnx")
    every = dmlgraph.optimize(path, target="onnx", allow_growth=True)
    assert _kernels(every.model) > _kernels(path)  # (what writing the site costs)
    assert _kernels(kept.model) <= _kernels(path)
    assert any(d.reason.startswith(costs.KERNEL_DECLINE) and "onnxruntime kernel" in d.reason
               for d in kept.declined)
    dml = dmlgraph.optimize(path, target="dml")
    assert not any(d.reason.startswith(costs.KERNEL_DECLINE) and "onnxruntime" in d.reason for d in dml.declined)


def test_run_time_nodes_leave_out_what_onnxruntime_folds_removes_or_fuses():
    from onnx import TensorProto as T
    from onnx import helper as h
    g = h.make_graph([h.make_node("Shape", ["c"], ["s"]),  # (of a constant: folded)
                      h.make_node("Less", ["x", "y"], ["lt"]), h.make_node("Not", ["lt"], ["n"]),
                      h.make_node("Cast", ["n"], ["nb"], to=T.BOOL), h.make_node("Where", ["nb", "x", "y"], ["w"]),
                      h.make_node("Identity", ["w"], ["z"])], "g",
                     [h.make_tensor_value_info(v, T.FLOAT, [2]) for v in "xy"],
                     [h.make_tensor_value_info("z", T.FLOAT, [2]), h.make_tensor_value_info("s", T.INT64, [1])],
                     [onnx.numpy_helper.from_array(np.zeros(2, np.float32), "c")])
    assert costs.run_time_nodes(g) == {"lt", "w"}
