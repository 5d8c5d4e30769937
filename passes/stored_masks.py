"""`stored_mask`: an initializer or Constant whose every [..., H, W] slice is one band pattern
(band analysis decides, exactly) becomes a generator; the constant leaves the model. Two-valued
masks {a, b} with b != 0 keep b as a one-element input broadcast by zero strides.

A constant no bigger than the node replacing it stays, unless every reader is an application that
absorbs the band (`apply.absorbed`): a 48-64 byte band applied by a Where or an And still goes, with
its application, into one node."""
from __future__ import annotations

from typing import cast

import numpy as np
from onnx import TensorProto, helper

from dmlgraph.io.modelfile import RAW_ITEMSIZE
from dmlgraph.ir.band import two_valued_matrix
from dmlgraph.ir.graph import DmlNode, Node, Value
from dmlgraph.passes.apply import absorbed
from dmlgraph.passes.common import const_value, lowering_reason, standin
from dmlgraph.passes.generators import band_of, generator, node_bytes, pattern_bounds
from dmlgraph.passes.sizes import Made
from dmlgraph.rewrite import Context, Match, Replacement, Rule
from dmlgraph.runtime.onnx_runner import numpy_dtype


def _match_stored(ctx: Context, item: Value | Node) -> Match | None:
    graph, options = ctx.graph, ctx.options
    if isinstance(item, Value):
        value = item
        if item.shape is None or len(item.shape) < 2 or item.elem_type in (None, TensorProto.STRING):
            return None
        m = Match("stored_mask", [], initializers=[item.name])
    else:
        if item.domain not in ("", "ai.onnx") or not item.outputs:
            return None
        value = item.outputs[0]
        m = Match("stored_mask", [item])
    if graph.is_graph_output(value) and not value.uses:
        return None  # a constant output is data, not a mask; keep it as is
    if isinstance(item, Value) and first_row_varies(item):
        return None  # (most initializers are weights: turned away before they are decoded)
    arr = const_value(graph, value)
    if arr is None or arr.ndim < 2:
        return None
    p = band_of(np.asarray(arr))
    if p is None:
        if not two_valued_matrix(np.asarray(arr)):
            return None
        # (the mask census counts it as a mask: say why it stays. ProphetNet's n-gram bias, [2, 256,
        # 512]: per stream a shifted triangle beside a diagonal, a different pattern in each slice)
        m.reason = "a stored two-valued matrix whose [..., H, W] slices are not all one band pattern"
        return m
    elem_type = value.elem_type or helper.np_dtype_to_tensor_dtype(arr.dtype)
    dml = DmlNode(f"{value.name}__gen", None, None, None, standin(value, elem_type), elem_type=elem_type, value=p.value,
                  begin=pattern_bounds(p)[0], end=pattern_bounds(p)[1], static_shape=arr.shape)
    m.dml = dml
    m.captures.update(pattern=p, nbytes=int(arr.nbytes))
    m.reason = lowering_reason(dml, arr.shape, options)
    threshold = options.min_mask_bytes if options.min_mask_bytes is not None else node_bytes(graph, dml)
    if m.reason is None and arr.nbytes <= threshold:
        # A tiny band read only by applications is worth it all the same: each application takes it
        # into its own DIAGONAL_MATRIX1, so the constant and the Where/And go, and no generator stays.
        into = None if options.min_mask_bytes is not None else \
            absorbed(graph, value, dml, np.asarray(p.other, dml_dtype(dml)).reshape(()), options)
        if into is None:
            m.reason = f"the constant ({arr.nbytes} bytes) is not bigger than the node replacing it ({threshold} bytes)"
        else:
            m.captures["absorbed_by"] = into
    return m


def dml_dtype(node: DmlNode) -> np.dtype:
    return numpy_dtype(node.elem_type)


def first_row_varies(v: Value, head: int = 16) -> bool:
    """True when the first row of an inline initializer's first matrix changes value more than
    twice in its first `head` elements, read from its raw bytes: no band does that (`analyze_band`
    makes the same test, bit for bit, after decoding)."""
    t = v.initializer
    size = RAW_ITEMSIZE.get(t.data_type) if t is not None and v.array is None else None
    if size is None or t is None or not t.HasField("raw_data") or t.data_location == TensorProto.EXTERNAL:
        return False
    n = min(cast("tuple[int, ...]", v.shape)[-1], head)  # (an initializer's dims are all static)
    row = t.raw_data[:n * size]
    if len(row) < n * size:
        return False  # (load_model refuses short data; left to the full read)
    items = [row[i:i + size] for i in range(0, n * size, size)]
    return sum(a != b for a, b in zip(items, items[1:])) > 2


def _rewrite_stored(ctx: Context, m: Match) -> Replacement:
    graph = ctx.graph
    proto = m.dml
    assert proto is not None, "the match made its DmlNode"
    value = proto.outputs[0]
    made = Made()
    node = generator(ctx, m.captures["pattern"], proto.elem_type, proto.name, value, None,
                     proto.static_shape, made)
    old = cast(Value, graph.find(value.name)) if m.initializers else m.nodes[0].outputs[0]
    return Replacement(nodes=[node], initializers=made.initializers, replaces=[(old, node.outputs[0])],
                       removes=list(m.nodes))


def _stored_candidates(ctx: Context) -> list[Value | Node]:
    """What `_match_stored` looks at, in the order the anchors offer it: stored constants of 2 or
    more dims (most stored constants of a model are scalars and vectors, offered in vain), then
    Constant nodes."""
    graph = ctx.graph
    stored = [*graph.initializers.values(), *(v for v in graph.free_values().values() if graph.stored(v))]
    return [*(v for v in stored if v.shape is not None and len(v.shape) >= 2),
            *graph.by_op.get("Constant", {}).values()]


STORED_MASK = Rule("stored_mask", ("Initializer", "Constant"), _match_stored, _rewrite_stored,
                   exact="bit-exact", candidates=_stored_candidates,
                   description="constant band mask -> DIAGONAL_MATRIX1 generator (the constant leaves the model)")
