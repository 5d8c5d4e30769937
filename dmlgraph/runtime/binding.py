"""Bind a DmlNode template to concrete shapes: the operator desc a DML runtime would compile.

Leading axes are batch axes for DIAGONAL_MATRIX1, so axes that are contiguous in every tensor are
merged (a reshape: only sizes and strides change) until the rank fits 2..4, and a small rank is
padded with leading 1s where the feature level needs 4 dims (DIAGONAL_MATRIX below 4_0).
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import cast

import numpy as np
from onnx import helper

from dmlgraph.errors import DmlgraphError
from dmlgraph.ir.dtypes import DmlDataType, ScalarUnion
from dmlgraph.ir.graph import DmlNode
from dmlgraph.ir.ops import DIAGONAL_MATRIX_SUPPORT, DiagonalMatrix1Desc, DiagonalMatrixDesc, FeatureLevel, bind_range
from dmlgraph.ir.tensor import BufferTensorDesc, DescError, packed_strides, view


def broadcast_strides(x_shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides that view a packed tensor of `x_shape` as `out_shape` (0 = broadcast)."""
    x_shape = (1,) * (len(out_shape) - len(x_shape)) + tuple(x_shape)
    packed = packed_strides(x_shape)
    return tuple(0 if xs != os_ else st for xs, os_, st in zip(x_shape, out_shape, packed))


def fold_axes(sizes: Iterable[int], strides_list: Iterable[Iterable[int]],
              max_rank: int = 4) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Merge adjacent batch axes that are contiguous in every tensor; keep the last two axes."""
    sizes = list(sizes)
    strides: list[list[int]] = [list(s) for s in strides_list]
    i = len(sizes) - 4  # try merging batch axes pairwise, from the innermost batch pair outwards
    while len(sizes) > max_rank and i >= 0:
        if all(s[i] == s[i + 1] * sizes[i + 1] for s in strides):
            sizes[i:i + 2] = [sizes[i] * sizes[i + 1]]
            for s in strides:
                s[i:i + 2] = [s[i + 1]]
        i -= 1
    if len(sizes) > max_rank:
        # Contiguity failed somewhere: batch axes of size 1 can always go.
        keep = [j for j in range(len(sizes) - 2) if sizes[j] != 1] + [len(sizes) - 2, len(sizes) - 1]
        sizes = [sizes[j] for j in keep]
        strides = [[s[j] for j in keep] for s in strides]
    return tuple(sizes), [tuple(s) for s in strides]


def min_rank(node: DmlNode, level: FeatureLevel) -> int:
    if node.kind == "DiagonalMatrix":
        for lvl, dims, _ in DIAGONAL_MATRIX_SUPPORT:
            if level >= lvl:
                return dims.start
    return 2


def node_desc(node: DmlNode, out_shape: Iterable[int], x_shape: Sequence[int] | None = None, k: int = 0,
              level: FeatureLevel = FeatureLevel.L5_1) -> DiagonalMatrix1Desc | DiagonalMatrixDesc:
    """The validated desc of `node` at these shapes. Raises DescError with the rule broken."""
    out_shape = tuple(int(s) for s in out_shape)
    if len(out_shape) < 2:
        raise DescError(f"output has rank {len(out_shape)}; DIAGONAL_MATRIX1 needs at least 2 dims")
    dtype = DmlDataType.from_onnx(node.elem_type)
    tensors = [packed_strides(out_shape)]
    if node.inputs[0] is not None:
        tensors.append(broadcast_strides(x_shape if x_shape is not None else out_shape, out_shape))
    sizes, strides = fold_axes(out_shape, tensors)
    pad = max(0, min_rank(node, level) - len(sizes))
    sizes = (1,) * pad + sizes
    strides = [(0,) * pad + s for s in strides]
    out_desc = BufferTensorDesc(dtype, sizes, None if strides[0] == packed_strides(sizes) else strides[0])
    height, width = out_shape[-2:]
    desc: DiagonalMatrix1Desc | DiagonalMatrixDesc
    if node.kind == "DiagonalMatrix":  # its begin is the offset, never None (onnx_io, passes/eyelike)
        desc = DiagonalMatrixDesc(out_desc, cast(int, node.begin), float(node.value))
    else:
        begin, end = bind_range(node.begin, node.end, k, height, width)
        in_desc = None if len(strides) < 2 else BufferTensorDesc(dtype, sizes, strides[1])
        value = node.value.item() if isinstance(node.value, np.generic) else node.value
        desc = DiagonalMatrix1Desc(out_desc, ScalarUnion.of(value, dtype), begin, end, in_desc)
    desc.validate(level)
    return desc


_DECLINE_CACHE: dict[tuple, str | None] = {}
_DECLINE_CACHE_MAX = 4096


def decline_reason(node: DmlNode, rank: int | None, level: FeatureLevel,
                   static_shape: tuple[int, ...] | None = None) -> str | None:
    """Why `node` cannot be lowered at `level` (checked on its static shape, else on 1s of its rank).

    Memoized on everything the check reads (a model's per-layer copies of one mask ask the same
    question thousands of times, and building the validated descs is the costly part). A value
    that is not a plain scalar is checked every time; an exception is never memoized.
    """
    value = node.value
    if not isinstance(value, (bool, int, float, np.generic)):
        return _decline_reason(node, rank, level, static_shape)
    bits = value.tobytes() if isinstance(value, np.generic) else \
        struct.pack("<d", value) if isinstance(value, float) else value  # bits: NaN payloads, -0.0
    key = (node.kind, node.elem_type, node.begin, node.end, node.inputs[0] is not None,
           type(value), bits, rank, level, static_shape)
    if key not in _DECLINE_CACHE:
        if len(_DECLINE_CACHE) >= _DECLINE_CACHE_MAX:
            _DECLINE_CACHE.clear()
        _DECLINE_CACHE[key] = _decline_reason(node, rank, level, static_shape)
    return _DECLINE_CACHE[key]


def _decline_reason(node: DmlNode, rank: int | None, level: FeatureLevel,
                    static_shape: tuple[int, ...] | None) -> str | None:
    try:
        DmlDataType.from_onnx(node.elem_type)
    except Exception:  # noqa: BLE001 - any failure means the same: no DirectML type
        return f"type {helper.tensor_dtype_to_string(node.elem_type)} has no DirectML data type"
    if static_shape is not None and 0 in static_shape:
        return f"shape {list(static_shape)} has a zero-size dimension, which DirectML cannot hold"
    if static_shape is not None and max(static_shape[-2:], default=0) > 2**31 - 1:
        return f"shape {list(static_shape)}: a matrix side beyond 2^31-1 does not fit INT32 fill bounds"
    shape = static_shape or ((1,) * rank if rank is not None else None)
    if shape is None:
        return "the output rank is unknown"
    try:
        node_desc(node, shape, shape, 0, level)
    except DescError as e:
        return str(e)
    return None


def run_desc(desc: DiagonalMatrix1Desc | DiagonalMatrixDesc, output_buffer: np.ndarray,
             input_buffer: np.ndarray | None = None) -> np.ndarray:
    """Run a DiagonalMatrix1Desc or DiagonalMatrixDesc on flat (C-contiguous) buffers.

    The buffers are seen through the descs' sizes and strides (`dmlgraph.ir.tensor.view`), so a
    zero-stride input broadcasts and a padded output keeps its padding bytes untouched.
    Returns the output view.
    """
    from dmlgraph.runtime import kernels  # (the rules import this module to bind descs, which runs none)
    if isinstance(desc, DiagonalMatrixDesc):
        desc.validate()
        if input_buffer is not None:
            raise DmlgraphError("DIAGONAL_MATRIX has no input tensor, but an input buffer was given")
        o = _output_view(output_buffer, desc.output)
        return kernels.diagonal_matrix(desc.output.sizes, o.dtype, desc.offset, desc.value, out=o)
    if not isinstance(desc, DiagonalMatrix1Desc):
        raise DmlgraphError(f"run_desc runs DIAGONAL_MATRIX1 or DIAGONAL_MATRIX descs, not {type(desc).__name__}")
    desc.validate()
    if (desc.input is None) != (input_buffer is None):
        raise DmlgraphError("DIAGONAL_MATRIX1 input buffer given without an InputTensor desc"
                            if desc.input is None else
                            "DIAGONAL_MATRIX1 desc has an InputTensor but no input buffer was given")
    o = _output_view(output_buffer, desc.output)
    s = None if desc.input is None else view(cast(np.ndarray, input_buffer), desc.input)  # given: checked above
    return kernels.diagonal_matrix1(desc.output.sizes, o.dtype, desc.value.numpy_value, desc.begin, desc.end,
                            input=s, out=o)


def _output_view(buffer: np.ndarray, desc: BufferTensorDesc) -> np.ndarray:
    o = view(buffer, desc)
    if not o.flags.writeable:
        raise DmlgraphError(f"OutputTensor strides {list(desc.effective_strides)} alias elements "
                            "(a zero stride): an output cannot broadcast")
    return o
