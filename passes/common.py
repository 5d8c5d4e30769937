"""What every rule needs: constant values, scalar attributes-as-inputs, and the lowering check."""
from __future__ import annotations

import functools
from typing import Sequence, cast

import numpy as np
import onnx

from dmlgraph.ir.graph import Dim, DmlNode, Graph, Node, OnnxNode, Value, constant_attribute_value, copied
from dmlgraph.rewrite import Options, Replacement
from dmlgraph.runtime.binding import decline_reason
from dmlgraph.runtime.onnx_runner import initializer_array


def const_value(graph: Graph, v: Value | None) -> np.ndarray | None:
    """The value of an initializer or Constant-node output; None when it is computed at run time.

    An initializer the model also lists as a graph input is a default the caller may override:
    not a constant. An Identity of a constant is that constant (`copied`).
    """
    v = copied(v)
    if v is None or v.name in graph.overridable_inputs:
        return None
    if graph.stored(v):
        return _initializer_value(v)
    p = v.producer
    if isinstance(p, OnnxNode) and p.op_type == "Constant" and p.domain in ("", "ai.onnx"):
        for a in p.attributes:
            arr = constant_attribute_value(a)
            if arr is not None:
                return arr
    return None


def from_constants(graph: Graph, v: Value, limit: int = 256) -> bool:
    """`v` is computed from constants alone (an initializer that is no graph input, a Constant, and
    ops of those: a Gather of a stored table by stored indices), as the mask census counts a
    constant; False past `limit` values (then it is taken for data)."""
    stack, seen = [v], set()
    while stack:
        x = stack.pop()
        if x.name in seen:
            continue
        seen.add(x.name)
        if x.name in graph.overridable_inputs or len(seen) > limit:
            return False
        if graph.stored(x):
            continue
        p = x.producer
        ins = [i for i in p.inputs if i is not None] if isinstance(p, OnnxNode) else []
        if not isinstance(p, OnnxNode) or (not ins and p.op_type != "Constant"):
            return False
        stack.extend(ins)
    return True


def reads_input_values(graph: Graph, v: Value, limit: int = 256) -> bool:
    """`v` is computed from the values (not only the shapes) of a graph input, or of a value no node
    here makes (an enclosing scope's); also True past `limit` values."""
    stack, seen = [v], set()
    while stack:
        x = stack.pop()
        if x.name in seen:
            continue
        seen.add(x.name)
        if len(seen) > limit or x.name in graph.overridable_inputs:
            return True
        p = x.producer
        if graph.stored(x) or (isinstance(p, OnnxNode) and p.op_type in ("Shape", "Size")):
            continue
        if not isinstance(p, (OnnxNode, DmlNode)):
            return True
        stack.extend(i for i in p.inputs if i is not None)
    return False


CACHED_CONSTANT_BYTES = 1 << 16


def _initializer_value(v: Value) -> np.ndarray:
    """`initializer_array`, remembered on the Value for small inline tensors (read-only).

    Rules ask for the same index constants many times per optimize (data-freeness, signatures,
    integer bounds, stored masks), and decoding a TensorProto costs more than the rule's test.
    Keyed on the TensorProto itself, so a replaced initializer is read afresh; big or external
    tensors are not kept (memory stays bounded by the weights' own storage).
    """
    if v.array is not None:
        return v.array
    hit = v.decoded
    if hit is not None and hit[0] is v.initializer:
        return hit[1]
    arr = initializer_array(v)
    if v.initializer is not None and not isinstance(arr, np.memmap) and arr.nbytes <= CACHED_CONSTANT_BYTES:
        arr.setflags(write=False)
        v.decoded = (v.initializer, arr)
    return arr


def int_list(graph: Graph, n: OnnxNode, attribute: str) -> list[int] | None:
    """The ints an op takes as its second input (opset 13 on) or as an attribute before that
    (Split's sizes, Squeeze's and Unsqueeze's axes); None when they are not constants."""
    if len(n.inputs) > 1 and n.inputs[1] is not None:
        arr = const_value(graph, n.inputs[1])
        return None if arr is None else [int(a) for a in np.asarray(arr).reshape(-1)]
    found = n.attr(attribute)
    return None if found is None else [int(a) for a in found]


@functools.cache  # (numpy scalars are immutable: one per type, not one per rewritten node)
def zero_of(elem_type: int) -> np.generic:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).type(0)


@functools.cache
def one_of(elem_type: int) -> np.generic:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).type(1)


def lowering_reason(node: DmlNode, out_shape: Sequence[Dim] | None, options: Options) -> str | None:
    """Why a DML node with this output shape cannot be lowered at the target level (None: it can)."""
    if out_shape is None:
        return "the output rank is unknown (shape inference found no shape)"
    static = cast("tuple[int, ...]", tuple(out_shape)) if all(isinstance(d, int) for d in out_shape) else None
    return decline_reason(node, len(out_shape), options.feature_level, static)


def standin(v: Value, elem_type: int | None = None) -> Value:
    """A detached value for a new node's output that will replace `v` (named after it)."""
    return Value(v.name, elem_type if elem_type is not None else v.elem_type)  # (as `detached`, one call less)


def replace_node(old: Node, new: Node | None, *extra: Node) -> Replacement:
    """`new` (after the `extra` nodes it reads) in place of `old`: its first output replaces
    `old`'s first output (name, uses, graph-output place), and `old` is removed. (`new` is a
    Match's `dml`, which a rule that matched has set.)"""
    assert new is not None, "a rule rewrites only what its match made a node for"
    return Replacement(nodes=[*extra, new], replaces=[(old.outputs[0], new.outputs[0])], removes=[old],
                       exact=not isinstance(new, DmlNode) or new.exact)
