"""Clean-up of an exported model: common subexpressions merged, unused nodes and initializers dropped.

The work is onnx-ir's (`CommonSubexpressionEliminationPass`, `RemoveUnusedNodesPass`), run on a copy
whose initializers are stubs (no weight is read or copied); the cleaned node list replaces the
model's. Why it is needed and what it never merges: docs/internals.md, "io/cleanup.py".
"""
from __future__ import annotations

from collections.abc import Iterator

import onnx


def _stub(t: onnx.TensorProto) -> onnx.TensorProto:
    return onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims)


def cleanup(model: onnx.ModelProto) -> bool:
    """Merge common subexpressions and drop what nothing reads, in `model` (in place).
    Returns whether anything changed. The graph's inputs, outputs and their names stay."""
    import onnx_ir as ir
    from onnx_ir.passes.common import CommonSubexpressionEliminationPass, RemoveUnusedNodesPass

    g = model.graph
    if g.sparse_initializer:
        return False  # (left as they are: onnx-ir's stub copy below carries dense initializers only)
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
    if not changed:
        return False
    out = ir.to_proto(m).graph
    _restore_trailing_empty_inputs(g, out)
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


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for n in graph.node:
        yield n
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                        a.graphs if a.type == onnx.AttributeProto.GRAPHS else []):
                yield from _nodes(sub)


def _restore_trailing_empty_inputs(before: onnx.GraphProto, after: onnx.GraphProto) -> None:
    """Put back the empty trailing inputs onnx-ir's RemoveUnusedNodesPass drops from every node it
    sees: `Loop(M, "")` must keep its empty `cond` (the checker wants two inputs)."""
    width = {tuple(n.output): len(n.input) for n in _nodes(before) if n.input and not n.input[-1]}
    for n in _nodes(after):
        missing = width.get(tuple(n.output), 0) - len(n.input)
        if missing > 0:
            n.input.extend([""] * missing)
