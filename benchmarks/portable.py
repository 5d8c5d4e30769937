"""`python -m benchmarks portable`: the portable output (`optimize(path, target="onnx")`) against the
model it came from, run by onnxruntime on CPU (issue 25, item 4).

For every model of models/ with saved input sets (models/inputs/<model>/*.npz) and, where the
model runs at it, a long prefill with an empty past (1024 tokens; 128 with --quick) built from
the model's own inputs:

* time: both sessions (default session options: ORT_ENABLE_ALL) in this one process, at one
  intra-op thread and at onnxruntime's default; rounds interleaved (original, portable; the order
  flips every round), each round one block of back-to-back runs per session (calibrated to about
  MIN_BLOCK_S); ratio = portable / original, the median of the per-round ratios (load that drifts
  between rounds cancels). One thread is timed in CPU time of this process (the session runs on
  the calling thread: time descheduled on a shared machine is not counted), the default threads
  in wall time (a pool of threads: the latency is the thing). Goal: <= 1.0 at every input set.
* equality: at every input set and thread setting, every output of the portable model is
  compared bit for bit (dtype, shape and bytes: -0.0 and NaN payloads included) with the
  original's. A mismatch is a failure and is not timed.
* peak memory of a run: each model (original and portable) in a fresh child process per
  measurement, one thread, onnxruntime's CPU arena and memory pattern off (so the resident set
  follows the tensors a run allocates, not the arena's growth in doubling chunks; glibc's
  malloc mapping every buffer of a page or more, with no top pad, see CHILD_ENV), the
  high-water mark reset (/proc/self/clear_refs 5) after the session is built. The judged figure
  is the process's peak during a run over the interpreter before the session (VmHWM minus that
  VmRSS: session and run, what a user's process peaks at), at the model's largest input set (the
  long prefill where it runs), for the first run and for a second (the mark reset again: a
  session's first run also faults in kernel code and builds lazy state, about 1 MiB). The run's
  increment over its built session is reported beside it, not judged: a run's small buffers land
  in the heap a session's build freed, so a smaller session shows a larger increment (a model
  cleaned of duplicate Shape reads alone, the same onnxruntime kernels, ran +28 KiB over a
  session 280 KiB smaller: docs/benchmarks.md, "Eighth round").
  Both children first run one tiny model of the ops the portable forms write (`_warm_kernels`),
  so that neither first run counts the code pages of a kernel the other child has already
  touched (the original's own kernels are not the portable's: Trilu, EyeLike, Expand).
  Children alternate original / portable (and with --control a copy of the original, the A/A
  arm); medians of 5 repeats (1 with --quick). Children of one
  model spread by a few pages, so a median a page over is not a finding: a model is demonstrably
  higher only when every portable child peaks above every original child (`above`).
* slower or noise: per input set, the per-round ratios' median and its 95% interval (the sign
  test's: order statistics of the rounds, distribution-free; `interval`). A set is "slower" only
  when its whole interval is above 1.0 (significantly more than half of the rounds ran slower),
  else "not slower"; the counts are a goal row and a line of the table.
* kernels: the nodes of onnxruntime's optimized model (ORT_ENABLE_ALL, CPU) of each side, the
  kernels a run launches (`kernels`; the table's last column and an informational goal row).
* `--control`: an A/A arm in the same rounds, the original against a second session of itself:
  the noise floor of every figure above on this machine (each ratio should be 1.0; its sets
  counted slower are the false alarms). `--baseline DIR`: another arm, the portable outputs
  another checkout wrote to DIR/<model>.onnx (main's, say: `write_portable`), timed in the same
  rounds and compared bit for bit as well; with `--control`, "vs_control" is the portable's
  ratio to the A/A session round by round (a second reference: at a 1024-token prefill the A/A
  arm itself ran 0.91-0.96x of the first session, one thread). Per set, `sets_table` puts the
  arms side by side.

Run: `python -m benchmarks portable [--quick] [--json FILE]` (`python -m benchmarks.portable
[--rounds N] [--exact] [--models NAME ...] [--control] [--baseline DIR] [--memory-only
[--repeats N]]`). A baseline folder from
another checkout: `cd /tmp && PYTHONPATH=/path/to/main python -m benchmarks.portable --write-portable
DIR --models ...` run with this file on the path (it only calls `dmlgraph.optimize`).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.procstat import proc_status

if TYPE_CHECKING:
    import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
LONG_PREFILL = 1024
QUICK_LONG_PREFILL = 128
QUICK_MODELS = ("llama_kv_ts", "concat_causal_halves_dynamo", "trilu_past_dynamo")
MIN_BLOCK_S = 0.002  # each timed block repeats a session's run until it lasts about this long
THREADS = (1, 0)  # 0: onnxruntime's default (one per physical core)
RATIO_GOAL = 1.0
MB = 1024 * 1024
# glibc's malloc with a fixed mmap threshold: every buffer of 64 KiB or more is its own mapping, given
# back when freed, so the resident set follows the live tensors. With the default (dynamic)
# threshold, the first free of a mapped buffer raises it and later buffers come from the heap,
# which keeps freed memory: one model's run peaked at 26 or 50 MiB from child to child (A/A).
# A page, not 64 KiB, and no top pad: a buffer of 4-64 KiB carved from the heap's slack stays
# resident after it is freed, and how much slack a session's build leaves differs from graph to
# graph, so the first run's peak moved by 0.1-0.2 MiB with the heap, not the tensors (benchmarks.md).
CHILD_ENV = dict(os.environ, MALLOC_MMAP_THRESHOLD_="4096", MALLOC_TOP_PAD_="0", MALLOC_TRIM_THRESHOLD_="0")


@dataclass
class Row:
    """One model x input set x thread setting (JSON keys: the fields)."""
    model: str
    input_set: str
    threads: str  # "1" or "default"
    original_us: float | None
    portable_us: float | None
    ratio: float | None  # portable / original: median of per-round ratios
    equal: bool  # every output bit-identical
    rounds: int = 0
    note: str = ""
    lo: float | None = None  # the 95% interval of the median ratio (`interval`; None: too few rounds)
    hi: float | None = None
    # the other arms timed in the same rounds: {"control" | "baseline": {"ratio", "lo", "hi"}}, and
    # "vs_control": the portable's ratio to the control's session, round by round
    arms: dict[str, dict[str, float | None]] = field(default_factory=dict)

    @property
    def slower(self) -> bool | None:
        """Demonstrably slower: the whole interval above 1.0 (None: no interval)."""
        return None if self.lo is None else self.lo > RATIO_GOAL


def _ratio(portable: float | None, original: float | None) -> float | None:
    """portable / original MiB; below a page's worth, both are "nothing": 1.0 rather than a ratio
    of noise (a process's peak is hundreds of pages: never floored)."""
    if original is None or portable is None:
        return None
    return max(portable, 4 / 1024) / max(original, 4 / 1024)


@dataclass
class Memory:
    """Peak memory of one run, original vs portable, at one input set (medians of fresh children)."""
    model: str
    input_set: str
    original_run_mib: float | None
    portable_run_mib: float | None
    original_session_mib: float | None = None
    portable_session_mib: float | None = None
    repeats: int = 0
    note: str = ""
    # A second run's peak (the high-water mark reset again after the first run): the steady state,
    # without what only a session's first run pays (kernel code faulted in, lazily built state).
    original_second_mib: float | None = None
    portable_second_mib: float | None = None
    # Demonstrably higher (`above`): every portable child's peak above every original child's
    # (first run, second run); None below MIN_RANKED children a side.
    higher: bool | None = None
    second_higher: bool | None = None
    # The process's high-water mark over the interpreter during a run (session included): what a
    # user's process peaks at. The increments above (`*_run_mib`) also count where a run's small
    # buffers land: a session whose build freed more heap leaves more slack for them
    # (docs/benchmarks.md, "Eighth round"), so a smaller session can show a larger increment.
    original_peak_mib: float | None = None
    portable_peak_mib: float | None = None
    original_second_peak_mib: float | None = None
    portable_second_peak_mib: float | None = None
    peak_higher: bool | None = None
    second_peak_higher: bool | None = None
    # With --control, an A/A arm: the original again, in its own children (the noise floor of the
    # figures above: its median over the original's, and whether it is "demonstrably higher").
    control_peak_mib: float | None = None
    control_peak_higher: bool | None = None

    @property
    def ratio(self) -> float | None:
        return _ratio(self.portable_run_mib, self.original_run_mib)

    @property
    def second_ratio(self) -> float | None:
        return _ratio(self.portable_second_mib, self.original_second_mib)

    @property
    def peak_ratio(self) -> float | None:
        return _ratio(self.portable_peak_mib, self.original_peak_mib)

    @property
    def second_peak_ratio(self) -> float | None:
        return _ratio(self.portable_second_peak_mib, self.original_second_peak_mib)

    def ratios(self) -> dict[str, float | None]:
        return {"ratio": self.ratio, "second_ratio": self.second_ratio, "peak_ratio": self.peak_ratio,
                "second_peak_ratio": self.second_peak_ratio}


@dataclass
class Result:
    rows: list[Row] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "model: why" (a long prefill that cannot run, ...)
    failures: list[str] = field(default_factory=list)  # "model set: what failed" (mismatch, error)
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> nodes/bytes before/after
    load: list[list[float]] = field(default_factory=list)  # os.getloadavg() at the start and the end


# ---- the corpus and its feeds -----------------------------------------------------------------------
def corpus(names: list[str] | None = None) -> list[tuple[str, str, dict[str, str]]]:
    """(model name, path, {input set: npz path}) for every model of models/ with saved input sets."""
    folder = os.path.join(MODELS, "inputs")
    out = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(MODELS, name + ".onnx")
        sets = {f[:-4]: os.path.join(folder, name, f) for f in sorted(os.listdir(os.path.join(folder, name)))
                if f.endswith(".npz")}
        if os.path.exists(path) and sets and (names is None or name in names):
            out.append((name, path, sets))
    return out


def load_feeds(npz: str) -> dict[str, np.ndarray]:
    with np.load(npz) as data:
        return {k: data[k] for k in data.files}


def long_prefill(model: onnx.ModelProto, sets: dict[str, dict[str, np.ndarray]],
                 length: int) -> tuple[dict[str, np.ndarray] | None, str]:
    """Feeds for a prefill of `length` tokens with an empty past, from the model's inputs: the
    template is the saved `prefill` set (else the set of the smallest batch); every axis whose
    symbolic dim is the sequence (`sequence`, or `past_sequence + sequence` with an empty past)
    is grown to `length` by repeating the template's values along it (token ids stay in the
    vocabulary, attention masks stay ones). (None, why) where it cannot be built."""
    if not sets:
        return None, "no saved input set to start from"
    name = "prefill" if "prefill" in sets else min(sets, key=lambda s: (min(
        (a.shape[0] for a in sets[s].values() if a.ndim), default=1), s))
    template = sets[name]
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    seq_names = {"sequence", "past_sequence + sequence", "seq", "seq_len", "sequence_length"}
    feeds: dict[str, np.ndarray] = {}
    grown = 0
    for key, arr in template.items():
        shape = dims.get(key)
        if shape is None or len(shape) != arr.ndim:
            return None, f"input {key!r}: no shape in the model to read the sequence axis from"
        if any(d == "past_sequence" for d in shape) and 0 not in arr.shape:
            return None, f"template set {name!r} has a non-empty past ({key} {arr.shape})"
        out = arr
        for axis, d in enumerate(shape):
            if isinstance(d, str) and d in seq_names:
                if out.shape[axis] == 0:
                    return None, f"input {key!r} is empty along the sequence axis"
                out = np.take(out, np.arange(length) % out.shape[axis], axis=axis)
                grown += 1
        feeds[key] = np.ascontiguousarray(out)
    if not grown:
        return None, "no input has a symbolic sequence axis (static shapes)"
    return feeds, f"from {name!r}"


# ---- running ----------------------------------------------------------------------------------------
def session(model: bytes | str, threads: int, *, memory_stats: bool = False) -> Any:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 4  # a long prefill past a model's positions fails by design: the row says so
    if memory_stats:
        opts.enable_cpu_mem_arena = False
        opts.enable_mem_pattern = False
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def identical(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit: dtype, shape and bytes (-0.0 against 0.0 and NaN payloads differ)."""
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == \
        np.ascontiguousarray(b).tobytes()


def compare(names: list[str], ours: list[np.ndarray], theirs: list[np.ndarray]) -> str:
    """'' when every output is identical, else what differs (first few outputs)."""
    bad = []
    for n, a, b in zip(names, ours, theirs):
        if identical(a, b):
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            bad.append(f"{n}: {b.dtype}{list(b.shape)} vs {a.dtype}{list(a.shape)}")
        else:
            with np.errstate(all="ignore"):
                diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            bad.append(f"{n}: {int(np.sum(a != b))} elements differ, max |diff| {np.nanmax(diff):.3g}")
    return "; ".join(bad[:3])


CONFIDENCE = 0.95


def interval(ratios: list[float], confidence: float = CONFIDENCE) -> tuple[float | None, float | None]:
    """The distribution-free interval of the median of `ratios` (the sign test's): the k-th
    smallest and k-th largest, k the largest with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2,
    so it holds the true median with at least `confidence`. (None, None) below 6 rounds (no k)."""
    n = len(ratios)
    tail, k, cdf = (1 - confidence) / 2, 0, 0.0
    while k < n and cdf + math.comb(n, k) / 2 ** n <= tail:
        cdf += math.comb(n, k) / 2 ** n
        k += 1
    if k == 0:
        return None, None
    ordered = sorted(ratios)
    return ordered[k - 1], ordered[n - k]


def time_arms(orig: Any, arms: list[Any], feeds: dict[str, np.ndarray], names: list[str], rounds: int,
              clock: Callable[[], float]) -> tuple[float, list[float], list[list[float]]]:
    """(original s/run, each arm's s/run, each arm's per-round ratios arm/original): interleaved
    rounds, each a block of `inner` back-to-back runs per session, the sessions' order rotated and
    reversed round by round (each one is first and last as often)."""
    t0 = clock()
    orig.run(names, feeds)
    one = max(clock() - t0, 1e-6)
    inner = max(1, min(1000, int(MIN_BLOCK_S / one) + 1))
    sessions = (orig, *arms)
    times: list[list[float]] = [[] for _ in sessions]
    for r in range(rounds):
        order = list(range(len(sessions)))
        order = order[r // 2 % len(order):] + order[:r // 2 % len(order)]
        for i in (order if r % 2 == 0 else order[::-1]):
            s = sessions[i]
            t0 = clock()
            for _ in range(inner):
                s.run(names, feeds)
            times[i].append((clock() - t0) / inner)
    ratios = [[p / o for o, p in zip(times[0], t) if o > 0] for t in times[1:]]
    return statistics.median(times[0]), [statistics.median(t) for t in times[1:]], ratios


def time_pair(orig: Any, port: Any, feeds: dict[str, np.ndarray], names: list[str], rounds: int,
              clock: Callable[[], float]) -> tuple[float, float, float]:
    """(original s/run, portable s/run, median per-round ratio portable/original)."""
    o, (p,), (ratios,) = time_arms(orig, [port], feeds, names, rounds, clock)
    return o, p, statistics.median(ratios)


def bench_model(name: str, path: str, portable: bytes, feed_sets: dict[str, dict[str, np.ndarray]],
                rounds: int, result: Result, log: Callable[..., None], arms: dict[str, bytes] | None = None) -> None:
    """Every input set at each thread setting: compare the outputs, then time the pair (and the
    other `arms`, "control" / "baseline", in the same rounds; a baseline is compared too)."""
    arms = arms or {}
    for threads in THREADS:
        label = "1" if threads == 1 else "default"
        clock = time.process_time if threads == 1 else time.perf_counter
        orig, port = session(path, threads), session(portable, threads)
        others = {k: session(m, threads) for k, m in arms.items()}
        names = [o.name for o in orig.get_outputs()]
        for set_name, feeds in feed_sets.items():
            try:
                want = orig.run(names, feeds)
            except Exception as e:  # the original itself cannot run it (a long prefill past its positions)
                if set_name.startswith("prefill_"):
                    if threads == THREADS[0]:
                        result.skipped.append(f"{name} {set_name}: the original does not run it ({str(e)[:160]})")
                    continue
                raise
            diff = ""
            for arm, sess in [("portable", port), *(("baseline", s) for k, s in others.items() if k == "baseline")]:
                try:
                    got = sess.run(names, feeds)
                except Exception as e:  # noqa: BLE001 - any failure of the portable model is a failure row
                    diff = f"the {arm} model fails: {str(e)[:200]}"
                    break
                diff = compare(names, got, want)
                if diff:
                    diff = f"{arm} outputs differ: {diff}"
                    break
            if diff:
                result.failures.append(f"{name} {set_name} ({label} thread): {diff}")
                result.rows.append(Row(name, set_name, label, None, None, None, False, note=f"MISMATCH: {diff}"))
                continue
            gc.collect()
            o, times, ratios = time_arms(orig, [port, *others.values()], feeds, names, rounds, clock)
            lo, hi = interval(ratios[0])
            row = Row(name, set_name, label, o * 1e6, times[0] * 1e6, statistics.median(ratios[0]), True, rounds,
                      lo=lo, hi=hi)
            per_arm = dict(zip(others, ratios[1:]))
            if "control" in per_arm:  # the portable against the A/A clone: a reference without the first one's place
                per_arm["vs_control"] = [p / c for p, c in zip(ratios[0], per_arm["control"])]
            for arm, r in per_arm.items():
                a_lo, a_hi = interval(r)
                row.arms[arm] = {"ratio": statistics.median(r), "lo": a_lo, "hi": a_hi}
            result.rows.append(row)
        del orig, port, others
        gc.collect()
    worst = max((r for r in result.rows if r.model == name and r.ratio is not None), key=lambda r: r.ratio or 0,
                default=None)
    if worst is not None:
        log(f"  {name}: worst {worst.ratio:.3f}x ({worst.input_set}, {worst.threads} thread)")


# ---- memory: fresh children -------------------------------------------------------------------------


def _warm_kernels() -> None:
    """Run the kernels the portable forms write (and the selects they share with the originals)
    once on tiny tensors: their code pages are then resident in both children alike."""
    from onnx import TensorProto as T
    from onnx import helper as h
    ones = h.make_tensor("one", T.BOOL, [1], [True])
    fones = h.make_tensor("fone", T.FLOAT, [1], [1.0])
    nodes = [h.make_node("ConstantOfShape", ["hw"], ["b"], value=ones),
             h.make_node("ConstantOfShape", ["hw"], ["f"], value=fones),
             h.make_node("Trilu", ["b", "k"], ["bt"]), h.make_node("Trilu", ["f", "k"], ["ft"], upper=0),
             h.make_node("EyeLike", ["f"], ["e"], k=1), h.make_node("Expand", ["bt", "hw"], ["be"]),
             h.make_node("Or", ["be", "bt"], ["bo"]), h.make_node("And", ["bo", "bt"], ["ba"]),
             h.make_node("Where", ["ba", "ft", "e"], ["w"]), h.make_node("Add", ["w", "ft"], ["y"])]
    g = h.make_graph(nodes, "warm", [], [h.make_tensor_value_info("y", T.FLOAT, [3, 3])],
                     [h.make_tensor("hw", T.INT64, [2], [3, 3]), h.make_tensor("k", T.INT64, [], [0])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    session(model.SerializeToString(), 1, memory_stats=True).run(None, {})


def _memory_child(model_path: str, feeds_path: str) -> None:
    """In a fresh interpreter: build the session (one thread, no arena), reset the high-water mark,
    run once, reset it again and run again; print JSON {session, run, second} in bytes."""
    feeds = load_feeds(feeds_path)
    import onnxruntime  # noqa: F401  (imported before the baseline)
    _warm_kernels()
    gc.collect()
    base = proc_status()["VmRSS"]
    sess = session(model_path, 1, memory_stats=True)
    names = [o.name for o in sess.get_outputs()]
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    before = proc_status()["VmRSS"]
    outputs = sess.run(names, feeds)
    peak = proc_status()["VmHWM"]
    del outputs
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    again = proc_status()["VmRSS"]
    outputs = sess.run(names, feeds)
    second = proc_status()["VmHWM"]
    print(json.dumps({"session": before - base, "run": peak - before, "second": second - again,
                      "peak": peak - base, "second_peak": second - base,
                      "output_bytes": sum(int(o.nbytes) for o in outputs)}))


def memory_supported() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return "VmHWM" in proc_status()
    except OSError:
        return False


def bench_memory(name: str, path: str, portable_path: str, set_name: str, feeds: dict[str, np.ndarray],
                 repeats: int, tmp: str, control: bool = False) -> Memory:
    """Fresh children per side, alternating (`control`: a third side, a copy of the original)."""
    feeds_path = os.path.join(tmp, f"{name}.{set_name}.npz")
    np.savez(feeds_path, **feeds)  # type: ignore[arg-type]
    paths = {"original": path, "portable": portable_path}
    if control:
        paths["control"] = os.path.join(tmp, f"{name}.control.onnx")
        shutil.copyfile(path, paths["control"])
    got: dict[str, list[dict[str, int]]] = {which: [] for which in paths}
    sides = list(paths)
    for r in range(repeats):
        for which in sides[r % len(sides):] + sides[:r % len(sides)]:  # (each side first in turn)
            model = paths[which]
            proc = subprocess.run([sys.executable, "-m", "benchmarks.portable", "--memory-child", model, feeds_path],
                                  capture_output=True, text=True, cwd=ROOT, env=CHILD_ENV)
            if proc.returncode != 0:
                return Memory(name, set_name, None, None, note=f"{which} child failed: {proc.stderr.strip()[-200:]}")
            got[which].append(json.loads(proc.stdout.strip().splitlines()[-1]))

    def med(which: str, key: str) -> float:
        return statistics.median(g[key] for g in got[which]) / MB

    def higher(key: str, side: str = "portable") -> bool | None:
        return above([g[key] for g in got["original"]], [g[key] for g in got[side]])

    return Memory(name, set_name, med("original", "run"), med("portable", "run"), med("original", "session"),
                  med("portable", "session"), repeats, original_second_mib=med("original", "second"),
                  portable_second_mib=med("portable", "second"), higher=higher("run"),
                  second_higher=higher("second"), original_peak_mib=med("original", "peak"),
                  portable_peak_mib=med("portable", "peak"), original_second_peak_mib=med("original", "second_peak"),
                  portable_second_peak_mib=med("portable", "second_peak"), peak_higher=higher("peak"),
                  second_peak_higher=higher("second_peak"),
                  control_peak_mib=med("control", "peak") if control else None,
                  control_peak_higher=higher("peak", "control") if control else None)


MIN_RANKED = 4  # children a side for `above` (4: 1 chance in 70 under no difference; 5: 1 in 252)


def above(original: list[int], portable: list[int]) -> bool | None:
    """Whether the portable side's peaks are demonstrably higher: all of them above all of the
    original's (the rank test's extreme: with n children a side and no difference, every ordering
    is equally likely, so this happens by chance once in C(2n, n)). Medians alone cannot say:
    children of one model spread by a few pages (docs/benchmarks.md, branch `peakmem`)."""
    if min(len(original), len(portable)) < MIN_RANKED:
        return None
    return min(portable) > max(original)


# ---- the suite --------------------------------------------------------------------------------------
def _nodes(model: onnx.ModelProto) -> int:
    from dmlgraph.rewrite.nested import all_nodes
    return sum(1 for _ in all_nodes(model.graph.node))


def kernels(model: bytes | str, tmp: str) -> int:
    """Nodes of onnxruntime's optimized model (ORT_ENABLE_ALL, CPU): the kernels a run launches."""
    import onnx
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.optimized_model_filepath = os.path.join(tmp, "ort_optimized.onnx")
    ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    return len(onnx.load(opts.optimized_model_filepath, load_external_data=False).graph.node)


def _runs(path: str, feed_sets: dict[str, dict[str, np.ndarray]]) -> list[str]:
    """The sets the original runs (a long prefill past its positions does not: skipped, as timed)."""
    sess, out = session(path, 1), []
    for set_name, feeds in feed_sets.items():
        try:
            sess.run(None, feeds)
        except Exception:  # the original cannot run it (past its positions): not a memory candidate
            if not set_name.startswith("prefill_"):
                raise
            continue
        out.append(set_name)
    return out


def rounds_for(quick: bool) -> int:
    return 3 if quick else 21


def run(quick: bool = False, json_out: str | None = None, log: Callable[..., None] = print,
        rounds: int | None = None, exact: bool = False, models: list[str] | None = None,
        memory: bool = True, control: bool = False, baseline: str | None = None, timing: bool = True,
        repeats: int | None = None) -> Result:
    """control: an A/A arm, a second session of the original model timed in the same rounds (the
    method's noise floor: every ratio should be 1.0). baseline: a folder of other portable outputs
    (<model>.onnx) timed as a third arm. timing=False: the memory children only (each set the
    original runs is a candidate; no rows), `repeats` of them per model (default 5; 1 with quick)."""
    import onnx

    import dmlgraph
    rounds = rounds or rounds_for(quick)
    length = QUICK_LONG_PREFILL if quick else LONG_PREFILL
    names = models if models is not None else (list(QUICK_MODELS) if quick else None)
    result = Result(load=[list(os.getloadavg())])
    start = time.perf_counter()
    with_memory = memory and memory_supported()
    with tempfile.TemporaryDirectory(prefix="dmlgraph-portable-") as tmp:
        for name, path, set_paths in corpus(names):
            log(f"{name} ...")
            original = onnx.load(path)
            try:
                optimized = dmlgraph.optimize(path, target="onnx", exact=exact)
            except Exception as e:  # noqa: BLE001 - recorded as the model's failure; the others still run
                result.failures.append(f"{name}: optimize failed: {str(e)[:200]}")
                continue
            portable_path = os.path.join(tmp, name + ".portable.onnx")
            optimized.save(portable_path)
            with open(portable_path, "rb") as f:
                portable = f.read()
            arms: dict[str, bytes] = {}
            if baseline is not None:
                with open(os.path.join(baseline, name + ".onnx"), "rb") as f:
                    arms["baseline"] = f.read()
            if control:
                with open(path, "rb") as f:
                    arms["control"] = f.read()
            result.sizes[name] = {"nodes_before": _nodes(original), "nodes_after": _nodes(optimized.model),
                                  "bytes_before": os.path.getsize(path), "bytes_after": len(portable),
                                  "rewrites": len(optimized.rewrites), "kernels_before": kernels(path, tmp),
                                  "kernels_after": kernels(portable, tmp)}
            feed_sets = {s: load_feeds(p) for s, p in set_paths.items()}
            long_name = f"prefill_{length}"
            long_feeds, why = long_prefill(original, feed_sets, length)
            if long_feeds is None:
                result.skipped.append(f"{name} {long_name}: {why}")
            else:
                feed_sets[long_name] = long_feeds
            try:
                if timing:
                    bench_model(name, path, portable, feed_sets, rounds, result, log, arms)
                    ran = {r.input_set for r in result.rows if r.model == name and r.ratio is not None}
                else:
                    ran = set(_runs(path, feed_sets))
            except Exception as e:  # noqa: BLE001 - recorded as the model's failure; the others still run
                result.failures.append(f"{name}: the original fails: {str(e)[:200]}")
                continue
            if with_memory:
                candidates = [s for s in feed_sets if s in ran]
                if candidates:
                    big = max(candidates, key=lambda s: (s == long_name, sum(a.nbytes for a in feed_sets[s].values())))
                    result.memory.append(bench_memory(name, path, portable_path, big, feed_sets[big],
                                                      repeats or (1 if quick else 5), tmp, control))
        if not with_memory:
            result.skipped.append("memory: /proc/self/clear_refs is not writable here (not Linux?): not measured")
    result.load.append(list(os.getloadavg()))
    log(f"done in {time.perf_counter() - start:.0f}s (load average {result.load[0][0]:.1f} at the start, "
        f"{result.load[-1][0]:.1f} at the end, {os.cpu_count()} CPUs)\n")
    log(table(result))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(payload(result, quick, rounds, exact) | {"control": control}, f, indent=1, default=str)
        log(f"wrote {json_out}")
    return result


# ---- summaries ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    goal: str
    detail: str
    target: str
    met: bool | None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def per_model(result: Result) -> list[dict[str, Any]]:
    """Per model: median and worst ratio (named) at each thread setting, outputs, memory."""
    out = []
    for model in dict.fromkeys([*(r.model for r in result.rows), *(m.model for m in result.memory)]):
        entry: dict[str, Any] = {"model": model}
        rows = [r for r in result.rows if r.model == model]
        for label in ("1", "default"):
            timed = [r for r in rows if r.threads == label and r.ratio is not None]
            worst = max(timed, key=lambda r: r.ratio or 0.0, default=None)
            entry[label] = {"median": statistics.median(r.ratio for r in timed if r.ratio is not None) if timed else None,
                            "worst": None if worst is None else worst.ratio,
                            "worst_set": None if worst is None else worst.input_set,
                            "sets": len(timed), "over": sum((r.ratio or 0) > RATIO_GOAL for r in timed)}
        entry["equal"] = all(r.equal for r in rows)
        entry["compared"] = len(rows)
        mem = next((m for m in result.memory if m.model == model), None)
        entry["memory"] = None if mem is None else asdict(mem) | mem.ratios()
        entry["sizes"] = result.sizes.get(model)
        out.append(entry)
    return out


def targets(result: Result) -> list[Target]:
    """The goal rows (for the goals table): ratios at one and default threads, equality, memory."""
    out = []
    for label, what in (("1", "one thread"), ("default", "default threads")):
        timed = [r for r in result.rows if r.threads == label]
        ratios = [r.ratio for r in timed if r.ratio is not None]
        if not ratios:
            out.append(Target(f"portable vs original in onnxruntime CPU, {what}", "not measured", "<= 1.0x, every set",
                              None))
            continue
        worst = max((r for r in timed if r.ratio is not None), key=lambda r: r.ratio or 0.0)
        ok = sum(x <= RATIO_GOAL for x in ratios)
        out.append(Target(f"portable vs original in onnxruntime CPU, {what}",
                          f"{ok}/{len(timed)} input sets <= 1.0x; median {statistics.median(ratios):.3f}x, worst "
                          f"{worst.ratio:.3f}x ({worst.model} {worst.input_set})", "<= 1.0x, every input set",
                          ok == len(timed)))
    for label, what in (("1", "one thread"), ("default", "default threads")):
        judged = [r for r in result.rows if r.threads == label and r.slower is not None]
        if judged:
            c = slow_counts(judged)
            out.append(Target(f"input sets demonstrably slower ({CONFIDENCE:.0%} interval above 1.0x), {what}",
                              "; ".join(f"{arm} {n}/{m} slower" for arm, (n, m) in c.items()), "0", c["portable"][0] == 0))
    counted = {m: z for m, z in result.sizes.items() if "kernels_before" in z}
    if counted:
        fewer = sorted(m for m, z in counted.items() if z["kernels_after"] < z["kernels_before"])
        more = [f"{m} {z['kernels_before']} -> {z['kernels_after']}" for m, z in sorted(counted.items())
                if m not in fewer]
        out.append(Target("onnxruntime kernels (optimized model's nodes), portable vs original",
                          f"{len(fewer)}/{len(counted)} models fewer" + (f"; not fewer: {', '.join(more)}" if more else ""),
                          "fewer, every KV decoder", None))
    compared = len(result.rows)
    equal = sum(r.equal for r in result.rows)
    out.append(Target("portable outputs bit-identical to the original's", f"{equal}/{compared} model x set x threads",
                      "every one",
                      None if not compared and not result.failures else  # (memory only: nothing compared)
                      equal == compared > 0 and not result.failures))
    out += _memory_targets(result.memory)
    return out


def _memory_targets(memory: list[Memory]) -> list[Target]:
    """The memory goal rows: the process's peak during a run (session included) against the
    original's, first and second run, and whether it is demonstrably higher; the run's increment
    over its built session beside them, not judged (it moves with the heap a build leaves)."""
    out = []
    measured = [m for m in memory if m.peak_ratio is not None]
    for what, judged, ratios, flags in (
            ("peak memory of a run (the process's, session included)", True, ("peak_ratio", "second_peak_ratio"),
             ("peak_higher", "second_peak_higher")),
            ("a run's increment over its built session", False, ("ratio", "second_ratio"), ("higher", "second_higher"))):
        for run, attr in zip(("first", "second"), ratios):
            mem = [m for m in measured if getattr(m, attr) is not None]
            if not mem:
                continue
            worst = max(mem, key=lambda m: getattr(m, attr))
            ok = sum(getattr(m, attr) <= 1.0 for m in mem)
            over = [(m.control_peak_mib or 0) > (m.original_peak_mib or 0) for m in mem if m.control_peak_mib is not None]
            noise = f"; the A/A control over the original at {sum(over)}/{len(over)}" \
                if judged and run == "first" and over else ""
            out.append(Target(f"{what}, {run} run, portable vs original",
                              f"{ok}/{len(mem)} models <= 1.0x; worst {getattr(worst, attr):.2f}x ({worst.model} "
                              f"{worst.input_set}){noise}", "<= 1.0x, every model" if judged else "informational",
                              ok == len(mem) == len(memory) if judged else None))
        ranked = [m for m in measured if getattr(m, flags[0]) is not None]
        if ranked:
            first = [m.model for m in ranked if getattr(m, flags[0])]
            again = [m.model for m in ranked if getattr(m, flags[1])]
            aa_higher = [m.model for m in ranked if m.control_peak_higher] if judged else []
            control = judged and any(m.control_peak_higher is not None for m in ranked)
            out.append(Target(f"{what} demonstrably higher (every portable child above every original child), "
                              "first / second run",
                              f"{len(first)}/{len(ranked)} / {len(again)}/{len(ranked)} models"
                              + (f" (first: {', '.join(first)})" if first else "")
                              + (f" (second: {', '.join(again)})" if again else "")
                              + (f"; the A/A control, first run: {len(aa_higher)}/{len(ranked)}" if control else ""),
                              "0" if judged else "informational", not first and not again if judged else None))
    return out


def slow_counts(rows: list[Row]) -> dict[str, tuple[int, int]]:
    """Per arm (portable, then the others): (sets whose whole interval is above 1.0, sets with an interval)."""
    out = {"portable": (sum(bool(r.slower) for r in rows), sum(r.slower is not None for r in rows))}
    for arm in dict.fromkeys(a for r in rows for a in r.arms):
        lows = [r.arms[arm]["lo"] for r in rows if arm in r.arms and r.arms[arm]["lo"] is not None]
        out[arm] = (sum((x or 0) > RATIO_GOAL for x in lows), len(lows))
    return out


def _stat(ratio: float | None, lo: float | None, hi: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.3f}" + ("" if lo is None or hi is None else f" [{lo:.3f}, {hi:.3f}]") \
        + (" SLOWER" if lo is not None and lo > RATIO_GOAL else "")


def sets_table(rows: list[dict[str, Any]] | list[Row], markdown: bool = False) -> str:
    """Per input set and thread setting, each arm's median ratio and its 95% interval (SLOWER: all
    of it above 1.0), then the counts per arm and thread setting. Rows as Row or as their JSON."""
    data = [asdict(r) if isinstance(r, Row) else r for r in rows]
    data = [r for r in data if r.get("ratio") is not None]
    arms = list(dict.fromkeys(a for r in data for a in r.get("arms", {})))
    head = ["model", "set", "threads", "portable", *arms]
    body = [[r["model"], r["input_set"], r["threads"], _stat(r["ratio"], r.get("lo"), r.get("hi")),
             *(_stat(*(r["arms"][a].get(k) for k in ("ratio", "lo", "hi"))) if a in r.get("arms", {}) else "-"
               for a in arms)] for r in data]
    counts = []
    for label in ("1", "default"):
        judged = [r for r in data if r["threads"] == label and r.get("lo") is not None]
        if not judged:
            continue
        slow = {"portable": sum(r["lo"] > RATIO_GOAL for r in judged)}
        for a in arms:
            slow[a] = sum((r["arms"].get(a, {}).get("lo") or 0) > RATIO_GOAL for r in judged)
        counts.append(f"{label} thread{'s' if label == 'default' else ''}: " + ", ".join(
            f"{a} {n} slower / {len(judged) - n} not slower" for a, n in slow.items()))
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines + [""] + [f"- {c}" for c in counts])
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + counts)


def memory_table(memory: list[Memory]) -> str:
    """Per model: the set, the process's peak during the first and second run (MiB over the
    interpreter, original / portable), the first run's increment over the session, "over" where
    the portable's median is higher and "demonstrably higher" where every child is."""
    lines = ["memory: model  set  peak first o/p MiB  peak second o/p MiB  (first run's increment o/p MiB)"]
    for m in memory:
        if m.ratio is None:
            lines.append(f"  {m.model}  {m.input_set}  - ({m.note})")
            continue
        over = [w for w, r in (("first", m.peak_ratio), ("second", m.second_peak_ratio)) if r is not None and r > 1.0]
        higher = [w for w, h in (("first", m.peak_higher), ("second", m.second_peak_higher)) if h]
        lines.append(f"  {m.model}  {m.input_set}  {m.original_peak_mib or 0:.3f}/{m.portable_peak_mib or 0:.3f}  "
                     f"{m.original_second_peak_mib or 0:.3f}/{m.portable_second_peak_mib or 0:.3f}  "
                     f"({m.original_run_mib:.3f}/{m.portable_run_mib:.3f})"
                     + (f"  over: {', '.join(over)}" if over else "")
                     + (f"  demonstrably higher: {', '.join(higher)}" if higher else "")
                     + ("" if m.control_peak_mib is None else f"  A/A first {m.control_peak_mib:.3f}"
                        + ("  A/A demonstrably higher" if m.control_peak_higher else "")))
    return "\n".join(lines)


def table(result: Result) -> str:
    head = ("model", "1 thread: median", "worst (set)", "default: median", "worst (set)", "outputs", "peak MiB o/p",
            "mem x", "ort kernels o/p")
    body = []
    for e in per_model(result):
        one, dflt, mem = e["1"], e["default"], e["memory"]
        body.append((e["model"], _fmt(one["median"]), f"{_fmt(one['worst'])} ({one['worst_set']})", _fmt(dflt["median"]),
                     f"{_fmt(dflt['worst'])} ({dflt['worst_set']})",
                     f"{'equal' if e['equal'] else 'DIFFER'} ({e['compared']})",
                     "-" if mem is None or mem["peak_ratio"] is None else
                     f"{mem['original_peak_mib']:.2f}/{mem['portable_peak_mib']:.2f} ({mem['input_set']})",
                     "-" if mem is None else _fmt(mem["peak_ratio"]),
                     "-" if not e["sizes"] else f"{e['sizes']['kernels_before']}/{e['sizes']['kernels_after']}"))
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += ["", sets_table(result.rows), "", memory_table(result.memory), ""]
    lines += [f"[{'met' if t.met else '-' if t.met is None else 'NOT met'}] {t.goal}: {t.detail} (goal {t.target})"
              for t in targets(result)]
    if result.failures:
        lines += ["", "failures:"] + [f"  {f}" for f in result.failures]
    if result.skipped:
        lines += ["", "skipped:"] + [f"  {s}" for s in result.skipped]
    return "\n".join(lines)


def markdown(document: dict[str, Any]) -> str:
    """The per-model table of a run's JSON document, as Markdown (for docs/benchmarks.md)."""
    ratio = {(r["model"], r["input_set"], r["threads"]): r["ratio"] for r in document["rows"]}
    long_sets = sorted({r["input_set"] for r in document["rows"] if r["input_set"].startswith("prefill_")})

    def cell(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    lines = ["| model | 1 thread: median, worst (set) | default threads: median, worst (set) | decode / long prefill, "
             "1 thread | outputs | peak MiB (process, first run), original -> portable (set) |", "|---|---|---|---|---|---|"]
    for m in document["models"]:
        one, dflt, mem = m["1"], m["default"], m["memory"]
        long_ratio = next((ratio.get((m["model"], s, "1")) for s in long_sets if (m["model"], s, "1") in ratio), None)
        lines.append(
            f"| {m['model']} | {cell(one['median'])}, {cell(one['worst'])} ({one['worst_set']}) | "
            f"{cell(dflt['median'])}, {cell(dflt['worst'])} ({dflt['worst_set']}) | "
            f"{cell(ratio.get((m['model'], 'decode', '1')))} / {cell(long_ratio)} | "
            f"{'equal' if m['equal'] else 'DIFFER'} ({m['compared']}) | "
            + ("-" if mem is None or mem.get("peak_ratio") is None else
               f"{mem['original_peak_mib']:.2f} -> {mem['portable_peak_mib']:.2f} ({mem['input_set']})") + " |")
    return "\n".join(lines)


def payload(result: Result, quick: bool, rounds: int, exact: bool) -> dict[str, Any]:
    """The JSON document (keys: suite, quick, rounds, exact, python, cpus, onnxruntime, rows,
    memory, models, targets, failures, skipped)."""
    import onnxruntime
    return {"suite": "portable", "quick": quick, "rounds": rounds, "exact": exact,
            "python": sys.version.split()[0], "cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__,
            "rows": [asdict(r) for r in result.rows],
            "memory": [asdict(m) | m.ratios() for m in result.memory],
            "models": per_model(result), "targets": [asdict(t) for t in targets(result)],
            "failures": result.failures, "skipped": result.skipped, "load": result.load}


def write_portable(folder: str, models: list[str] | None, exact: bool = False) -> None:
    """The portable output of every corpus model (or `models`) as folder/<model>.onnx: a `--baseline`
    for a later run (written by whichever dmlgraph is imported: run it with another checkout's)."""
    import dmlgraph
    os.makedirs(folder, exist_ok=True)
    for name, path, _ in corpus(models):
        dmlgraph.optimize(path, target="onnx", exact=exact).save(os.path.join(folder, name + ".onnx"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.portable", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few models, few rounds, a 128-token prefill")
    p.add_argument("--rounds", type=int, help="interleaved rounds per input set (default 21; 3 with --quick)")
    p.add_argument("--exact", action="store_true", help="optimize with exact=True (bit-exact rules only)")
    p.add_argument("--models", nargs="+", metavar="NAME", help="only these models (names without .onnx)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory children")
    p.add_argument("--memory-only", action="store_true", help="only the memory children (no timing rows)")
    p.add_argument("--repeats", type=int, help="memory children per model and side (default 5; 1 with --quick)")
    p.add_argument("--control", action="store_true",
                   help="A/A: time the original against a second session of itself, and run it in a third "
                   "memory child (the noise floor)")
    p.add_argument("--baseline", metavar="DIR", help="also time DIR/<model>.onnx (another checkout's portable "
                   "outputs) in the same rounds")
    p.add_argument("--write-portable", metavar="DIR", help="only write this checkout's portable outputs to DIR")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="also write the rows as JSON")
    p.add_argument("--markdown", metavar="JSON", help="print the per-model Markdown table of a run's JSON file")
    p.add_argument("--memory-child", nargs=2, metavar=("MODEL", "FEEDS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_child:
        _memory_child(*args.memory_child)
        return 0
    if args.markdown:
        with open(args.markdown) as f:
            document = json.load(f)
        print(markdown(document) + "\n\n" + sets_table(document["rows"], markdown=True))
        return 0
    if args.write_portable:
        write_portable(args.write_portable, args.models, args.exact)
        return 0
    result = run(quick=args.quick, json_out=args.json_out, rounds=args.rounds, exact=args.exact, models=args.models,
                 memory=not args.no_memory, control=args.control, baseline=args.baseline,
                 timing=not args.memory_only, repeats=args.repeats)
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
