"""Mutations of real exports: dmlgraph on the same models rewritten the ways other tools write them.

Run (project venv, no torch):
    nice -n 10 .venv/bin/python models/scripts/mutate_report.py [--only SUBSTR ...] [--kinds KIND ...]
        [--seeds N] [--json FILE] [--dir KEY=PATH ...]
    .venv/bin/python models/scripts/mutate_report.py --rows --json FILE      (the tables of a saved run)

Models: sizes_report's MODELS and EXTRA (the corpus and the held-out rounds 2-7; `--dir` as there),
skipping any onnxruntime cannot load. Input sets: sizes_report's signature-driven generator
(`grid`, `make_set`) at three sets per model (prefill, decode with a past, left-padded batch; the
nearest the model's signature has), kept where the original runs twice alike.

Per model the unmutated model is optimized on `dml`, `onnx` and `onnx --exact` (dmlgraph's Python
API) for the baseline count of applied rewrites. Per mutation of tests/mutations.py (and seed): the
mutant is made; it is discarded unless it loads in onnxruntime, passes onnx.checker where the
original does, and gives bit-identical outputs to the original at every set. Then per target:
`dmlgraph.optimize(mutant)`; a `DmlgraphError` is a refusal, any other exception a crash;
`OptimizeResult.check()` (onnx's full check where the mutant passes it) and, on `onnx`, loading in
onnxruntime, else an invalid output; the `onnx` outputs run in onnxruntime against the mutant's
(= the original's) outputs at every set (bit-exact for --exact; `sizes_report.compare` otherwise),
the `dml` output through `dmlgraph.validate`: else a wrong result; and the applied rewrites against
the baseline: fewer is a lost lowering (a rule depending on a form detail it should not).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import signal
import sys
import traceback
import zlib

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests")]

import mutations  # noqa: E402  (tests/mutations.py)
import sizes_report as sr  # noqa: E402  (the input-set generator)

import dmlgraph  # noqa: E402
from dmlgraph.errors import DmlgraphError  # noqa: E402

TARGETS = (("dml", "dml", False), ("onnx", "onnx", False), ("onnx_exact", "onnx", True))
PREFER = {"kv": ["b1_s5_p0", "b1_s1_p5", "b3left_s1_p4"], "seq": ["b1_s5", "b3left_s5", "b3right_s5", "b1_s31"],
          "other": ["b1_s5", "b1_r4_c5", "b3_s4", "b1_s17", "b1_r31_c64"]}
# where rounds 2-7 left their exports on this machine (not committed; `--dir KEY=PATH` elsewhere)
SOURCES = {"h2": "/work/main/out/heldout2", "h4": "/work/main/out/heldout4", "h6": "/work/wt/heldout6a/out/heldout6",
           "h6b": "/work/wt/heldout6b/out/heldout6b", "h7": "/work/wt/heldout7/out/heldout7"}
ORDER = ("crash", "invalid", "wrong", "refusal", "lost", "ok")  # a target's outcome: the worst that happened


class Timeout(Exception):
    pass


def _alarm(signum, frame):  # type: ignore[no-untyped-def]
    raise Timeout("no answer in 180 s")


def _session(m: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Bit-identical, NaN payloads aside (array_equal with equal_nan for floats)."""
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and
        (x.tobytes() == y.tobytes() or (x.dtype.kind == "f" and np.array_equal(x, y, equal_nan=True)))
        for x, y in zip(a, b))


def _checker_fails(m: onnx.ModelProto) -> str | None:
    try:
        onnx.checker.check_model(m, full_check=True)
        return None
    except Exception as e:  # noqa: BLE001
        return sr._err(e)


def _lowered(r: dmlgraph.OptimizeResult) -> int:
    return sum(r.counts.values())


def sets_for(path: str, name: str, sess: ort.InferenceSession) -> list[tuple[str, dict, list[np.ndarray]]]:
    saved_dir = os.path.join(os.path.dirname(path), "inputs", name)
    saved = [dict(np.load(f)) for f in sorted(glob.glob(os.path.join(saved_dir, "*.npz")))]
    sig = sr.Signature(path, saved)
    grid = {label: args for label, *args in sr.grid(sig, name)}
    kind = "kv" if sig.kv else "seq" if sig.ids is not None else "other"
    labels = [x for x in PREFER[kind] if x in grid]
    labels += [x for x in grid if x not in labels and not x.startswith(("probe", "special"))][:max(0, 3 - len(labels))]
    rng = np.random.default_rng(9)
    out = []
    for label in labels[:3]:
        feeds = sr.make_set(sig, *grid[label], rng)
        try:
            ref = sess.run(None, feeds)
            if _same(ref, sess.run(None, feeds)):
                out.append((label, feeds, ref))
        except Exception:  # noqa: BLE001 (onnxruntime refuses the original at this set: not used)
            continue
    return out


def run_target(mutant: onnx.ModelProto, ref_model_fails: str | None, sets: list, target: str, exact: bool,
               base: int) -> dict:
    rec: dict = {"outcome": "ok"}

    def worst(o: str, detail: str) -> None:
        if ORDER.index(o) < ORDER.index(rec["outcome"]):
            rec["outcome"] = o
        rec.setdefault("details", []).append(f"{o}: {detail}"[:500])

    try:
        r = dmlgraph.optimize(mutant, target=target, exact=exact)
    except DmlgraphError as e:
        worst("refusal", sr._err(e))
        return rec
    except Exception as e:  # noqa: BLE001 (a crash: recorded with where it happened)
        worst("crash", sr._err(e) + " @ " + " <- ".join(
            f"{os.path.basename(f.filename)}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)[-3:]))
        return rec
    rec["lowered"] = _lowered(r)
    rec["rules"] = {k: v for k, v in r.counts.items() if v}
    try:
        r.check()
    except AssertionError as e:
        worst("invalid", str(e)[:300])
    sess = None
    if target == "onnx":
        try:
            sess = _session(r.model)
        except Exception as e:  # noqa: BLE001
            worst("invalid", "onnxruntime cannot load the output: " + sr._err(e))
    for label, feeds, ref in sets:
        try:
            if sess is not None:
                got = sess.run([o.name for o in mutant.graph.output], feeds)
                st, diff = sr.compare(ref, got)
                ok = st == "exact" or (not exact and (_same(ref, got) or st == "equal"))
                if not ok:
                    worst("wrong", f"{label}: {st} {diff:.3g}")
            elif target == "dml":
                v = dmlgraph.validate(mutant, r, feeds)
                if not v.ok:
                    worst("wrong", f"{label}: " + "; ".join(
                        f"{c.name} {c.detail}" for c in v.outputs + v.tensors if not c.match)[:300])
        except DmlgraphError as e:
            worst("refusal", f"{label}: " + sr._err(e))
        except Exception as e:  # noqa: BLE001
            ours = type(e).__module__.startswith("onnxruntime")
            worst("refusal" if ours else "crash", f"{label}: " + sr._err(e))
    if rec["lowered"] < base:
        worst("lost", f"{rec['lowered']} rewrites, unmutated {base}")
    return rec


def measure(d: str, name: str, kinds: list[str], seeds: int, log) -> dict:  # type: ignore[no-untyped-def]
    path = os.path.join(sr._D.get(d, d), name + ".onnx")
    row: dict = {"model": name, "dir": os.path.dirname(path), "mutants": []}
    try:
        model = onnx.load(path)
        sess = _session(model)
    except Exception as e:  # noqa: BLE001
        row["skipped"] = "original does not load: " + sr._err(e)
        return row
    sets = sets_for(path, name, sess)
    row["sets"] = [s[0] for s in sets]
    if not sets:
        row["skipped"] = "onnxruntime runs none of the sets"
        return row
    fails = _checker_fails(model)
    base: dict[str, int] = {}
    prefer: set[str] = set()
    for key, target, exact in TARGETS:
        try:
            r = dmlgraph.optimize(model, target=target, exact=exact)
            base[key] = _lowered(r)
            prefer.update(n for rw in r.rewrites for n in rw.nodes)
        except Exception as e:  # noqa: BLE001
            base[key] = 0
            row.setdefault("base_errors", {})[key] = sr._err(e)
    row["base"] = base
    for kind in kinds:
        fn = mutations.MUTATIONS[kind]
        for k in range(seeds):
            seed = zlib.crc32(f"{name}/{kind}/{k}".encode())
            mrec: dict = {"kind": kind, "seed": seed}
            row["mutants"].append(mrec)
            try:
                if kind in mutations.AIMED:
                    mutant = mutations.AIMED[kind](model, seed, tuple(sorted(prefer)))
                else:
                    mutant = fn(model, seed)
            except mutations.NotApplicable as e:
                mrec["discarded"] = "not applicable: " + str(e)[:200]
                continue
            except Exception as e:  # noqa: BLE001 (a bug of the mutation: reported, not hidden)
                mrec["discarded"] = "mutation failed: " + sr._err(e)
                continue
            if mutant.SerializeToString() == model.SerializeToString():
                mrec["discarded"] = "unchanged"
                continue
            if fails is None and (f := _checker_fails(mutant)) is not None:
                mrec["discarded"] = "mutant fails onnx.checker: " + f[:200]
                continue
            try:
                msess = _session(mutant)
                mref = []
                for label, feeds, ref in sets:
                    got = msess.run(None, feeds)
                    if not _same(ref, got[:len(ref)]):
                        raise ValueError(f"differs from the original at {label}")
                    mref.append((label, feeds, got))
            except Exception as e:  # noqa: BLE001
                mrec["discarded"] = "mutant not equivalent: " + sr._err(e)
                continue
            for key, target, exact in TARGETS:
                signal.alarm(180)
                try:
                    mrec[key] = run_target(mutant, fails, mref, target, exact, base[key])
                except Timeout as e:
                    mrec[key] = {"outcome": "crash", "details": [f"crash: {e}"]}
                finally:
                    signal.alarm(0)
            bad = {k: mrec[k] for k, _, _ in TARGETS if mrec[k]["outcome"] != "ok"}
            if bad and log:
                print(f"  {name} {kind}/{seed}: " + "; ".join(
                    f"{k}={v['outcome']} {(v.get('details') or [''])[0][:220]}" for k, v in bad.items()),
                    file=log, flush=True)
    return row


def tables(rows: list[dict]) -> None:
    per_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    per_target: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        for m in r.get("mutants", []):
            c = per_kind[m["kind"]]
            if "discarded" in m:
                c["discarded: " + m["discarded"].split(":")[0]] += 1
                continue
            c["mutants"] += 1
            for key, _, _ in TARGETS:
                c[m[key]["outcome"]] += 1
                per_target[key][m[key]["outcome"]] += 1
    cols = ["mutants", *ORDER, "discarded: not applicable", "discarded: unchanged", "discarded: mutant not equivalent",
            "discarded: mutant fails onnx.checker", "discarded: mutation failed"]
    print(f"models: {sum('skipped' not in r for r in rows)} measured, {sum('skipped' in r for r in rows)} skipped")
    print("| mutation | mutants | " + " | ".join(c.replace("discarded: ", "") for c in cols[1:]) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for kind in mutations.MUTATIONS:
        if kind in per_kind:
            print(f"| {kind} | " + " | ".join(str(per_kind[kind][c]) for c in cols) + " |")
    tot = collections.Counter()
    for c in per_kind.values():
        tot.update(c)
    print("| total | " + " | ".join(str(tot[c]) for c in cols) + " |")
    print("per target (outcomes over mutants):")
    for key, c in per_target.items():
        print(f"  {key}: " + ", ".join(f"{o} {c[o]}" for o in ORDER))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=os.path.join(ROOT, "out", "mutate9", "mutate.json"))
    ap.add_argument("--only", nargs="*", help="model name substrings")
    ap.add_argument("--kinds", nargs="*", choices=sorted(mutations.MUTATIONS), help="mutations (default: all)")
    ap.add_argument("--seeds", type=int, default=1, help="mutants per kind and model")
    ap.add_argument("--extra", action="store_true", help="sizes_report's EXTRA models too")
    ap.add_argument("--rows", action="store_true", help="print the tables of the --json file instead of measuring")
    ap.add_argument("--dir", action="append", default=[], metavar="KEY=PATH", help="a round's folder (sizes_report)")
    args = ap.parse_args(argv)
    for key, path in SOURCES.items():
        if not os.path.isdir(sr._D[key]) and os.path.isdir(path):
            sr._D[key] = path
    for item in args.dir:
        key, _, path = item.partition("=")
        sr._D[key] = path
    if args.rows:
        with open(args.json) as f:
            tables(json.load(f))
        return 0
    signal.signal(signal.SIGALRM, _alarm)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    pool = sr.MODELS + (sr.EXTRA if args.extra else [])
    models = [(d, n) for d, n in pool if not args.only or any(w in n for w in args.only)]
    kinds = args.kinds or list(mutations.MUTATIONS)
    def summary(row: dict) -> str:
        c = collections.Counter(m[k]["outcome"] for m in row["mutants"] if "discarded" not in m for k, _, _ in TARGETS)
        return f"{row.get('skipped', '')} {dict(c)}"
    rows = sr.measure_all(models, lambda d, n: measure(d, n, kinds, args.seeds, sys.stderr), args.json, summary)
    tables(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
