"""`python -m benchmarks portable` and `python -m benchmarks sizes` (issue 25): smoke runs and the
pieces they are built from. No timing asserts: structure, a ratio on every row, outputs compared."""
from __future__ import annotations

import json
import os
from dataclasses import asdict

import numpy as np
import onnx

from benchmarks import portable as bench_portable
from benchmarks import size_table
from benchmarks.__main__ import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")


def test_quick_run_times_and_compares_every_input_set(tmp_path):
    out = tmp_path / "portable.json"
    result = bench_portable.run(quick=True, json_out=str(out), log=lambda *a: None)
    models = {name for name, _, _ in bench_portable.corpus(list(bench_portable.QUICK_MODELS))}
    assert models and {r.model for r in result.rows} == models
    assert not result.failures
    for name, _, sets in bench_portable.corpus(list(bench_portable.QUICK_MODELS)):
        for threads in ("1", "default"):
            got = {r.input_set for r in result.rows if r.model == name and r.threads == threads}
            assert set(sets) <= got  # every saved set, at each thread setting
            assert got - set(sets) <= {f"prefill_{bench_portable.QUICK_LONG_PREFILL}"}
    assert any(r.input_set.startswith("prefill_") for r in result.rows)  # the long prefill ran somewhere
    for r in result.rows:
        assert r.ratio is not None and r.ratio > 0 and r.original_us and r.portable_us
        assert r.equal is True and r.rounds == bench_portable.rounds_for(True)
    data = json.loads(out.read_text())
    assert {"suite", "quick", "rounds", "rows", "memory", "models", "targets", "failures", "skipped"} <= set(data)
    assert data["quick"] is True and len(data["rows"]) == len(result.rows)
    assert {m["model"] for m in data["models"]} == models
    for m in data["models"]:
        assert m["equal"] is True and m["compared"] > 0
        for threads in ("1", "default"):
            assert m[threads]["worst"] is not None and m[threads]["worst_set"]
    if bench_portable.memory_supported():
        assert {m.model for m in result.memory} == models
        for m in result.memory:
            assert m.original_run_mib is not None and m.portable_run_mib is not None and m.ratio is not None
            assert m.second_ratio is not None  # a second run's peak (no first-run code faults)
    for z in result.sizes.values():  # (the kernels onnxruntime's optimized model runs, both sides)
        assert z["kernels_before"] > 0 and z["kernels_after"] > 0
    goals = [t.goal for t in bench_portable.targets(result)]
    assert any("one thread" in g for g in goals) and any("default threads" in g for g in goals)
    assert any(g.startswith("onnxruntime kernels") for g in goals)
    assert any("bit-identical" in g for g in goals)
    md = bench_portable.markdown(data).splitlines()
    assert md[0].startswith("| model | 1 thread") and len(md) == len(models) + 2
    text = bench_portable.table(result)
    assert text.splitlines()[0].split()[:3] == ["model", "1", "thread:"]


def test_long_prefill_grows_the_sequence_axes_and_keeps_the_past_empty():
    name, path, sets = bench_portable.corpus(["llama_kv_ts"])[0]
    feeds, why = bench_portable.long_prefill(onnx.load(path), {s: bench_portable.load_feeds(p) for s, p in sets.items()},
                                             16)
    assert feeds is not None, why
    assert feeds["input_ids"].shape == (1, 16) and feeds["attention_mask"].shape == (1, 16)
    assert (feeds["attention_mask"] == 1).all()
    assert all(v.shape[2] == 0 for k, v in feeds.items() if k.startswith("past_key_values"))
    template = bench_portable.load_feeds(sets["prefill"])["input_ids"]
    assert set(np.unique(feeds["input_ids"])) <= set(np.unique(template))  # ids stay in the vocabulary


def test_long_prefill_says_why_not_for_a_static_model():
    model = onnx.load(os.path.join(MODELS, "eye_static8_ts.onnx"))
    name = model.graph.input[0].name
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds, why = bench_portable.long_prefill(model, {"only": {name: np.zeros(shape, np.float32)}}, 1024)
    assert feeds is None and "static" in why


def test_outputs_are_compared_bit_for_bit():
    a = np.array([0.0, 1.0], np.float32)
    assert bench_portable.identical(a, a.copy())
    assert not bench_portable.identical(a, np.array([-0.0, 1.0], np.float32))  # -0.0 is not 0.0
    nan = np.array([np.nan], np.float32)
    other_nan = nan.view(np.uint32) | np.uint32(1)
    assert not bench_portable.identical(nan, other_nan.view(np.float32))  # another NaN payload
    assert not bench_portable.identical(a, a.astype(np.float64))
    assert "1 elements differ" in bench_portable.compare(["y"], [a], [np.array([0.0, 2.0], np.float32)])
    assert bench_portable.compare(["y"], [a], [a.copy()]) == ""


def test_a_mismatch_is_a_failure_not_a_timing_row():
    result = bench_portable.Result(rows=[
        bench_portable.Row("m", "decode", "1", 10.0, 9.0, 0.9, True, 3),
        bench_portable.Row("m", "prefill", "1", None, None, None, False, note="MISMATCH: y differs"),
    ], failures=["m prefill (1 thread): outputs differ"])
    got = {t.goal: t for t in bench_portable.targets(result)}
    one = got["portable vs original in onnxruntime CPU, one thread"]
    assert one.met is False and one.detail.startswith("1/2 input sets <= 1.0x")
    assert got["portable outputs bit-identical to the original's"].met is False
    assert "DIFFER" in bench_portable.table(result)


def test_the_interval_is_the_sign_tests_and_needs_six_rounds():
    """The median's 95% interval from order statistics: 41 rounds keep the 14th to the 28th (each
    tail's binomial mass <= 2.5%); below 6 rounds no interval holds 95%."""
    assert bench_portable.interval([float(x) for x in range(1, 42)]) == (14.0, 28.0)
    assert bench_portable.interval([float(x) for x in range(6, 0, -1)]) == (1.0, 6.0)
    assert bench_portable.interval([1.0] * 5) == (None, None)
    rng = np.random.default_rng(0)
    noise = list(1.0 + rng.normal(0, 0.05, 41))
    lo, hi = bench_portable.interval(noise)
    assert lo is not None and hi is not None and lo <= 1.0 <= hi  # (A/A noise: not slower)
    lo, _ = bench_portable.interval([x + 0.05 for x in noise])
    assert lo is not None and lo > 1.0  # (5% slower in most rounds: slower)


def test_memory_is_demonstrably_higher_only_when_every_child_is():
    """A median a page over is within the children's spread; higher means every portable child
    above every original child, and needs 4 children a side."""
    assert bench_portable.above([100, 104, 108, 100], [112, 116, 112, 120]) is True
    assert bench_portable.above([100, 104, 108, 100], [104, 116, 112, 120]) is False  # (one overlaps)
    assert bench_portable.above([100, 100, 100], [200, 200, 200]) is None
    mem = [bench_portable.Memory("a", "s", 1.0, 1.01, original_peak_mib=2.0, portable_peak_mib=2.01,
                                 peak_higher=False, second_peak_higher=False, higher=True),
           bench_portable.Memory("b", "s", 1.0, 1.2, original_peak_mib=2.0, portable_peak_mib=2.2,
                                 peak_higher=True, second_peak_higher=False)]
    rows = {t.goal.split(" (every")[0]: t for t in bench_portable.targets(bench_portable.Result(memory=mem))}
    row = rows["peak memory of a run (the process's, session included) demonstrably higher"]
    assert row.met is False and row.detail.startswith("1/2 / 0/2 models (first: b)")
    first = rows["peak memory of a run (the process's, session included), first run, portable vs original"]
    assert first.met is False and first.detail.startswith("0/2 models <= 1.0x; worst 1.10x (b s)")
    assert "A/A" not in first.detail  # (no control arm measured)
    mem[0].control_peak_mib, mem[0].control_peak_higher = 2.02, False  # (--control: the A/A arm over by a page)
    mem[1].control_peak_mib, mem[1].control_peak_higher = 1.98, False
    rows = {t.goal.split(" (every")[0]: t for t in bench_portable.targets(bench_portable.Result(memory=mem))}
    assert rows["peak memory of a run (the process's, session included), first run, portable vs original"].detail \
        .endswith("the A/A control over the original at 1/2")
    assert rows["peak memory of a run (the process's, session included) demonstrably higher"].detail \
        .endswith("the A/A control, first run: 0/2")


def test_a_runs_increment_over_its_session_is_reported_not_judged():
    """The increment moves with the heap a session's build freed (docs/benchmarks.md, "Eighth
    round"): a portable child whose process peaks lower is not failed by a larger increment."""
    mem = [bench_portable.Memory("a", "s", 0.46, 0.50, original_peak_mib=2.12, portable_peak_mib=1.77,
                                 original_second_peak_mib=2.12, portable_second_peak_mib=1.77,
                                 higher=True, second_higher=False, peak_higher=False, second_peak_higher=False)]
    rows = {t.goal: t for t in bench_portable.targets(bench_portable.Result(memory=mem))}
    judged = [t for t in rows.values() if t.met is not None]
    assert judged and all(t.met for t in judged)
    increment = [t for g, t in rows.items() if g.startswith("a run's increment")]
    assert len(increment) == 2 and all(t.met is None for t in increment)
    assert "1/1 / 0/1 models (first: a)" in next(t.detail for t in increment if "demonstrably" in t.goal)


def test_arms_are_timed_in_the_same_rounds_and_counted(tmp_path):
    """`--control` and `--baseline` are arms of the same rounds: each row holds their median and
    interval beside the portable's, the table puts them side by side and counts each arm's
    slower sets, and a baseline is compared bit for bit too."""
    name, path, sets = bench_portable.corpus(["concat_causal_halves_dynamo"])[0]
    import dmlgraph
    portable = dmlgraph.optimize(path, target="onnx").model.SerializeToString()
    with open(path, "rb") as f:
        original = f.read()
    result = bench_portable.Result()
    feeds = {s: bench_portable.load_feeds(p) for s, p in sets.items()}
    bench_portable.bench_model(name, path, portable, feeds, 6, result, lambda *a: None,
                               {"baseline": portable, "control": original})
    assert not result.failures and len(result.rows) == 2 * len(sets)
    for r in result.rows:
        assert r.lo is not None and r.hi is not None and r.lo <= r.ratio <= r.hi and r.slower is not None
        assert set(r.arms) == {"baseline", "control", "vs_control"}
        assert all(a["lo"] <= a["ratio"] <= a["hi"] for a in r.arms.values())  # type: ignore[operator]
    text = bench_portable.sets_table(result.rows)
    assert text.splitlines()[0].split() == ["model", "set", "threads", "portable", "baseline", "control", "vs_control"]
    assert "1 thread: portable" in text and "control" in text.splitlines()[-1]
    goals = {t.goal: t for t in bench_portable.targets(result)}
    slow = goals["input sets demonstrably slower (95% interval above 1.0x), one thread"]
    assert "control" in slow.detail and "baseline" in slow.detail
    md = bench_portable.sets_table([asdict(r) for r in result.rows], markdown=True)
    assert md.startswith("| model | set | threads | portable | baseline | control | vs_control |")
    bad = onnx.load_from_string(original)  # a baseline that does not give the original's outputs: a failure
    bad.graph.output[0].name, bad.graph.node[-1].output[0] = "other", "other"
    result = bench_portable.Result()
    bench_portable.bench_model(name, path, portable, {"seq6": feeds["seq6"]}, 6, result, lambda *a: None,
                               {"baseline": bad.SerializeToString()})
    assert result.failures and "baseline" in result.failures[0]


def test_size_table_counts_both_targets_and_the_nodes_per_site(tmp_path):
    paths = [os.path.join(MODELS, m) for m in ("trilu_offsets_ts.onnx", "bert_ts.onnx", "band_w2_ts.onnx")]
    out = tmp_path / "sizes.json"
    lines: list[str] = []
    rows = size_table.run(json_out=str(out), log=lambda *a, **k: lines.append(" ".join(map(str, a))), paths=paths)
    by = {r.model: r for r in rows}
    assert by["bert_ts.onnx"].sites == 0 and by["bert_ts.onnx"].expansion_per_site is None  # nothing lowered
    tri = by["trilu_offsets_ts.onnx"]
    assert tri.sites >= 1 and tri.nodes_dml is not None and tri.nodes_onnx is not None
    assert tri.expansion_per_site == (tri.nodes_onnx - tri.nodes_dml + tri.sites) / tri.sites
    assert tri.attribution in ("exact", "estimate") and tri.added_per_site is not None
    assert by["band_w2_ts.onnx"].site_nodes == [(3, 4)]  # the mask part, and with the select (Where)
    text = "\n".join(lines)
    assert text.startswith("| model | nodes | dml nodes | onnx nodes |") and "`--target onnx`:" in text
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 3 and {"dml", "onnx", "sites"} <= set(data["summary"])
    goals = size_table.goal_rows(data["summary"])
    assert [g[0].split(" --target ")[-1][:4] for g in goals[:2]] == ["dml ", "onnx"]
    assert data["summary"]["over_site_goal"] == [] and goals[2][1].startswith("0 of ") and goals[2][3] is True


def test_cli_routes_the_new_suites(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(bench_portable, "run", lambda quick, json_out: calls.append(("portable", quick, json_out)))
    monkeypatch.setattr(size_table, "run", lambda json_out: calls.append(("sizes", json_out)))
    assert main(["portable", "--quick"]) == 0
    assert main(["sizes", "--json", str(tmp_path / "s.json")]) == 0
    assert calls == [("portable", True, None), ("sizes", str(tmp_path / "s.json"))]


def test_memory_only_measures_the_children_without_timing_rows():
    result = bench_portable.run(models=["split_concat_tril_ts"], timing=False, repeats=1, control=True,
                                log=lambda *a: None)
    assert not result.rows and not result.failures
    if bench_portable.memory_supported():
        (m,) = result.memory
        assert m.model == "split_concat_tril_ts" and m.repeats == 1 and m.ratio is not None
        assert m.second_ratio is not None and m.peak_ratio is not None and m.second_peak_ratio is not None
        assert (m.original_peak_mib or 0) >= m.original_run_mib  # (the session's memory and the run's)
        assert m.control_peak_mib is not None  # (--control: the A/A arm's own children)
        assert "split_concat_tril_ts" in bench_portable.memory_table(result.memory)
    rows = {t.goal: t for t in bench_portable.targets(result)}
    assert rows["portable outputs bit-identical to the original's"].met is None  # nothing compared: not judged


def test_memory_children_map_every_buffer_of_a_page_or_more():
    # (the heap's slack left by a session's build decided where 4-64 KiB buffers went: benchmarks.md)
    env = bench_portable.CHILD_ENV
    assert env["MALLOC_MMAP_THRESHOLD_"] == "4096" and env["MALLOC_TOP_PAD_"] == "0"
    assert env["MALLOC_TRIM_THRESHOLD_"] == "0"
