"""The corpus of real exported models (models/*.onnx, expected lowering in models/expected.json).

For every band tensor the corpus lists, the lowered model must make it with DIAGONAL_MATRIX1
(directly, or fused into the node that applies it), with the same values at a real size; no stored
mask byte may remain; and validation against onnxruntime must pass at two sequence lengths.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dmlgraph import pipeline
from dmlgraph.ir.graph import DmlNode
from dmlgraph.ir.ops import bind_range
from dmlgraph.rewrite import Options
from dmlgraph.runtime import kernels
from dmlgraph.runtime.executor import initializer_array

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
with open(os.path.join(MODELS, "expected.json")) as f:
    EXPECTED = json.load(f)["models"]
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def expected_array(entry) -> np.ndarray | None:
    """The expected band at the corpus' recorded size (None for applications: they have an input)."""
    if str(entry["other"]).startswith("input:"):
        return None
    shape = entry["shape_at_len7"]
    dtype = np.dtype(entry["dtype"])
    value = dtype.type(float(entry["value"]))
    h, w = shape[-2:]
    b, e = bind_range(entry["begin"], entry["end"], 0, h, w)
    other = np.broadcast_to(np.asarray(float(entry["other"]), dtype), shape)
    return kernels.diagonal_matrix1(shape, dtype, value, b, e, input=other)


def lowered(entry):
    _, g = pipeline.load(os.path.join(MODELS, entry["file"]))
    result = pipeline.optimize_graph(g, Options())
    return g, result


@pytest.mark.parametrize("entry", EXPECTED, ids=[e["file"] for e in EXPECTED])
def test_every_band_tensor_is_lowered(entry):
    g, result = lowered(entry)
    dml = [n for n in g.nodes.values() if isinstance(n, DmlNode)]
    if not entry["masks"]:
        assert not dml, "a model without bands must not get DML nodes"
        return
    assert dml
    for mask in entry["masks"]:
        name = mask["onnx_nodes_or_initializer"]
        if mask["kind"] == "stored_mask":
            assert name not in g.initializers, f"stored mask {name} is still stored"
            v = g.values.get(name)
            assert v is None or v.producer is None or not v.uses or isinstance(v.producer, DmlNode) or \
                v.producer.op_type != "Constant", f"stored mask {name} is still a Constant"
            continue
        v = g.values.get(name)
        if v is not None and v.producer is not None and v.producer.id in g.nodes:
            node = v.producer
            assert isinstance(node, DmlNode), f"{name} ({mask['kind']}) is still made by {node.op_type}"
            if mask["kind"] == "mask_application":
                assert node.inputs[0] is not None and pipeline.bitwise_equal(
                    np.asarray(node.value), np.asarray(node.value).dtype.type(float(mask["value"])))
        # else: the band was fused into the node applying it (checked through that node's entry)


@pytest.mark.parametrize("entry", [e for e in EXPECTED if e["masks"]], ids=lambda e: e["file"])
def test_generators_reproduce_the_expected_band(entry):
    g, _ = lowered(entry)
    for mask in entry["masks"]:
        expected = expected_array(mask)
        v = g.values.get(mask["onnx_nodes_or_initializer"])
        if expected is None or v is None or not isinstance(v.producer, DmlNode) or v.producer.id not in g.nodes:
            continue
        node = v.producer
        x = node.inputs[0]
        other = np.zeros((), expected.dtype) if x is None else np.asarray(
            initializer_array(x), expected.dtype).reshape(())
        h, w = expected.shape[-2:]
        b, e = bind_range(node.begin, node.end, 0, h, w)
        got = kernels.diagonal_matrix1(expected.shape, expected.dtype, node.value, b, e,
                                       input=np.broadcast_to(other, expected.shape))
        assert pipeline.bitwise_equal(got, expected), mask["onnx_nodes_or_initializer"]


@pytest.mark.parametrize("entry", EXPECTED, ids=[e["file"] for e in EXPECTED])
def test_validates_against_onnxruntime_at_two_lengths(entry):
    path = os.path.join(MODELS, entry["file"])
    dynamic = entry.get("dynamic_axes") or []
    for size in (7, 12):
        report = pipeline.validate(path, dims={d: (2 if d == "batch" else size) for d in dynamic}).report
        assert report["ok"], [r for r in report["tensors"] + report["outputs"] if not r["match"]]
        for row in report["tensors"]:
            assert row["detail"] in ("bit-exact", "equal values (signed zeros or NaN payloads differ)")
        if not dynamic:
            break
