"""`dmlgraph optimize DIR -o OUTDIR --jobs N` and the summary `optimize` prints."""
from __future__ import annotations

import json
import os
import shutil

import onnx

from dmlgraph.io.resources import DEMO_MODEL, bundled_model, models_dir
from dmlgraph.tools.cli import main


def _folder(tmp_path):
    src = tmp_path / "in"
    (src / "nested").mkdir(parents=True)
    shutil.copy(bundled_model(DEMO_MODEL), src / "causal.onnx")
    shutil.copy(os.path.join(models_dir(), "gpt2_ts.onnx"), src / "nested" / "gpt2.onnx")
    (src / "broken.onnx").write_bytes(b"not a model")
    (src / "notes.txt").write_text("not a model either, and not picked up")
    return src


def test_a_folder_is_optimized_by_a_pool_and_one_bad_model_does_not_stop_the_rest(tmp_path, capsys):
    src, out = _folder(tmp_path), tmp_path / "out"
    code = main(["optimize", str(src), "-o", str(out), "--jobs", "2"])
    text = capsys.readouterr().out
    assert code == 2  # one failed
    assert sorted(os.listdir(out)) == ["causal.onnx", "nested"] and os.listdir(out / "nested") == ["gpt2.onnx"]
    for path in (out / "causal.onnx", out / "nested" / "gpt2.onnx"):
        onnx.checker.check_model(str(path), full_check=True)
    lines = text.splitlines()
    assert any(line.startswith("FAILED") and "broken.onnx" in line and "not a valid ONNX model" in line
               for line in lines)
    assert sum(line.startswith("ok ") for line in lines) == 2
    assert lines[-1] == "optimized 2 of 3 models; 1 failed"


def test_folder_json_and_a_clean_run(tmp_path, capsys):
    src, out = _folder(tmp_path), tmp_path / "out"
    (src / "broken.onnx").unlink()
    assert main(["optimize", str(src), "-o", str(out), "--jobs", "1", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["failed"] == 0 and [m["ok"] for m in payload["models"]] == [True, True]
    assert set(payload["models"][0]) == {"model", "output", "ok", "seconds", "rewrites", "before", "after", "error"}


def test_outputs_over_inputs_are_refused(tmp_path, capsys):
    src = _folder(tmp_path)
    assert main(["optimize", str(src), "-o", str(src)]) == 2
    assert "refusing to write the outputs over the inputs" in capsys.readouterr().err


def test_optimize_prints_a_summary_and_lists_each_rewrite_with_v(tmp_path, capsys):
    model, out = bundled_model(DEMO_MODEL), str(tmp_path / "o.onnx")
    assert main(["optimize", model, "-o", out]) == 0
    short = capsys.readouterr().out
    assert "rewrites (3):" in short and "mask_subgraph       2" in short and "[mask_subgraph]" not in short
    assert main(["optimize", model, "-o", out, "-v"]) == 0
    assert capsys.readouterr().out.count("[mask_subgraph]") == 2
    assert main(["optimize", model, "-o", out, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"model", "target", "feature_level", "exact_only", "rewrites", "lowered", "declined", "before", "after",
            "output"} <= set(report)


def test_a_folder_with_an_output_named_like_a_model_is_refused(tmp_path, capsys):
    """`optimize DIR -o out.onnx` made a folder named out.onnx; now it says -o names a folder."""
    src = _folder(tmp_path)
    assert main(["optimize", str(src), "-o", str(tmp_path / "out.onnx")]) == 2
    assert "-o names the folder" in capsys.readouterr().err and not (tmp_path / "out.onnx").exists()
