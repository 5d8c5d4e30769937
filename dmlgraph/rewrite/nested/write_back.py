"""A lowered body written back under its attribute: the holder's formal inputs and declared outputs
kept, the extra inputs, borrowed constants and copied cones dropped, on both targets.

Edits the exported graph in place rather than copying fields out of it (a copy per field was a
third of a small body's write-back).
"""
from __future__ import annotations

from typing import Any, Callable

import onnx

from dmlgraph.io.onnx_io import (
    export_model,
    graphs_of,
)
from dmlgraph.ir.graph import free_names
from dmlgraph.rewrite.nested.bodies import Body


def graph_attribute(a: onnx.AttributeProto, bodies: list[onnx.GraphProto]) -> onnx.AttributeProto:
    new = onnx.AttributeProto(name=a.name, type=a.type, doc_string=a.doc_string)
    if a.type == onnx.AttributeProto.GRAPH:
        new.g.CopyFrom(bodies[0])
    else:
        new.graphs.extend(bodies)
    return new


def write_back(body: Body, proto: onnx.GraphProto) -> onnx.GraphProto:
    """The lowered body as a GraphProto for the same attribute: `proto`'s formal inputs, no extra
    inputs, no enclosing constants (edited in the exported graph rather than copied out of it: a
    copy per field was a third of the write-back of a small body)."""
    return _as_body(export_model(body.graph, "dml").graph, body, proto)


def write_back_portable(body: Body, proto: onnx.GraphProto, exact_only: bool) -> onnx.GraphProto | None:
    """The lowered body as the portable target writes it, from the typed copy the rules ran on:
    the same proofs as the main graph's export (a k computed from sizes needs no Clip, a static
    size no Shape), its new constants initializers of the body (ONNX and onnxruntime allow them;
    a Constant node each was a node more)."""
    new = _as_body(export_model(body.graph, "onnx", exact_only, body=True).graph, body, proto)
    _drop_dead(new)
    return new


def _drop_dead(g: onnx.GraphProto) -> None:
    """Delete the nodes nothing reads (the portable nodes of a copied enclosing generator, whose
    last node `_as_body` dropped)."""
    live = {vi.name for vi in g.output}
    dead = []
    for i in reversed(range(len(g.node))):
        n = g.node[i]
        if not any(o in live for o in n.output):
            dead.append(i)
            continue
        live.update(n.input)
        for b in graphs_of(n.attribute):
            live |= free_names(b)
    for i in dead:  # (descending)
        del g.node[i]


def read_names(g: onnx.GraphProto) -> set[str]:
    """The names a graph's nodes (their bodies included) and outputs read."""
    read = {vi.name for vi in g.output}
    for n in g.node:
        read.update(n.input)
        for b in graphs_of(n.attribute):
            read |= free_names(b)
    return read


def _as_body(new: onnx.GraphProto, body: Body, proto: onnx.GraphProto) -> onnx.GraphProto:
    """An exported body's graph edited into the body of `proto`'s attribute (`write_back`)."""
    outer = body.outer
    new.name = proto.name
    new.doc_string = proto.doc_string
    del new.input[:]
    new.input.extend(proto.input)
    declared = {vi.name: vi for vi in proto.output}
    for i, vi in enumerate(new.output):
        if vi.name in declared:
            new.output[i].CopyFrom(declared[vi.name])
    drop_items(new.initializer, lambda t: t.name in outer)
    new.sparse_initializer.extend(proto.sparse_initializer)
    drop_items(new.value_info, lambda vi: vi.name in outer)
    drop_items(new.node, lambda n: all(o in outer for o in n.output))  # (copied generators)
    new.quantization_annotation.extend(proto.quantization_annotation)
    new.metadata_props.extend(proto.metadata_props)
    return new


def drop_items(items: Any, gone: Callable[[Any], bool]) -> None:
    """Delete the items of a repeated proto field that are `gone`, keeping the others' order."""
    for i in reversed([i for i, x in enumerate(items) if gone(x)]):
        del items[i]
