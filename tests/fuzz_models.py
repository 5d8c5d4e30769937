"""Seeded mutations of valid ONNX models, for the reliability fuzz test (tests/test_reliability.py).

Every mutation is deterministic given its `random.Random`: the same seed gives the same bytes.
Two families:
- byte level: flip a few bytes of the serialized model, or truncate it;
- field level: parse, edit one field the way a broken exporter or a hand edit would (op_type, a
  deleted input or node, dims, elem_type, attribute ints set to extreme values, initializer
  dims/type, opset version), serialize without any check.
"""
from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

EXTREME_INTS = [0, 1, -1, 2, 2**31 - 1, -2**31, 2**31, 2**32, 2**40, 2**62, 2**63 - 1, -2**63]
OP_TYPES = ["Trilu", "EyeLike", "Where", "Add", "Mul", "Range", "Less", "Expand", "Cast", "Foo", "Identity",
            "Shape", "Reshape", "Softmax", "ConstantOfShape", "DiagonalMatrix1", ""]
DOMAINS = ["", "ai.onnx", "com.dmlgraph", "com.example", "ai.onnx.ml"]


# ---- seed models ---------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)


def seed_models() -> dict[str, onnx.ModelProto]:
    """Small valid models that exercise every rule family (each passes onnx.checker)."""
    f = lambda n, s, t=T.FLOAT: h.make_tensor_value_info(n, t, s)
    c = lambda n, a: numpy_helper.from_array(np.asarray(a), n)
    models = {}
    models["trilu_k"] = _model([h.make_node("Trilu", ["x", "k"], ["y"], upper=0, name="tril")],
                               [f("x", ["b", 6, 6])], [f("y", ["b", 6, 6])], [c("k", np.int64(1))])
    models["trilu_upper"] = _model([h.make_node("Trilu", ["x"], ["y"], upper=1)],
                                   [f("x", [2, 3, 5, 7], T.INT32)], [f("y", [2, 3, 5, 7], T.INT32)])
    models["eyelike"] = _model([h.make_node("EyeLike", ["x"], ["y"], k=-1, dtype=T.INT64)],
                               [f("x", [4, 5])], [f("y", [4, 5], T.INT64)])
    mask = np.tril(np.ones((8, 8), np.float32))
    mask = np.where(mask > 0, 0.0, -np.inf).astype(np.float32)
    models["stored_mask"] = _model([h.make_node("Add", ["x", "mask"], ["y"])],
                                   [f("x", [1, 2, 8, 8])], [f("y", [1, 2, 8, 8])], [c("mask", mask)])
    models["range_mask"] = _model([
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "i2"], ["n"], axis=0),
        h.make_node("Range", ["zero", "n", "one"], ["r"]),
        h.make_node("Unsqueeze", ["r", "ax0"], ["row"]),
        h.make_node("Unsqueeze", ["r", "ax1"], ["col"]),
        h.make_node("LessOrEqual", ["row", "col"], ["keep"]),
        h.make_node("Where", ["keep", "x", "ninf"], ["y"]),
    ], [f("x", [1, 2, "s", "s"])], [f("y", [1, 2, "s", "s"])],
        [c("i2", np.int64(2)), c("zero", np.int64(0)), c("one", np.int64(1)),
         c("ax0", np.array([0], np.int64)), c("ax1", np.array([1], np.int64)), c("ninf", np.float32(-np.inf))])
    for m in models.values():
        onnx.checker.check_model(m, full_check=True)
    return models


# ---- mutations -----------------------------------------------------------------------------------
def flip_bytes(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        b[i] = rng.randrange(256) if rng.random() < 0.5 else b[i] ^ (1 << rng.randrange(8))
    return bytes(b)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[:rng.randrange(1, len(data))]


def _any_dims(model):
    """Every TensorShapeProto.Dimension of graph inputs/outputs/value_info."""
    g = model.graph
    return [d for vi in list(g.input) + list(g.output) + list(g.value_info)
            if vi.type.HasField("tensor_type") for d in vi.type.tensor_type.shape.dim]


def _edit_op_type(m, rng):
    n = rng.choice(m.graph.node)
    n.op_type = rng.choice(OP_TYPES)
    if rng.random() < 0.3:
        n.domain = rng.choice(DOMAINS)
        if n.domain not in ("", "ai.onnx") and rng.random() < 0.7:
            m.opset_import.add(domain=n.domain, version=1)
    return f"op_type -> {n.domain}::{n.op_type}"


def _delete_graph_input(m, rng):
    if not m.graph.input:
        return _delete_node(m, rng)
    i = rng.randrange(len(m.graph.input))
    name = m.graph.input[i].name
    del m.graph.input[i]
    return f"deleted graph input {name}"


def _delete_node_input(m, rng):
    n = rng.choice(m.graph.node)
    if not n.input:
        return _edit_op_type(m, rng)
    i = rng.randrange(len(n.input))
    if rng.random() < 0.5:
        del n.input[i]
        return f"deleted input {i} of {n.op_type}"
    n.input[i] = rng.choice(["", "ghost", n.output[0]])
    return f"input {i} of {n.op_type} -> {n.input[i]!r}"


def _delete_node(m, rng):
    i = rng.randrange(len(m.graph.node))
    op = m.graph.node[i].op_type
    del m.graph.node[i]
    return f"deleted node {op}"


def _swap_nodes(m, rng):
    if len(m.graph.node) < 2:
        return _delete_node(m, rng)
    i, j = rng.sample(range(len(m.graph.node)), 2)
    a, b = onnx.NodeProto(), onnx.NodeProto()
    a.CopyFrom(m.graph.node[i])
    b.CopyFrom(m.graph.node[j])
    m.graph.node[i].CopyFrom(b)
    m.graph.node[j].CopyFrom(a)
    return "swapped two nodes"


def _edit_dim(m, rng):
    dims = _any_dims(m)
    if not dims:
        return _edit_elem_type(m, rng)
    d = rng.choice(dims)
    choice = rng.random()
    if choice < 0.15:
        d.dim_param = rng.choice(["s", "n", "", "??"])
    elif choice < 0.25:
        d.Clear()
    else:
        d.dim_value = rng.choice([0, 1, -1, -7, 3, 2**31, 2**40, 70000, 2**62])
    return "edited a dim"


def _edit_rank(m, rng):
    vis = [vi for vi in list(m.graph.input) + list(m.graph.output) if vi.type.HasField("tensor_type")]
    if not vis:
        return _edit_dim(m, rng)
    shape = rng.choice(vis).type.tensor_type.shape
    if shape.dim and rng.random() < 0.5:
        del shape.dim[rng.randrange(len(shape.dim))]
    else:
        shape.dim.add().dim_value = rng.choice([1, 2, 0, 9])
    return "changed a rank"


def _edit_elem_type(m, rng):
    vis = [vi for vi in list(m.graph.input) + list(m.graph.output) if vi.type.HasField("tensor_type")]
    if not vis:
        return _edit_attr(m, rng)
    rng.choice(vis).type.tensor_type.elem_type = rng.choice(list(range(0, 27)) + [99, -1])
    return "edited an elem_type"


def _edit_attr(m, rng):
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes or rng.random() < 0.3:
        n = rng.choice(m.graph.node)
        n.attribute.append(h.make_attribute(rng.choice(["k", "upper", "dtype", "axis", "to"]),
                                            rng.choice(EXTREME_INTS)))
        return f"added an int attribute to {n.op_type}"
    a = rng.choice(rng.choice(nodes).attribute)
    if a.type == onnx.AttributeProto.INT:
        a.i = rng.choice(EXTREME_INTS)
    elif a.type == onnx.AttributeProto.INTS:
        a.ints[:] = [rng.choice(EXTREME_INTS) for _ in range(rng.randint(0, 4))]
    elif a.type == onnx.AttributeProto.TENSOR:
        a.t.data_type = rng.choice([T.FLOAT, T.INT64, T.STRING, T.BFLOAT16, T.BOOL, 0])
    else:
        a.type = onnx.AttributeProto.INT
        a.i = rng.choice(EXTREME_INTS)
    return f"edited attribute {a.name}"


def _edit_initializer(m, rng):
    if not m.graph.initializer:
        return _edit_attr(m, rng)
    t = rng.choice(m.graph.initializer)
    r = rng.random()
    if r < 0.3:
        t.dims[:] = [rng.choice([0, 1, 2, 8, -1, 2**40]) for _ in range(rng.randint(0, 3))]
        return f"initializer {t.name} dims -> {list(t.dims)}"
    if r < 0.6:
        t.data_type = rng.choice(list(range(0, 27)))
        return f"initializer {t.name} type -> {t.data_type}"
    if r < 0.8:
        arr = numpy_helper.to_array(t)
        if arr.size:
            flat = arr.reshape(-1).copy()
            if flat.dtype.kind == "f":
                flat[rng.randrange(flat.size)] = rng.choice([np.nan, np.inf, -np.inf, 1e30, -0.0, 7])
            elif flat.dtype.kind in "iu":
                flat[rng.randrange(flat.size)] = rng.choice([np.iinfo(flat.dtype).max, np.iinfo(flat.dtype).min, 0])
            t.CopyFrom(numpy_helper.from_array(flat.reshape(arr.shape), t.name))
        return f"initializer {t.name} value edited"
    t.raw_data = t.raw_data[: len(t.raw_data) // 2] if t.raw_data else b"\x01"
    return f"initializer {t.name} raw_data truncated"


def _edit_opset(m, rng):
    m.opset_import[0].version = rng.choice([1, 7, 13, 14, 21, 22, 23, 99, 0, -1])
    return f"opset -> {m.opset_import[0].version}"


FIELD_MUTATIONS = [_edit_op_type, _delete_graph_input, _delete_node_input, _delete_node, _swap_nodes,
                   _edit_dim, _edit_rank, _edit_elem_type, _edit_attr, _edit_initializer, _edit_opset]


def mutate(model: onnx.ModelProto, rng: random.Random) -> tuple[bytes, str]:
    """One mutated serialization of `model` and a description of the mutation."""
    data = model.SerializeToString(deterministic=True)
    r = rng.random()
    if r < 0.2:
        return flip_bytes(data, rng), "byte flips"
    if r < 0.3:
        return truncate(data, rng), "truncation"
    m = onnx.ModelProto()
    m.CopyFrom(model)
    what = []
    for _ in range(1 if rng.random() < 0.7 else 2):
        mutation = rng.choice(FIELD_MUTATIONS)
        try:
            what.append(mutation(m, rng))
        except (IndexError, ValueError):  # nothing left to edit (e.g. no nodes): edit the opset instead
            what.append(_edit_opset(m, rng))
    return m.SerializeToString(), "; ".join(what)
