"""The types of a body's formal inputs, from the node that runs it (a Loop's carried values, a Scan's
state and slices), and what changes per iteration.

The rules prove sizes, so a body is lowered only with its inputs typed; dims no node gives are fresh
(`FreshDims`), never guessed.
"""
from __future__ import annotations

import functools
import itertools
from typing import Callable, Iterable

import onnx
from onnx import TensorProto, helper

from dmlgraph.io.modelfile import iter_graphs
from dmlgraph.io.onnx_io import (
    graphs_of,
)
from dmlgraph.io.shape_inference import type_shape
from dmlgraph.ir.graph import Graph, OnnxNode, Value
from dmlgraph.rewrite import body_reuse
from dmlgraph.rewrite.call_leaves import STANDARD
from dmlgraph.rewrite.nested.scopes import scopes

TypeSpec = tuple[int, "tuple | None"]  # ONNX element type, shape (None: unknown rank)
FRESH_PREFIX = body_reuse.FRESH  # `FreshDims`


class FreshDims:
    """Symbolic dims that name nothing else: `unk__dmlgraph_N` (export writes `unk__` dims as
    unknown), skipping every dim the model itself names so (`taken`, asked on the first `new`: a
    model's own `unk__dmlgraph_0` would otherwise be proved equal to a fresh dim)."""

    def __init__(self, taken: Callable[[], set[str]] = set) -> None:
        self._n = itertools.count()
        self._taken_of = taken
        self._taken: set[str] | None = None

    def new(self) -> str:
        if self._taken is None:
            self._taken = self._taken_of()
        while True:
            name = f"{FRESH_PREFIX}{next(self._n)}"
            if name not in self._taken:
                return name

    def fill(self, shape: tuple | None) -> tuple | None:
        """`shape` with every unknown dim given a fresh name."""
        return None if shape is None else tuple(self.new() if d is None else d for d in shape)


def fresh_like_dims(g: Graph, bodies: Iterable[onnx.GraphProto] = ()) -> set[str]:
    """The dims named like fresh ones anywhere in the model `g` is the main graph of (its values',
    its bodies' and functions' declarations at any depth), and in `bodies`."""
    dims = {d for v in g.values.values() if v.shape for d in v.shape if isinstance(d, str) and FRESH_PREFIX in d}
    bodies = itertools.chain((s.proto for s in scopes(g, recursive=False)),
                             (b for f in g.info.functions for n in f.node for b in graphs_of(n.attribute)), bodies)
    infos = [vi for body in bodies for sub, _ in iter_graphs(body)
             for vi in itertools.chain(sub.input, sub.output, sub.value_info)]
    infos += [vi for f in g.info.functions for vi in f.value_info]
    return dims | {d.dim_param for vi in infos for d in vi.type.tensor_type.shape.dim if FRESH_PREFIX in d.dim_param}


def _declared(vi: onnx.ValueInfoProto) -> tuple | None:
    return type_shape(vi.type)[1]


def typed_value_info(name: str, spec: TypeSpec) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto(name=name)
    vi.type.CopyFrom(_tensor_type(*spec))
    return vi


@functools.lru_cache(maxsize=1024)  # (the bodies of a model read values of a few types: each built once)
def _tensor_type(elem_type: int, shape: tuple | None) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(elem_type, None if shape is None else list(shape))


def _state_type(outer: Value | None, declared_in: onnx.ValueInfoProto, declared_out: onnx.ValueInfoProto | None,
                dims: FreshDims, what: str) -> TypeSpec | str:
    """A value carried from one iteration to the next: the initial value's element type; a dim is
    static only where the initial value, the body's declared input and its declared output all give
    the same size (the value may change shape between iterations), else fresh."""
    if outer is None or not outer.elem_type:
        return f"the {what} {declared_in.name!r} has no known type"
    shapes = [outer.shape, _declared(declared_in), None if declared_out is None else _declared(declared_out)]
    rank = {len(s) for s in shapes if s is not None}
    if outer.shape is None or len(rank) != 1:
        return outer.elem_type, None
    given = [s for s in shapes if s is not None]
    known = len(given) == len(shapes)
    return outer.elem_type, tuple(d if known and isinstance(d, int) and all(s[a] == d for s in given) else dims.new()
                                  for a, d in enumerate(outer.shape))


def formal_types(parent: Graph, node: OnnxNode, attr: str, body: onnx.GraphProto,
                 dims: FreshDims) -> list[TypeSpec] | str:
    """The types of a body's formal inputs, from the node that runs it; a reason when they cannot
    be known (or the op's bodies are not lowered)."""
    op = node.op_type if node.domain in STANDARD else f"{node.domain}::{node.op_type}"
    n_in, n_out = len(body.input), len(body.output)
    if op == "If":
        return [] if n_in == 0 else "an If branch takes no inputs, and this one declares some"
    if op == "Loop" and attr == "body":
        carried = len(node.inputs) - 2
        if carried < 0 or n_in != 2 + carried or n_out < 1 + carried:
            return "its inputs and outputs do not match the Loop's"
        types: list[TypeSpec] = [(TensorProto.INT64, ()), (TensorProto.BOOL, ())]
        for i in range(carried):
            t = _state_type(node.inputs[2 + i], body.input[2 + i], body.output[1 + i], dims, "loop-carried value")
            if isinstance(t, str):
                return t
            types.append(t)
        return types
    if op == "Scan" and attr == "body":
        if parent.info.opset_imports.get("", 0) < 9:
            return "Scan before opset 9 (with a batch axis) is not lowered"
        m = node.attr("num_scan_inputs", 0)
        n_state = len(node.inputs) - m
        if m <= 0 or n_state < 0 or n_in != n_state + m or n_out < n_state:
            return "its inputs and outputs do not match the Scan's"
        types = []
        for i in range(n_state):
            t = _state_type(node.inputs[i], body.input[i], body.output[i], dims, "scan state")
            if isinstance(t, str):
                return t
            types.append(t)
        axes = node.attr("scan_input_axes") or [0] * m
        for j in range(m):
            outer = node.inputs[n_state + j]
            if outer is None or not outer.elem_type:
                return f"the scanned input {j} has no known type"
            shape = dims.fill(outer.shape)
            if shape is not None:
                axis = axes[j] + len(shape) if axes[j] < 0 else axes[j]
                shape = shape[:axis] + shape[axis + 1:]
            types.append((outer.elem_type, shape))
        return types
    return f"bodies of {op} are not lowered (If, Loop and Scan bodies are)"
