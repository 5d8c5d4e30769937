"""Kernel benchmark: the DIAGONAL_MATRIX1 kernel against a plain copy and onnxruntime.

    python -m benchmarks kernels [--quick] [--json FILE]    (python -m benchmarks.kernels [--rounds N])

Median CPU time per call over interleaved rounds, each result checked bit for bit against
onnxruntime's. What each column measures and how the ratios are taken: docs/internals.md, benchmarks/kernels.py.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from dmlgraph.ir.dtypes import INT32_MAX, INT32_MIN
from dmlgraph.runtime import kernels

if TYPE_CHECKING:
    from onnx import ModelProto

ROW_KEYS = ("case", "shape", "dtype", "elements", "ours_us", "copy_baseline_us", "ratio_vs_copy",
            "ort_model", "ort_us", "ratio_vs_ort", "matches_ort", "numpy_us", "numpy_ratio_vs_copy",
            "numpy_ratio_vs_ort")

FULL_SHAPES = ((4096, 4096), (8, 1024, 1024), (2, 16, 512, 512), (64, 100000), (256, 256), (4, 5))
QUICK_SHAPES = ((256, 256), (4, 5))
FULL_TYPES = ("float32", "float16", "int64", "uint8")
QUICK_TYPES = ("float32", "uint8")
LARGE_ELEMENTS = 4 * 1024 * 1024
LARGE_TARGET = 0.85  # of the copy/fill bandwidth proxy
MIN_MEASURE_S = 0.002  # each timed measurement repeats the call until it lasts about this long
# CPU time of the calling thread: every callable runs on it (onnxruntime with one intra-op
# thread), and time spent descheduled on a shared machine is not counted.
CLOCK = time.thread_time


Case = tuple[str, int, int, int, bool, str | None, dict[str, int]]
Shape = tuple[int, ...]


def _cases(h: int, w: int) -> tuple[Case, ...]:
    """(name, begin, end, value, has_input, ort graph kind, ort params) per benchmark case."""
    k_big = w - 8
    return (
        # Trilu(x, k=0, upper=1) keeps x - y >= 0: zero topX < 0.
        ("triu", INT32_MIN, 0, 0, True, "trilu", {"upper": 1, "k": 0}),
        # Trilu(x, k=0, upper=0) keeps x - y <= 0: zero topX >= 1.
        ("tril", 1, INT32_MAX, 0, True, "trilu", {"upper": 0, "k": 0}),
        # Trilu(x, k=W-8, upper=1): almost all zero, a small triangle kept top right.
        ("triu_bigk", INT32_MIN, min(max(k_big, -h), w), 0, True, "trilu", {"upper": 1, "k": k_big}),
        # keep a narrow band topX in [-2, 3) (inverted range), zero elsewhere.
        ("band_keep", 3, -2, 0, True, "band", {"lo": -2, "hi": 2}),
        # set Value inside a narrow band topX in [-2, 3), input elsewhere.
        ("band_set", -2, 3, 1, True, None, {}),
        # identity, no input.
        ("eye", 0, 1, 1, False, "eyelike", {"k": 0}),
        # generated (causal) triangle of ones, no input: 1 where x - y <= 0.
        ("tri_gen", INT32_MIN, 1, 1, False, "const_trilu", {"upper": 0, "k": 0}),
    )


# --------------------------------------------------------------------------------------------
# onnxruntime side


def _onnx_type(dtype: np.dtype) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _ort_model(kind: str, params: dict[str, int], shape: Shape, dtype: np.dtype) -> tuple["ModelProto | None", str]:
    """A one- or two-node ONNX model (ir_version 10, opset 17) and its single input's name/array."""
    from onnx import NodeProto, TensorProto, helper, numpy_helper

    et = _onnx_type(dtype)
    y = helper.make_tensor_value_info("y", et, list(shape))
    inits: list[TensorProto] = []
    nodes: list[NodeProto] = []
    if kind == "trilu":
        x = helper.make_tensor_value_info("x", et, list(shape))
        inits.append(numpy_helper.from_array(np.array(params["k"], np.int64), "k"))
        nodes.append(helper.make_node("Trilu", ["x", "k"], ["y"], upper=params["upper"]))
        label = f"Trilu(upper={params['upper']}, k={params['k']})"
    elif kind == "band":
        x = helper.make_tensor_value_info("x", et, list(shape))
        inits += [numpy_helper.from_array(np.array(params["lo"], np.int64), "klo"),
                  numpy_helper.from_array(np.array(params["hi"], np.int64), "khi")]
        nodes += [helper.make_node("Trilu", ["x", "klo"], ["t"], upper=1),
                  helper.make_node("Trilu", ["t", "khi"], ["y"], upper=0)]
        label = f"Trilu(upper=1,k={params['lo']})->Trilu(upper=0,k={params['hi']})"
    elif kind == "eyelike":
        if len(shape) != 2:
            return None, "EyeLike is 2-D only"
        x = helper.make_tensor_value_info("x", et, list(shape))
        nodes.append(helper.make_node("EyeLike", ["x"], ["y"], k=params["k"]))
        label = f"EyeLike(k={params['k']})"
    elif kind == "const_trilu":
        x = helper.make_tensor_value_info("x", TensorProto.INT64, [len(shape)])
        one = helper.make_tensor("one", et, [1], np.ones(1, dtype).tobytes(), raw=True)
        inits.append(numpy_helper.from_array(np.array(params["k"], np.int64), "k"))
        nodes += [helper.make_node("ConstantOfShape", ["x"], ["c"], value=one),
                  helper.make_node("Trilu", ["c", "k"], ["y"], upper=params["upper"])]
        label = f"ConstantOfShape(1)->Trilu(upper={params['upper']})"
    else:
        return None, "no ONNX op"
    graph = helper.make_graph(nodes, "bench", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model, label


class _OrtRunner:
    def __init__(self, model: "ModelProto", input_array: np.ndarray, out: np.ndarray) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1  # one core each: the work, not the machine's load, is compared
        self.session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        self.binding = self.session.io_binding()
        self.binding.bind_cpu_input("x", input_array)
        self.out_value = ort.OrtValue.ortvalue_from_numpy(out)
        self.binding.bind_ortvalue_output("y", self.out_value)

    def __call__(self) -> None:
        self.session.run_with_iobinding(self.binding)


def _make_ort(kind: str | None, params: dict[str, int], shape: Shape, dtype: np.dtype, inp: np.ndarray | None,
              out: np.ndarray) -> tuple[Callable[[], None] | None, str]:
    """(callable or None, label) -- None with the reason when onnxruntime cannot run it."""
    if kind is None:
        return None, "n/a (no single ONNX op)"
    model, label = _ort_model(kind, params, shape, dtype)
    if model is None:
        return None, f"n/a ({label})"
    if kind == "const_trilu":
        x = np.array(shape, np.int64)
    else:
        x = inp if inp is not None else out
    try:
        run = _OrtRunner(model, np.ascontiguousarray(x), out)
        run()
    except Exception as err:  # noqa: BLE001 - NOT_IMPLEMENTED for the type, etc.: a row, not a crash
        msg = str(err)
        reason = "no kernel for this type" if "NOT_IMPLEMENTED" in msg else msg.splitlines()[0][:60]
        return None, f"n/a ({label}: {reason})"
    return run, label


# --------------------------------------------------------------------------------------------
# timing


def _calibrate(fn: Callable[[], object]) -> int:
    """How many calls make one measurement last about MIN_MEASURE_S."""
    fn()
    n = 1
    while True:
        t0 = CLOCK()
        for _ in range(n):
            fn()
        dt = CLOCK() - t0
        if dt >= MIN_MEASURE_S or n >= 1 << 20:
            return n
        n = max(n * 2, int(n * MIN_MEASURE_S / max(dt, 1e-9)) + 1)


def _measure(fn: Callable[[], object], n: int) -> float:
    t0 = CLOCK()
    for _ in range(n):
        fn()
    return (CLOCK() - t0) / n


def _input_for(shape: Shape, dtype: np.dtype) -> np.ndarray:
    n = int(np.prod(shape))
    base = (np.arange(n, dtype=np.int64) * 2654435761 % 251).astype(np.uint8)
    if np.dtype(dtype).kind == "f":
        return (base.astype(np.float32) * 0.37 + 1).astype(dtype).reshape(shape)
    return base.astype(dtype).reshape(shape)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}")


def _numpy_path(call: Callable[[], object]) -> None:
    """The same call on the numpy kernel (what an install without numba runs)."""
    with kernels.numpy_only():
        call()


def bench_kernels(quick: bool = False, rounds: int = 7,
                  progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run the kernel benchmark; one dict per case x shape x type (keys: ROW_KEYS)."""
    shapes = QUICK_SHAPES if quick else FULL_SHAPES
    types = QUICK_TYPES if quick else FULL_TYPES
    compiled = kernels.compiled_available()
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        h, w = shape[-2:]
        for tname in types:
            dtype = np.dtype(tname)
            inp_full = _input_for(shape, dtype)
            for name, begin, end, value, has_input, kind, params in _cases(h, w):
                inp = inp_full if has_input else None
                out = np.empty(shape, dtype)
                ref_out = np.empty(shape, dtype)
                ort_out = np.empty(shape, dtype)
                v = np.array(value, dtype)

                ours = partial(kernels.diagonal_matrix1, shape, dtype, v, begin, end, input=inp, out=out)
                base = partial(np.copyto, ref_out, inp) if inp is not None else partial(ref_out.fill, 0)
                numpy_path = partial(_numpy_path, ours)

                ort_fn, ort_label = _make_ort(kind, params, shape, dtype, inp, ort_out)
                fns: list[tuple[str, Callable[[], object]]] = [("ours", ours), ("copy", base)]
                if ort_fn is not None:
                    fns.append(("ort", ort_fn))
                if compiled:
                    fns.append(("numpy", numpy_path))
                counts = {k: _calibrate(f) for k, f in fns}
                times: dict[str, list[float]] = {k: [] for k, _ in fns}
                for r in range(max(1, rounds)):
                    order = fns[r % len(fns):] + fns[:r % len(fns)]
                    for k, f in order:
                        times[k].append(_measure(f, counts[k]))
                med = {k: statistics.median(ts) * 1e6 for k, ts in times.items()}

                def ratio(k: str, of: str = "ours", times: dict = times) -> float:
                    """Median over rounds of k's time / `of`'s, each pair measured in one round."""
                    return round(statistics.median(b / a for a, b in zip(times[of], times[k])), 3)
                matches = None
                if ort_fn is not None:
                    ours()
                    matches = bool(np.array_equal(_bits(out), _bits(ort_out)))
                row = {
                    "case": name,
                    "shape": list(shape),
                    "dtype": tname,
                    "elements": int(np.prod(shape)),
                    "ours_us": round(med["ours"], 2),
                    "copy_baseline_us": round(med["copy"], 2),
                    "ratio_vs_copy": ratio("copy"),
                    "ort_model": ort_label,
                    "ort_us": round(med["ort"], 2) if "ort" in med else None,
                    "ratio_vs_ort": ratio("ort") if "ort" in med else None,
                    "matches_ort": matches,
                    "numpy_us": round(med["numpy"], 2) if "numpy" in med else None,
                    "numpy_ratio_vs_copy": ratio("copy", of="numpy") if "numpy" in med else None,
                    "numpy_ratio_vs_ort": ratio("ort", of="numpy") if "numpy" in med and "ort" in med else None,
                }
                rows.append(row)
                if progress:
                    progress(row)
                del out, ref_out, ort_out, ort_fn
    return rows


# --------------------------------------------------------------------------------------------
# reporting


class Target(NamedTuple):
    """One goal of the suite: what, the threshold, whether every row meets it, and the counts."""
    goal: str
    target: str
    met: bool
    detail: str


def _where(r: dict[str, Any]) -> str:
    return f"{r['case']} {'x'.join(map(str, r['shape']))} {r['dtype']}"


def targets(rows: list[dict[str, Any]]) -> list[Target]:
    """The suite's goals, each over every row it applies to."""
    out: list[Target] = []
    large = [r for r in rows if r["elements"] >= LARGE_ELEMENTS]
    if large:
        worst = min(large, key=lambda r: r["ratio_vs_copy"])
        bad = [r for r in large if r["ratio_vs_copy"] < LARGE_TARGET]
        out.append(Target("kernel: large tensors (>= 4M elements) vs a copy/fill of the same bytes",
                          f">= {LARGE_TARGET}x, every row", not bad,
                          f"{len(large) - len(bad)}/{len(large)} rows; worst {worst['ratio_vs_copy']}x ({_where(worst)})"))
    with_ort = [r for r in rows if r["ratio_vs_ort"] is not None]
    if with_ort:
        worst = min(with_ort, key=lambda r: r["ratio_vs_ort"])
        bad = [r for r in with_ort if r["ratio_vs_ort"] <= 1.0]
        out.append(Target("kernel: vs onnxruntime's Trilu/EyeLike (one thread)", "> 1x, every row it runs", not bad,
                          f"{len(with_ort) - len(bad)}/{len(with_ort)} rows; worst {worst['ratio_vs_ort']}x "
                          f"({_where(worst)})"))
        mism = [r for r in with_ort if r["matches_ort"] is False]
        out.append(Target("kernel: bit-exact against onnxruntime", "every row", not mism,
                          f"{len(with_ort) - len(mism)}/{len(with_ort)} rows identical"))
    tiny = [r for r in rows if r["shape"] == [4, 5]]
    if tiny:
        worst = max(tiny, key=lambda r: r["ours_us"])
        bad = [r for r in tiny if r["ours_us"] > 3.0]
        out.append(Target("kernel: [4,5] calls", "<= 3 us", not bad,
                          f"{len(tiny) - len(bad)}/{len(tiny)} rows; slowest {worst['ours_us']} us ({_where(worst)})"))
    return out


def _fmt(v: object, digits: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def case_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case: the worst and median ratio to the copy over the large rows, how many of those reach
    the target, and the worst and median ratio to onnxruntime over the rows it runs."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        large = [r["ratio_vs_copy"] for r in mine if r["elements"] >= LARGE_ELEMENTS]
        ort = [r["ratio_vs_ort"] for r in mine if r["ratio_vs_ort"] is not None]
        out.append({
            "case": case,
            "large_rows": len(large),
            "large_min_vs_copy": min(large) if large else None,
            "large_median_vs_copy": round(statistics.median(large), 3) if large else None,
            "large_rows_met": sum(x >= LARGE_TARGET for x in large),
            "ort_rows": len(ort),
            "min_vs_ort": min(ort) if ort else None,
            "median_vs_ort": round(statistics.median(ort), 3) if ort else None,
            "ort_rows_faster": sum(x > 1.0 for x in ort),
        })
    return out


def _aligned(head: tuple[str, ...], body: Sequence[tuple[str, ...]], left: int) -> list[str]:
    """Columns padded to width; the first `left` columns left-aligned, numbers right-aligned."""
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(c.ljust(wd) if i < left else c.rjust(wd) for i, (c, wd) in enumerate(zip(row, widths))).rstrip()
             for row in [head, *body]]
    lines.insert(1, "  ".join("-" * wd for wd in widths))
    return lines


def format_summary(rows: list[dict[str, Any]]) -> str:
    """The per-case summary (case_summary) as a table, then the targets."""
    body = [(c["case"], f"{_fmt(c['large_min_vs_copy'])} / {_fmt(c['large_median_vs_copy'])}",
             f"{c['large_rows_met']}/{c['large_rows']}",
             f"{_fmt(c['min_vs_ort'])} / {_fmt(c['median_vs_ort'])}" if c["ort_rows"] else "n/a",
             f"{c['ort_rows_faster']}/{c['ort_rows']}" if c["ort_rows"] else "n/a")
            for c in case_summary(rows)]
    lines = _aligned(("case", "large x_copy min / median", f">= {LARGE_TARGET}", "x_ort min / median", "> 1.0"),
                     body, left=1)
    lines.append("")
    lines += [f"[{'met' if t.met else 'NOT met'}] {t.goal} ({t.target}): {t.detail}" for t in targets(rows)]
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]]) -> str:
    """Every row as a plain-text table, then the per-case summary and the targets."""
    head = ("case", "shape", "dtype", "ours_us", "copy_us", "x_copy", "ort_us", "x_ort", "np_x_copy",
            "np_x_ort", "ort model")
    body = [(r["case"], "x".join(map(str, r["shape"])), r["dtype"], _fmt(r["ours_us"]),
             _fmt(r["copy_baseline_us"]), _fmt(r["ratio_vs_copy"]), _fmt(r["ort_us"]),
             _fmt(r["ratio_vs_ort"]) + ("" if r["matches_ort"] in (None, True) else " MISMATCH"),
             _fmt(r.get("numpy_ratio_vs_copy")), _fmt(r.get("numpy_ratio_vs_ort")), r["ort_model"])
            for r in rows]
    lines = _aligned(head, body, left=3)
    lines.append("")
    lines.append("x_copy = copy_us / ours_us, x_ort = ort_us / ours_us (higher: ours faster); medians of "
                 "per-round ratios over interleaved rounds, preallocated outputs. np_x_copy: x_copy of the "
                 "numpy path (kernels.numpy_only()) in the same rounds, np_x_ort likewise; n/a without numba.")
    lines += ["", format_summary(rows)]
    return "\n".join(lines)


def payload(rows: list[dict[str, Any]], rounds: int, quick: bool) -> dict[str, Any]:
    """The JSON document of a run (keys: suite, rounds, quick, compiled, rows, cases, targets)."""
    return {"suite": "kernels", "rounds": rounds, "quick": quick, "compiled": kernels.compiled_available(),
            "rows": rows, "cases": case_summary(rows),
            "targets": [t._asdict() for t in targets(rows)]}


def _progress(row: dict[str, Any]) -> None:
    print(f"  {row['case']:<10} {'x'.join(map(str, row['shape'])):<14} {row['dtype']:<8} "
          f"ours {row['ours_us']:>10.2f} us  x_copy {row['ratio_vs_copy']:.2f}  "
          f"x_ort {_fmt(row['ratio_vs_ort'])}", file=sys.stderr, flush=True)


def run(quick: bool = False, rounds: int | None = None, json_out: str | None = None,
        log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run the suite, print the full table (progress per row on stderr), write JSON if asked."""
    rounds = rounds if rounds is not None else (3 if quick else 7)
    t0 = time.perf_counter()
    rows = bench_kernels(quick=quick, rounds=rounds, progress=_progress)
    log(format_table(rows))
    log(f"({len(rows)} rows, {rounds} rounds, {time.perf_counter() - t0:.1f} s)")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(payload(rows, rounds, quick), f, indent=1)
        log(f"wrote {json_out}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernels",
                                 description="Benchmark the DIAGONAL_MATRIX1 kernel against a copy and onnxruntime.")
    ap.add_argument("--quick", action="store_true", help="a reduced set (smoke test)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7, quick 3)")
    ap.add_argument("--json", dest="json_out", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    run(quick=args.quick, rounds=args.rounds, json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
