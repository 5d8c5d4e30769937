"""Clean-up of an exported model: common subexpressions merged, unused nodes and initializers dropped.

The work is onnx-ir's (`onnx_ir.passes.common`: `CommonSubexpressionEliminationPass`,
`RemoveUnusedNodesPass`), kept and tested upstream, run on a copy of the graph whose initializers
are stubs (name, type, dims: no data), so no weight is read or copied; the cleaned node list then
replaces the model's, and initializers and value_info entries nothing reads any more are dropped.

Why a pass at all: a lowered site's size plumbing (Shape/Gather/Concat of the same tensors) is
merged with what the model already has only where the rules could see it, and a portable form that
reads the padding mask directly leaves the node that turned it into a fill value unread; exporters
write the same Shape read several times (the dynamo exporter's `Shape(attention_mask)` twice).
Nodes with subgraphs and non-deterministic ops are never merged (onnx-ir's rules).
"""
from __future__ import annotations

import onnx
from onnx import numpy_helper


def _stub(t: onnx.TensorProto) -> onnx.TensorProto:
    return onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims)


SMALL = 64  # elements: the index and size constants exporters and the rules each write their own copy of


def _merge_small_initializers(g: onnx.GraphProto) -> bool:
    """Small initializers holding the same tensor read through one name (the main graph's nodes only;
    one a body or a caller can override, or a body reads, keeps its name): onnx-ir's CSE matches
    inputs by identity, so Gather(shape, idx2) and Gather(shape, dmlgraph__axis2) merge only then."""
    fixed = {i.name for i in g.input} | {o.name for o in g.output}
    for n in g.node:
        for a in n.attribute:
            for body in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs[:] if a.type ==
                         onnx.AttributeProto.GRAPHS else []):
                fixed.update(_names(body))
    first: dict[tuple, str] = {}
    rename: dict[str, str] = {}
    for t in g.initializer:
        if t.name in fixed or t.data_location == onnx.TensorProto.EXTERNAL or t.data_type == onnx.TensorProto.STRING:
            continue
        size = 1
        for d in t.dims:
            size *= d
        if size > SMALL:
            continue
        key = (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes())
        if key in first:
            rename[t.name] = first[key]
        else:
            first[key] = t.name
    if not rename:
        return False
    for n in g.node:
        for i, x in enumerate(n.input):
            if x in rename:
                n.input[i] = rename[x]
    return True


def _names(body: onnx.GraphProto) -> set[str]:
    out = {x for n in body.node for x in n.input}
    for n in body.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out |= _names(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for b in a.graphs:
                    out |= _names(b)
    return out


def cleanup(model: onnx.ModelProto) -> bool:
    """Merge common subexpressions and drop what nothing reads, in `model` (in place).
    Returns whether anything changed. The graph's inputs, outputs and their names stay."""
    import onnx_ir as ir
    from onnx_ir.passes.common import CommonSubexpressionEliminationPass, RemoveUnusedNodesPass

    g = model.graph
    if g.sparse_initializer:
        return False  # (left as they are: onnx-ir's stub copy below carries dense initializers only)
    merged = _merge_small_initializers(g)
    light = onnx.ModelProto(ir_version=model.ir_version)
    light.opset_import.extend(model.opset_import)
    lg = light.graph
    lg.name = g.name
    lg.input.extend(g.input)
    lg.output.extend(g.output)
    lg.node.extend(g.node)
    lg.initializer.extend(_stub(t) for t in g.initializer)
    light.functions.extend(model.functions)
    m = ir.from_proto(light)
    changed = CommonSubexpressionEliminationPass()(m).modified
    changed = RemoveUnusedNodesPass()(m).modified or changed
    if not changed and not merged:
        return False
    out = ir.to_proto(m).graph
    keep_init = {t.name for t in out.initializer}
    del g.node[:]
    g.node.extend(out.node)
    kept = [t for t in g.initializer if t.name in keep_init]
    if len(kept) != len(g.initializer):
        inits = list(kept)
        del g.initializer[:]
        g.initializer.extend(inits)
    produced = {o for n in g.node for o in n.output}
    infos = [vi for vi in g.value_info if vi.name in produced]
    if len(infos) != len(g.value_info):
        del g.value_info[:]
        g.value_info.extend(infos)
    return True
