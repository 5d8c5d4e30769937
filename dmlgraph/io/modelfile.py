"""The only place dmlgraph reads model files (`dmlgraph.io.saving` writes them).

Everything read here is untrusted: a bad file becomes a `ModelError` naming the path, weights are
memory-mapped on demand, external-data locations are validated before anything is opened, and sizes
in the proto are checked before numpy sees them. The full list: docs/internals.md, io/modelfile.py.
Dependencies: onnx, numpy and the standard library only.
"""
from __future__ import annotations

import math
import mmap
import os
import re
import stat
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dmlgraph.errors import ModelError

if TYPE_CHECKING:
    from google.protobuf.message import Message

__all__ = ["RAW_ITEMSIZE", "check_model", "check_model_proto", "checker_failure", "onnxruntime_refuses",
           "data_nbytes", "load_model", "read_tensor", "tensor_nbytes",
           "without_weights"]

# protobuf cannot parse or serialize a message of 2 GiB or more.
PROTOBUF_LIMIT = 2**31 - 1
# More elements than this is not a real model; refusing it keeps every size computation sane.
_MAX_ELEMENTS = 2**40

# Element widths in bits for packed sub-byte types; the other fixed-size types use numpy itemsize.
_PACKED_BITS: dict[int, int] = {
    TensorProto.INT4: 4,
    TensorProto.UINT4: 4,
    TensorProto.FLOAT4E2M1: 4,
    TensorProto.INT2: 2,
    TensorProto.UINT2: 2,
    TensorProto.FLOAT6E2M3: 6,
    TensorProto.FLOAT6E3M2: 6,
}
_KNOWN_TYPES = frozenset(v for _, v in TensorProto.DataType.items()) - {TensorProto.UNDEFINED}
# Types whose raw_data is exactly numpy's little-endian bytes: decoded without onnx's generic path.
_PLAIN_NUMPY: dict[int, np.dtype[Any]] = {t: np.dtype(helper.tensor_dtype_to_np_dtype(t)).newbyteorder("<") for t in (
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL, TensorProto.INT8,
    TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.UINT16,
    TensorProto.UINT32, TensorProto.UINT64)}


# --------------------------------------------------------------------------------------------
# walking a model


def _node_label(node: onnx.NodeProto, index: int) -> str:
    name = f"'{node.name}'" if node.name else f"#{index}"
    return f"node {name} ({node.op_type})"


# Attribute types that hold no tensor and no graph, and that hold no graph (an UNDEFINED type is
# looked at: old files omit it).
_A = onnx.AttributeProto
_PLAIN_ATTRIBUTES = frozenset({_A.INT, _A.FLOAT, _A.STRING, _A.INTS, _A.FLOATS, _A.STRINGS})
_GRAPHLESS_ATTRIBUTES = _PLAIN_ATTRIBUTES | {_A.TENSOR, _A.TENSORS}


def _subgraphs_of(attr: onnx.AttributeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    if attr.HasField("g"):
        yield attr.name, attr.g
    for g in attr.graphs:
        yield attr.name, g


def _subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    for attr in node.attribute:
        yield from _subgraphs_of(attr)


def iter_graphs(graph: onnx.GraphProto, where: str = "") -> Iterator[tuple[onnx.GraphProto, str]]:
    """The graph and every subgraph (If/Loop/Scan bodies), each with a suffix saying where it is."""
    return ((g, w) for g, w, _ in _walk(graph, where, tensors=False))


def iter_tensors(model: onnx.ModelProto, graphs: Iterable[tuple[onnx.GraphProto, str]] | None = None,
                  skip: Callable[[TensorProto], bool] | None = None) -> Iterator[tuple[TensorProto, str, bool]]:
    """Every TensorProto in the model as (tensor, label, is_initializer).

    Covers initializers, sparse initializers and tensor-valued node attributes (Constant) in the
    main graph and all subgraphs: any of them may carry data or point at external data.
    `graphs`: `iter_graphs(model.graph)` when the caller already has it. `skip(tensor)`: tensors it
    accepts are left out before their labels are built (most of a model's tensors, on hot paths).
    """
    walked = _walk(model.graph) if graphs is None else ((g, w, _attribute_tensors(g)) for g, w in graphs)
    for graph, where, found in walked:
        yield from _graph_tensors(graph, where, found, skip)


def _graph_tensors(graph: onnx.GraphProto, where: str, attribute_tensors: list[tuple[TensorProto, int, str]],
                   skip: Callable[[TensorProto], bool] | None) -> Iterator[tuple[TensorProto, str, bool]]:
    """`iter_tensors` of one graph, given its nodes' tensors (`_attribute_tensors`)."""
    keep = (lambda t: True) if skip is None else (lambda t: not skip(t))
    for t in graph.initializer:
        if keep(t):
            yield t, f"initializer '{t.name}'{where}", True
    for sp in graph.sparse_initializer:
        for part, t in (("values", sp.values), ("indices", sp.indices)):
            if keep(t):
                yield t, f"sparse initializer '{sp.values.name}' {part}{where}", False
    for t, i, name in attribute_tensors:
        if keep(t):
            yield t, f"attribute '{name}' of {_node_label(graph.node[i], i)}{where}", False


def _attribute_tensors(graph: onnx.GraphProto, subgraphs: list[tuple[str, int, onnx.GraphProto]] | None = None,
                       tensors: bool = True) -> list[tuple[TensorProto, int, str]]:
    """The tensors of `graph`'s node attributes (none unless `tensors`), each with its node's index
    and attribute's name; the subgraphs met on the way go to `subgraphs` (attribute name, node
    index, body), when given: one walk for both."""
    found = []
    for i, node in enumerate(graph.node):
        if not node.attribute:  # most nodes: no attribute, so no tensor and no subgraph
            continue
        # (all: a load that skips the checker reads them too; a slice: a loop over a upb container
        # ends in an IndexError)
        for attr in node.attribute[:]:
            if tensors:
                if attr.HasField("t"):
                    found.append((attr.t, i, attr.name))
                if attr.tensors:
                    found += [(t, i, attr.name) for t in attr.tensors]
            if subgraphs is not None and attr.type not in _GRAPHLESS_ATTRIBUTES:
                subgraphs += [(name, i, sub) for name, sub in _subgraphs_of(attr)]
    return found


def _walk(graph: onnx.GraphProto, where: str = "",
          tensors: bool = True) -> Iterator[tuple[onnx.GraphProto, str, list[tuple[TensorProto, int, str]]]]:
    """The graph and every subgraph with its suffix (`iter_graphs`), each with its
    `_attribute_tensors` when `tensors`, in one pass over the nodes."""
    subgraphs: list[tuple[str, int, onnx.GraphProto]] = []
    yield graph, where, _attribute_tensors(graph, subgraphs, tensors)
    for attr_name, i, sub in subgraphs:
        yield from _walk(sub, f" (in subgraph '{attr_name}' of {_node_label(graph.node[i], i)}{where})", tensors)


# --------------------------------------------------------------------------------------------
# tensor sizes (never trusting the file)


def _num_elements(tensor: TensorProto, label: str) -> int:
    dims = tensor.dims[:]  # (a list: a loop over a upb container ends in an IndexError, ~1 us)
    if not dims:
        return 1
    n = math.prod(dims)
    if 0 < n <= _MAX_ELEMENTS and min(dims) > 0:  # every partial product is <= n: nothing to report
        return n
    n = 1
    for d in dims:
        if d < 0:
            raise ModelError(f"{label} has a negative dimension in shape {list(tensor.dims)}",
                             hint="the model is corrupt; re-export it")
        n *= d
        if n > _MAX_ELEMENTS:
            raise ModelError(f"{label} has an absurd shape {list(tensor.dims)} (more than 2^40 elements)",
                             hint="the model is corrupt; re-export it")
    return n


def _check_dtype(tensor: TensorProto, label: str) -> int:
    dt = tensor.data_type
    if dt not in _KNOWN_TYPES:
        raise ModelError(f"{label} has an unknown or undefined data type ({dt})",
                         hint="the model is corrupt or needs a newer onnx")
    return dt


def _bits_per_element(dt: int) -> int | None:
    """Width in bits of one element, or None for variable-size types (STRING)."""
    if dt == TensorProto.STRING:
        return None
    if dt in _PACKED_BITS:
        return _PACKED_BITS[dt]
    bits = _BITS.get(dt)
    if bits is None:
        bits = _BITS[dt] = np.dtype(helper.tensor_dtype_to_np_dtype(dt)).itemsize * 8
    return bits


_BITS: dict[int, int] = {}


def _expected_nbytes(tensor: TensorProto, label: str) -> int | None:
    """Bytes of raw/external data the shape and type call for; None for STRING."""
    dt = _check_dtype(tensor, label)
    n = _num_elements(tensor, label)
    bits = _bits_per_element(dt)
    return None if bits is None else (n * bits + 7) // 8


_EXTERNAL = TensorProto.EXTERNAL
EXTERNAL_FIELD = bytes([TensorProto.DESCRIPTOR.fields_by_name["data_location"].number << 3, _EXTERNAL])


def uses_external(tensor: TensorProto) -> bool:
    return tensor.HasField("data_location") and tensor.data_location == TensorProto.EXTERNAL


def any_external(graph: onnx.GraphProto) -> bool:
    """Whether a tensor of `graph` or its subgraphs is external data: `iter_tensors`' walk in one
    pass over the nodes, without labels (a save asks this of every model; most say no)."""
    if any(t.data_location == _EXTERNAL for t in graph.initializer) or \
            any(uses_external(sp.values) or uses_external(sp.indices) for sp in graph.sparse_initializer):
        return True
    # An external tensor's data_location = EXTERNAL is serialized as the bytes 0x70 0x01 (field 14,
    # varint 1): nodes whose bytes lack them hold none, at any depth (one C call per node instead
    # of a Python step per attribute). The walk tells the rest (the bytes may be other data).
    if EXTERNAL_FIELD not in b"".join(map(onnx.NodeProto.SerializeToString, graph.node)):
        return False
    for node in graph.node:
        for attr in node.attribute if node.attribute else ():
            kind = attr.type
            if kind in _PLAIN_ATTRIBUTES:
                continue
            if kind == _A.TENSOR:  # (the common one, a Constant's or a DML node's value, read alone: the
                if uses_external(attr.t):  # checker allows an attribute only its type's value field)
                    return True
            elif (attr.HasField("t") and uses_external(attr.t)) or any(map(uses_external, attr.tensors)) or \
                    any(any_external(sub) for _, sub in _subgraphs_of(attr)):
                return True
    return False


def _type_name(dt: int) -> str:
    return TensorProto.DataType.Name(dt)


# Bytes per element of the types whose raw_data is numpy's bytes (its length follows from the shape).
RAW_ITEMSIZE: dict[int, int] = {t: d.itemsize for t, d in _PLAIN_NUMPY.items()}


def _plain_inline(tensor: TensorProto) -> bool:
    """True for the common tensor that every load check passes: inline, unsegmented raw_data of a
    plain numeric type, non-empty, whose length is what its positive dims call for. (Anything else,
    including every failure, takes the checks that name the problem.)"""
    raw = tensor.raw_data
    size = RAW_ITEMSIZE.get(tensor.data_type)
    if not raw or size is None:
        return False
    dims = tensor.dims[:]  # (a list, as in `_num_elements`)
    n = math.prod(dims)
    return len(raw) == n * size and n <= _MAX_ELEMENTS and (not dims or min(dims) > 0) \
        and tensor.data_location != _EXTERNAL and not tensor.HasField("segment")


def check_inline_data(tensor: TensorProto, label: str) -> None:
    """Raw data or typed field counts must match the shape exactly (numpy would fail or misread)."""
    expected = _expected_nbytes(tensor, label)
    dt = tensor.data_type
    shape = list(tensor.dims)
    if tensor.HasField("raw_data"):
        if expected is None:
            raise ModelError(f"{label} is a STRING tensor with raw_data, which ONNX does not allow",
                             hint="the model is corrupt; re-export it")
        got = len(tensor.raw_data)
        if got != expected:
            which = "shorter" if got < expected else "longer"
            raise ModelError(
                f"{label}: raw_data holds {got} bytes, {which} than the {expected} bytes its shape "
                f"{shape} of type {_type_name(dt)} needs",
                hint="the file is truncated or corrupt; re-export the model")
        return
    n = _num_elements(tensor, label)
    field = helper.tensor_dtype_to_field(dt)
    got = len(getattr(tensor, field))
    if dt in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        want = 2 * n
    elif dt in _PACKED_BITS and _PACKED_BITS[dt] in (2, 4):
        want = (n * _PACKED_BITS[dt] + 7) // 8  # int32_data holds packed bytes
    else:
        want = n
    if got != want:
        raise ModelError(
            f"{label}: {field} holds {got} values but its shape {shape} of type {_type_name(dt)} "
            f"needs {want}", hint="the file is truncated or corrupt; re-export the model")


def data_nbytes(data_type: int, dims: Iterable[int]) -> int | None:
    """Bytes of a tensor of this type and shape (None for STRING: its size is in its strings)."""
    bits = _bits_per_element(data_type)
    return None if bits is None else (math.prod(dims) * bits + 7) // 8


def tensor_nbytes(tensor: TensorProto) -> int:
    """Bytes of a tensor's data without reading external data.

    Used for size reports and to decide when a model needs external data. For an external tensor
    the stored `length` is used when present; otherwise the size follows from dims and dtype
    (STRING: the sum of the encoded string lengths).
    """
    label = f"tensor '{tensor.name}'"
    if uses_external(tensor):
        entries = _external_entries(tensor, label)
        if "length" in entries:
            return _parse_nonneg_int(entries["length"], "length", label)
    expected = _expected_nbytes(tensor, label)
    if expected is None:
        return sum(len(s) for s in tensor.string_data)
    return expected


# --------------------------------------------------------------------------------------------
# external data: validated before anything is opened

_DRIVE = re.compile(r"^[A-Za-z]:")


def _external_entries(tensor: TensorProto, label: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for e in tensor.external_data:
        # protobuf hands back bytes instead of str for a string field that is not valid UTF-8
        if not isinstance(e.key, str) or not isinstance(e.value, str):
            raise ModelError(f"{label} has an external-data entry that is not valid UTF-8 "
                             f"({e.key!r}: {e.value!r})", hint="the model is corrupt; re-export it")
        if e.key in entries:
            raise ModelError(f"{label} has the external-data key '{e.key}' twice",
                             hint="the model is corrupt; re-export it")
        entries[e.key] = e.value
    return entries


def _parse_nonneg_int(value: str, key: str, label: str) -> int:
    text = value.strip()
    if not text.isascii() or not text.isdigit() or int(text) >= 2**63:
        raise ModelError(f"{label} has an invalid external-data {key} {value!r} "
                         "(must be a non-negative integer)", hint="the model is corrupt; re-export it")
    return int(text)


def _resolve_location(location: str, base_dir: str, label: str) -> str:
    """Real path of an external-data file, refusing anything that is not a file inside base_dir."""
    hint = ("external data must be a file inside the model's folder; a model that points elsewhere "
            "is refused rather than followed")
    if not location:
        raise ModelError(f"{label} is marked as external data but has no location",
                         hint="the model is corrupt; re-export it")
    if "\0" in location:
        raise ModelError(f"{label} has an external-data location containing a NUL byte", hint=hint)
    if os.path.isabs(location) or location.startswith(("/", "\\")) or _DRIVE.match(location):
        raise ModelError(f"{label} has an absolute external-data location {location!r}", hint=hint)
    if ".." in re.split(r"[\\/]", location):
        raise ModelError(f"{label} has an external-data location {location!r} that escapes the "
                         "model's folder with '..'", hint=hint)
    base_real = os.path.realpath(base_dir)
    real = os.path.realpath(os.path.join(base_real, location))
    if os.path.commonpath([real, base_real]) != base_real:
        raise ModelError(f"{label} has an external-data location {location!r} that resolves outside "
                         f"the model's folder (to {real}; a symlink?)", hint=hint)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise ModelError(f"{label}: external data file {location!r} is missing (looked in {base_real})",
                         hint="copy the model together with its external data file(s)") from None
    except OSError as e:
        raise ModelError(f"{label}: cannot access external data file {location!r}: {e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelError(f"{label}: external data {location!r} is not a regular file", hint=hint)
    return real


def external_span(tensor: TensorProto, base_dir: str | os.PathLike, label: str) -> tuple[str, int, int]:
    """(real path, offset, length) of an external tensor's bytes, after every check."""
    entries = _external_entries(tensor, label)
    location = entries.get("location", "")
    if tensor.HasField("raw_data"):
        raise ModelError(f"{label} is marked as external data but also has raw_data",
                         hint="the model is corrupt; re-export it")
    expected = _expected_nbytes(tensor, label)
    if expected is None:
        raise ModelError(f"{label} is a STRING tensor stored as external data, which is not supported")
    offset = _parse_nonneg_int(entries.get("offset", "0"), "offset", label)
    length = _parse_nonneg_int(entries["length"], "length", label) if "length" in entries else None
    path = _resolve_location(location, os.fspath(base_dir), label)
    if length is not None and length != expected:
        raise ModelError(f"{label}: external data length {length} does not match the {expected} bytes "
                         f"its shape {list(tensor.dims)} of type {_type_name(tensor.data_type)} needs "
                         f"(location {location!r})", hint="the model is corrupt; re-export it")
    length = expected
    size = os.path.getsize(path)
    if offset + length > size:
        raise ModelError(f"{label}: external data at offset {offset} with length {length} runs past the "
                         f"end of {location!r} ({size} bytes)",
                         hint="the external data file is truncated or belongs to another model")
    return path, offset, length


def read_span(path: str, offset: int, length: int) -> bytes:
    """`length` bytes of `path` at `offset`; a file that shrank since it was checked is a ModelError."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise ModelError(f"external data file {path} shrank while reading it")
    return data


def read_tensor(tensor: TensorProto, base_dir: str | os.PathLike) -> np.ndarray:
    """The numpy value of a tensor (initializer, Constant value...).

    External data is memory-mapped read-only (an `np.memmap`), after the same location checks as
    `load_model`, so a huge initializer is paged in on demand instead of read into memory. Sub-byte
    packed types cannot be mapped and are read (they are small by construction). Inline data is
    size-checked and converted: raw bytes of a plain numpy type directly, anything else (or a size
    mismatch, which `check_inline_data` then reports) with `onnx.numpy_helper.to_array`.
    """
    label = f"tensor '{tensor.name}'"
    if tensor.HasField("segment"):
        raise ModelError(f"{label} is stored in segments, which is not supported")
    if not uses_external(tensor):
        dtype = _PLAIN_NUMPY.get(tensor.data_type)
        if dtype is not None and tensor.HasField("raw_data"):  # the common case, ~10x faster than to_array
            raw, shape = tensor.raw_data, tuple(tensor.dims[:])
            if len(raw) == dtype.itemsize * _num_elements(tensor, label):
                return np.frombuffer(raw, dtype).reshape(shape).astype(dtype.newbyteorder("="))
        check_inline_data(tensor, label)
        try:
            return numpy_helper.to_array(tensor)
        except Exception as e:  # noqa: BLE001 - untrusted data; surface as a user-facing error
            raise ModelError(f"{label} cannot be decoded: {e}") from None
    path, offset, length = external_span(tensor, base_dir, label)
    dt = tensor.data_type
    shape = tuple(tensor.dims)
    np_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(dt))
    if dt in _PACKED_BITS:
        raw = TensorProto()
        raw.CopyFrom(tensor)
        del raw.external_data[:]
        raw.data_location = TensorProto.DEFAULT
        raw.raw_data = read_span(path, offset, length)
        return numpy_helper.to_array(raw)
    if length == 0:
        return np.empty(shape, dtype=np_dtype)
    if np_dtype.itemsize > 1:
        np_dtype = np_dtype.newbyteorder("<")  # external data is little-endian
    try:
        mapped = np.memmap(path, dtype=np_dtype, mode="r", offset=offset, shape=shape)
        # Rules read a few rows or columns of a weight: without this the kernel's read-ahead maps
        # the whole tensor into RSS on the first page faults.
        raw_map = getattr(mapped, "_mmap", None)  # (numpy's stubs do not declare memmap._mmap)
        if hasattr(mmap, "MADV_RANDOM") and raw_map is not None:
            raw_map.madvise(mmap.MADV_RANDOM)
        return mapped
    except (OSError, ValueError) as e:
        raise ModelError(f"{label}: cannot map external data {path}: {e}") from None


# --------------------------------------------------------------------------------------------
# loading


def _check_structure(graph: onnx.GraphProto, outer: set[str], where: str = "") -> None:
    """Every node input must be produced earlier (or be a graph input/initializer/outer value).

    The ONNX checker reports dangling inputs, cycles and mere misordering with one message
    ("must be topologically sorted"); this tells the three apart and names the values involved.
    """
    available = set(outer)
    available.update(i.name for i in graph.input)
    available.update(t.name for t in graph.initializer)
    available.update(sp.values.name for sp in graph.sparse_initializer)
    producer: dict[str, int] = {}
    for idx, node in enumerate(graph.node):
        for out in node.output:
            if out:
                producer.setdefault(out, idx)
    for idx, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in available:
                _diagnose(graph, idx, name, producer, where)
        for attr_name, sub in _subgraphs(node):
            _check_structure(sub, available,
                             f" (in subgraph '{attr_name}' of {_node_label(node, idx)}{where})")
        available.update(o for o in node.output if o)
    for out in graph.output:
        if out.name not in available:
            raise ModelError(f"graph output '{out.name}'{where} is not produced by any node and is not "
                             "a graph input or initializer", hint="the model is corrupt; re-export it")


def _names_used(node: onnx.NodeProto) -> set[str]:
    """Inputs of a node including values its subgraphs use (an over-approximation, for diagnosis)."""
    names = {n for n in node.input if n}
    for _, sub in _subgraphs(node):
        for inner in sub.node:
            names |= _names_used(inner)
    return names


def _diagnose(graph: onnx.GraphProto, idx: int, name: str, producer: dict[str, int], where: str) -> None:
    node = graph.node[idx]
    label = _node_label(node, idx)
    if name not in producer:
        raise ModelError(f"{label}{where} uses input '{name}', which no node produces and which is "
                         "not a graph input or initializer (dangling input)",
                         hint="the model is corrupt or was edited incompletely; re-export it")
    target = producer[name]
    # Is there a path from this node to the producer of its input? Then the graph has a cycle.
    consumers: dict[str, list[int]] = {}
    for j, other in enumerate(graph.node):
        for used in _names_used(other):
            consumers.setdefault(used, []).append(j)
    parent = {idx: -1}
    queue = [idx]
    while queue:
        j = queue.pop(0)
        if j == target:
            chain = []
            while j != -1:
                chain.append(_node_label(graph.node[j], j))
                j = parent[j]
            chain.reverse()
            cycle = " -> ".join(chain + [label])
            raise ModelError(f"the graph{where} has a cycle: {cycle} (input '{name}' of {label} depends "
                             "on its own output)", hint="ONNX graphs must be acyclic; re-export the model")
        for out in graph.node[j].output:
            for k in consumers.get(out, ()):
                if k not in parent:
                    parent[k] = j
                    queue.append(k)
    raise ModelError(f"{label}{where} uses input '{name}' before it is produced (by "
                     f"{_node_label(graph.node[target], target)}); ONNX requires nodes in topological order",
                     hint="re-export the model or sort its nodes topologically")


_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
STRIP_BYTES = 1 << 16  # tensors this big carry weights, not the shapes and indices inference reads


def copy_fields(dst: Message, src: Message, skip: str = "") -> None:
    """Copy every set field of `src` into `dst` but `skip` (a shallow proto copy without one big field)."""
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        if fd.is_repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def _strip(tensor: TensorProto, keep_dims: bool) -> None:
    for name in _DATA_FIELDS:
        tensor.ClearField(name)
    if keep_dims:  # a stand-in that says "stored elsewhere": nothing reads it
        if not uses_external(tensor):
            tensor.data_location = TensorProto.EXTERNAL
            tensor.external_data.add(key="location", value="(data not needed for shapes)")
    else:  # an empty tensor of the same name and type
        del tensor.external_data[:]
        tensor.ClearField("data_location")
        del tensor.dims[:]
        tensor.dims.append(0)


def _big(tensor: TensorProto, min_bytes: int) -> bool:
    if uses_external(tensor):
        return True
    n = data_nbytes(tensor.data_type, tensor.dims) if tensor.data_type in _KNOWN_TYPES else None
    return n is not None and n >= min_bytes


def may_hold_big(model: onnx.ModelProto, min_bytes: int) -> bool:
    """False only when no inline tensor has `min_bytes` or more: read from encoded sizes, which a
    tensor's data cannot exceed (about 10x cheaper than visiting every tensor)."""
    mg = model.graph  # (map: the sizes are read in C, with no Python step per tensor or node)
    return max(map(TensorProto.ByteSize, mg.initializer), default=0) >= min_bytes or \
        max(map(onnx.NodeProto.ByteSize, mg.node), default=0) >= min_bytes


def without_weights(model: onnx.ModelProto, *, keep_dims: bool, min_bytes: int = STRIP_BYTES,
                    has_external: bool | None = None) -> onnx.ModelProto:
    """A copy of `model` whose external tensors, and inline ones of `min_bytes` or more, carry no data
    (`model` itself when there is none); for the ONNX checker and shape inference, which would
    otherwise serialize, copy and parse every weight, twice over for inference.

    keep_dims=True keeps each such tensor's dims, marked as external data (shape inference reads
    only the dims and type of a big tensor; the values it reads are small index vectors).
    keep_dims=False makes it an empty tensor (the checker, which with full_check=False does not
    use initializer shapes, but would resolve external locations against the working directory);
    `load_model` has checked every tensor's data against its shape already. `has_external`: the
    model has external tensors (they carry no data, but the checker must not see their locations:
    they are the source's, not where a written model keeps its data); None: found out here.
    The main graph's big initializers are never copied; big Constant or subgraph tensors are copied,
    then stripped.
    """
    mg = model.graph
    if not keep_dims and has_external is None:
        has_external = any_external(mg)
    if not (has_external and not keep_dims) and not may_hold_big(model, min_bytes):
        return model
    view = onnx.ModelProto()
    copy_fields(view, model, skip="graph")
    copy_fields(view.graph, mg, skip="initializer")
    for t in mg.initializer:
        if _big(t, min_bytes):
            stub = view.graph.initializer.add()
            copy_fields(stub, t, skip="raw_data")
            _strip(stub, keep_dims)
        else:
            view.graph.initializer.add().CopyFrom(t)
    for g, _ in iter_graphs(view.graph):  # Constant values, subgraph initializers
        dense = list(g.initializer) if g is not view.graph else []
        for n in g.node:
            for a in n.attribute if n.attribute else ():
                dense += ([a.t] if a.HasField("t") else []) + list(a.tensors)
        for t in dense:
            if _big(t, min_bytes):
                _strip(t, keep_dims)
        if not keep_dims:  # a sparse part keeps its data (its dims must match), unless external
            for t in [p for sp in g.sparse_initializer for p in (sp.values, sp.indices)]:
                if uses_external(t):
                    _strip(t, keep_dims)
    return view


# Where onnx's checks see the default-domain ops only onnxruntime defines (`check_model`).
RUNTIME_OPS_DOMAIN = "dmlgraph.onnxruntime_ops"


def check_model(model: onnx.ModelProto | bytes, full_check: bool = False) -> None:
    """`onnx.checker.check_model`, accepting what onnxruntime accepts.

    onnxruntime defines ops in the default domain that onnx does not (its transformer optimizer
    writes SimplifiedLayerNormalization there). onnx's checker refuses them ("No Op registered");
    a model holding them is checked again with those nodes in a domain of their own, which onnx
    checks as it checks any custom op: everything else as before, and onnxruntime checks them
    when it loads the model. Any other refusal stands."""
    try:
        onnx.checker.check_model(model, full_check=full_check)
    except onnx.checker.ValidationError as e:
        view = _runtime_ops_apart(model) if "No Op registered for" in str(e) else None
        if view is None:
            raise
        onnx.checker.check_model(view, full_check=full_check)


def _runtime_ops() -> dict[str, tuple[int, int]]:
    """The default-domain ops onnxruntime defines and onnx does not, at the opsets where that holds:
    name -> [first opset, onnx's first opset of it). LayerNormalization is onnx's from opset 17 and
    onnxruntime's from 1: its transformer optimizer writes one into opset 14 models."""
    global _RUNTIME_OPS
    if _RUNTIME_OPS is None:
        from onnxruntime.capi import _pybind_state  # (only once onnx refused an op)
        onnx_first: dict[str, int] = {}
        for schema in onnx.defs.get_all_schemas_with_history():
            if schema.domain in ("", "ai.onnx"):
                onnx_first[schema.name] = min(schema.since_version, onnx_first.get(schema.name, schema.since_version))
        found: dict[str, tuple[int, int]] = {}
        for op in _pybind_state.get_all_operator_schema():
            end = onnx_first.get(op.name, 1 << 30)
            if op.domain in ("", "ai.onnx") and op.since_version < end:
                found[op.name] = (min(op.since_version, found.get(op.name, (op.since_version,))[0]), end)
        _RUNTIME_OPS = found
    return _RUNTIME_OPS


_RUNTIME_OPS: dict[str, tuple[int, int]] | None = None


def _runtime_ops_apart(model: onnx.ModelProto | bytes) -> onnx.ModelProto | None:
    """A copy of `model` with its nodes of `_runtime_ops` in RUNTIME_OPS_DOMAIN; None if it has none."""
    view = onnx.ModelProto()
    if isinstance(model, bytes):
        view.ParseFromString(model)
    else:
        view.CopyFrom(model)
    opset = next((o.version for o in view.opset_import if o.domain in ("", "ai.onnx")), 0)
    known = _runtime_ops()
    graphs = [g for g, _ in iter_graphs(view.graph)] + [
        b for f in view.functions for n in f.node for _, g in _subgraphs(n) for b, _ in iter_graphs(g)]
    nodes = [n for g in graphs for n in g.node] + [n for f in view.functions for n in f.node]
    moved = [n for n in nodes if n.domain in ("", "ai.onnx") and
             known.get(n.op_type, (opset + 1, 0))[0] <= opset < known.get(n.op_type, (0, 0))[1]]
    if not moved:
        return None
    for n in moved:
        n.domain = RUNTIME_OPS_DOMAIN
    view.opset_import.append(helper.make_opsetid(RUNTIME_OPS_DOMAIN, 1))
    for f in view.functions:
        f.opset_import.append(helper.make_opsetid(RUNTIME_OPS_DOMAIN, 1))
    return view


def checker_failure(model: onnx.ModelProto | bytes, full_check: bool = False) -> str | None:
    """The first line of what `check_model` refuses in `model` (None: it passes), naming the node
    where the checker does so on a later line."""
    try:
        check_model(model, full_check=full_check)
    except Exception as e:  # noqa: BLE001 - checker raises ValidationError and others; all mean "invalid"
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        node = re.search(r"Bad node spec for node\. Name: (.*?) OpType: (\S+)", str(e))
        if node:  # (the checker names the node on a later line)
            name = node.group(1).strip()
            first += f" (in {node.group(2)} node {name!r})" if name else f" (in an unnamed {node.group(2)} node)"
        return first
    return None


def onnxruntime_refuses(model: onnx.ModelProto | bytes, base_dir: str | None = None) -> str | None:
    """Why onnxruntime's CPU provider cannot load `model` (None: it loads it), graph optimizations
    off: whether it loads, not how fast. `base_dir`: where its external data lives. Asked only where
    onnx's checks refuse a model: a model onnxruntime runs is one dmlgraph must take."""
    import onnxruntime as ort  # (only once onnx refused a model)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    if base_dir is not None:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", base_dir)
    data = model if isinstance(model, bytes) else model.SerializeToString()
    try:
        ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several types; all mean "does not load"
        return (str(e).strip().splitlines() or [type(e).__name__])[0]
    return None


def _run_checker(model: onnx.ModelProto, path: str, has_external: bool, data: bytes | None = None,
                 base_dir: str | None = None, notes: list[str] | None = None) -> None:
    """onnx's checker on the model without its weights; `data`: the file's bytes, which it checks
    as they are when nothing is left out (instead of serializing the model again). A model the
    checker refuses and onnxruntime loads is taken, with a line in `notes` saying so."""
    view = without_weights(model, keep_dims=False, has_external=has_external)
    first = checker_failure(data if view is model and data is not None else view)
    if first is None:
        return
    # (`check_model_proto` refused external data without a folder before this runs)
    if onnxruntime_refuses(data if data is not None else model, base_dir) is None:
        if notes is not None:
            notes.append(f"the model fails onnx's checker ({first}); onnxruntime loads it, so dmlgraph takes it")
        return
    raise ModelError(f"{path} failed the ONNX checker: {first}",
                     hint="the model does not conform to the ONNX spec, and onnxruntime does not load it "
                          "either; re-export it")


def utf8_twin() -> type[Message]:
    """A proto3 twin of onnx's ModelProto (same fields and numbers, its own package).

    ONNX is proto2, whose parser accepts any bytes in a string field; proto3's parser refuses bad
    UTF-8. Parsing a file's bytes with the twin checks every string field in C, ~10x faster than
    walking the parsed model in Python. (onnx's schema has no required fields, defaults or
    extensions, the only proto2 features proto3 lacks.)
    """
    global _UTF8_TWIN
    if _UTF8_TWIN is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        fdp = descriptor_pb2.FileDescriptorProto()
        onnx.ModelProto.DESCRIPTOR.file.CopyToProto(fdp)
        package = "dmlgraph_utf8_twin"
        fdp.name, fdp.package, fdp.syntax = f"{package}.proto", package, "proto3"
        stack = list(fdp.message_type)
        while stack:
            m = stack.pop()
            stack.extend(m.nested_type)
            for fd in m.field:
                if fd.type_name.startswith(f".{onnx.ModelProto.DESCRIPTOR.file.package}."):
                    fd.type_name = f".{package}." + fd.type_name.split(".", 2)[2]
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        _UTF8_TWIN = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.ModelProto"))
    return _UTF8_TWIN


_UTF8_TWIN: type[Message] | None = None
# The twin holds a second copy of the model while it parses: for bigger files the walk is used
# (big files are big because of tensor bytes, which the walk does not visit).
_UTF8_TWIN_MAX_BYTES = 64 << 20


def _check_utf8(model: onnx.ModelProto, path: str, data: bytes | None = None) -> None:
    """ONNX is proto2, so protobuf accepts string fields (names, dim_param, domains) that are not
    valid UTF-8 and hands them back as bytes, which every later step would trip over.

    Given the file's bytes, the proto3 twin checks them all at once; the walk below finds which
    field is bad (and is the check itself without them)."""
    if data is not None:
        try:
            utf8_twin().FromString(data)
            return
        except Exception:  # noqa: BLE001 - a bad string (the model itself parsed): name it below
            pass
    from google.protobuf.descriptor import FieldDescriptor as F
    stack: list = [model]
    while stack:
        msg = stack.pop()
        for fd, val in msg.ListFields():
            if fd.type == F.TYPE_STRING:
                for x in (val if not isinstance(val, (str, bytes)) else [val]):
                    if not isinstance(x, str):
                        raise ModelError(f"{path} has a {msg.DESCRIPTOR.name}.{fd.name} that is not valid UTF-8 "
                                         f"({x[:40]!r})", hint="the file is corrupt; re-export the model")
            elif fd.type == F.TYPE_MESSAGE:
                if hasattr(val, "ListFields"):
                    stack.append(val)
                else:
                    stack.extend(val)


_TENSOR_TYPES = frozenset(v for _, v in onnx.TensorProto.DataType.items())  # UNDEFINED (0): type unknown


def _check_value_types(graphs: Iterable[tuple[onnx.GraphProto, str]], path: str) -> None:
    """Declared element types of inputs, outputs and value_info must be ONNX types (the checker lets
    e.g. -1 through), in every graph of `graphs` (`iter_graphs`)."""
    for g, _ in graphs:
        for infos in (g.input, g.output, g.value_info):
            for vi in infos:
                tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
                if tt is not None and tt.elem_type not in _TENSOR_TYPES:
                    raise ModelError(f"{path}: value '{vi.name}' declares element type {tt.elem_type}, which "
                                     "is not an ONNX tensor type", hint="the model is corrupt; re-export it")


def _check_opsets(model: onnx.ModelProto, path: str) -> None:
    """Refuse opset versions the installed onnx does not know: the checker resolves an unknown newer
    version to the newest schema it has, but the rules would then assume semantics the model may
    not have (and onnxruntime refuses such a model anyway)."""
    newest = onnx.defs.onnx_opset_version()
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and not 1 <= o.version <= newest:
            raise ModelError(f"{path} imports default-domain (ai.onnx) opset {o.version}; this onnx knows "
                             f"opsets 1 to {newest}",
                             hint="re-export the model for a released opset, or upgrade onnx")


def check_model_proto(model: onnx.ModelProto, label: str, base_dir: str | None, *, check: bool = True,
                      data: bytes | None = None, notes: list[str] | None = None) -> bool:
    """Validate a parsed model as `load_model` does (ModelError naming `label` on any failure);
    returns whether it stores tensors as external data. `base_dir` locates external data (None:
    a model holding external data is refused). `data`: the serialized model, when at hand.
    `notes` gets what was accepted though onnx's checks refuse it (onnxruntime loads it)."""
    missing = [what for what, bad in (("graph", not model.HasField("graph")),
                                      ("opset_import", len(model.opset_import) == 0),
                                      ("ir_version", model.ir_version <= 0)) if bad]
    if missing:
        raise ModelError(f"{label} is not a valid ONNX model (it parses, but has no {', '.join(missing)}); "
                         "is the file complete?")
    has_external = False
    walked = list(_walk(model.graph))  # (the graphs, read twice, and their nodes' tensors)
    graphs = [(g, where) for g, where, _ in walked]
    for tensor, where, _ in (x for g, w, found in walked for x in _graph_tensors(g, w, found, _plain_inline)):
        if tensor.HasField("segment"):
            raise ModelError(f"{where} is stored in segments, which is not supported")
        if uses_external(tensor):
            has_external = True
            if base_dir is None:
                raise ModelError(f"{label}: {where} is stored as external data, and an in-memory model has "
                                 "no folder to find it in", hint="pass the model's path instead")
            external_span(tensor, base_dir, where)
        else:
            check_inline_data(tensor, where)
    _check_opsets(model, label)
    _check_utf8(model, label, data)
    _check_value_types(graphs, label)
    if check:
        try:
            _run_checker(model, label, has_external, data, base_dir, notes)
        except ModelError:
            # The checker reports dangling inputs, cycles and misordering alike; tell them apart
            # (a walk over every node in Python, so only once something is known to be wrong).
            _check_structure(model.graph, set())
            raise
    return has_external


def load_model(path: str | os.PathLike, *, load_external_data: bool = False,
               check: bool = True, parsed: Callable[[onnx.ModelProto], None] | None = None,
               notes: list[str] | None = None) -> onnx.ModelProto:
    """Read and validate an ONNX model file; every failure is a ModelError naming the path.

    Weights stored as external data are not read: their locations, offsets and lengths are
    validated (see module docstring) and `read_tensor` maps them on demand. With
    `load_external_data=True` they are copied into the proto (raw_data) after the same checks, for
    callers that need a self-contained proto (it must then stay under protobuf's 2 GB).

    `check=True` also rejects dangling inputs, cycles and misordered nodes with a specific message
    and runs `onnx.checker.check_model`. `parsed(model)` is called once the file has parsed, before
    any check (to start work that must not wait for them; the caller discards it on an error).
    A model onnx's checker refuses and onnxruntime loads is taken (a line in `notes` says so).
    """
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ModelError(f"model file not found: {p}", hint="check the path") from None
    except OSError as e:
        raise ModelError(f"cannot access model file {p}: {e.strerror or e}", hint="check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelError(f"{p} is a directory, not an ONNX model file",
                         hint="pass the path of the .onnx file inside it")
    if not stat.S_ISREG(st.st_mode):
        raise ModelError(f"{p} is not a regular file", hint="pass the path of an .onnx file")
    if st.st_size == 0:
        raise ModelError(f"{p} is empty (0 bytes), not an ONNX model",
                         hint="the file was not written completely; re-export or re-download it")
    if st.st_size > PROTOBUF_LIMIT:
        raise ModelError(f"{p} is {st.st_size / 2**30:.1f} GiB; protobuf cannot parse a model file of "
                         "2 GiB or more",
                         hint="models this large must store their weights as external data; re-export "
                              "with external data (onnx.save(..., save_as_external_data=True))")
    try:
        with open(p, "rb"):
            pass
    except OSError as e:
        raise ModelError(f"cannot read model file {p}: {e.strerror or e}",
                         hint="check the file's permissions") from None
    data: bytes | None
    try:
        with open(p, "rb") as f:
            data = f.read()
        model = onnx.ModelProto.FromString(data)  # what onnx.load does
    except Exception as e:  # noqa: BLE001 - any parse failure of untrusted bytes is a user-facing error
        raise ModelError(f"{p} is not a valid ONNX model (protobuf parse failed: {e}); "
                         "is the file complete?") from None
    if parsed is not None:
        parsed(model)
    data = data if len(data) <= _UTF8_TWIN_MAX_BYTES else None  # kept for _check_utf8 only when small
    base_dir = os.path.dirname(os.path.abspath(p))
    has_external = check_model_proto(model, p, base_dir, check=check, data=data, notes=notes)
    del data
    if load_external_data and has_external:
        for tensor, label, _ in iter_tensors(model):
            if uses_external(tensor):
                span = external_span(tensor, base_dir, label)
                tensor.raw_data = read_span(*span)
                del tensor.external_data[:]
                tensor.data_location = TensorProto.DEFAULT
    return model
