"""The KV-cache / sliced-mask corpus (expected.json `symbolic_models`, inputs in models/inputs/).

No torch: only the committed .onnx and .npz files. Every model runs in onnxruntime at each saved
input set with outputs of the right shapes (including the empty-cache prefill); every mask listed
in expected.json names tensors and nodes that exist, and at every input set the named tensor IS the
DIAGONAL_MATRIX1 pattern given by its Begin/End expressions evaluated at that set's sizes; and
`dmlgraph inspect --json` runs on every model. Lowering results are not asserted here.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from dmlgraph.tools import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
sys.path.insert(0, os.path.join(MODELS, "scripts"))
import inspect_masks  # noqa: E402  (models/ is a folder of scripts, not a package)

with open(os.path.join(MODELS, "expected.json")) as f:
    ENTRIES = json.load(f)["symbolic_models"]
IDS = [e["file"] for e in ENTRIES]


def _sets(entry: dict) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for name, rel in entry["input_sets"].items():
        with np.load(os.path.join(MODELS, rel)) as z:
            out[name] = {k: z[k] for k in z.files}
    return out


def _sizes(feeds: dict[str, np.ndarray]) -> tuple[int, int, int]:
    """(batch, sequence, past_sequence) of one input set."""
    first = feeds.get("input_ids", feeds.get("x"))
    past = next((v.shape[2] for k, v in feeds.items() if k.startswith("past")), 0)
    return first.shape[0], first.shape[1], past


def _session(path: str, extra: list[str] = ()) -> ort.InferenceSession:
    model = onnx.load(path)
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in extra if n not in have)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_corpus_is_small_and_complete() -> None:
    assert len(ENTRIES) >= 20
    families = {e["file"].rsplit("_", 1)[0] for e in ENTRIES}
    assert {"gpt2_kv", "llama_kv", "mistral_sw4_kv", "t5_decoder_kv", "clip_text"} <= families
    for family in families:  # both exporters for every family
        assert {e["exporter"] for e in ENTRIES if e["file"].rsplit("_", 1)[0] == family} == {"torchscript", "dynamo"}
    total = sum(os.path.getsize(os.path.join(MODELS, e["file"])) for e in ENTRIES)
    assert total < 15_000_000


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_runs_at_every_input_set(entry: dict) -> None:
    path = os.path.join(MODELS, entry["file"])
    model = onnx.load(path)
    onnx.checker.check_model(model)
    assert model.ir_version <= 10 and os.path.getsize(path) < 1_000_000  # onnxruntime 1.31 reads IR <= 10
    sess = _session(path)
    assert [i.name for i in sess.get_inputs()] == list(entry["inputs"])
    sets = _sets(entry)
    assert sets, "no input sets"
    for name, feeds in sets.items():
        batch, seq, past = _sizes(feeds)
        outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        for oname, value in outs.items():
            assert np.isfinite(value).all(), (name, oname)
            if oname.startswith("present"):
                assert value.shape[0] == batch and value.shape[2] == past + seq, (name, oname, value.shape)
            else:
                assert value.shape[:2] == (batch, seq), (name, oname, value.shape)


def test_kv_models_have_the_deployed_input_sets() -> None:
    for entry in ENTRIES:
        if "past_sequence" not in entry["dynamic_axes"]:
            continue
        sets = _sets(entry)
        assert set(sets) == {"prefill", "prefill_past", "decode", "left_padded"}, entry["file"]
        assert _sizes(sets["prefill"])[2] == 0  # an empty past tensor
        assert _sizes(sets["decode"])[1] == 1
        assert not sets["left_padded"]["attention_mask"][0, 0] and sets["left_padded"]["attention_mask"][1].all()


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_expected_names_exist(entry: dict) -> None:
    model = onnx.load(os.path.join(MODELS, entry["file"]))
    tensors = {i.name for i in model.graph.initializer} | {o for n in model.graph.node for o in n.output}
    nodes = {f"{n.op_type} {n.name}" for n in model.graph.node}
    assert [o.name for o in model.graph.output] == entry["outputs"]
    for mask in entry["masks"]:
        assert mask["onnx_nodes_or_initializer"] in tensors
        assert mask["producer"] == "initializer" or mask["producer"] in nodes
        for key in ("applied_by", "combined_with_padding_by"):
            assert mask[key] is None or mask[key] in nodes, (key, mask[key])
        if mask["other"].__class__ is str and mask["other"].startswith("input:"):
            assert mask["other"][len("input:"):] in tensors
    for name in entry["other_band_tensors"]:
        assert name in tensors


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["masks"]], ids=lambda e: e["file"])
def test_masks_follow_their_expressions_at_every_input_set(entry: dict) -> None:
    """At the deployed sizes (empty past, decode, padded) each listed tensor equals
    DIAGONAL_MATRIX1 with Begin/End evaluated from the expressions in expected.json."""
    masks = entry["masks"]
    data = [m["other"][len("input:"):] for m in masks if str(m["other"]).startswith("input:")]
    names = [m["onnx_nodes_or_initializer"] for m in masks]
    sess = _session(os.path.join(MODELS, entry["file"]), names + data)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(os.path.join(MODELS, entry["file"])).graph.initializer}
    for set_name, feeds in _sets(entry).items():
        _, seq, past = _sizes(feeds)
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        got.update(inits)
        for m in masks:
            t = np.asarray(got[m["onnx_nodes_or_initializer"]])
            h, w = t.shape[-2:]
            use = inspect_masks.use_value(h, w, inspect_masks.evaluate(m["begin"], seq, past),
                                          inspect_masks.evaluate(m["end"], seq, past))
            value = np.asarray(float(m["value"]), t.dtype)
            if str(m["other"]).startswith("input:"):
                other = np.broadcast_to(got[m["other"][len("input:"):]], t.shape)
            else:
                other = np.asarray(float(m["other"]), t.dtype)
            want = np.broadcast_to(np.where(use, value, other), t.shape)
            assert np.array_equal(want, t), (set_name, m["onnx_nodes_or_initializer"])


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_inspect_runs(entry: dict, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["inspect", "--json", os.path.join(MODELS, entry["file"])]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "candidates" in report and "declined" in report
