"""Run a Graph: DML nodes on the numpy kernels, everything else in onnxruntime.

ONNX nodes are grouped by stage into as few cached InferenceSessions as the graph allows. A fast
path (the default) keeps the values that depend only on the input shapes and skips the steps that
make them; a mixed region runs as its *twin*, so both paths agree bit for bit. Bodies holding DML
nodes run as steps of their own (`control_flow`). Stages, the fast path and why it is exact:
docs/internals.md, runtime/executor.py.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import onnx
from onnx import helper

from dmlgraph.errors import DmlgraphError
from dmlgraph.io.onnx_io import DOMAIN, onnx_node_proto, value_info
from dmlgraph.ir.graph import DmlNode, Graph, Node, OnnxNode, Value
from dmlgraph.ir.ops import bind_range
from dmlgraph.runtime import control_flow, kernels
from dmlgraph.runtime.onnx_runner import OnnxRunner, initializer_array, numpy_dtype

MAX_ELEMENTS = 2**32 - 1  # DML_BUFFER_TENSOR_DESC's limit; a bigger DML output is refused, not allocated
CACHE_ENTRIES = 8  # input-shape sets whose shape constants are kept (least recently used dropped)
CACHE_BYTES = 256 * 1024 * 1024  # at most this many bytes of kept constants over all entries
# A twin is a second session over its region's weights: regions holding more stored bytes than
# this run as they are (their runs are long enough that the shape arithmetic matters little).
TWIN_MAX_WEIGHT_BYTES = 64 * 1024 * 1024

# ONNX ops (default domain, no subgraph) whose outputs are a deterministic function of their inputs,
# grouped by what their output *shapes* depend on. Anything else is never a shape constant.
_SHAPE_FROM_SHAPES = frozenset("""
    Abs Acos Acosh Add And Asin Asinh Atan Atanh BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor
    Cast CastLike Ceil Celu Clip Cos Cosh Div Elu Equal Erf Exp Floor Gelu Greater GreaterOrEqual
    HardSigmoid HardSwish Identity IsInf IsNaN LeakyRelu Less LessOrEqual Log Max Mean Min Mish Mod
    Mul Neg Not Or PRelu Pow Reciprocal Relu Round Selu Sigmoid Sign Sin Sinh Softplus Softsign Sqrt
    Sub Sum Tan Tanh ThresholdedRelu Where Xor
    Softmax LogSoftmax Hardmax Trilu EyeLike LayerNormalization
    Concat Gather GatherElements GatherND Transpose MatMul Gemm Flatten Einsum
""".split())  # output shapes follow from the input shapes (and attributes)
_SHAPE_FROM_FIRST = frozenset("""
    Reshape Expand Unsqueeze Squeeze Slice Tile Pad Split CumSum TopK OneHot ArgMax ArgMin
    ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
    ReduceSumSquare
""".split())  # ... from the first input's shape and the other inputs' values
_PURE = _SHAPE_FROM_SHAPES | _SHAPE_FROM_FIRST | {"Constant", "ConstantOfShape", "Range", "Shape", "Size"}


@dataclass
class Region:
    stage: int
    nodes: list[Node] = field(default_factory=list)
    runner: OnnxRunner | None = None
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    twin: OnnxRunner | None = None  # what the fast path runs instead, when there is one (`Executor._twin`)


def shape_constants(g: Graph, order: list[Node] | None = None) -> set[str]:
    """Names of the values that depend only on the shapes and dtypes of the graph inputs.

    Initializers (not overridable ones) are constants; Shape/Size of a value whose shape depends
    only on input shapes is one; so is the output of a deterministic op (`_PURE`, or a DML node)
    whose inputs all are. Which output shapes depend only on input shapes is tracked alongside:
    the op tables above say, per op, whether that needs the input shapes or also the values of
    the inputs after the first; a DML node's output shape is its shape input's value, else x's.
    """
    overridable = set(g.overridable_inputs)
    const = {name for name in g.initializers if name not in overridable}
    shaped = set(g.initializers) | {v.name for v in g.inputs}  # values whose shape is known from input shapes
    for n in order if order is not None else g.topological_order():
        ins = [v.name for v in n.inputs if v is not None]
        outs = [v.name for v in n.outputs]
        if isinstance(n, DmlNode):
            x, shape, _ = n.operands
            if all(name in const for name in ins):
                const.update(outs)
                shaped.update(outs)
            elif (shape is None or shape.name in const) and (x is None or x.name in shaped) \
                    and (n.matrix is None or n.matrix.name in const):
                shaped.update(outs)
            continue
        if n.domain not in ("", "ai.onnx") or n.op_type not in _PURE or cast(OnnxNode, n).has_subgraph:
            continue
        if n.op_type in ("Shape", "Size"):
            if ins and ins[0] in shaped:
                const.update(outs)
                shaped.update(outs)
        elif all(name in const for name in ins):
            const.update(outs)
            shaped.update(outs)
        elif n.op_type in _SHAPE_FROM_SHAPES:
            if all(name in shaped for name in ins):
                shaped.update(outs)
        elif n.op_type in _SHAPE_FROM_FIRST:
            first = n.inputs[0]
            if first is not None and first.name in shaped and all(name in const for name in ins[1:]):
                shaped.update(outs)
    return const


@dataclass(frozen=True)
class DmlCall:
    """One DML node as a run bound it: the operands a DML runtime would be handed, and the result.

    `x` is the input as the graph produced it (not broadcast: a DML input desc broadcasts it with
    zero strides); `k` is the run-time shift of the bounds (0 without a k input).
    """

    node: DmlNode
    shape: tuple[int, ...]
    x: np.ndarray | None
    k: int
    output: np.ndarray
    matrix: tuple[int, ...] | None = None  # the applied mask's own sizes (`DmlNode.matrix`), when read


@dataclass
class _Entry:
    """What the fast path keeps for one set of input shapes."""
    consts: dict[str, np.ndarray]  # outputs of skipped steps that later steps or the caller read
    nbytes: int
    bound: dict[int, tuple] = field(default_factory=dict)  # DML node id -> `_bind_dml`'s answer
    twinned: bool = False  # holds what the twins read (kept after they were made)


class Executor:
    """Runs a Graph on concrete inputs; `timings` keeps the last run's seconds per backend.

    timings: "onnx" and "dml" (seconds in onnxruntime sessions and in DML kernels), "total" (the
    whole run), "skipped" (steps the fast path did not run: their outputs were shape constants).
    A DML generator sized by input shapes runs its kernel on the first run at those shapes only;
    after that it is skipped and adds nothing to "dml". `last_path` says which path ran: "fast"
    or "simple".
    """

    def __init__(self, graph: Graph, threads: int | None = None, optimize: bool = True, fast: bool = True,
                 stages: Mapping[str, int] | None = None):
        self.graph = graph
        # `stages` (value name -> session, another Executor's `value_stages`) places a node making
        # one of those values in that session: `validate` runs the original cut as the lowered model
        self._pinned = dict(stages or {})
        self.threads = threads
        self.optimize = optimize
        # If/Loop/Scan nodes and calls whose bodies hold DML nodes run here (`control_flow`); a graph
        # with any takes the simple path every run.
        self._hosts = control_flow.host_nodes(graph)
        self.fast = fast and not self._hosts
        order = graph.topological_order()
        self.steps = self._plan(order)
        self.timings: dict[str, float] = {}
        self.last_path = ""
        self._cache: OrderedDict[tuple, _Entry] = OrderedDict()
        self._cache_bytes = 0
        self._const: set[str] = set()
        self._keep: list[str] = []
        self._const_outputs: set[str] = set()
        self._outputs: list[tuple[str, int]] = []
        self._fast_steps: list[Region | DmlNode] = []  # (planned below when the fast path is on)
        self._twinned = False
        # Initializers the model lets callers replace are baked into the plan: a feed for one
        # is refused (pipeline.run_graph writes it into the graph before an Executor is made).
        self._baked = frozenset(graph.overridable_inputs)
        if self.fast:
            self._plan_fast(order)

    def _plan(self, order: list[Node]) -> list[Region | DmlNode | control_flow.HostStep]:
        g = self.graph
        hosts = self._hosts
        stage: dict[int, int] = {}
        for n in order:
            s = 0
            for v in g.reads(n):  # (inputs, and what its bodies read)
                p = v.producer if v is not None else None
                if p is not None and p.id in stage:
                    s = max(s, stage[p.id] + (1 if isinstance(p, DmlNode) or p.id in hosts else 0))
            stage[n.id] = max([s] + [self._pinned[v.name] for v in n.outputs if v.name in self._pinned])
        # Then each ONNX node moves as late as its readers allow: what only later stages need (the
        # data path beside a mask, weights behind Identity nodes) runs in their region instead of
        # crossing a session boundary. Edges still never go to an earlier stage, so the invariant
        # above holds. A value's readers are its consumers (the nodes whose bodies read it among them).
        # Pinned nodes keep the other plan's stage; the nodes it does not have (what its clean-up
        # merged, what its DML nodes replaced) move too, so their values do not cross a session
        # boundary the other model's do not (ModernBERT float16's Identity of its norm weights).
        for n in reversed(order):
            if isinstance(n, DmlNode) or n.id in hosts or any(v.name in self._pinned for v in n.outputs):
                continue
            later = [stage[c.id] for v in n.outputs for c in v.consumers if c.id in stage]
            if later:
                stage[n.id] = max(stage[n.id], min(later))
        regions: dict[int, Region] = {}
        dml_at: dict[int, list[DmlNode | control_flow.HostStep]] = {}
        for n in order:
            if isinstance(n, DmlNode):
                dml_at.setdefault(stage[n.id], []).append(n)
            elif n.id in hosts:
                dml_at.setdefault(stage[n.id], []).append(control_flow.HostStep(g, cast(OnnxNode, n), self._sub_executor))
            else:
                regions.setdefault(stage[n.id], Region(stage[n.id])).nodes.append(n)
        steps: list[Region | DmlNode | control_flow.HostStep] = []
        for s in sorted(set(regions) | set(dml_at)):
            if s in regions:
                self._wire(regions[s])
                if regions[s].outputs:  # (else dead code nothing reads: a session must return something)
                    steps.append(regions[s])
            steps.extend(dml_at.get(s, []))
        return steps

    @property
    def fast_plan(self) -> list[Region | DmlNode]:
        """The steps the fast path runs (a region of onnxruntime nodes or a DML node), in order;
        empty without a fast path."""
        return list(self._fast_steps)

    @property
    def cache_bytes(self) -> int:
        """Bytes the fast path's per-shape cache holds now."""
        return self._cache_bytes

    def value_stages(self) -> dict[str, int]:
        """The session (region stage) that makes each value. onnxruntime rounds a value handed to
        another session to its type, where one session can keep the wider type of the Casts it
        inserts (float16 on CPU): a model run cut the same way rounds alike."""
        return {v.name: s.stage for s in self.steps if isinstance(s, Region) for n in s.nodes for v in n.outputs}

    def _wire(self, region: Region) -> None:
        inside = {n.id for n in region.nodes}
        produced = {v.name for n in region.nodes for v in n.outputs}
        needed: list[str] = []
        for n in region.nodes:
            names = [v.name for v in control_flow.reads(self.graph, n) if v is not None]
            for name in names:
                if name not in produced and name not in needed:
                    needed.append(name)
        region.inputs = needed
        graph_out = {v.name for v in self.graph.outputs}
        region.outputs = [v.name for n in region.nodes for v in n.outputs
                          if v.name in graph_out or any(c.id not in inside for c in v.consumers)]

    def _runner(self, region: Region, env: dict | None = None) -> OnnxRunner:
        """The region's session, made at its first run. A value nothing typed (the output of a
        function call whose body holds DML nodes, which onnx's inference cannot see into) is
        declared as an input with the type it has in `env` this run, and as an output untyped."""
        if region.runner is None:
            g = self.graph
            inits, external, inputs = [], {}, []
            for name in region.inputs:
                home = cast(Graph, g.owner(name))  # (in a body: an enclosing graph's value too)
                v = home.values[name]
                if name in home.initializers:  # (a constant stays one: onnxruntime prepacks weights)
                    if v.initializer is None:  # made by a rule
                        inits.append(onnx.numpy_helper.from_array(np.asarray(v.array), name))
                    else:
                        inits.append(v.initializer)
                        if v.initializer.data_location == onnx.TensorProto.EXTERNAL:
                            external[name] = initializer_array(v)  # memory-mapped, not read
                elif not v.elem_type and env is not None and name in env:
                    inputs.append(helper.make_tensor_value_info(
                        name, helper.np_dtype_to_tensor_dtype(np.asarray(env[name]).dtype), None))
                else:
                    inputs.append(value_info(v))
            outputs = [value_info(g.values[o]) if g.values[o].elem_type else onnx.ValueInfoProto(name=o)
                       for o in region.outputs]
            proto = helper.make_graph([onnx_node_proto(cast(OnnxNode, n)) for n in region.nodes], f"stage{region.stage}",
                                      inputs, outputs, inits)
            opsets = [helper.make_opsetid(d, v) for d, v in g.info.opset_imports.items() if d != DOMAIN]
            model = helper.make_model(proto, opset_imports=opsets, ir_version=g.info.ir_version)
            hosted = control_flow.dml_functions(g) if self._hosts else set()  # (run here, never in a session)
            model.functions.extend(f for f in g.info.functions if (f.domain, f.name, f.overload) not in hosted)
            region.runner = OnnxRunner(model, self.threads, external, self.optimize)
        return region.runner

    def _make_twins(self) -> None:
        """Twins for the regions the fast path runs, made once, when it first runs (a one-off run
        pays for no second session). Entries kept before hold no values for them: the fast path
        runs the regions themselves at their shapes once more and keeps those values then."""
        for step in self._fast_steps:
            if isinstance(step, Region) and step.runner is not None and not step.runner.external \
                    and sum(t.ByteSize() for t in step.runner.model.graph.initializer) <= TWIN_MAX_WEIGHT_BYTES:
                try:
                    self._twin(step)
                except DmlgraphError:  # onnxruntime would not load its own optimized graph: no twin
                    pass
        self._twinned = True

    def _twin(self, region: Region) -> bool:
        """Give the region a twin without its shape constants, for the fast path; False if it has none.

        onnxruntime would redo a region's Shape/Gather/Concat arithmetic on every run. The twin is
        the region's graph as onnxruntime optimized it, less every node whose outputs are all shape
        constants: the fast path feeds it their values from the cache. The region's own session
        becomes that same optimized graph, which also outputs what the twin reads, and neither is
        optimized again: both run the very same kernels (a fusion that matches a computed shape
        may not match a fed one), so the two paths agree bit for bit. It costs a second session
        over the region's weights (regions with external data keep one).
        """
        const = self._const
        if region.runner is None or region.runner.backend != "onnxruntime" or not any(
                v.name in const for n in region.nodes for v in n.outputs):
            return False
        opt = model = region.runner.model
        if self.optimize:
            try:
                fd, path = tempfile.mkstemp(suffix=".onnx")  # (a file, not a folder: rmdir costs ms on some disks)
            except OSError:  # nowhere to write: no twin
                return False
            os.close(fd)
            try:
                if OnnxRunner(model, self.threads, optimized_path=path).backend != "onnxruntime":
                    return False
                opt = onnx.load(path)
            finally:
                os.remove(path)
        g = opt.graph
        keep = [n for n in g.node if not all(o in const for o in n.output if o)]
        if not keep or len(keep) == len(g.node) or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in keep for a in n.attribute):
            return False  # nothing to drop, or bodies that read values by name
        produced = {o for n in keep for o in n.output}
        used = {name for n in keep for name in n.input}
        known = produced | {v.name for v in g.input} | {t.name for t in g.initializer}
        needs = list(dict.fromkeys(name for n in keep for name in n.input if name and name not in known))
        types = [self.graph.values[name].elem_type or 0 for name in needs]
        if not all(types):
            return False
        twin = helper.make_graph(keep, g.name, [v for v in g.input if v.name in used]  # (fed: typed, any shape)
                                 + [helper.make_tensor_value_info(name, t, None) for name, t in zip(needs, types)],
                                 [v for v in g.output if v.name in produced],
                                 [t for t in g.initializer if t.name in used])
        declared = {v.name for v in g.output}
        g.output.extend(onnx.ValueInfoProto(name=name) for name in needs if name not in declared)
        runner = OnnxRunner(opt, self.threads, optimize=False)
        fast = OnnxRunner(helper.make_model(twin, opset_imports=opt.opset_import, ir_version=opt.ir_version),
                          self.threads, optimize=False)
        if runner.backend != "onnxruntime" or fast.backend != "onnxruntime":
            return False
        region.runner, region.twin = runner, fast
        # what the twin reads, and the region's outputs it no longer makes, now come from the cache
        cached = set(needs) | {name for name in region.outputs if name not in produced}
        self._keep = sorted(set(self._keep) | cached)
        self._const_outputs |= cached & {name for name, _ in self._outputs}
        self._outputs = [(name, 1 if name in self._const_outputs else how) for name, how in self._outputs]
        return True

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._baked and not self._baked.isdisjoint(feeds):
            self._refuse_baked(feeds)
        key = self._key(feeds) if self.fast else None
        if key is not None:
            entry = self._cache.get(key)
            if entry is not None:
                if not self._twinned:
                    self._make_twins()
                self._cache.move_to_end(key)
                return self._run_fast(key, entry, feeds)
        out, env = self._run_simple(feeds)
        if key is not None:
            self._remember(key, env)
        return out

    def _refuse_baked(self, feeds: dict[str, np.ndarray]) -> None:
        names = ", ".join(sorted(self._baked.intersection(feeds)))
        raise DmlgraphError(f"the feeds replace initializers this Executor was built with: {names}",
                            hint="run through dmlgraph.run or dmlgraph.pipeline.run_graph, which write them into the graph "
                                 "before the run (pipeline.apply_overrides)")

    def run_traced(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[DmlCall]]:
        """Run every step (the simple path) and record each DML node's operands and output, in order.

        For tools that hand single operators to another runtime (a DxDispatch export): the values
        they need are the real intermediate values of this run, not re-derived ones."""
        if self._baked and not self._baked.isdisjoint(feeds):
            self._refuse_baked(feeds)
        trace: list[DmlCall] = []
        out, _ = self._run_simple(feeds, trace)
        return out, trace

    def _run_simple(self, feeds: dict[str, np.ndarray],
                    trace: list[DmlCall] | None = None) -> tuple[dict[str, np.ndarray], dict]:
        """Every step, every time: the reference the fast path is checked against."""
        t_start = time.perf_counter()
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
                if trace is not None:
                    trace.append(DmlCall(step, *self._dml_operands(step, env), env[step.outputs[0].name],
                                         self._matrix(step, env)))
            elif isinstance(step, control_flow.HostStep):
                env.update(step.run(lambda name: self._value(cast(Value, g.find(name)), env), trace))
                t_dml += time.perf_counter() - t0
            else:
                runner = self._runner(step, env)
                results = runner.run({k: env[k] for k in runner.input_names})
                env.update(zip(runner.output_names, results))
                t_ort += time.perf_counter() - t0
        out = {}
        for v in g.outputs:
            if v.name not in env and v.name in g.initializers:
                env[v.name] = initializer_array(g.initializers[v.name])
            out[v.name] = env[v.name]
        self.timings = {"onnx": t_ort, "dml": t_dml, "total": time.perf_counter() - t_start, "skipped": 0}
        self.last_path = "simple"
        return out, env

    def _sub_executor(self, body: Graph) -> "Executor":
        """The executor of a body a HostStep runs (same settings)."""
        return Executor(body, self.threads, self.optimize)

    # ---- the fast path ------------------------------------------------------------------------
    def _plan_fast(self, order: list[Node]) -> None:
        g = self.graph
        const = self._const = shape_constants(g, order)
        skipped = [s for s in self.steps if (s.outputs[0].name in const if isinstance(s, DmlNode)
                                              else all(name in const for name in s.outputs))]
        skip_ids = {id(s) for s in skipped}
        # (no HostStep: the fast path is planned only for graphs without host nodes)
        self._fast_steps = cast("list[Region | DmlNode]", [s for s in self.steps if id(s) not in skip_ids])
        self._skipped = len(skipped)
        made = {name for s in skipped for name in ([s.outputs[0].name] if isinstance(s, DmlNode) else s.outputs)}
        read: set[str] = {v.name for v in g.outputs}
        for s in self._fast_steps:
            if isinstance(s, DmlNode):
                read.update(v.name for v in s.inputs if v is not None)  # (a claimed node's matrix too)
            else:
                read.update(s.inputs)
        self._keep = sorted(made & read)  # what the fast path reads from the cache (twins add theirs)
        outputs = {v.name for v in g.outputs}
        self._const_outputs = outputs & made  # handed out as copies: the cached array stays intact
        produced = {v.name for n in order for v in n.outputs} | {v.name for v in g.inputs}
        self._outputs = [(v.name, 1 if v.name in self._const_outputs else
                          0 if v.name in produced or v.name not in g.initializers else 2) for v in g.outputs]
        self._input_names = [v.name for v in g.inputs]
        # DML nodes run through a kernel prepared per input-shape set when only x varies
        self._bindable = {s.id for s in self._fast_steps if isinstance(s, DmlNode) and s.kind == "DiagonalMatrix1"
                          and s.inputs[0] is not None and all(v is None or v.name in const for v in s.inputs[1:])}

    def _key(self, feeds: dict[str, np.ndarray]) -> tuple | None:
        """The input shapes and dtypes, when the fast path may serve these feeds (plain arrays, no extras)."""
        if len(feeds) != len(self._input_names):
            return None
        key: list[object] = []
        for name in self._input_names:
            x = feeds.get(name)
            if type(x) is not np.ndarray:
                return None
            key.append(x.shape)
            key.append(x.dtype)
        return tuple(key)

    def _remember(self, key: tuple, env: dict) -> None:
        consts = {}
        for name in self._keep:
            a = env[name]
            if type(a) is not np.ndarray:
                return
            if name in self._const_outputs:
                a = a.copy()  # the caller holds the array the simple path returned
            consts[name] = a  # else only onnxruntime and the DML kernels read it, never writing
        nbytes = sum(a.nbytes for a in consts.values())
        if nbytes > CACHE_BYTES:
            return
        old = self._cache.pop(key, None)
        if old is not None:
            self._cache_bytes -= old.nbytes
        self._cache[key] = _Entry(consts, nbytes, twinned=self._twinned)
        self._cache_bytes += nbytes
        while len(self._cache) > CACHE_ENTRIES or self._cache_bytes > CACHE_BYTES:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= old.nbytes

    def _run_fast(self, key: tuple, entry: _Entry, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        perf = time.perf_counter
        t_start = perf()
        env = dict(feeds)
        env.update(entry.consts)
        t_ort = t_dml = 0.0
        bound_all = entry.bound
        twinned = entry.twinned
        for step in self._fast_steps:
            t0 = perf()
            if isinstance(step, Region):
                runner = (twinned and step.twin) or step.runner or self._runner(step)
                env.update(zip(runner.output_names, runner.run_exact({k: env[k] for k in runner.input_names})))
                t_ort += perf() - t0
                continue
            bound = bound_all.get(step.id)
            if bound is None:
                bound = bound_all[step.id] = self._bind_dml(step, env)
            if bound:
                x = env.get(bound[0])
                if x.__class__ is np.ndarray and x.shape == bound[1]:
                    env[bound[2]] = bound[3](x)
                    t_dml += perf() - t0
                    continue
            env[step.outputs[0].name] = self._run_dml(step, env)
            t_dml += perf() - t0
        out = {}
        for name, const in self._outputs:
            if const == 0:
                out[name] = env[name]
            elif const == 1:  # a kept shape constant: the caller gets its own copy
                out[name] = env[name].copy()
            else:  # an initializer
                out[name] = initializer_array(self.graph.initializers[name])
        if not twinned:  # the regions ran, so env holds what their twins read: keep it now
            self._remember(key, env)
            if key in self._cache:
                self._cache[key].bound = bound_all
        self.timings = {"onnx": t_ort, "dml": t_dml, "total": perf() - t_start, "skipped": self._skipped}
        self.last_path = "fast"
        return out

    def _bind_dml(self, node: DmlNode, env: dict[str, np.ndarray]) -> tuple:
        """(x's name, x's shape, the output's name, prepared kernel) for a node whose shape and k
        are constants at these input shapes; () otherwise (the node then takes `_run_dml`, as it
        does whenever x comes with another shape). x may broadcast to the output (a padding row)."""
        if node.id not in self._bindable:
            return ()
        x_name = cast(Value, node.inputs[0]).name  # a bindable node has x
        x = env.get(x_name)
        if type(x) is not np.ndarray:
            return ()
        shape, dtype, _, bound = self._dml_checked(node, env)  # (checks that x broadcasts)
        if not bound or self._broadcast_form(node, shape, env):  # (zero-size, or a band broadcast: the general path)
            return ()
        return (x_name, x.shape, node.outputs[0].name,
                kernels.prepare_diagonal_matrix1(shape, dtype, node.value, *bound, input_shape=x.shape))

    def _value(self, v: Value, env: dict[str, np.ndarray]) -> np.ndarray:
        if v.name in env:
            return env[v.name]
        return initializer_array(self.graph.initializers[v.name])

    def _run_dml(self, node: DmlNode, env: dict[str, np.ndarray]) -> np.ndarray:
        shape, dtype, x, bound = self._dml_checked(node, env)
        if 0 in shape:
            return np.zeros(shape, dtype)
        if node.kind == "DiagonalMatrix":
            return kernels.diagonal_matrix(shape, dtype, cast(int, node.begin), float(node.value))  # begin: the offset
        hw = self._broadcast_form(node, shape, env)
        if hw:  # the mask's [H, W] is not the output's matrix: its band, broadcast as the model did
            band = kernels.diagonal_matrix1(hw, np.bool_, np.True_, *bind_range(node.begin, node.end,
                                                                                  self._dml_operands(node, env)[2], *hw))
            return np.where(band, np.asarray(node.value, dtype), np.zeros(shape, dtype) if x is None else x)
        return kernels.diagonal_matrix1(shape, dtype, node.value, *cast("tuple[int, int]", bound), input=x)  # 0 not in shape

    def _matrix(self, node: DmlNode, env: dict[str, np.ndarray]) -> tuple[int, ...] | None:
        """The sizes of the mask a claimed node applies (`DmlNode.matrix`), else None."""
        if not node.claimed or node.matrix is None:
            return None
        return tuple(int(s) for s in np.asarray(self._value(node.matrix, env)).reshape(-1))

    def _broadcast_form(self, node: DmlNode, shape: tuple[int, ...], env: dict[str, np.ndarray]) -> tuple[int, int] | None:
        """The mask's [H, W] when a claimed node's output matrix is not it (a claim the inputs broke)."""
        m = self._matrix(node, env)
        return None if m is None or m[-2:] == shape[-2:] else (m[-2], m[-1])

    def _dml_operands(self, node: DmlNode, env: dict[str, np.ndarray]) -> tuple[tuple[int, ...], np.ndarray | None, int]:
        """(output shape, x as produced, k), with the checks on the shape and on k. A claimed
        node's output is its sizes broadcast with its mask's (`DmlNode.matrix`)."""
        x_v, shape_v, k_v = node.operands
        x = None if x_v is None else np.asarray(self._value(x_v, env))
        if shape_v is not None:
            shape = tuple(int(s) for s in np.asarray(self._value(shape_v, env)).reshape(-1))
        elif node.static_shape is not None:
            shape = node.static_shape
        else:
            shape = cast(np.ndarray, x).shape  # a node without shape input or static shape has x
        label = f"{node.kind} node {node.name or node.outputs[0].name!r}"
        matrix = self._matrix(node, env)
        if matrix is not None:
            try:
                shape = tuple(int(d) for d in np.broadcast_shapes(shape, matrix))
            except ValueError:
                raise DmlgraphError(f"{label}: its mask's sizes {list(matrix)} do not broadcast with the output "
                                    f"sizes {list(shape)}", hint="onnxruntime refuses these inputs too") from None
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
        return shape, x, k

    def _dml_checked(self, node: DmlNode, env: dict[str, np.ndarray]
                     ) -> tuple[tuple[int, ...], np.dtype, np.ndarray | None, tuple[()] | tuple[int, int]]:
        """(shape, dtype, x broadcast to shape, (begin, end)) with every check `run` makes; the
        range is () for a zero-size output and for DIAGONAL_MATRIX (which has none)."""
        shape, x, k = self._dml_operands(node, env)
        label = f"{node.kind} node {node.name or node.outputs[0].name!r}"
        dtype = numpy_dtype(node.elem_type)
        if x is not None:
            try:
                x = np.broadcast_to(x, shape)
            except ValueError:
                # Most often the inputs break a dim name the model declares on two inputs, which the
                # lowered sizes read from one of them (docs/limits.md: a dynamo KV decoder's
                # attention_mask longer than past + sequence, or input_ids of one row against it)
                raise DmlgraphError(f"{label}: input shape {list(x.shape)} does not broadcast to the output shape "
                                    f"{list(shape)}", hint="the inputs break a dim name the model declares on two "
                                    "inputs (e.g. an attention_mask whose length is not past + sequence), a size "
                                    "the lowered model reads from one of them; give inputs whose sizes agree with "
                                    "the dim names, else re-optimize the original model") from None
        if 0 in shape or node.kind == "DiagonalMatrix":
            return shape, dtype, x, ()
        return shape, dtype, x, bind_range(node.begin, node.end, k, shape[-2], shape[-1])
