"""Running plain ONNX models and reading initializers: what both the rules (to evaluate a mask
subgraph) and the executor (for its ONNX regions) need, below both of them.
"""
from __future__ import annotations

from typing import cast

import numpy as np
import onnx
from onnx import helper

from dmlgraph.errors import DmlgraphError
from dmlgraph.io.modelfile import read_tensor
from dmlgraph.ir.graph import Value


def numpy_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def initializer_array(v: Value) -> np.ndarray:
    """An initializer's value; external data is memory-mapped, not read."""
    if v.array is not None:
        return v.array
    # Callers pass initializers only; base_dir is set for every initializer read from a file (it is
    # used only for external data).
    assert v.initializer is not None
    return read_tensor(v.initializer, cast(str, v.base_dir))


class OnnxRunner:
    """One model run by onnxruntime, or by onnx.reference where onnxruntime lacks a kernel."""

    def __init__(self, model: onnx.ModelProto, threads: int | None = None,
                 external: dict[str, np.ndarray] | None = None, optimize: bool = True,
                 optimized_path: str | None = None):
        self.model = model
        self.input_names = [i.name for i in model.graph.input]
        self._input_set = frozenset(self.input_names)
        self.output_names = [o.name for o in model.graph.output]
        import onnxruntime as ort  # here, not at the top: commands that run nothing skip its import

        opts = ort.SessionOptions()
        opts.log_severity_level = 4  # fatal only: its errors reach the user as our message, not as a log
        if not optimize:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        if optimized_path:  # where onnxruntime writes the graph as it optimized it
            opts.optimized_model_filepath = optimized_path
        self.external = external or {}
        self._ort_values = []  # onnxruntime borrows these buffers: keep them alive
        if self.external:  # the graph declares them as external data; these buffers stand in for the files
            self._ort_values = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a))
                                for a in self.external.values()]
            opts.add_external_initializers(list(self.external), self._ort_values)
        self.backend = "onnxruntime"
        self._direct = None
        try:
            self.session = ort.InferenceSession(model.SerializeToString(), opts,
                                                providers=["CPUExecutionProvider"])
            # InferenceSession.run checks the feed names and ownership on every call (about a
            # microsecond); run_exact's feeds are always exactly the inputs, so it calls the
            # binding that run wraps, when this onnxruntime has it where it used to be.
            inner = getattr(self.session, "_sess", None)
            self._direct = getattr(inner, "run", None) or self.session.run
        except Exception as e:  # noqa: BLE001
            # A missing kernel (e.g. Trilu on int8): onnx.reference has one. Any other refusal means
            # the model is invalid (a type error, an unknown op); the reference evaluator would run
            # some of those anyway and give a meaningless answer, so they are reported instead.
            if "NOT_IMPLEMENTED" not in str(e):
                raise DmlgraphError(f"onnxruntime cannot load the model: {_first_line(e)}",
                                    hint="the model is invalid or uses an op onnxruntime does not have") from None
            self._use_reference(e)

    def _use_reference(self, why: Exception) -> None:
        from onnx.reference import ReferenceEvaluator
        self.backend = "onnx.reference"
        self.fallback_reason = str(why).splitlines()[0][:200]
        self.session = None
        self._direct = None
        model = self.model
        if self.external:
            model = onnx.ModelProto()
            model.CopyFrom(self.model)
            inline = [t for t in model.graph.initializer if t.name not in self.external]
            del model.graph.initializer[:]
            model.graph.initializer.extend(inline + [onnx.numpy_helper.from_array(np.asarray(a), name)
                                                     for name, a in self.external.items()])
        try:
            self.reference = ReferenceEvaluator(model)
        except Exception as e:  # noqa: BLE001 - neither backend can run this model
            raise DmlgraphError(f"onnxruntime cannot run the model ({self.fallback_reason}) and neither can "
                                f"onnx.reference: {_first_line(e)}") from None

    def run_exact(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """`run` for feeds holding exactly `input_names` (no filtering: the executor's fast path)."""
        if self._direct is not None:
            try:
                return self._direct(self.output_names, feeds, None)
            except Exception:  # noqa: BLE001 - `run` reports it, or falls back to onnx.reference
                pass
        return self.run(feeds)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        feeds = {k: v for k, v in feeds.items() if k in self._input_set}
        if self.session is not None:
            try:
                return self.session.run(self.output_names, feeds)
            except Exception as e:  # noqa: BLE001
                if "NOT_IMPLEMENTED" not in str(e) and "not implemented" not in str(e).lower():
                    raise DmlgraphError(f"onnxruntime failed: {_first_line(e)}") from None
                self._use_reference(e)
        try:
            return [np.asarray(r) for r in self.reference.run(self.output_names, feeds)]
        except Exception as e:  # noqa: BLE001 - bad values for the model (as onnxruntime's run errors)
            raise DmlgraphError(f"onnx.reference failed: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
