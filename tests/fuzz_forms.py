"""A fuzzer of mask *forms* (issue 26): hypothesis composes whole models the way exporters do, where
`fuzz_masks.py` varies one mask cone.

A model (`form_models`): x float [1, 2, S, S] (S symbolic, or static) and a boolean padding input;
a mask made by one source --
  * an index grid: Range over Shape(x)[2], compared with a shift (causal, shifted, sliding window);
  * Trilu or EyeLike of a shape-only ones tensor;
  * a stored band buffer [N, N] sliced to [S, S] by Shape (the dynamo form);
-- then a random sequence of forms: Not, Unsqueeze/Expand to 4-D, Transpose of the matrix axes,
Slice of all rows, a Cast to float and back through `1 - b`, And/Or with a second source, And/Or
with the padding (data), a stack of two masks Concat-ed along a batch axis and Split back; then an
application: Where either way, Add of a 0/-inf bias, Mul by the 0/1 gate, or GPT-1's blend
`x * b + -1e4 * (1 - b)`. The whole form may sit in an If branch reading the outer x.

The oracle (`oracle_bands`) evaluates every intermediate of the form (as a flat model) with
onnxruntime at several sizes and two random data sets, and marks the band tensors: the same under
both data sets, and at every size one DIAGONAL_MATRIX1 pattern (or one value). `check` then asks,
per model: no crash in optimize/inspect on either target; outputs equal to onnxruntime on the
original at sizes around every constant (bit for bit where every rewrite is exact, as values on
finite data otherwise; where onnxruntime's Where drops a -0.0, the ONNX reference evaluator judges);
every oracle band site lowered or declined with a reason in the census
(else a silent miss). `Stats` adds up the share of band sites lowered.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from fuzz_masks import CaseBuilder, _each_bits_either, reference, same_bits, same_values
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h

from dmlgraph import api
from dmlgraph.passes.generators import band_of

STORED_N = 12  # rows and columns of a stored band buffer (sizes past it fail in the original too)
FORMS = ["not", "rank4", "transpose", "slice_rows", "arith_not", "combine", "padding", "stack_split"]
APPLICATIONS = ["where_x_c", "where_c_x", "add_bias", "mul_gate", "blend"]


@dataclass
class FormCase:
    model: onnx.ModelProto  # what is optimized (the form maybe inside an If)
    flat: onnx.ModelProto  # the same nodes in the main graph: the oracle evaluates its intermediates
    static: int | None
    constants: list[int]
    in_if: bool
    description: str


@dataclass
class Stats:
    cases: int = 0
    sites: int = 0
    lowered: int = 0
    declined: int = 0
    silent: int = 0
    wrong: int = 0
    crashes: int = 0
    executor: int = 0  # signed-zero differences the executor shows on the original model too
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, other: "Stats") -> None:
        for k in ("cases", "sites", "lowered", "declined", "silent", "wrong", "crashes", "executor"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for r, n in other.reasons.items():
            self.reasons[r] = self.reasons.get(r, 0) + n

    def line(self) -> str:
        share = self.lowered / self.sites if self.sites else 1.0
        return (f"{self.cases} cases, {self.sites} band sites: {self.lowered} lowered ({share:.1%}), "
                f"{self.declined} declined, {self.silent} silent misses; {self.wrong} wrong results, "
                f"{self.crashes} crashes ({self.executor} executor signed-zero differences on the original too)")


def _int(b: CaseBuilder, v) -> str:
    return b.const(np.array(v, np.int64), "i")


def _ints(b: CaseBuilder, v) -> str:
    return b.const(np.array(v, np.int64), "a")


@st.composite
def _source(draw, b: CaseBuilder, constants: list[int]) -> tuple[str, str]:
    """A bool [S, S] mask over x's matrix; (its name, what it is)."""
    kind = draw(st.sampled_from(["grid", "grid", "window", "trilu", "eyelike", "stored"]))
    shape = b.op("Shape", ["x"], "shape")
    n = b.op("Gather", [shape, _int(b, 2)], "n", axis=0)
    if kind in ("grid", "window"):
        r = b.op("Range", [_int(b, 0), n, _int(b, 1)], "range")
        rows, cols = b.op("Unsqueeze", [r, _ints(b, [1])], "rows"), b.op("Unsqueeze", [r, _ints(b, [0])], "cols")
        k = draw(st.integers(-4, 4))
        constants.append(k)
        shifted = b.op("Add", [rows, _int(b, k)], "shifted")
        m = b.op(draw(st.sampled_from(["LessOrEqual", "Less", "GreaterOrEqual", "Greater"])), [cols, shifted], "cmp")
        if kind == "window":
            w = draw(st.integers(1, 5))
            constants.append(w)
            dist = b.op("Sub", [rows, cols], "dist")
            m = b.op("And", [m, b.op("Less", [dist, _int(b, w)], "win")], "window")
        return m, f"{kind} k={k}"
    matrix = b.op("Slice", [shape, _ints(b, [2]), _ints(b, [4])], "matrix")
    if kind == "trilu":
        ones = b.op("ConstantOfShape", [matrix], "ones", value=onnx.numpy_helper.from_array(np.ones(1, np.float32)))
        k = draw(st.integers(-4, 4))
        constants.append(k)
        upper = int(draw(st.booleans()))
        return b.op("Cast", [b.op("Trilu", [ones, _int(b, k)], "tri", upper=upper)], "band", to=T.BOOL), \
            f"trilu k={k} upper={upper}"
    if kind == "eyelike":
        ones = b.op("ConstantOfShape", [matrix], "zeros", value=onnx.numpy_helper.from_array(np.zeros(1, np.float32)))
        k = draw(st.integers(-3, 3))
        constants.append(k)
        return b.op("Cast", [b.op("EyeLike", [ones], "eye", k=k)], "band", to=T.BOOL), f"eyelike k={k}"
    lo, hi = sorted((draw(st.integers(-4, 4)), draw(st.integers(-4, 4))))
    top = np.arange(STORED_N)[None, :] - np.arange(STORED_N)[:, None]
    buffer = b.const((top >= lo) & (top <= hi) if draw(st.booleans()) else top <= hi, "buffer")
    constants += [lo, hi]
    n1 = b.op("Unsqueeze", [n, _ints(b, [0])], "n1")
    rows = b.op("Slice", [buffer, _ints(b, [0]), n1, _ints(b, [0])], "rows")
    return b.op("Slice", [rows, _ints(b, [0]), n1, _ints(b, [1])], "stored"), f"stored [{lo}, {hi}]"


@st.composite
def _forms(draw, b: CaseBuilder, m: str, constants: list[int], steps: list[str]) -> str:
    ranks: dict[str, int] = {}
    for _ in range(draw(st.integers(0, 3))):
        form = draw(st.sampled_from(FORMS))
        steps.append(form)
        r = ranks.get(m, 2)
        if form == "not":
            m = b.op("Not", [m], "not")
        elif form == "rank4" and r == 2:
            m = b.op("Unsqueeze", [m, _ints(b, [0, 1])], "m4")
            if draw(st.booleans()):
                m = b.op("Expand", [m, _ints(b, [1, 2, 1, 1])], "expanded")
            r = 4
        elif form == "transpose":
            m = b.op("Transpose", [m], "t", perm=list(range(r - 2)) + [r - 1, r - 2])
        elif form == "slice_rows":
            m = b.op("Slice", [m, _ints(b, [0]), _ints(b, [2**62]), _ints(b, [-2])], "sliced")
        elif form == "arith_not":  # 1 - Cast(b) as float, back to bool: Not through arithmetic
            f = b.op("Cast", [m], "f", to=T.FLOAT)
            m = b.op("Cast", [b.op("Sub", [b.const(np.float32(1), "one"), f], "inv")], "back", to=T.BOOL)
        elif form == "combine":
            other, what = draw(_source(b, constants))
            steps[-1] = f"combine({what})"
            if r == 4:
                other = b.op("Unsqueeze", [other, _ints(b, [0, 1])], "o4")
            m = b.op(draw(st.sampled_from(["And", "Or"])), [m, other], "comb")
        elif form == "padding":
            m = b.op(draw(st.sampled_from(["And", "Or"])), [m, "padding"], "padded")
            r = 4
        elif form == "stack_split" and r == 4:  # two bands stacked on the batch axis, then split back
            other, what = draw(_source(b, constants))
            other = b.op("Expand", [b.op("Unsqueeze", [other, _ints(b, [0, 1])], "o4"), _ints(b, [1, 2, 1, 1])], "oe")
            m = b.op("Expand", [m, _ints(b, [1, 2, 1, 1])], "me")
            first = draw(st.booleans())
            stacked = b.op("Concat", [m, other] if first else [other, m], "stack", axis=0)
            a, c = b.name("piece"), b.name("piece")
            b.nodes.append(h.make_node("Split", [stacked, _ints(b, [1, 1])], [a, c], axis=0))
            m = a if first else c
            steps[-1] = f"stack_split({what})"
        ranks[m] = r
    return m


@st.composite
def form_models(draw) -> FormCase:
    b = CaseBuilder()
    constants: list[int] = []
    m, what = draw(_source(b, constants))
    steps: list[str] = []
    m = draw(_forms(b, m, constants, steps))
    application = draw(st.sampled_from(APPLICATIONS))
    if application == "where_x_c":
        y = b.op("Where", [m, "x", b.const(np.float32(-np.inf), "fill")], "y")
    elif application == "where_c_x":
        y = b.op("Where", [m, b.const(np.float32(-1e9), "fill"), "x"], "y")
    elif application == "add_bias":
        bias = b.op("Where", [m, b.const(np.float32(0), "zero"), b.const(np.float32(-np.inf), "ninf")], "bias")
        y = b.op("Add", ["x", bias], "y")
    elif application == "mul_gate":
        y = b.op("Mul", ["x", b.op("Cast", [m], "gate", to=T.FLOAT)], "y")
    else:
        g = b.op("Cast", [m], "gate", to=T.FLOAT)
        fill = b.op("Mul", [b.op("Sub", [b.const(np.float32(1), "one"), g], "inv"), b.const(np.float32(-1e4), "big")],
                    "fill")
        y = b.op("Add", [b.op("Mul", ["x", g], "wx"), fill], "y")
    y = b.op("Identity", [y], "out")  # (the output keeps its name whatever rewrites the last node)
    static = draw(st.sampled_from([None, None, None, 3, 6]))
    in_if = draw(st.integers(0, 3)) == 0
    dim = static if static else "S"
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [1, 2, dim, dim]),
              h.make_tensor_value_info("padding", T.BOOL, [1, 1, 1, dim])]
    output = h.make_tensor_value_info(y, T.FLOAT, [1, 2, dim, dim])
    opsets = [h.make_opsetid("", 18)]
    flat = h.make_model(h.make_graph(b.nodes, "form", inputs, [output], b.inits), opset_imports=opsets, ir_version=10)
    if in_if:
        then = h.make_graph(b.nodes, "then", [], [h.make_tensor_value_info(y, T.FLOAT, None)], b.inits)
        other = h.make_graph([h.make_node("Identity", ["x"], ["x_else"])], "else", [],
                             [h.make_tensor_value_info("x_else", T.FLOAT, None)])
        inputs = inputs + [h.make_tensor_value_info("cond", T.BOOL, [])]
        node = h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other, name="form_if")
        model = h.make_model(h.make_graph([node], "form", inputs, [h.make_tensor_value_info("y", T.FLOAT, [1, 2, dim, dim])]),
                             opset_imports=opsets, ir_version=10)
    else:
        model = flat
    onnx.checker.check_model(model, full_check=True)  # (a generator bug, not a finding)
    description = f"{what} -> {' -> '.join(steps) or '(as is)'} -> {application}" + (" in If" if in_if else "") + \
        (f" static {static}" if static else "")
    return FormCase(model, flat, static, constants, in_if, description)


# ---- the oracle ----------------------------------------------------------------------------------
def sizes_of(case: FormCase, most: int = STORED_N) -> list[int]:
    if case.static:
        return [case.static]
    sizes = {1, 2, 3, 5, 8}
    for c in case.constants:
        sizes.update(abs(c) + d for d in (-1, 0, 1, 2))
    return sorted(s for s in sizes if 1 <= s <= most)


def feeds(case: FormCase, size: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 2, size, size)).astype(np.float32)
    x.reshape(-1)[::5] = np.float32(-0.0)
    f = {"x": x, "padding": rng.random((1, 1, 1, size)) < 0.7}
    if case.in_if:
        f["cond"] = np.array(True)
    return f


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def oracle_bands(case: FormCase) -> list[str]:
    """The intermediates of the form that are bands: data-independent, and at every size tried one
    DIAGONAL_MATRIX1 pattern over their matrices (or one value), a pattern at one size at least."""
    m = onnx.ModelProto()
    m.CopyFrom(case.flat)
    # Every node output becomes a model output, typed by inference (onnxruntime needs the types).
    inferred = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(case.flat).graph.value_info}
    del m.graph.output[:]
    m.graph.output.extend(inferred[o] for n in m.graph.node for o in n.output if o in inferred)
    names = [vi.name for vi in m.graph.output]
    sess = _session(m)
    seen_pattern, failed = set(), set()
    for size in sizes_of(case):
        try:
            one, two = sess.run(None, feeds(case, size, 1)), sess.run(None, feeds(case, size, 2))
        except Exception:  # noqa: BLE001 - a size the original cannot run (a stored buffer's end)
            continue
        for name, a, c in zip(names, one, two):
            a = np.asarray(a)
            if a.ndim < 2 or not same_bits(a, np.asarray(c)) or a.dtype.kind not in "biuf":
                failed.add(name)
                continue
            if a.size and np.all(a.reshape(-1) == a.reshape(-1)[0]):
                continue  # one value at this size: no pattern, no contradiction
            if band_of(a) is None:
                failed.add(name)
            else:
                seen_pattern.add(name)
    return [n for n in names if n in seen_pattern and n not in failed]


# ---- the check -----------------------------------------------------------------------------------
def check(case: FormCase) -> tuple[Stats, list[str]]:
    """The model through optimize (both targets) and inspect; its stats and the problems found."""
    stats, problems = Stats(cases=1), []
    try:
        lowered = {t: api.optimize(case.model, target=t) for t in ("dml", "onnx")}
        report = api.inspect(case.model).report
    except Exception as e:  # noqa: BLE001 - any exception on a model onnxruntime runs is a crash
        stats.crashes += 1
        return stats, [f"crash: {type(e).__name__}: {e}"]
    exact = all(r.exact for r in lowered["dml"].rewrites)
    want_session = _session(case.model)
    onnx_session = _session(lowered["onnx"].model)
    out = case.model.graph.output[0].name
    for size in sizes_of(case):
        f = feeds(case, size, 7)
        try:
            want = want_session.run(None, f)[0]
        except Exception:  # noqa: BLE001 - past a stored buffer's end: the original fails too
            continue
        got = {"onnx": onnx_session.run(None, f)[0], "dml": api.run(lowered["dml"].model, f)[out]}
        spec = None
        for target, g in got.items():
            ok = same_bits(want, g) if exact else same_values(want, g)
            if not ok and exact:  # onnxruntime's Where drops a -0.0 of its true branch: ONNX's Where does not
                spec = reference(case.model, f) if spec is None else spec
                ok = spec is not None and _each_bits_either(want, spec, g)
            if not ok and target == "dml" and same_values(want, g) and same_bits(api.run(case.model, f)[out], g):
                # The executor runs the original the same: onnxruntime's own graph optimizations (a Not
                # folded into a Where moves x into the true branch, whose kernel drops -0.0), not a rewrite.
                stats.executor += 1
                ok = True
            if not ok:
                stats.wrong += 1
                problems.append(f"wrong result: {target} at S={size} ({'exact' if exact else 'finite'})")
    rows = {r["value"]: r for r in report["masks"]}
    for site in oracle_bands(case):
        stats.sites += 1
        row = rows.get(site)
        status = row["status"] if row else None
        if status == "lowered":
            stats.lowered += 1
        elif status == "declined" and row and row["reason"]:
            stats.declined += 1
            key = f"{row['rule']}: {str(row['reason']).split(':', 2)[-1].strip()[:70]}"
            stats.reasons[key] = stats.reasons.get(key, 0) + 1
        else:
            stats.silent += 1
            problems.append(f"silent miss: band {site!r} is {'not in the census' if row is None else status}")
    return stats, problems
