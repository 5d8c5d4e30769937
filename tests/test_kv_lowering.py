"""The KV-cache corpus lowered: every mask site `models/expected.json` lists (found numerically by
`models/inspect_masks.py`) is lowered with the Begin/End it found, written as expressions of the
dims, and the lowered model equals onnxruntime on the original at every saved input set (prefill
with an empty cache, prefill with past, a decode step, a left-padded batch), bit for bit under
`--exact`."""
from __future__ import annotations

import json
import os

import pytest

from dmlgraph import api
from dmlgraph.onnx_io import import_model
from dmlgraph.rewrite import Options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
with open(os.path.join(MODELS, "expected.json")) as f:
    ENTRIES = {e["file"]: e for e in json.load(f)["symbolic_models"]}

# Sites the analysis declines, with the reason it gives (checked below): the mask is not lost, it
# stays as the exporter wrote it.
DECLINED = {
    # bias[past:past+S, :past+S] of a stored 64x64 tril: past the buffer the slice clamps, and its
    # diagonal then follows min(past, 64): not an affine expression of the dims.
    ("stored_tril_past_ts.onnx", "MIN", "past_sequence + 1"): "slice clamps",
    ("stored_tril_past_dynamo.onnx", "MIN", "past_sequence + 1"): "slice clamps",
    # T5's relative-position buckets: `Less(-min(rel, 0), 4)` is a band, but -min(rel, 0) is
    # piecewise affine along the diagonals, which the analysis does not represent.
    ("t5_decoder_kv_ts.onnx", "past_sequence - 3", "MAX"): "Min",
    ("t5_decoder_kv_dynamo.onnx", "past_sequence - 3", "MAX"): "Min",
}
GENERATOR_KINDS = ("mask_subgraph", "trilu")


def _optimized(file: str, **options: object):
    from dmlgraph.modelfile import load_model
    g = import_model(load_model(os.path.join(MODELS, file)), base_dir=MODELS)
    return api.optimize_graph(g, Options(**options))  # type: ignore[arg-type]


@pytest.mark.parametrize("file", sorted(ENTRIES))
def test_every_generator_site_is_lowered_with_its_bounds(file):
    result = _optimized(file)
    got = sorted(tuple(m.captures["bounds"]) for m in result.applied if "bounds" in m.captures)
    want = sorted((s["begin"], s["end"]) for s in ENTRIES[file]["masks"] if s["kind"] in GENERATOR_KINDS)
    missing = [w for w in want if w not in got]
    for site in missing:
        reason = DECLINED.get((file, *site))
        assert reason is not None, f"{file}: site {site} neither lowered nor a known decline; got {got}"
        assert any(reason in m.reason for m in result.declined if m.rule == "mask_subgraph"), \
            (site, [m.reason for m in result.declined])
    # nothing lowered that the numeric search did not find
    assert all(g in want for g in got), (got, want)


CASES = [(file, name) for file, e in sorted(ENTRIES.items()) for name in sorted(e.get("input_sets", {}))]


@pytest.mark.parametrize("file,input_set", CASES)
def test_lowered_model_equals_onnxruntime_at_every_input_set(file, input_set):
    feeds = api.load_inputs(os.path.join(MODELS, ENTRIES[file]["input_sets"][input_set]))
    report = api.validate(os.path.join(MODELS, file), Options(exact_only=True), feeds=feeds)
    assert report["ok"], [t for t in report["tensors"] if not t.get("ok", True)]
    assert sum(report["rewrites"].values()) >= 1
