"""The KV-cache corpus lowered: every mask site `models/expected.json` lists (found numerically by
`models/inspect_masks.py`) is lowered with the Begin/End it found, written as expressions of the
dims, and the lowered model equals onnxruntime on the original at every saved input set (prefill
with an empty cache, prefill with past, a decode step, a left-padded batch), bit for bit under
`--exact`."""
from __future__ import annotations

import json
import os

import pytest

from dmlgraph import pipeline
from dmlgraph.io.onnx_io import import_model
from dmlgraph.rewrite import Options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
with open(os.path.join(MODELS, "expected.json")) as f:
    ENTRIES = {e["file"]: e for e in json.load(f)["symbolic_models"]}

# Sites the analysis declines, with the reason it gives (checked below): the mask is not lost, it
# stays as the exporter wrote it.
DECLINED: dict[tuple[str, str, str], str] = {}  # (file, begin, end) -> the reason's text, for a site declined on purpose
GENERATOR_KINDS = ("mask_subgraph", "trilu")
# bias[past:past+S, :past+S] of a stored 64x64 tril: ONNX's Slice clamps its start to the buffer, yet
# where past passes 64 the slice has no rows, so the lowered band's End is past + 1 at every size, as
# the numeric search found (it was min(past + 1, 65) before the empty-slice argument, docs/semantics.md).


def _optimized(file: str, **options: object):
    from dmlgraph.io.modelfile import load_model
    g = import_model(load_model(os.path.join(MODELS, file)), base_dir=MODELS)
    return pipeline.optimize_graph(g, Options(**options))  # type: ignore[arg-type]


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
    feeds = pipeline.load_inputs(os.path.join(MODELS, ENTRIES[file]["input_sets"][input_set]))
    report = pipeline.validate(os.path.join(MODELS, file), inputs=feeds, options=Options(exact_only=True)).report
    assert report["ok"], [t for t in report["tensors"] if not t.get("ok", True)]
    assert sum(report["rewrites"].values()) >= 1


@pytest.mark.parametrize("file", ["stored_tril_past_ts.onnx", "stored_tril_past_dynamo.onnx"])
def test_a_stored_mask_sliced_past_its_end_clamps_as_the_original_does(file):
    """Up to the buffer's 64 positions the lowered model equals the original; past them both fail
    (the clamped mask no longer broadcasts with the scores), neither gives a result the other lacks."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from dmlgraph.errors import DmlgraphError
    from dmlgraph.runtime.executor import Executor
    model = onnx.load(os.path.join(MODELS, file))
    g = import_model(model)
    pipeline.optimize_graph(g, Options())
    sess, ex = ort.InferenceSession(model.SerializeToString()), Executor(g)
    rng = np.random.default_rng(0)
    ran = 0
    for past in (0, 1, 60, 61, 63, 64, 65, 70):
        for seq in (1, 3, 4):
            feeds = {"input_ids": rng.integers(0, 100, (2, seq)).astype(np.int64),
                     "attention_mask": np.ones((2, past + seq), np.int64),
                     "past_key": rng.standard_normal((2, 1, past, 16)).astype(np.float32),
                     "past_value": rng.standard_normal((2, 1, past, 16)).astype(np.float32)}
            try:
                expected = sess.run(None, feeds)
            except Exception:  # noqa: BLE001 - past + seq > 64: the original cannot run
                with pytest.raises(DmlgraphError):  # the clamped mask does not broadcast with the scores
                    ex.run(feeds)
                continue
            got = ex.run(feeds)
            assert all(pipeline.bitwise_equal(got[o.name], e) for o, e in zip(model.graph.output, expected)), (past, seq)
            ran += 1
    assert ran >= 10
