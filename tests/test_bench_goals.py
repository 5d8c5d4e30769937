"""`python -m benchmarks`: the kernel suite's rows and summaries, and the goals table over both suites
(smoke runs and synthetic rows: no timing asserts)."""
from __future__ import annotations

import json

from benchmarks import goals as bench_goals
from benchmarks import kernels as bench_kernels
from benchmarks import pipeline as bench_pipeline
from benchmarks import portable as bench_portable
from benchmarks import size_table
from benchmarks.__main__ import main


def _row(case: str, shape: list[int], x_copy: float, x_ort: float | None, ours_us: float = 10.0,
         matches: bool | None = True) -> dict:
    elements = 1
    for n in shape:
        elements *= n
    return {"case": case, "shape": shape, "dtype": "float32", "elements": elements, "ours_us": ours_us,
            "copy_baseline_us": ours_us * x_copy, "ratio_vs_copy": x_copy, "ort_model": "Trilu",
            "ort_us": None if x_ort is None else ours_us * x_ort, "ratio_vs_ort": x_ort,
            "matches_ort": None if x_ort is None else matches, "numpy_us": None,
            "numpy_ratio_vs_copy": None, "numpy_ratio_vs_ort": None}


ROWS = [
    _row("triu", [4096, 4096], 0.80, 1.2),
    _row("triu", [8, 1024, 1024], 0.90, 0.9),
    _row("triu", [256, 256], 0.30, 1.1),  # not large: no copy goal
    _row("eye", [4096, 4096], 2.0, None),
    _row("eye", [4, 5], 0.1, 1.5, ours_us=3.5),
]


def test_kernel_quick_run_has_every_key_and_matches_onnxruntime():
    rows = bench_kernels.bench_kernels(quick=True, rounds=1)
    assert rows
    for r in rows:
        assert set(bench_kernels.ROW_KEYS) <= set(r)
        assert r["ours_us"] > 0 and r["copy_baseline_us"] > 0
        assert r["matches_ort"] in (None, True)
    text = bench_kernels.format_table(rows)
    assert "large x_copy min / median" in text and "[met] kernel: bit-exact against onnxruntime" in text


def test_case_summary_counts_large_rows_and_onnxruntime_rows():
    by_case = {c["case"]: c for c in bench_kernels.case_summary(ROWS)}
    triu = by_case["triu"]
    assert (triu["large_rows"], triu["large_rows_met"], triu["large_min_vs_copy"]) == (2, 1, 0.80)
    assert triu["large_median_vs_copy"] == 0.85
    assert (triu["ort_rows"], triu["ort_rows_faster"], triu["min_vs_ort"]) == (3, 2, 0.9)
    assert by_case["eye"]["ort_rows"] == 1 and by_case["eye"]["large_rows_met"] == 1


def test_targets_name_the_worst_row_and_fail_when_one_row_misses():
    got = {t.goal.split(":")[1].strip()[:5]: t for t in bench_kernels.targets(ROWS)}
    large = got["large"]
    assert not large.met and large.detail.startswith("2/3 rows; worst 0.8x (triu 4096x4096 float32)")
    assert not got["vs on"].met and "3/4 rows" in got["vs on"].detail
    assert got["bit-e"].met
    assert not got["[4,5]"].met and "slowest 3.5 us" in got["[4,5]"].detail
    assert all(t.met for t in bench_kernels.targets([r for r in ROWS if r["ratio_vs_copy"] >= 0.85
                                                     and (r["ratio_vs_ort"] or 2) > 1 and r["ours_us"] <= 3]))


def test_goals_take_kernel_targets_and_every_pipeline_row_with_a_target():
    pipeline = [
        bench_pipeline.Row("marginal rate, chain", 30000.0, 25000.0, 1.2, "nodes/s", "ratio >= 1", True),
        bench_pipeline.Row("vs onnxscript, chain", 1.0, None, None, "s", "ratio >= 1.5", None,
                           note="skipped: onnxscript is not installed"),
        bench_pipeline.Row("untargeted", 1.0, 1.0, 1.0),
        bench_pipeline.Row("optimize vs onnxruntime load", 350.0, 250.0, 1.4, "ms", "ratio <= 1", False, floor=240.0),
    ]
    goals = bench_goals.goals(ROWS, pipeline)
    assert [g.suite for g in goals] == ["kernels"] * 4 + ["pipeline"] * 3
    assert goals[4].measured == "30,000 vs 25,000 nodes/s: 1.2x" and goals[4].met
    assert goals[5].measured == "skipped: onnxscript is not installed" and goals[5].met is None
    assert goals[6].measured == "350.0 vs 250.0 ms: 1.4x; onnx floor 240.0 ms: 0.96x" and goals[6].met is False
    table = bench_goals.format_goals(goals)
    assert table.splitlines()[0].split() == ["goal", "measured", "target", "met"]
    assert table.endswith("2 of 6 goals met (1 not measured)")


def test_bench_without_a_suite_runs_every_suite_and_writes_one_document(tmp_path, monkeypatch, capsys):
    calls = []

    def kernels_run(quick: bool, rounds: int, log) -> list[dict]:
        calls.append(("kernels", quick))
        return ROWS

    def pipeline_run(quick: bool, log) -> list[bench_pipeline.Row]:
        calls.append(("pipeline", quick))
        return [bench_pipeline.Row("marginal rate, chain", 30000.0, 25000.0, 1.2, "nodes/s", "ratio >= 1", True)]

    def portable_run(quick: bool, log) -> bench_portable.Result:
        calls.append(("portable", quick))
        return bench_portable.Result(rows=[bench_portable.Row("m", "decode", t, 10.0, 9.0, 0.9, True, 3)
                                           for t in ("1", "default")])

    def sizes_run(log, paths) -> list[size_table.SizeRow]:
        calls.append(("sizes", len(paths)))
        return [size_table.SizeRow("m.onnx", 10, 1000, 9, 900, 12, 1100, 1, 1, 4.0, 4.0, "exact",
                                   site_nodes=[(4, 5)])]

    monkeypatch.setattr(bench_kernels, "run", kernels_run)
    monkeypatch.setattr(bench_pipeline, "run", pipeline_run)
    monkeypatch.setattr(bench_portable, "run", portable_run)
    monkeypatch.setattr(size_table, "run", sizes_run)
    out = tmp_path / "bench.json"
    assert main(["--quick", "--json", str(out)]) == 0
    assert calls == [("kernels", True), ("pipeline", True), ("portable", True),
                     ("sizes", len(bench_portable.QUICK_MODELS))]
    document = json.loads(out.read_text())
    assert set(document) == {"suite", "quick", "python", "cpus", "goals", "kernels", "pipeline", "portable", "sizes"}
    assert {g["suite"] for g in document["goals"]} == {"kernels", "pipeline", "portable", "sizes"}
    assert set(document["goals"][0]) == {"suite", "goal", "measured", "target", "met"}
    assert document["kernels"]["rows"] == ROWS and len(document["pipeline"]["rows"]) == 1
    printed = capsys.readouterr().out
    # kernels 1 of 4, pipeline 1 of 1, portable 3 of 3 (ratios, outputs), sizes 1 of 3 (dml; onnx grew; a mask part of 4)
    assert "== goals" in printed and "6 of 11 goals met" in printed
