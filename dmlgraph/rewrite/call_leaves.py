"""New formal inputs for what a local function's calls read but do not pass (issue 26).

A function given `p = Gather(Shape(past_key), 2)` by its caller, `past_key` no argument, sees `p` as
an unknown input. Where every call computes `p` alike from the same main-graph inputs (the *leaves*
of its cone), the function takes those as new formals and each call passes them. This module finds
the calls and edits them; nested/functions.py decides when (docs/internals.md, "rewrite/call_leaves.py").
"""
from __future__ import annotations

import collections
from typing import Iterable

import onnx

from dmlgraph.io.onnx_io import graphs_of, set_bodies
from dmlgraph.ir.graph import Graph, OnnxNode

FunctionKey = tuple[str, str, str]  # domain, name, overload
STANDARD = ("", "ai.onnx")


def proto_call_key(n: onnx.NodeProto) -> FunctionKey:
    return n.domain, n.op_type, n.overload


def call_key(n: OnnxNode) -> FunctionKey:
    return n.domain, n.op_type, n.source.overload if n.source is not None else ""


def _body_calls(nodes: Iterable[onnx.NodeProto], keys: set[FunctionKey]) -> Iterable[FunctionKey]:
    """The key of each call in `nodes` and their bodies."""
    for n in nodes:
        if n.domain not in STANDARD and proto_call_key(n) in keys:
            yield proto_call_key(n)
        for body in graphs_of(n.attribute):
            yield from _body_calls(body.node, keys)


def count_calls(g: Graph, functions: list[onnx.FunctionProto]) -> collections.Counter:
    """How many calls each local function has in the whole model (main graph, bodies, functions):
    a leaf is given only where every call was traced."""
    keys = {(f.domain, f.name, f.overload) for f in functions}
    counts: collections.Counter = collections.Counter()
    for n in g.nodes.values():
        if n.__class__ is not OnnxNode:
            continue
        assert isinstance(n, OnnxNode)
        if n.domain not in STANDARD and call_key(n) in keys:
            counts[call_key(n)] += 1
        for body in graphs_of(n.attributes):
            counts.update(_body_calls(body.node, keys))
    for f in functions:
        counts.update(_body_calls(f.node, keys))
    return counts


def pass_leaves(g: Graph, key: FunctionKey, n_formals: int, leaves: list[str]) -> int:
    """Append `leaves` (main-graph inputs of `g`) as arguments to every call of `key` in `g` and
    its bodies, after its `n_formals` arguments (absent trailing ones written as ''). Returns the
    number of calls edited."""
    edited = 0
    values = [g.values[name] for name in leaves]
    for n in list(g.nodes.values()):
        if n.__class__ is not OnnxNode:
            continue
        assert isinstance(n, OnnxNode)
        if n.domain not in STANDARD and call_key(n) == key:
            n.inputs += [None] * (n_formals - len(n.inputs))
            for v in values:
                v.uses[n, len(n.inputs)] = None
                n.inputs.append(v)
            n.rewired = True
            g.changes.append(n)
            edited += 1
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attributes):
            attributes = [_copy(a) for a in n.attributes]
            count = sum(_edit(body, key, n_formals, leaves) for a in attributes for body in graphs_of([a]))
            if count:
                set_bodies(g, n, attributes)
                edited += count
    return edited


def _copy(a: onnx.AttributeProto) -> onnx.AttributeProto:
    new = onnx.AttributeProto()
    new.CopyFrom(a)
    return new


def _edit(body: onnx.GraphProto, key: FunctionKey, n_formals: int, leaves: list[str]) -> int:
    edited = 0
    for n in body.node:
        if n.domain not in STANDARD and proto_call_key(n) == key:
            n.input.extend([""] * (n_formals - len(n.input)))
            n.input.extend(leaves)
            edited += 1
        for sub in graphs_of(n.attribute):
            edited += _edit(sub, key, n_formals, leaves)
    return edited
