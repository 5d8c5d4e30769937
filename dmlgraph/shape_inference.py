"""onnx's shape inference, made safe to run on any model, and the data-propagation pass overlapped.

Shapes come from onnx's C++ inference, first plain (linear in the graph), then with data
propagation, which resolves shapes computed from shapes (Reshape(x, Concat(Shape(y)...))) and
which two of the corpus's masks need. Data propagation turns a 1-D value of static length N into
N dims, in time and memory linear in N, whatever its element type: a declared [2^62] vector, or
Range(0, 10^9) -> Cast, never returns (10^7 takes seconds). So:

* the plain pass looks for 1-D values longer than MAX_DATA_PROP_LENGTH, and data propagation is
  skipped when one exists;
* where the process can fork (Linux), data propagation runs in a child started before the plain
  pass, under a memory cap and a deadline. A length that only data propagation computes (Shape ->
  Mul -> ConstantOfShape of a [50000, 50000] input) then costs a killed child, not a hang, and on
  a machine with a second core the two passes overlap (about 0.15 s of 1.4 s on 31,000 nodes).
  Elsewhere both passes run in-process, one after the other, and only the first guard holds.

Either way the result is the same model `onnx.shape_inference.infer_shapes` returns (the tests
compare the two paths), or the plain pass's when data propagation is skipped, fails or runs out of
time or memory. Inference is a help, never a reason to refuse a model: a model it cannot handle
simply has fewer known shapes.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
import warnings

import onnx
from onnx.onnx_cpp2py_export import shape_inference as _cpp

from dmlgraph.modelfile import _iter_graphs, without_weights

MAX_DATA_PROP_LENGTH = 1 << 18  # dims data propagation may make of one value (tens of milliseconds)
CHILD_MEMORY = 2 << 30  # bytes of address space the child may add to what it inherits
CHILD_SECONDS = 10.0  # the child's deadline: this, or 20x the plain pass's time if longer
USE_CHILD = sys.platform.startswith("linux") and hasattr(os, "fork")  # (macOS: fork without exec is unsafe)


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (a copy of it) with every shape onnx can infer. Weights are left out
    (`without_weights`): inference reads their dims and types, and copying them in and out would
    cost more than inference itself."""
    data = without_weights(model, keep_dims=True).SerializeToString()
    child = _DataPropChild.start(data) if USE_CHILD else None
    try:
        t0 = time.perf_counter()
        plain = _run(data, data_prop=False)
        if plain is None:
            return onnx.ModelProto.FromString(data)
        if _long_vector(plain):
            return plain
        if child is None:
            return _run(data, data_prop=True) or plain
        # Normally the child is about as fast as the plain pass; the deadline only ends a runaway.
        return child.result(deadline=time.perf_counter() + max(CHILD_SECONDS, 20 * (time.perf_counter() - t0))) \
            or plain
    finally:
        if child is not None:
            child.stop()


def _run(data: bytes, data_prop: bool) -> onnx.ModelProto | None:
    try:
        return onnx.ModelProto.FromString(_cpp.infer_shapes(data, False, False, data_prop))
    except Exception:  # noqa: BLE001 - inference errors of every kind: fewer known shapes
        return None


def _long_vector(model: onnx.ModelProto) -> bool:
    """Whether a 1-D value of `model` (an inferred one) has a static length over the limit."""
    for g, _ in _iter_graphs(model.graph):
        for infos in (g.input, g.output, g.value_info):
            for vi in infos:
                dims = vi.type.tensor_type.shape.dim
                if len(dims) == 1 and dims[0].dim_value > MAX_DATA_PROP_LENGTH:
                    return True
    return False


class _DataPropChild:
    """A forked child running data propagation on serialized `data`, its result read from a pipe."""

    def __init__(self, pid: int, fd: int):
        self.pid, self.fd = pid, fd

    @classmethod
    def start(cls, data: bytes) -> "_DataPropChild | None":
        try:
            r, w = os.pipe()
        except OSError:
            return None
        try:
            with warnings.catch_warnings():  # (3.12+ warns when threads exist: the child runs no Python of theirs)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:  # no fork allowed here (process limits, memory): in-process instead
            os.close(r)
            os.close(w)
            return None
        if pid == 0:  # the child: onnx's C++ and a pipe, then out without running any exit handlers
            code = 1
            try:
                os.close(r)
                _cap_address_space(CHILD_MEMORY)
                view = memoryview(_cpp.infer_shapes(data, False, False, True))
                while view:
                    view = view[os.write(w, view):]
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        return cls(pid, r)

    def result(self, deadline: float) -> onnx.ModelProto | None:
        """The child's model, or None if it failed, or did not finish by `deadline`."""
        chunks = []
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        try:
            return onnx.ModelProto.FromString(b"".join(chunks))
        except Exception:  # noqa: BLE001 - a child that died mid-write: its partial output is no model
            return None

    def stop(self) -> None:
        os.close(self.fd)
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = None


def _cap_address_space(extra: int) -> None:
    """Limit this process's address space to its current size + `extra` (never above a set limit)."""
    import resource
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = current + extra
    for cap in (soft, hard):
        if cap != resource.RLIM_INFINITY:
            limit = min(limit, cap)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
