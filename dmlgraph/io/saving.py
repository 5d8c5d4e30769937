"""The only place dmlgraph writes model files: atomically and deterministically.

A temp file in the destination folder, fsync, `os.replace`; on any failure an existing output is left
as it was. Only a regular file (or nothing) at the output path is replaced (`output_target`); what
is written through or refused: docs/internals.md, "io/saving.py".
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

import onnx
from onnx import TensorProto, numpy_helper
from onnx.external_data_helper import ExternalDataInfo

from dmlgraph.errors import InternalError, ModelError
from dmlgraph.io.inference_scopes import full_check, strict_inference
from dmlgraph.io.modelfile import (
    EXTERNAL_FIELD,
    PROTOBUF_LIMIT,
    STRIP_BYTES,
    any_external,
    check_inline_data,
    check_model,
    external_span,
    iter_tensors,
    may_hold_big,
    read_span,
    tensor_nbytes,
    uses_external,
    without_weights,
)

# Above this the model proto is written with external data (leaves headroom under the limit).
_EXTERNAL_THRESHOLD = 1_800_000_000
# Offsets of tensors in a written data file are aligned so runtimes can mmap them.
_ALIGN = 4096
# Tensors smaller than this stay inline when writing external data (as onnx's own converter does).
_INLINE_BELOW = 1024
# Streaming copy chunk: external data is copied in pieces, never held in memory as a whole.
_CHUNK = 16 * 1024 * 1024

def check_for_save(model: onnx.ModelProto) -> bytes | None:
    """Raise InternalError unless `model` passes `onnx.checker.check_model(full_check=True)`;
    return the bytes it was checked from, when it was: the model serialized as `save_model`
    writes it (so a caller can tell later whether the model is still the one checked), else None.

    Run on every model dmlgraph is about to write: an invalid one is a bug of ours, and nothing
    must reach the disk. A model without weights to leave out (nor external data, which its bytes
    tell) is serialized once and checked from those bytes (`full_check`: its shape inference with
    each If of a graph of many in a scope of its own, where onnx's own is quadratic). Otherwise it
    is the full check split in its two parts, each on a view without the weights
    (`without_weights`): the checker proper, then strict, type-checking shape inference (what
    full_check adds), which reads the dims of big tensors but never their bytes.
    """
    try:
        has_external = None
        if not may_hold_big(model, STRIP_BYTES):
            data = model.SerializeToString(deterministic=True)
            has_external = _has_external(model, data)
            if not has_external:
                full_check(model, data)
                return data
        if has_external is None:
            has_external = any_external(model.graph)
        check_model(without_weights(model, keep_dims=False, has_external=has_external))
        strict_inference(without_weights(model, keep_dims=True, has_external=has_external))
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise InternalError(f"the model to be written fails the ONNX checker ({first}); nothing was written") from e
    return None


def _has_external(model: onnx.ModelProto, data: bytes) -> bool:
    """`any_external(model.graph)`, given `model` serialized: a tensor stored as external data has
    the bytes of data_location = EXTERNAL in it, so bytes without them answer at once (one C search
    instead of serializing every node once more)."""
    return EXTERNAL_FIELD in data and any_external(model.graph)


def write_bytes(f: BinaryIO, data: bytes) -> None:
    """The one place bytes go to disk: a seam where tests inject write faults."""
    f.write(data)


def _default_mode() -> int:
    umask = 0o022
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    umask = int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o666 & ~umask


class _TempFile:
    """A temp file beside `final`, committed with fsync + os.replace or removed on failure."""

    path: str | None  # None once committed

    def __init__(self, final: str) -> None:
        self.final = final
        folder, base = os.path.split(final)
        fd, self.path = tempfile.mkstemp(dir=folder, prefix=f".{base}.", suffix=".tmp")
        self.file = os.fdopen(fd, "wb")
        try:
            mode = stat.S_IMODE(os.stat(final).st_mode)
        except OSError:
            mode = _default_mode()
        try:
            os.chmod(self.path, mode)
        except OSError:
            pass

    def finish(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()

    def commit(self) -> None:
        assert self.path is not None, "committed twice"
        os.replace(self.path, self.final)
        self.path = None

    def discard(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass


class _Through:
    """A character device or FIFO at the output path, written through (never replaced): it has no
    contents to keep, and a rename would put a regular file in its place. Opened without blocking,
    so a FIFO nobody reads is an error at once instead of a hang."""

    path = None  # (nothing to remove or rename)

    def __init__(self, final: str) -> None:
        self.final = final
        try:
            fd = os.open(final, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ENXIO:
                raise ModelError(f"cannot write {final}: it is a FIFO that no process is reading",
                                 hint="start the reader first, or write to a regular file") from None
            raise
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        self.file: BinaryIO = io.BufferedWriter(_Unseekable(fd, "wb"))

    def finish(self) -> None:
        self.file.close()

    def commit(self) -> None:
        pass

    def discard(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass


class _Unseekable(io.FileIO):
    """A device or FIFO as a stream with no position: `/dev/null` says it is always at 0, which
    a writer that seeks back to patch sizes (zipfile, under numpy.savez) would take at its word."""

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        raise io.UnsupportedOperation("not seekable")

    def seek(self, offset: int, whence: int = 0) -> int:
        raise io.UnsupportedOperation("not seekable")


def output_target(path: str | os.PathLike[str], what: str = "the output") -> tuple[str, bool]:
    """Where a write to `path` goes, and whether it goes through (True: a character device or a
    FIFO, written in place) or by an atomic rename (False: a regular file, or nothing yet; the path
    a symbolic link names, not the link). Raises ModelError for a path that names a folder (empty,
    ending in a separator, `.` or `..`), a directory, a block device or a socket: nothing at the
    output path is ever replaced unless it is a regular file."""
    p = os.fspath(path)
    if not p:
        raise ModelError(f"the path for {what} is empty", hint="pass a file name")
    if p.endswith((os.sep, os.altsep or os.sep)) or os.path.basename(p) in (".", ".."):
        raise ModelError(f"cannot write {what} to {p}: a path ending in '/', '.' or '..' names a folder",
                         hint=f"pass a file path, e.g. {os.path.join(p, 'out' + _suffix(what))}")
    try:
        mode = os.stat(p).st_mode
    except OSError:
        mode = None
    if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        return os.path.abspath(p), True
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a block device" if stat.S_ISBLK(mode) else \
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise ModelError(f"cannot write {p}: it is {kind}",
                         hint="pass the path of a regular file (a new one, or one to replace)")
    return (os.path.realpath(p) if os.path.islink(p) else os.path.abspath(p)), False


def _suffix(what: str) -> str:
    return ".onnx" if "model" in what else ""


def _open_output(final: str, through: bool) -> _TempFile | _Through:
    return _Through(final) if through else _TempFile(final)


@contextlib.contextmanager
def atomic_writer(path: str) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` only if the block completes (temp file + fsync + rename;
    a character device or FIFO is written through: `output_target`).

    On any failure nothing is left behind and an existing file at `path` is untouched; an OSError
    becomes a ModelError naming the path.
    """
    final, through = output_target(path)
    try:
        tmp = _open_output(final, through)
    except OSError as e:
        raise ModelError(f"cannot write {path}: {e.strerror or e}", hint="check the folder and permissions") from None
    try:
        yield tmp.file
        tmp.finish()
        tmp.commit()
    except OSError as e:
        tmp.discard()
        raise ModelError(f"cannot write {path}: {e.strerror or e}", hint="check free space and permissions") from None
    except BaseException:
        tmp.discard()
        raise


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _entry(path: str) -> str:
    """The directory entry `path` names (its folder resolved, its last part kept): two spellings
    of one entry compare equal; a symlink and its target are two entries."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(os.path.realpath(folder), name)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _set_external(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    for field in ("raw_data", "float_data", "int32_data", "string_data", "int64_data",
                  "double_data", "uint64_data"):
        tensor.ClearField(field)
    del tensor.external_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key = key
        entry.value = value


def _copy_span(src: str, offset: int, length: int, dst: BinaryIO) -> None:
    with open(src, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                raise ModelError(f"external data file {src} shrank while copying it")
            write_bytes(dst, chunk)
            left -= len(chunk)


def save_model(model: onnx.ModelProto, out_path: str | os.PathLike, *,
               input_path: str | os.PathLike | None = None, in_place: bool = False,
               external_data: bool | None = None, base_dir: str | os.PathLike | None = None,
               check: Callable[[bytes | None], None] | None = None, serialized: bytes | None = None) -> int:
    """Write `model` to `out_path` atomically and deterministically (same model, same bytes);
    returns the size of the model file written, in bytes.

    - Refuses to overwrite `input_path` (same real path or same file) unless `in_place=True`,
      refuses to replace a file the source's external data is in (but for its data file, which
      `in_place` replaces too), and refuses a missing output folder.
    - Tensors that are external in the source model are read from `base_dir` (the source model's
      folder), after the same location checks as loading, and streamed in chunks.
    - `external_data=None` writes one file unless the model would exceed ~1.8 GB; `True` forces
      external data; `False` forbids it (error if too large). External data goes to
      `<out_basename>.data` beside the output, 4096-byte aligned, initializers of 1 KiB or more.
      The data file is committed first, then the model; if the process dies between the two
      renames, the old model may be left beside the new data file.
    - `check`, if given, is called before anything is committed with the bytes about to be written
      (None where they are not `model`'s own: external data moved out); when it raises, nothing is
      written. (A caller that checked the model before can tell from them whether it changed since,
      without serializing it once more.)
    - `serialized`, if given, is `model` as `check_for_save` serialized it (the caller vouches that
      `model` has not changed since): it is not serialized again.
    - Only a regular file is replaced; a character device or FIFO is written through
      (`output_target`), without external data.
    - `model` itself is not modified.
    """
    out, through = output_target(out_path, "the model")
    folder, base = os.path.split(os.path.abspath(out))
    _check_output_path(out, folder, input_path, in_place)
    data_path = out + ".data"
    if external_data is True:
        serialized = None
    elif serialized is None:
        try:  # (a model without external data is serialized once: its size decides)
            serialized = model.SerializeToString(deterministic=True)
        except Exception:  # noqa: BLE001 - over protobuf's limit: external data or an error below
            pass
    sources, source_files = _external_sources(model, serialized, base_dir)
    use_external = _use_external(model, out, serialized, sources, external_data)
    if use_external:
        _check_data_path(out, data_path, through, input_path)
    _check_clash([out] + [data_path] * use_external, source_files, in_place and input_path is not None
                 and _same_file(out, os.fspath(input_path)))
    # A single-file save of a model without external data leaves every tensor as it is: the
    # per-tensor pass over a copy is needed only for external data (in the source or the save).
    placing = use_external or any(span is not None for span in sources)
    if use_external or placing:
        serialized = None
    temps: list[_TempFile | _Through] = []
    try:
        if placing:
            data_tmp = _TempFile(data_path) if use_external else None
            temps += [data_tmp] if data_tmp is not None else []
            serialized = _serialize(_placed(model, sources, data_tmp, base + ".data"), out)
        elif serialized is None:
            serialized = _serialize(model, out)
        if check is not None:
            check(None if placing else serialized)
        model_tmp = _open_output(out, through)
        temps.append(model_tmp)
        write_bytes(model_tmp.file, serialized)
        for t in temps:
            t.finish()
        for t in temps:  # data file first, then the model that refers to it
            t.commit()
        if not through:
            _fsync_dir(folder)
        return len(serialized)
    except OSError as e:
        for t in temps:
            t.discard()
        raise ModelError(f"cannot write {out}: {e}", hint="check free space and permissions") from None
    except BaseException:
        for t in temps:
            t.discard()
        raise


def _check_output_path(out: str, folder: str, input_path: str | os.PathLike | None, in_place: bool) -> None:
    if not os.path.isdir(folder):
        raise ModelError(f"cannot write {out}: the folder {folder} does not exist",
                         hint="create the folder first or choose another output path")
    if input_path is not None and not in_place and _same_file(out, os.fspath(input_path)):
        raise ModelError(f"refusing to overwrite the input model {os.fspath(input_path)} with the output",
                         hint="choose a different output path, or pass --in-place to replace the input")


def _check_clash(paths: list[str], source_files: set[str], replacing_input: bool) -> None:
    """Replacing a file the source's data is in would destroy the input (unless it is the input
    being replaced, data file and all: --in-place); `paths`: the model, then its data file."""
    clash = [p for p in paths if _entry(p) in source_files]
    if clash and not (replacing_input and clash == paths[1:]):
        raise ModelError(f"refusing to overwrite {clash[0]}, external data of the input model, with the output",
                         hint="choose a different output path or folder")


def _external_sources(model: onnx.ModelProto, serialized: bytes | None, base_dir: str | os.PathLike | None
                      ) -> tuple[list[tuple[str, int, int] | None], set[str]]:
    """Spans of the tensors that are external in the source (one entry per tensor in
    `iter_tensors` order, None: not external; empty when none is), validated before anything is
    written, and the files they reach. (Most models have none: a first look skips the walk.)"""
    sources: list[tuple[str, int, int] | None] = []
    source_files: set[str] = set()
    if not (_has_external(model, serialized) if serialized is not None else any_external(model.graph)):
        return sources, source_files
    for tensor, label, _ in iter_tensors(model):
        span = None
        if uses_external(tensor):
            if base_dir is None:
                raise ModelError(f"{label} is stored as external data, but the source model's folder "
                                 "is unknown", hint="pass base_dir (the input model's folder)")
            span = external_span(tensor, base_dir, label)
            location = ExternalDataInfo(tensor).location
            source_files |= {span[0], _entry(os.path.join(os.fspath(base_dir), location))}
        sources.append(span)
    return sources, source_files


def _use_external(model: onnx.ModelProto, out: str, serialized: bytes | None,
                  sources: list[tuple[str, int, int] | None], external_data: bool | None) -> bool:
    """Whether the output gets a data file: asked for, or needed past protobuf's limit."""
    external_bytes = sum(span[2] for span in sources if span is not None)
    if external_bytes == 0 and external_data is not True:  # (ByteSize would cost one more pass)
        total = len(serialized) if serialized is not None else PROTOBUF_LIMIT + 1
    else:
        total = model.ByteSize() + external_bytes
    if external_data is None:
        return total > _EXTERNAL_THRESHOLD
    if not external_data and total > _EXTERNAL_THRESHOLD:
        raise ModelError(f"cannot write {out} as a single file: the model is {total / 2**30:.2f} GiB, "
                         "over protobuf's 2 GiB limit", hint="write it with external data")
    return bool(external_data)


def _check_data_path(out: str, data_path: str, through: bool, input_path: str | os.PathLike | None) -> None:
    if through:
        raise ModelError(f"cannot write {out} with external data: it is not a regular file, and the "
                         f"data file would go beside it", hint="write the model to a regular file")
    if os.path.isdir(data_path):
        raise ModelError(f"cannot write external data {data_path}: it is a directory")
    if input_path is not None and _same_file(data_path, os.fspath(input_path)):
        raise ModelError(f"refusing to overwrite the input model {os.fspath(input_path)} with "
                         "the output's external data", hint="choose a different output path")


def _placed(model: onnx.ModelProto, sources: list[tuple[str, int, int] | None], data_tmp: _TempFile | None,
            data_name: str) -> onnx.ModelProto:
    """A copy of `model` (the caller's stays untouched) whose tensors are where the output keeps
    them: the source's external spans read inline, or every initializer of 1 KiB or more (and each
    external span) appended to `data_tmp`, 4096-byte aligned."""
    result = onnx.ModelProto()
    result.CopyFrom(model)  # (its tensors are visited in the same order as the original's: `sources`)
    if not sources:
        sources = [None] * sum(1 for _ in iter_tensors(model))
    offset = 0
    for span, (tensor, label, is_init) in zip(sources, iter_tensors(result), strict=True):
        if data_tmp is None:
            if span is not None:
                tensor.raw_data = read_span(*span)
                del tensor.external_data[:]
                tensor.data_location = TensorProto.DEFAULT
            continue
        if span is None and (not is_init or tensor.data_type == TensorProto.STRING
                             or tensor_nbytes(tensor) < _INLINE_BELOW):
            continue
        pad = -offset % _ALIGN
        if pad:
            write_bytes(data_tmp.file, b"\0" * pad)
            offset += pad
        if span is not None:
            _copy_span(*span, data_tmp.file)
            length = span[2]
        else:
            check_inline_data(tensor, label)
            if tensor.HasField("raw_data"):
                payload = tensor.raw_data
            else:
                payload = numpy_helper.from_array(numpy_helper.to_array(tensor)).raw_data
            write_bytes(data_tmp.file, payload)
            length = len(payload)
        _set_external(tensor, data_name, offset, length)
        offset += length
    return result


def _serialize(model: onnx.ModelProto, out: str) -> bytes:
    try:
        serialized = model.SerializeToString(deterministic=True)
    except Exception as e:  # noqa: BLE001 - protobuf raises various types for oversized messages
        raise ModelError(f"cannot serialize the model for {out}: {e}",
                         hint="a model over 2 GiB must be written with external data") from None
    if len(serialized) > PROTOBUF_LIMIT:
        raise ModelError(f"cannot write {out}: the model proto is over protobuf's 2 GiB limit",
                         hint="write it with external data")
    return serialized
