"""Small hand-built models (onnx.helper only, no torch) used by the demo and the tests.

Run: python models/synthetic/make_synthetic.py   (rewrites the .onnx files beside this script)
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def _model(nodes, inputs, outputs, inits=(), opset=18, name="g"):
    g = h.make_graph(nodes, name, inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10,
                     producer_name="dmlgraph-synthetic")
    onnx.checker.check_model(m, full_check=True)
    return m


def causal_attention() -> onnx.ModelProto:
    """softmax(q k^T / sqrt(d) masked causally) v, the mask built by Trilu from the sequence length.

    Also adds the identity (EyeLike) to the scores' last [seq, seq] slice as a second output, so
    the demo shows both rules.
    """
    d = 8
    f = lambda n, shape: h.make_tensor_value_info(n, T.FLOAT, shape)  # noqa: E731
    c = lambda n, arr: numpy_helper.from_array(np.asarray(arr), n)  # noqa: E731
    inits = [c("scale", np.float32(1 / np.sqrt(d))), c("neg_inf", np.float32(-np.inf)),
             c("zero_f", np.float32(0)), c("idx2", np.array([2], np.int64))]
    nodes = [
        h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        h.make_node("MatMul", ["q", "kt"], ["qk"]),
        h.make_node("Mul", ["qk", "scale"], ["scores"]),
        h.make_node("Shape", ["q"], ["q_shape"]),
        h.make_node("Gather", ["q_shape", "idx2"], ["seq_len"], axis=0),
        h.make_node("Concat", ["seq_len", "seq_len"], ["mask_shape"], axis=0),
        h.make_node("ConstantOfShape", ["mask_shape"], ["ones"],
                    value=numpy_helper.from_array(np.array([1.0], np.float32))),
        h.make_node("Trilu", ["ones"], ["causal"], upper=0, name="causal_tril"),
        h.make_node("Equal", ["causal", "zero_f"], ["masked"]),
        h.make_node("Where", ["masked", "neg_inf", "scores"], ["masked_scores"]),
        h.make_node("Softmax", ["masked_scores"], ["probs"], axis=-1),
        h.make_node("MatMul", ["probs", "v"], ["attn"]),
        h.make_node("EyeLike", ["ones"], ["eye"], name="identity"),
        h.make_node("Add", ["scores", "eye"], ["scores_plus_eye"]),
    ]
    shape = ["batch", 2, "seq", d]
    return _model(nodes, [f("q", shape), f("k", shape), f("v", shape)],
                  [f("attn", shape), f("scores_plus_eye", ["batch", 2, "seq", "seq"])], inits,
                  name="causal_attention")


def main() -> None:
    for name, build in [("causal_attention", causal_attention)]:
        path = os.path.join(HERE, f"{name}.onnx")
        onnx.save(build(), path)
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
