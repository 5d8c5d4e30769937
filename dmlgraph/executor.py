"""Run a Graph: DML nodes on the numpy kernels, everything else in onnxruntime.

ONNX nodes are grouped into as few InferenceSessions as the graph allows: a node's *stage* is at
least the number of DML nodes on the longest path into it (and an ONNX node then moves as late as
its consumers allow), and all ONNX nodes of one stage form one region.
No path leaves a stage and comes back to it (it would have to cross a DML node, which raises the
stage), so every region runs as one session, created once and cached. Where onnxruntime has no
kernel for a region (e.g. Trilu on int8), `onnx.reference` runs it instead.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from dmlgraph import kernels
from dmlgraph.errors import DmlgraphError
from dmlgraph.graph import DmlNode, Graph, Node, OnnxNode, Value, outer_names
from dmlgraph.onnx_io import DOMAIN, onnx_node_proto, value_info
from dmlgraph.ops import bind_range
from dmlgraph.runtime import OnnxRunner, initializer_array, numpy_dtype  # noqa: F401 - re-exported


MAX_ELEMENTS = 2**32 - 1  # DML_BUFFER_TENSOR_DESC's limit; a bigger DML output is refused, not allocated


@dataclass
class Region:
    stage: int
    nodes: list[Node] = field(default_factory=list)
    runner: OnnxRunner | None = None
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


class Executor:
    """Runs a Graph on concrete inputs; `timings` keeps the last run's seconds per backend."""

    def __init__(self, graph: Graph, threads: int | None = None, optimize: bool = True):
        self.graph = graph
        self.threads = threads
        self.optimize = optimize
        self.steps = self._plan()
        self.timings: dict[str, float] = {}

    def _plan(self) -> list[Region | DmlNode]:
        g = self.graph
        order = g.topological_order()
        stage: dict[int, int] = {}
        for n in order:
            s = 0
            for v in n.inputs:
                p = v.producer if v is not None else None
                if p is not None and p.id in stage:
                    s = max(s, stage[p.id] + (1 if isinstance(p, DmlNode) else 0))
            stage[n.id] = s
        # Then each ONNX node moves as late as its consumers allow: what only later stages need (the
        # data path beside a mask, weights behind Identity nodes) runs in their region instead of
        # crossing a session boundary. Edges still never go to an earlier stage, so the invariant
        # above holds. Values read by name from subgraph bodies keep their producers in place.
        read_by_name = set().union(*(outer_names(n) for n in order if isinstance(n, OnnxNode)))
        for n in reversed(order):
            if isinstance(n, DmlNode) or any(v.name in read_by_name for v in n.outputs):
                continue
            later = [stage[c.id] for v in n.outputs for c in v.consumers if c.id in stage]
            if later:
                stage[n.id] = max(stage[n.id], min(later))
        regions: dict[int, Region] = {}
        dml_at: dict[int, list[DmlNode]] = {}
        for n in order:
            if isinstance(n, DmlNode):
                dml_at.setdefault(stage[n.id], []).append(n)
            else:
                regions.setdefault(stage[n.id], Region(stage[n.id])).nodes.append(n)
        steps: list[Region | DmlNode] = []
        for s in sorted(set(regions) | set(dml_at)):
            if s in regions:
                steps.append(regions[s])
                self._wire(regions[s])
            steps.extend(dml_at.get(s, []))
        return steps

    def _wire(self, region: Region) -> None:
        inside = {n.id for n in region.nodes}
        produced = {v.name for n in region.nodes for v in n.outputs}
        needed: list[str] = []
        for n in region.nodes:
            names = [v.name for v in n.inputs if v is not None]
            if isinstance(n, OnnxNode):
                names += sorted(outer_names(n))
            for name in names:
                if name not in produced and name not in needed:
                    needed.append(name)
        region.inputs = needed
        graph_out = {v.name for v in self.graph.outputs}
        region.outputs = [v.name for n in region.nodes for v in n.outputs
                          if v.name in graph_out or any(c.id not in inside for c in v.consumers)]

    def _runner(self, region: Region) -> OnnxRunner:
        if region.runner is None:
            g = self.graph
            inits, external, inputs = [], {}, []
            for name in region.inputs:
                v = g.values[name]
                if name in g.initializers:
                    if v.initializer is None:  # made by a rule
                        inits.append(onnx.numpy_helper.from_array(np.asarray(v.array), name))
                    else:
                        inits.append(v.initializer)
                        if v.initializer.data_location == onnx.TensorProto.EXTERNAL:
                            external[name] = initializer_array(v)  # memory-mapped, not read
                else:
                    inputs.append(value_info(v))
            proto = helper.make_graph([onnx_node_proto(n) for n in region.nodes], f"stage{region.stage}",
                                      inputs, [value_info(g.values[o]) for o in region.outputs], inits)
            opsets = [helper.make_opsetid(d, v) for d, v in g.info.opset_imports.items() if d != DOMAIN]
            model = helper.make_model(proto, opset_imports=opsets, ir_version=g.info.ir_version)
            model.functions.extend(g.info.functions)
            region.runner = OnnxRunner(model, self.threads, external, self.optimize)
        return region.runner

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = self.graph
        missing = [v.name for v in g.inputs if v.name not in feeds]
        if missing:
            raise DmlgraphError(f"missing inputs: {', '.join(missing)}",
                                hint=f"the model's inputs are {', '.join(v.name for v in g.inputs)}")
        env: dict[str, np.ndarray] = dict(feeds)
        t_ort = t_dml = 0.0
        for step in self.steps:
            t0 = time.perf_counter()
            if isinstance(step, DmlNode):
                env[step.outputs[0].name] = self._run_dml(step, env)
                t_dml += time.perf_counter() - t0
            else:
                runner = self._runner(step)
                results = runner.run({k: env[k] for k in runner.input_names})
                env.update(zip(runner.output_names, results))
                t_ort += time.perf_counter() - t0
        self.timings = {"onnx": t_ort, "dml": t_dml}
        out = {}
        for v in g.outputs:
            if v.name not in env and v.name in g.initializers:
                env[v.name] = initializer_array(g.initializers[v.name])
            out[v.name] = env[v.name]
        return out

    def _value(self, v: Value, env) -> np.ndarray:
        if v.name in env:
            return env[v.name]
        return initializer_array(self.graph.initializers[v.name])

    def _run_dml(self, node: DmlNode, env) -> np.ndarray:
        x_v, shape_v, k_v = node.inputs
        x = None if x_v is None else np.asarray(self._value(x_v, env))
        if shape_v is not None:
            shape = tuple(int(s) for s in np.asarray(self._value(shape_v, env)).reshape(-1))
        elif node.static_shape is not None:
            shape = node.static_shape
        else:
            shape = x.shape
        label = f"{node.kind} node {node.name or node.outputs[0].name!r}"
        if len(shape) < 2 or any(d < 0 for d in shape):
            raise DmlgraphError(f"{label}: output shape {list(shape)} is not a matrix (needs 2+ dims, none "
                                "negative)")
        if math.prod(shape) > MAX_ELEMENTS:
            raise DmlgraphError(f"{label}: output shape {list(shape)} has {math.prod(shape)} elements, more "
                                f"than DirectML allows (2^32 - 1)", hint="run it with smaller inputs")
        if k_v is None:
            k = 0
        else:
            k_arr = np.asarray(self._value(k_v, env))
            if k_arr.size != 1 or k_arr.dtype.kind not in "iu":
                raise DmlgraphError(f"{label}: k must be one integer, got shape {list(k_arr.shape)} {k_arr.dtype}")
            k = int(k_arr.reshape(-1)[0])
        dtype = numpy_dtype(node.elem_type)
        if x is not None:
            try:
                x = np.broadcast_to(x, shape)
            except ValueError:
                raise DmlgraphError(f"{label}: input shape {list(x.shape)} does not broadcast to the output shape "
                                    f"{list(shape)}", hint="the lowered model is inconsistent; re-optimize the "
                                    "original model") from None
        if 0 in shape:
            return np.zeros(shape, dtype)
        if node.kind == "DiagonalMatrix":
            return kernels.diagonal_matrix(shape, dtype, node.begin, float(node.value))
        begin, end = bind_range(node.begin, node.end, k, shape[-2], shape[-1])
        return kernels.diagonal_matrix1(shape, dtype, node.value, begin, end, input=x)
