"""ONNX <-> Graph: import (with shape inference) and export to the `dml` or portable `onnx` target.

`dml`: each DmlNode becomes a `com.dmlgraph` node (schemas registered so the checker accepts them);
`onnx`: the same node as standard ops, the spec's pseudocode in int64, so any runtime runs it and
no mask is stored. The node's inputs and attributes: docs/internals.md, io/onnx_io.py.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any, Mapping, cast

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dmlgraph.errors import DmlgraphError, ModelError, UnsupportedError
from dmlgraph.io import portable, shape_inference
from dmlgraph.ir.dtypes import DmlDataType
from dmlgraph.ir.graph import DmlNode, Graph, ModelInfo, OnnxNode, Value, gc_paused

INT64_MAX = 2**63 - 1
MAX_ELEMENTS = 2**32 - 1  # DML_BUFFER_TENSOR_DESC's limit

DOMAIN = "com.dmlgraph"
DOMAIN_VERSION = 1
_T_ALL = ["tensor(float)", "tensor(float16)", "tensor(double)", "tensor(int8)", "tensor(int16)",
          "tensor(int32)", "tensor(int64)", "tensor(uint8)", "tensor(uint16)", "tensor(uint32)",
          "tensor(uint64)", "tensor(bool)"]


def _register_schemas() -> None:
    """Register the custom ops once, so onnx.checker and shape inference accept a `dml` model."""
    if onnx.defs.has("DiagonalMatrix1", DOMAIN):
        return
    P, A = onnx.defs.OpSchema.FormalParameter, onnx.defs.OpSchema.Attribute
    opt = onnx.defs.OpSchema.FormalParameterOption.Optional
    AT = onnx.defs.OpSchema.AttrType
    common_inputs = [P("X", "T", "input (broadcast to the output)", param_option=opt),
                     P("shape", "tensor(int64)", "output sizes, when not static", param_option=opt),
                     P("k", "tensor(int64)", "one int64 added to each bounded end (begin/end) when the node runs: "
                       "Trilu's run-time k, or the part of Begin/End that moves with the sizes (a KV-cache "
                       "mask's past length, computed from shapes with standard ops)", param_option=opt)]
    matrix = P("matrix", "tensor(int64)", "the sizes of the mask the node applies ([H, W], or ending so): Y is then "
               "that mask's band broadcast with X and the output sizes, as the model computed it", param_option=opt)
    outputs = [P("Y", "T", "output")]
    types = [("T", _T_ALL, "DML data types; bool is carried as UINT8")]
    dm1 = onnx.defs.OpSchema(
        "DiagonalMatrix1", DOMAIN, DOMAIN_VERSION,
        "DML_OPERATOR_DIAGONAL_MATRIX1: Y = value where (end >= begin) ^ (x-y >= begin) ^ (x-y < end), "
        "else X (or 0).",
        inputs=common_inputs + [matrix], outputs=outputs, type_constraints=types,
        attributes=[A("begin", AT.INT, "DiagonalFillBegin; absent = unbounded (INT32_MIN)", required=False),
                    A("end", AT.INT, "DiagonalFillEnd; absent = unbounded (INT32_MAX)", required=False),
                    A("value", AT.TENSOR, "Value: one element of the output type"),
                    A("value_data_type", AT.INT, "ValueDataType (DML_TENSOR_DATA_TYPE)"),
                    A("output_shape", AT.INTS, "static output sizes", required=False),
                    A("exact", AT.INT, "1 if the rewrite is bit-exact", required=False),
                    A("rule", AT.STRING, "the dmlgraph rule that made this node", required=False)])
    dm = onnx.defs.OpSchema(
        "DiagonalMatrix", DOMAIN, DOMAIN_VERSION,
        "DML_OPERATOR_DIAGONAL_MATRIX: Y = value if y + offset == x else 0 (value truncated for ints).",
        inputs=common_inputs[1:], outputs=outputs, type_constraints=types,
        attributes=[A("offset", AT.INT, "Offset"),
                    A("value", AT.FLOAT, "Value (a FLOAT)"),
                    A("dtype", AT.INT, "ONNX element type of the output"),
                    A("output_shape", AT.INTS, "static output sizes", required=False),
                    A("rule", AT.STRING, "the dmlgraph rule that made this node", required=False)])
    dm1.set_type_and_shape_inference_function(_infer_output)
    dm.set_type_and_shape_inference_function(_infer_output)
    onnx.defs.register_schema(dm1)
    onnx.defs.register_schema(dm)


def _infer_output(ctx: onnx.shape_inference.InferenceContext) -> None:
    """Y's type: DiagonalMatrix1's X, else its `value` tensor's; DiagonalMatrix's `dtype`. Its shape:
    `output_shape` when static, else unknown dims of the longest of X's rank, the `shape` input's
    length and the `matrix` input's (X broadcasts with the sizes, a claimed node's with its mask's).
    (Inference inside a local function reads no value_info: without this, what reads a DML node
    there has no type and the checker refuses the model; and a Loop that runs no iteration gives its
    scan outputs the body's rank.)"""
    dtype, value = ctx.get_attribute("dtype"), ctx.get_attribute("value")
    shape_at = 0 if dtype is not None else 1  # (DiagonalMatrix has no X: its first input is the shape)
    if dtype is not None:
        elem = dtype.i
    elif ctx.has_input(0) and ctx.get_input_type(0).tensor_type.elem_type:
        elem = ctx.get_input_type(0).tensor_type.elem_type
    else:
        elem = value.t.data_type if value is not None and value.HasField("t") else 0
    if not elem:
        return
    sizes = ctx.get_attribute("output_shape")
    dims: list[int | None] | None = list(sizes.ints) if sizes is not None else None
    if dims is None:  # (the rank only: X's dims are what the export declares, so a model optimized
        # again reads what it read the first time). X broadcasts with the sizes: the longer rank.
        ranks = []
        if ctx.has_input(shape_at):
            given = ctx.get_input_type(shape_at).tensor_type
            ok = given.HasField("shape") and len(given.shape.dim) == 1 and given.shape.dim[0].HasField("dim_value")
            ranks.append(given.shape.dim[0].dim_value if ok else None)
        if shape_at == 1 and ctx.has_input(0):
            x = ctx.get_input_type(0).tensor_type
            ranks.append(len(x.shape.dim) if x.HasField("shape") else None)
        if shape_at == 1 and ctx.has_input(3):  # a claimed node's output broadcasts with its mask's sizes too
            matrix = ctx.get_input_type(3).tensor_type
            ok = matrix.HasField("shape") and len(matrix.shape.dim) == 1 and matrix.shape.dim[0].HasField("dim_value")
            ranks.append(matrix.shape.dim[0].dim_value if ok else None)
        if ranks and None not in ranks:
            dims = [None] * max(cast("list[int]", ranks))
    ctx.set_output_type(0, onnx.helper.make_tensor_type_proto(elem, dims))


_register_schemas()


# ---- import ----------------------------------------------------------------------------------
@gc_paused
def import_model(model: onnx.ModelProto, base_dir: str | None = None,
                 shapes: shape_inference.PendingShapes | None = None) -> Graph:
    """Build a Graph from a loaded model (external data stays unread: `base_dir` locates it).
    `shapes`: the inference of `model` when the caller started it (closed here, as one started
    here is)."""
    opsets = {o.domain or "": o.version for o in model.opset_import}
    info = ModelInfo(
        ir_version=model.ir_version, opset_imports=opsets, producer_name=model.producer_name,
        producer_version=model.producer_version, domain=model.domain, model_version=model.model_version,
        doc_string=model.doc_string, metadata_props=[(p.key, p.value) for p in model.metadata_props],
        graph_name=model.graph.name or "graph", graph_doc_string=model.graph.doc_string,
        functions=list(model.functions), base_dir=base_dir, source=model)
    g = Graph(info)
    try:
        if shapes is None:
            shapes = shape_inference.PendingShapes(model)
            shapes.start()  # (where it can, a child infers while the graph is built)
        return build_graph(g, model, shapes, base_dir)
    finally:
        if shapes is not None:
            shapes.close()


def build_graph(g: Graph, model: onnx.ModelProto, shapes: shape_inference.PendingShapes, base_dir: str | None) -> Graph:
    """The values and nodes of `model`, then their inferred types and shapes (`shapes.value_types()`)."""
    mg = model.graph
    value, values = g.value, g.values
    g.value_info_names = dict.fromkeys(vi.name for vi in mg.value_info)
    for t in mg.initializer:
        v = value(t.name)
        v.initializer, v.base_dir = t, base_dir
        v.elem_type, v.shape = t.data_type, tuple(t.dims[:])
        g.initializers[t.name] = v
    init_names = set(g.initializers)
    g.inputs = [value(i.name) for i in mg.input if i.name not in init_names]
    g.overridable_inputs = [i.name for i in mg.input if i.name in init_names]
    unnamed: list[tuple[Value, str]] = []  # unused outputs: named once every name in the graph is known
    # (The hottest loop of a load: each proto field is read once, a repeated one as a slice: upb's
    # containers have no iterator, and a loop over one ends by raising IndexError, ~1 us.)
    g.reading = []  # (bodies are read once every value of the graph exists: it may be unsorted)
    for i, n in enumerate(mg.node):
        ins = [(values.get(x) or value(x)) if x else None for x in n.input[:]]  # (read: mostly there)
        out_names = n.output[:]
        outs = [value(x) if x else _unnamed(unnamed, f"{n.name or n.op_type}__unused{i}") for x in out_names]
        domain = n.domain
        if domain == DOMAIN:
            g.add_node(_import_dml(n, ins, outs))
        else:
            node = OnnxNode(n.name, n.op_type, ins, outs, n.attribute[:], domain, n.doc_string, n)
            g.add_node(node)
            node.rewired = "" in out_names  # an unused output got a name above
    for v, hint in unnamed:
        v.name = g.fresh_value(hint).name  # (a free name: the unused output takes its place)
        g.values[v.name] = v
    for node in g.finish_reading():
        read_bodies(g, node)
    g.outputs = [value(o.name) for o in mg.output]
    # Declared graph inputs/outputs win over inferred shapes; inferred ones fill the rest; an
    # initializer's own type and dims win over both.
    for name, et, shape in shapes.value_types():
        v = value(name)
        v.elem_type = et or v.elem_type
        if shape is not None and v.shape is None:
            v.shape = shape
    types: dict[bytes, tuple] = {}  # most values share a few types: decode each once
    for vi in mg.value_info:
        _annotate(value(vi.name), vi, False, types)
    for vi in list(mg.input) + list(mg.output):
        if vi.name not in g.initializers:
            _annotate(value(vi.name), vi, True, types)
    for name, shape in shape_inference.input_dims(model).items():  # (as inference saw them)
        value(name).shape = shape
    _check_defined(g)
    _check_dml_types(g)
    return g


def read_bodies(g: Graph, node: OnnxNode) -> None:
    """Read `node`'s GRAPH attributes (If/Loop/Scan bodies) as Graphs nested in `g`, and link them."""
    node.bodies = {a.name: _read_body(a.g, node, g) for a in node.attributes if a.type == onnx.AttributeProto.GRAPH}
    g.link_bodies(node)


def set_bodies(g: Graph, node: OnnxNode, attributes: list[onnx.AttributeProto]) -> None:
    """Give `node` these attributes (its bodies lowered, written as protos) and their bodies read as Graphs."""
    bodies = {a.name: _read_body(a.g, node, g) for a in attributes if a.type == onnx.AttributeProto.GRAPH}
    g.set_bodies(node, attributes, bodies)


def _read_body(proto: onnx.GraphProto, holder: OnnxNode, parent: Graph) -> Graph:
    """A body as a Graph (onnx-ir's scope stack): a name it does not define itself is the enclosing
    scope's Value (an edge), else a value of its own that nothing defines. Untyped: the passes and
    the executor type a body from its holder (`rewrite.nested`)."""
    b = Graph(parent.info, holder, parent, proto)
    # (each repeated field read once, as a slice: `build_graph` says why)
    inputs, initializers, nodes = proto.input[:], proto.initializer[:], proto.node[:]
    own = {vi.name for vi in inputs} if inputs else set()
    for n in nodes:
        own.update(n.output[:])
    if initializers or len(proto.sparse_initializer):
        own.update(t.name for t in initializers)
        own.update(t.values.name for t in proto.sparse_initializer)
    value, values, find = b.value, b.values, parent.find
    for t in initializers:
        v = value(t.name)
        v.initializer, v.base_dir = t, parent.info.base_dir
        v.elem_type, v.shape = t.data_type, tuple(t.dims[:])
        b.initializers[t.name] = v
    b.inputs = [value(vi.name) for vi in inputs if vi.name not in b.initializers]
    b.reading = []
    for n in nodes:
        ins = [None if not x else (values.get(x) or value(x)) if x in own else (find(x) or value(x))
               for x in n.input[:]]
        outs = [value(x) if x else Value("") for x in n.output[:]]
        node: DmlNode | OnnxNode | None = None
        if n.domain == DOMAIN:
            try:
                node = _import_dml(n, ins, outs)
            except ModelError:  # (kept as read: running it says why it cannot run, as lowering it does)
                node = None
        b.add_node(node or OnnxNode(n.name, n.op_type, ins, outs, n.attribute[:], n.domain, n.doc_string, n))
    for h in b.finish_reading():
        read_bodies(b, h)
    b.outputs = [value(o.name) if o.name in own else (find(o.name) or value(o.name)) for o in proto.output[:]]
    return b


def _unnamed(unnamed: list, hint: str) -> Value:
    v = Value("")
    unnamed.append((v, hint))
    return v


def _annotate(v: Value, vi: onnx.ValueInfoProto, override: bool, types: dict[bytes, tuple]) -> None:
    et, shape = shape_inference.type_shape(vi.type, types)
    v.elem_type = et or v.elem_type
    if shape is not None and (override or v.shape is None):
        v.shape = shape


def _check_defined(g: Graph) -> None:
    """Every value read is produced by a node, or is a graph input or an initializer."""
    inputs = {v.name for v in g.inputs}
    for v in g.values.values():
        if v.producer is not None or v.name in g.initializers or v.name in inputs:
            continue
        if v.uses:
            n = min((n for n, _ in v.uses), key=lambda n: n.id)  # the first reader in file order
            raise ModelError(f"node {n.name or n.op_type!r} reads {v.name!r}, which no node, graph input "
                             "or initializer defines", hint="the graph is incomplete; re-export it")
        if g.is_graph_output(v):
            raise ModelError(f"graph output {v.name!r} is not produced by anything")


def _import_dml(n: onnx.NodeProto, ins: list, outs: list) -> DmlNode:
    """A `com.dmlgraph` node as a DmlNode, after checking every field the checker cannot (it knows
    the attributes' kinds, not their meaning): a malformed one is a ModelError naming the field."""
    if n.op_type not in ("DiagonalMatrix1", "DiagonalMatrix"):
        raise ModelError(f"unknown op {DOMAIN}::{n.op_type}", hint="this dmlgraph knows DiagonalMatrix1 and "
                         "DiagonalMatrix")
    label = f"{n.op_type} node {n.name or outs[0].name!r}"

    def bad(field: str, problem: str) -> ModelError:
        return ModelError(f"{label}: {field} {problem}", hint="the node is malformed; make it again with "
                          "dmlgraph optimize from the original model")

    a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
    ins = ins + [None] * (4 - len(ins)) if n.op_type == "DiagonalMatrix1" else [None] + ins + [None] * (3 - len(ins))
    shape = tuple(a["output_shape"]) if "output_shape" in a else None
    if shape is not None and (len(shape) < 2 or min(shape) < 1):
        raise bad("output_shape", f"{list(shape)} is not a matrix shape (2 or more dims, each at least 1)")
    if shape is not None and math.prod(shape) > MAX_ELEMENTS:
        raise bad("output_shape", f"{list(shape)} has {math.prod(shape)} elements, more than a DirectML tensor "
                  f"holds ({MAX_ELEMENTS})")
    if shape is None and ins[0] is None and ins[1] is None:
        raise bad("output_shape", "is missing, and there is no X or shape input to size the output")
    rule = a.get("rule", b"").decode(errors="replace") or None
    if n.op_type == "DiagonalMatrix1":
        t = a["value"]
        elem_type = t.data_type
        _dml_type(elem_type, bad, "value")
        try:
            value = numpy_helper.to_array(t).reshape(-1)
        except Exception as e:  # noqa: BLE001 - undecodable tensor data
            raise bad("value", f"cannot be read: {e}") from None
        if value.size != 1:
            raise bad("value", f"holds {value.size} elements; it must hold exactly one")
        expected = int(DmlDataType.from_onnx(elem_type))
        if a["value_data_type"] != expected:
            raise bad("value_data_type", f"is {a['value_data_type']}, but the value is "
                      f"{TensorProto.DataType.Name(elem_type)} (DML_TENSOR_DATA_TYPE {expected})")
        node = DmlNode(n.name, ins[0], ins[1], ins[2], outs[0], elem_type=elem_type, value=value[0],
                       begin=a.get("begin"), end=a.get("end"), static_shape=shape, exact=bool(a.get("exact", 1)),
                       matrix=ins[3], claimed=True)  # (the DML export writes a matrix only where it is claimed)
    else:
        elem_type = a["dtype"]
        _dml_type(elem_type, bad, "dtype")
        dt = helper.tensor_dtype_to_np_dtype(elem_type)
        offset = a["offset"]
        if offset >= INT64_MAX:
            raise bad("offset", f"{offset} leaves no room for the end of its diagonal (offset + 1) in int64")
        v = a["value"]
        if not np.issubdtype(dt, np.floating) and dt != np.bool_:
            info = np.iinfo(dt)
            if not math.isfinite(v) or not info.min <= math.trunc(v) <= info.max:
                raise bad("value", f"{v} does not fit the output type {dt} (truncated toward zero)")
            v = math.trunc(v)
        node = DmlNode(n.name, None, ins[1], ins[2], outs[0], elem_type=elem_type, value=dt.type(v),
                       begin=offset, end=offset + 1, static_shape=shape, kind="DiagonalMatrix")
    node.rule = rule
    return node


def _dml_type(elem_type: int, bad: Callable[[str, str], ModelError], field: str) -> None:
    """`elem_type` must be an ONNX type DirectML has (bool is carried as UINT8)."""
    try:
        DmlDataType.from_onnx(elem_type)
    except DmlgraphError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else "unknown"
        raise bad(field, f"has element type {elem_type} ({name}), which is not a DirectML data type") from None


def _check_dml_types(g: Graph) -> None:
    """DirectML requires ValueDataType to equal the output's type, and X the output's type: a DML
    node whose declared output (or X) has another element type is malformed."""
    for n in g.nodes.values():
        if not isinstance(n, DmlNode):
            continue
        for what, v in (("output", n.outputs[0]), ("input X", n.inputs[0])):
            if v is not None and v.elem_type and v.elem_type != n.elem_type:
                field = "value" if n.kind == "DiagonalMatrix1" else "dtype"
                raise ModelError(f"{n.kind} node {n.name or n.outputs[0].name!r}: {field} is "
                                 f"{TensorProto.DataType.Name(n.elem_type)}, but its {what} {v.name!r} is "
                                 f"{_type_name(v.elem_type)}; DirectML needs them equal",
                                 hint="the node is malformed; make it again with dmlgraph optimize from the "
                                 "original model")


def _type_name(elem_type: int) -> str:
    return TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else str(elem_type)


# ---- export ----------------------------------------------------------------------------------
@gc_paused
def export_model(g: Graph, target: str = "dml", exact_only: bool = False, body: bool = False) -> onnx.ModelProto:
    """A ModelProto for `g`: `dml` keeps DML nodes as custom ops, `onnx` writes standard ops only
    (`exact_only`: only bit-exact portable forms, as `--exact`; see `portable.build`). `body`: `g`
    is a body (`rewrite.nested`): new names also avoid `g.reserved` (its scopes')."""
    if target not in ("dml", "onnx"):
        raise UnsupportedError(f"unknown export target {target!r}", hint="use --target dml or --target onnx")
    # Filled in place, as helper.make_graph + make_model would: make_model copies the graph, which
    # for inline weights is one more copy of all of them (and a node list extended into the graph
    # is one more copy of every node).
    if target == "dml":  # (the sizes a portable band may read; a DML node reads them only where claimed)
        hinted = [n for n in g.nodes.values() if isinstance(n, DmlNode) and n.matrix is not None and not n.claimed]
        for n in hinted:
            g.drop_matrix(n)
        if hinted:
            g.remove_dead()
    model = onnx.ModelProto()
    opsets = dict(g.info.opset_imports)
    written = _write_nodes(g, target, opsets.get("", 0), model.graph.node, exact_only, body)
    functions = list(g.info.functions)
    dml_functions = [i for i, f in enumerate(functions) if has_dml_nodes(f.node)]
    if target == "onnx":
        for i in dml_functions:
            functions[i] = portable_function(functions[i], opsets.get("", 0), exact_only)
    if written.dml_outputs or (target == "dml" and (written.nested_dml or dml_functions)):
        opsets[DOMAIN] = DOMAIN_VERSION
    elif target == "onnx":
        opsets.pop(DOMAIN, None)
    _write_graph(g, model.graph, written)
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in sorted(opsets.items()))
    # Only the fields the source set: an optional field set to its default is still written, and
    # an optimize that changes nothing must give back a file no bigger than its input.
    for field, value in (("ir_version", g.info.ir_version), ("producer_name", g.info.producer_name),
                         ("producer_version", g.info.producer_version), ("domain", g.info.domain),
                         ("model_version", g.info.model_version), ("doc_string", g.info.doc_string)):
        if value:
            setattr(model, field, value)
    for k, prop in g.info.metadata_props:
        model.metadata_props.add(key=k, value=prop)
    model.functions.extend(functions)
    return model


class _Written:
    """What writing the nodes found: the DML outputs to annotate, the portable forms' constants."""

    def __init__(self) -> None:
        self.dml_outputs: list[Value] = []
        self.nested_dml = False  # a DML node inside an If/Loop/Scan body (or a function) needs the domain too
        self.initializers: list[onnx.TensorProto] = []
        self.value_info: list[onnx.ValueInfoProto] = []  # the portable bands' declared dims (`portable.declared_tail`)


def _write_nodes(g: Graph, target: str, opset: int, nodes: Any, exact_only: bool, body: bool = False) -> _Written:
    """`g`'s nodes in topological order into `nodes` (a graph's repeated node field)."""
    out = _Written()
    # Calls of functions holding DML nodes: onnx's inference cannot type their outputs (as a DML
    # node's), so those are written down too.
    hosted = dml_function_keys(g.info.functions) if target == "dml" and g.info.functions else set()
    order = g.topological_order()
    names = _NameSet.of_graph(g, order, body) if target == "onnx" else None
    shared: dict[tuple, str] = {}  # the portable forms' constants, one initializer each
    for n in order:
        if isinstance(n, OnnxNode):
            proto = onnx_node_proto(n)
            if n.attributes and n.has_subgraph and has_dml(proto.attribute):
                out.nested_dml = True
                if target == "onnx":
                    proto = portable_node(proto, opset, exact_only, n.bodies)
            elif hosted and (proto.domain, proto.op_type, proto.overload) in hosted:
                out.dml_outputs.extend(n.outputs)
            nodes.append(proto)
        else:
            assert isinstance(n, DmlNode)  # (a graph's nodes are ONNX or DML nodes)
            if target == "dml":
                dml_node_proto(n, nodes.add())
                out.dml_outputs.append(n.outputs[0])
            else:
                assert names is not None  # (made for target onnx)
                nodes.extend(portable_nodes(g, n, opset, names, shared, out.initializers, exact_only,
                                            None if body else out.value_info))
    return out


def _write_graph(g: Graph, graph: onnx.GraphProto, written: _Written) -> None:
    """The graph's name, inputs, outputs, initializers and value_info (its nodes are written)."""
    initializers = []
    for v in g.initializers.values():
        if v.initializer is not None:
            initializers.append(v.initializer)
        else:
            initializers.append(numpy_helper.from_array(np.asarray(v.array), v.name))
    initializers += written.initializers
    # The source's value_info (in its order), then each DML node's output: a custom DML node has no
    # shape inference, so its output's type and shape are written down (the portable form is
    # standard ops that onnx infers itself). Optimizing the output again writes the same list.
    annotated = [g.values.get(name) for name in g.value_info_names]
    annotated += [v for v in written.dml_outputs if v.name not in g.value_info_names]
    graph.name = g.info.graph_name
    for v in g.inputs:
        value_info(v, graph.input.add())
    for name in g.overridable_inputs:
        if name in g.initializers:
            value_info(g.initializers[name], graph.input.add())
    for v in g.outputs:
        value_info(v, graph.output.add())
    graph.initializer.extend(initializers)
    for a in annotated:
        if a is not None and a.producer is not None and a.producer.id in g.nodes and a.elem_type \
                and not g.is_graph_output(a):
            value_info(a, graph.value_info.add())
    graph.value_info.extend(written.value_info)
    if g.info.graph_doc_string:
        graph.doc_string = g.info.graph_doc_string


# ---- DML nodes inside bodies and functions ---------------------------------------------------------
def graphs_of(attributes: Iterable[onnx.AttributeProto]) -> list[onnx.GraphProto]:
    """The bodies (GRAPH and GRAPHS attributes) among a node's attributes."""
    graphs: list[onnx.GraphProto] = []
    for a in attributes:
        if a.type == onnx.AttributeProto.GRAPH:
            graphs.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(a.graphs[:])
    return graphs


def has_dml_nodes(nodes: Iterable[onnx.NodeProto]) -> bool:
    """Whether these NodeProtos, or the bodies of their If/Loop/Scan nodes, hold a DML node."""
    return any(n.domain == DOMAIN or (n.attribute and has_dml(n.attribute)) for n in nodes)


def dml_function_keys(functions: list[onnx.FunctionProto]) -> set[tuple[str, str, str]]:
    """(domain, name, overload) of the local functions that hold DML nodes, or call one that does."""
    found = {(f.domain, f.name, f.overload) for f in functions if has_dml_nodes(f.node)}
    grew = bool(found)
    while grew:  # their callers, to a fixed point
        grew = False
        for f in functions:
            key = (f.domain, f.name, f.overload)
            if key not in found and any((n.domain, n.op_type, n.overload) in found for n in _all_protos(f.node)):
                found.add(key)
                grew = True
    return found


def _all_protos(nodes: Iterable[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """NodeProtos and those of their bodies, at any depth."""
    out: list[onnx.NodeProto] = []
    for n in nodes:
        out.append(n)
        if n.attribute:
            for body in graphs_of(n.attribute):
                out.extend(_all_protos(body.node))
    return out


def has_dml(attributes: Iterable[onnx.AttributeProto]) -> bool:
    """Whether the bodies among these attributes hold a DML node (at any depth)."""
    return any(has_dml_nodes(g.node) for g in graphs_of(attributes))


def _portable_protos(nodes: Iterable[onnx.NodeProto], opset: int, exact_only: bool) -> list[onnx.NodeProto]:
    """`nodes` with every DML node written as standard ops (`portable_nodes`), bodies included."""
    out: list[onnx.NodeProto] = []
    names = _NameSet.of_protos(nodes)
    for n in nodes:
        if n.domain == DOMAIN:
            dml = _import_dml(n, [Value(x) if x else None for x in n.input], [Value(x) for x in n.output])
            out.extend(portable_nodes(None, dml, opset, names, exact_only=exact_only))  # (it reads the node, not the graph)
        elif n.attribute and has_dml(n.attribute):
            out.append(portable_node(n, opset, exact_only))
        else:
            out.append(n)
    return out


def portable_node(node: onnx.NodeProto, opset: int, exact_only: bool,
                  bodies: Mapping[str, Graph] | None = None) -> onnx.NodeProto:
    """An If/Loop/Scan node whose bodies hold DML nodes, with those written as standard ops (whose
    outputs, as in the main graph's portable export, onnx's inference types: no value_info): a body
    Graph's own portable form where its lowering made one (`Graph.portable`: written from the typed
    copy the rules ran on, so with the same proofs as the main graph, its constants initializers of
    the body), else each DML node without its graph (constants as Constant nodes)."""
    proto = onnx.NodeProto()
    proto.CopyFrom(node)
    for a in proto.attribute:
        made_for = bodies.get(a.name) if bodies and a.type == onnx.AttributeProto.GRAPH else None
        written = made_for.portable_source() if made_for is not None else None
        if written is not None:
            a.g.CopyFrom(written)
            continue
        for body in graphs_of([a]):
            if has_dml_nodes(body.node):
                made = {o for n in body.node if n.domain == DOMAIN for o in n.output}
                nodes = _portable_protos(body.node, opset, exact_only)
                infos = [vi for vi in body.value_info if vi.name not in made]
                del body.node[:], body.value_info[:]
                body.node.extend(nodes)
                body.value_info.extend(infos)
    return proto


def portable_function(f: onnx.FunctionProto, opset: int, exact_only: bool) -> onnx.FunctionProto:
    """A model-local function with its DML nodes written as standard ops (and no DML opset)."""
    proto = onnx.FunctionProto()
    proto.CopyFrom(f)
    made = {o for n in f.node if n.domain == DOMAIN for o in n.output}
    del proto.node[:], proto.value_info[:]
    proto.node.extend(_portable_protos(f.node, opset, exact_only))
    proto.value_info.extend(vi for vi in f.value_info if vi.name not in made)
    imports = [o for o in proto.opset_import if o.domain != DOMAIN]
    if not any(o.domain in ("", "ai.onnx") for o in imports):
        imports.append(helper.make_opsetid("", opset))
    del proto.opset_import[:]
    proto.opset_import.extend(imports)
    return proto


def onnx_node_proto(n: OnnxNode) -> onnx.NodeProto:
    if n.source is not None:  # as read, fields dmlgraph does not model included
        if not n.rewired:
            return n.source  # (and ~4x cheaper than helper.make_node)
        proto = onnx.NodeProto()
        proto.CopyFrom(n.source)
        del proto.input[:], proto.output[:]
        proto.input.extend(_name(v) for v in n.inputs)
        proto.output.extend(v.name for v in n.outputs)
        return proto
    proto = helper.make_node(n.op_type, [_name(v) for v in n.inputs], [v.name for v in n.outputs],
                             name=n.name or None, domain=n.domain or None, doc_string=n.doc_string or None)
    proto.attribute.extend(n.attributes)
    return proto


def value_info(v: Value, into: onnx.ValueInfoProto | None = None) -> onnx.ValueInfoProto:
    """The ValueInfo of `v` (filled into `into`, an empty one, when given: one in the graph being
    written, which saves a copy). Shape inference's invented `unk__N` dim names are written as
    unknown dims: they are numbered per run, so keeping them would make the same graph export
    differently."""
    proto = onnx.ValueInfoProto() if into is None else into
    proto.name = v.name
    proto.type.CopyFrom(_type_proto(v.elem_type or 0, None if v.shape is None else tuple(v.shape)))
    return proto


@functools.lru_cache(maxsize=4096)  # most values of a model share a few types: each is built once
def _type_proto(elem_type: int, shape: tuple | None) -> onnx.TypeProto:
    """(Shared: callers copy it, never change it.)"""
    dims = None if shape is None else [None if isinstance(d, str) and d.startswith("unk__") else d for d in shape]
    return helper.make_tensor_type_proto(elem_type, dims)


def _name(v: Value | None) -> str:
    return "" if v is None else v.name


def _trim(names: list[str]) -> list[str]:
    while names and not names[-1]:
        names.pop()
    return names


def dml_node_proto(n: DmlNode, into: onnx.NodeProto | None = None) -> onnx.NodeProto:
    """The NodeProto of `n` (filled into `into`, an empty one, when given: one in the graph being
    written, which saves a copy of the node)."""
    # A model's DML nodes share a few attribute sets (one per mask kind): each is built once, in a
    # node that is copied whole (one C call instead of one per attribute). The value's bytes tell
    # apart values that compare equal, or print the same, but are stored differently (-0.0 and
    # 0.0; NaNs with other payloads).
    value = np.asarray(n.value)
    key = (n.kind, n.elem_type, value.dtype.str, value.tobytes(), n.begin, n.end, n.static_shape, n.rule, n.exact)
    template = _DML_TEMPLATES.get(key)
    if template is None:
        if len(_DML_TEMPLATES) > 256:
            _DML_TEMPLATES.clear()
        template = _DML_TEMPLATES[key] = onnx.NodeProto(op_type=n.kind, domain=DOMAIN, attribute=_dml_attributes(n))
    proto = onnx.NodeProto() if into is None else into
    proto.CopyFrom(template)
    ins = n.operands[1:] if n.kind == "DiagonalMatrix" else n.operands + ((n.matrix,) if n.claimed else ())
    proto.input.extend(_trim([_name(v) for v in ins]))
    proto.output.append(n.outputs[0].name)
    if n.name:
        proto.name = n.name
    return proto


_DML_TEMPLATES: dict[tuple, onnx.NodeProto] = {}


def _dml_attributes(n: DmlNode) -> tuple[onnx.AttributeProto, ...]:
    """A DML node's attributes, in the order `helper.make_node` writes them (by name)."""
    common: dict[str, Any] = {}
    if n.static_shape is not None:
        common["output_shape"] = list(n.static_shape)
    if n.rule:
        common["rule"] = n.rule
    if n.kind == "DiagonalMatrix":
        node = helper.make_node(n.kind, [], [], offset=n.begin, value=float(n.value), dtype=n.elem_type, **common)
    else:
        value = numpy_helper.from_array(np.array([n.value], dtype=helper.tensor_dtype_to_np_dtype(n.elem_type)))
        value.data_type = n.elem_type
        bounds: dict[str, Any] = {k: v for k, v in (("begin", n.begin), ("end", n.end)) if v is not None}
        if not n.exact:
            bounds["exact"] = 0  # (absent: 1, as import reads it; 12 bytes a node saved)
        node = helper.make_node(n.kind, [], [], value=value, **bounds,
                                value_data_type=int(DmlDataType.from_onnx(n.elem_type)), **common)
    return tuple(node.attribute)


class _NameSet:
    """Every value name in the exported model, and fresh ones that collide with none of them.

    Taken: the main graph's inputs, outputs and initializers, every name a live node reads or
    writes, and every name inside its subgraphs and the model's function bodies (a subgraph may
    read an outer name, and a generated name must not shadow one it defines). Names of nodes a
    rewrite removed are free again, so optimizing a portable export again reproduces its names.
    """

    def __init__(self, taken: set[str], scoped: Graph | None = None) -> None:
        self.taken = taken
        self.scoped = scoped

    @classmethod
    def of_graph(cls, g: Graph, nodes: list, body: bool = False) -> "_NameSet":
        """(`body`: `g` is a body: a new name must not name a value of its enclosing
        scopes (`g.reserved.encloses`), and is asked of `g.values` too, which a `body_reuse`
        template records; the other bodies' names are free, as the body's removed ones.)"""
        taken = {v.name for v in g.inputs} | {v.name for v in g.outputs} | set(g.initializers)
        for n in nodes:
            taken.update(v.name for v in n.inputs if v is not None)
            taken.update(v.name for v in n.outputs)
            if isinstance(n, OnnxNode):
                for sub in graphs_of(n.attributes):
                    _graph_names(sub, taken)
                for b in n.bodies.values():  # (the constants of a body's portable form)
                    written = b.portable_source()
                    if written is not None:
                        _graph_names(written, taken)
        for f in g.info.functions:
            taken.update(f.input)
            taken.update(f.output)
            for fn in f.node:
                _node_names(fn, taken)
        return cls(taken, g if body else None)

    @classmethod
    def of_protos(cls, nodes: Iterable[onnx.NodeProto]) -> "_NameSet":
        """The names of a body's nodes (and their subgraphs)."""
        taken: set[str] = set()
        for n in nodes:
            _node_names(n, taken)
        return cls(taken)

    def fresh(self, hint: str) -> str:
        name, i = hint, 0
        while name in self.taken or self.scoped is not None and self._scoped(name):
            i += 1
            name = f"{hint}__{i}"
        self.taken.add(name)
        return name

    def _scoped(self, name: str) -> bool:
        g = cast(Graph, self.scoped)
        g.values.__contains__(name)  # (asked, not heeded: a removed node's name is free, as in the main graph)
        encloses = getattr(g.reserved, "encloses", None)  # (`nested.enclosing.EnclosingNames`: the enclosing scopes' values)
        return bool(encloses(name)) if encloses is not None else False


def _graph_names(gp: onnx.GraphProto, out: set[str]) -> None:
    out.update(v.name for v in gp.input)
    out.update(v.name for v in gp.output)
    out.update(v.name for v in gp.value_info)
    out.update(t.name for t in gp.initializer)
    out.update(t.values.name for t in gp.sparse_initializer)
    for n in gp.node:
        _node_names(n, out)


def _node_names(n: onnx.NodeProto, out: set[str]) -> None:
    out.update(n.input)
    out.update(n.output)
    for sub in graphs_of(n.attribute):
        _graph_names(sub, out)


PORTABLE_MIN_OPSET = 13  # the oldest default-domain opset the portable forms are written in (Trilu: 14)


def portable_nodes(g: Graph | None, n: DmlNode, opset: int, names: "_NameSet",
                   shared: dict[tuple, str] | None = None,
                   initializers: list[onnx.TensorProto] | None = None, exact_only: bool = False,
                   declared: list[onnx.ValueInfoProto] | None = None) -> list[onnx.NodeProto]:
    """Standard ops computing exactly what the DML node computes: the Trilu-first form
    (`dmlgraph.io.portable`) where one is bit-exact, else the spec pseudocode in int64.
    `shared`/`initializers`: the export's shared constants (new ones are appended as initializers);
    without them (in a body) constants are Constant nodes. `declared`: the main graph's value_info,
    for the bands whose dims the model declares. Sets `n.portable_form` and
    `n.portable_nodes` (mask part, whole site: `portable.MASK`)."""
    if opset < PORTABLE_MIN_OPSET:
        raise UnsupportedError(f"the portable target needs default-domain opset {PORTABLE_MIN_OPSET} or later; the model "
                               f"uses {opset}", hint="use --target dml, or convert the model with "
                               "onnx.version_converter first")
    out = n.outputs[0].name
    em = portable.Emitter(names, f"{out}__dm", shared if initializers is not None else None)
    em.declare = declared is not None
    made = portable.build(g, n, em, opset, exact_only)
    rank = None if n.outputs[0].shape is None else len(n.outputs[0].shape)
    n.portable_form = portable.form(em.nodes if made is not None else None, rank)
    if made is None:
        pseudo = _Pseudocode(n, names, f"{out}__dm")
        nodes = pseudo.nodes()
        n.portable_nodes, n.portable_exact = pseudo.counts(), True
        return nodes
    n.portable_nodes, n.portable_exact = em.counts(), not em.inexact
    assert em.nodes and em.nodes[-1].output[0] == made, "a form ends with the node making its output"
    em.nodes[-1].output[0] = out
    em.commit()
    if initializers is not None:
        initializers.extend(em.initializers)
    if declared is not None:
        declared.extend(vi for vi in em.value_info if vi.name != out)
    return em.nodes


def portable_is_exact(n: DmlNode, opset: int, exact_only: bool) -> bool:
    """Whether a DML node in a body or function (written as `_portable_protos` writes it, without its
    graph) gets a bit-exact portable form: builds it aside, changing nothing."""
    em = portable.Emitter(_NameSet(set()), "dry", None)
    return portable.build(None, n, em, opset, exact_only) is None or not em.inexact


def site_nodes(g: Graph, exact_only: bool = False) -> dict[str, list[onnx.NodeProto]]:
    """Per DML node of `g` (by output name): the standard nodes the portable export writes for it."""
    names = _NameSet.of_graph(g, g.topological_order())
    opset = g.info.opset_imports.get("", 0)
    return {n.outputs[0].name: portable_nodes(g, n, opset, names, {}, [], exact_only)
            for n in g.topological_order() if isinstance(n, DmlNode)}


class _Pseudocode:
    """The spec's pseudocode of a DML node in int64 standard ops (where no Trilu form is exact):
    useValue = (End >= Begin) ^ (topX >= Begin) ^ (topX < End), then a bit-exact select."""

    def __init__(self, n: DmlNode, names: "_NameSet", prefix: str) -> None:
        self.n, self.names, self.p = n, names, prefix
        self.out: list[onnx.NodeProto] = []
        self.clipped_k: str | None = None  # made once per node: both bounds of an inverted band shift by it
        self.sizes = 0  # nodes of size plumbing and constants (`portable.MASK`: counted in neither part)
        self.select = 0  # nodes of the select applying the band to the data

    def counts(self) -> tuple[int, int]:
        """(mask part, whole site), as `portable.Emitter.counts` (the select: its bit-exact nodes)."""
        site = len(self.out) - self.sizes
        return site - self.select, site

    def const(self, name: str, arr: Any) -> str:
        fresh = self.names.fresh(f"{self.p}_{name}")
        self.out.append(helper.make_node("Constant", [], [fresh], value=numpy_helper.from_array(np.asarray(arr), fresh)))
        self.sizes += 1
        return fresh

    def op(self, op_type: str, ins: list[str], name: str, size: bool = False, **attrs: Any) -> str:
        fresh = self.names.fresh(f"{self.p}_{name}")
        self.out.append(helper.make_node(op_type, ins, [fresh], **attrs))
        self.sizes += size
        return fresh

    def shift(self, b: int, name: str) -> str:
        """A bound as an int64 scalar, shifted by the run-time k (clipped: no int64 overflow)."""
        c = self.const(name, np.array(b, np.int64))
        k = self.n.inputs[2]
        if k is None:
            return c
        if self.clipped_k is None:
            self.clipped_k = self.op("Clip", [k.name, self.const("kmin", np.array(-2**40, np.int64)),
                                              self.const("kmax", np.array(2**40, np.int64))], "kc", size=True)
        return self.op("Add", [c, self.clipped_k], f"{name}_k", size=True)

    def shape_name(self) -> str:
        x, shape, _ = self.n.operands
        if shape is not None:
            return shape.name
        if self.n.static_shape is not None:
            return self.const("shape", np.array(self.n.static_shape, dtype=np.int64))
        assert x is not None  # (import refuses a generator with neither a shape input nor output_shape)
        return self.op("Shape", [x.name], "shape", size=True)

    def top_x(self, shape_name: str) -> str:
        """topX = col - row over the output's last two sizes ([H, W], int64)."""
        op, const = self.op, self.const
        zero, one = const("zero", np.array(0, np.int64)), const("one", np.array(1, np.int64))
        h = op("Squeeze", [op("Slice", [shape_name, const("m2", [-2]), const("m1", [-1])], "h1", size=True)], "h",
               size=True)
        w = op("Squeeze", [op("Slice", [shape_name, const("m1b", [-1]), const("big", [2**62])], "w1", size=True)],
               "w", size=True)
        rows = op("Unsqueeze", [op("Range", [zero, h, one], "rows"), const("ax1", [1])], "rows_col")
        return op("Sub", [op("Range", [zero, w, one], "cols"), rows], "topx")

    def use_value(self, top_x: str) -> str:
        """useValue, each term written as a Less and whether it is negated; an unbounded end makes
        its terms `true` (one negation each), so no constant is needed for them."""
        n, op = self.n, self.op
        begin = None if n.begin is None else self.shift(n.begin, "begin")
        end = None if n.end is None else self.shift(n.end, "end")
        terms: list[str] = []
        negations = 0
        if begin is not None and end is not None:
            terms.append(op("Less", [end, begin], "end_lt_begin"))  # End >= Begin: not (End < Begin)
        negations += 1
        if begin is not None:
            terms.append(op("Less", [top_x, begin], "lt_begin"))  # topX >= Begin: not (topX < Begin)
        negations += 1
        if end is not None:
            terms.append(op("Less", [top_x, end], "lt_end"))
        else:
            negations += 1
        if not terms:
            return self.const("all", np.array(True))
        use = terms[0]
        for t in terms[1:]:
            use = op("Xor", [use, t], "use")
        return op("Not", [use], "use") if negations % 2 else use

    def nodes(self) -> list[onnx.NodeProto]:
        n = self.n
        x, shape, _ = n.operands
        shape_name = self.shape_name()
        claimed = n.matrix if n.claimed else None  # (the band of its mask's sizes, broadcast by the select)
        use = self.use_value(self.top_x(shape_name if claimed is None else claimed.name))
        np_dt = helper.tensor_dtype_to_np_dtype(n.elem_type)
        value_arr = np.array(n.value, dtype=np_dt)
        value = self.const("value", value_arr)
        other = x.name if x is not None else self.const("other", np.zeros((), np_dt))
        if x is not None and (shape is not None or n.static_shape is not None):
            # x broadcast to the output first: the select then has the output's shape (no Expand after
            # it), and re-optimizing the portable model finds the selection again, a fixed point.
            other = self.op("Expand", [x.name, shape_name], "input")
        before, sizes = len(self.out), self.sizes
        result = _portable_select(use, value, value_arr, other, n.elem_type, self.op, self.const,
                                  other_is_data=x is not None)
        if x is not None:
            self.select = len(self.out) - before - (self.sizes - sizes)
            # The output is shaped like the (broadcast) input and the selection already broadcast `use`
            # ([H, W]) to it, so an Expand would be a no-op; leaving it out also keeps re-optimizing a
            # portable model from stacking one more Expand per round.
            self.out[-1].output[0] = n.outputs[0].name
            return self.out
        self.out.append(helper.make_node("Expand", [result, shape_name], [n.outputs[0].name]))
        return self.out


# onnxruntime's CPU Where lacks these; each is widened losslessly and narrowed back.
_WHERE_WIDEN: dict[int, int] = {TensorProto.INT16: TensorProto.INT32, TensorProto.UINT16: TensorProto.INT32,
                TensorProto.UINT64: TensorProto.INT64}


def _portable_select(use: str, value: str, value_arr: np.ndarray, other: str, elem_type: int, op: Callable[..., str],
                     const: Callable[[str, Any], str],
                     other_is_data: bool = True) -> str:
    """`value` where `use`, else `other`, with every bit of both kept.

    onnxruntime's Where is not a pure selection for floats: a -0.0 can come out +0.0 (from the
    true branch always, from the false branch too when the other branch is a broadcast scalar),
    and for float16 it rewrites every NaN payload. So floats are selected by pure data movement:
    GatherElements from [other, value] stacked on a new leading axis, indexed by `use` as 0/1,
    which copies whichever bits it picks. Integer types, for which every path of Where is exact,
    keep the one Where, and so does a generator (`other` is +0) whose value is neither -0.0 nor
    a NaN: no bit Where could change is there.
    """
    if elem_type == TensorProto.BOOL:
        # Where has no bool kernel in onnxruntime: (use and value) or (not use and other).
        return op("Or", [op("And", [use, value], "pick_v"),
                         op("And", [op("Not", [use], "not_use"), other], "pick_o")], "sel")
    plain_constants = not other_is_data and not (value_arr == 0 and np.signbit(value_arr)) and not np.isnan(value_arr)
    if value_arr.dtype.kind != "f" or plain_constants:
        wide = _WHERE_WIDEN.get(elem_type)
        if wide is None:
            return op("Where", [use, value, other], "sel")
        sel = op("Where", [use, op("Cast", [value], "value_w", to=wide), op("Cast", [other], "other_w", to=wide)],
                 "sel_w")
        return op("Cast", [sel], "sel", to=elem_type)
    other_full = op("Expand", [other, op("Shape", [use], "use_shape")], "other_full")  # the output's shape
    out_shape = op("Shape", [other_full], "out_shape")
    axis0 = const("axis0", [0])
    stacked = op("Concat", [op("Unsqueeze", [other_full, axis0], "other_1"),
                            op("Unsqueeze", [op("Expand", [value, out_shape], "value_full"), axis0], "value_1")],
                 "stacked", axis=0)
    index = op("Cast", [op("Expand", [use, out_shape], "use_full")], "index", to=TensorProto.INT64)
    picked = op("GatherElements", [stacked, op("Unsqueeze", [index, axis0], "index_1")], "picked", axis=0)
    return op("Squeeze", [picked, axis0], "sel")
