"""Dim names are claims, not premises (issue 26).

Optimum's merged decoders name attention_mask's length `sequence_length`, like input_ids', though it
is past + sequence at run time. onnxruntime runs such a model with any past; `run`/`validate` refused
every input set with a past ("inputs sharing a dim name must agree"). And a mask proved over dim
names took the two for one size: the lowered model read "the" sequence length from input_ids and
gave a wrong mask (or a broadcast error) once they differed. Now the inputs are taken as onnxruntime
takes them, and a lowered mask that reads a size several of its inputs claim checks at run time
that they agree: outputs equal onnxruntime's wherever the claim holds or the proof did not use it,
and a named error (never a different result) where it used a claim the inputs break.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import dmlgraph
from dmlgraph.errors import DmlgraphError
from dmlgraph.tools import cli

LYING = ("batch_size", "sequence_length", "sequence_length", "past_sequence_length")  # Optimum's names
HONEST = ("batch_size", "sequence_length", "total_sequence_length", "past_sequence_length")


def _i64(name: str, v) -> onnx.TensorProto:
    return h.make_tensor(name, T.INT64, [len(v)] if isinstance(v, list) else [], v if isinstance(v, list) else [v])


def decoder_mask(past_from: str, names: tuple[str, str, str, str]) -> onnx.ModelProto:
    """A decoder's attention: causal [S, T] mask over absolute positions And the padding mask, applied
    by Where to q.k scores. past_from="mask": past = T - S with T attention_mask's length (the cone
    reads both inputs' shapes); "cache": past is the cache's length and T = past + S."""
    b, s, t, p = names
    nodes = [h.make_node("Shape", ["input_ids"], ["ids_shape"]), h.make_node("Gather", ["ids_shape", "one"], ["S"], axis=0),
             h.make_node("Shape", ["attention_mask"], ["am_shape"]), h.make_node("Gather", ["am_shape", "one"], ["Tm"], axis=0),
             h.make_node("Shape", ["past_key"], ["pk_shape"]), h.make_node("Gather", ["pk_shape", "two"], ["P"], axis=0)]
    if past_from == "mask":
        nodes += [h.make_node("Sub", ["Tm", "S"], ["past"]), h.make_node("Identity", ["Tm"], ["T"])]
    else:
        nodes += [h.make_node("Identity", ["P"], ["past"]), h.make_node("Add", ["P", "S"], ["T"])]
    nodes += [h.make_node("Range", ["zero", "S", "one"], ["r0"]), h.make_node("Add", ["r0", "past"], ["rows"]),
              h.make_node("Range", ["zero", "T", "one"], ["cols"]), h.make_node("Unsqueeze", ["rows", "ax1"], ["rows2"]),
              h.make_node("LessOrEqual", ["cols", "rows2"], ["causal"]),
              h.make_node("Cast", ["attention_mask"], ["pad"], to=T.BOOL),
              h.make_node("Unsqueeze", ["pad", "ax12"], ["pad4"]), h.make_node("And", ["causal", "pad4"], ["mask"]),
              h.make_node("Cast", ["input_ids"], ["idf"], to=T.FLOAT), h.make_node("Unsqueeze", ["idf", "ax13"], ["id4"]),
              h.make_node("Mul", ["id4", "qw"], ["q"]), h.make_node("Mul", ["id4", "kw"], ["knew"]),
              h.make_node("Concat", ["past_key", "knew"], ["keys"], axis=2),
              h.make_node("Transpose", ["keys"], ["kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["q", "kt"], ["scores"]),
              h.make_node("Where", ["mask", "scores", "neg"], ["y"])]
    inits = [_i64("zero", 0), _i64("one", 1), _i64("two", 2), _i64("ax1", [1]), _i64("ax12", [1, 2]), _i64("ax13", [1, 3]),
             h.make_tensor("neg", T.FLOAT, [], [-1e4]),
             h.make_tensor("qw", T.FLOAT, [1, 2, 1, 4], np.linspace(0.1, 0.8, 8).tolist()),
             h.make_tensor("kw", T.FLOAT, [1, 2, 1, 4], np.linspace(-0.5, 0.5, 8).tolist())]
    inputs = [h.make_tensor_value_info("input_ids", T.INT64, [b, s]),
              h.make_tensor_value_info("attention_mask", T.INT64, [b, t]),
              h.make_tensor_value_info("past_key", T.FLOAT, [b, 2, p, 4])]
    g = h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info("y", T.FLOAT, [b, 2, s, t])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(m, full_check=True)
    return m


def feeds(s: int, past: int, b: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(s * 10 + past)
    am = np.ones((b, past + s), np.int64)
    am[0, :2] = 0  # left padding
    return {"input_ids": rng.integers(0, 5, (b, s)).astype(np.int64), "attention_mask": am,
            "past_key": rng.standard_normal((b, 2, past, 4)).astype(np.float32)}


SIZES = [(3, 0), (3, 4), (1, 5), (4, 1)]  # (sequence, past): a prefill, a prefill with past, decode steps


@pytest.mark.parametrize("names", [LYING, HONEST], ids=["lying", "honest"])
@pytest.mark.parametrize("past_from", ["mask", "cache"])
def test_a_lowered_mask_never_relies_on_an_unchecked_dim_name(past_from, names):
    m = decoder_mask(past_from, names)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    lowered = {t: dmlgraph.optimize(m, target=t, allow_growth=True) for t in ("dml", "onnx")}  # (the guard itself)
    for t, r in lowered.items():
        assert r.counts["mask_subgraph"] == 1, t
    for s, past in SIZES:
        f = feeds(s, past)
        want = session.run(None, f)[0]
        assert np.array_equal(dmlgraph.run(m, f)["y"], want)  # the original: as onnxruntime (before: refused)
        for t, r in lowered.items():
            relied = names == LYING and past_from == "mask" and past > 0  # the proof took T for S
            if relied:  # (before: a wrong mask at (1, 5), a broadcast error at (3, 4))
                with pytest.raises(DmlgraphError, match="sequence_length__same_in_attention_mask"):
                    dmlgraph.run(r.model, f)
            else:
                assert np.array_equal(dmlgraph.run(r.model, f)["y"], want), (t, s, past)


def test_run_and_validate_take_inputs_whose_dims_disagree_with_their_names(tmp_path):
    src = str(tmp_path / "m.onnx")
    onnx.save(decoder_mask("cache", LYING), src)
    np.savez(tmp_path / "in.npz", **feeds(1, 5))
    assert cli.main(["run", src, "--inputs", str(tmp_path / "in.npz")]) == 0  # before: exit 2
    assert cli.main(["validate", src, "--inputs", str(tmp_path / "in.npz")]) == 0


def test_a_claimed_mask_of_higher_rank_than_its_data_writes_its_output_rank():
    """A rank-4 band [1, 1, S, S] (a Trilu's, unsqueezed) selecting a rank-3 x [2, S, S] beside an
    unread padding that claims S too: the DML node reads the mask's sizes (`matrix`) and its output
    is x broadcast with them, [1, 2, S, S]; the op schema inferred x's rank, 3, against the declared
    4, and the dml target refused to write the model (found by the fuzzer of forms, fuzz8)."""
    ones = h.make_tensor("one", T.FLOAT, [1], [1.0])
    nodes = [h.make_node("Shape", ["x"], ["shape"]), h.make_node("Slice", ["shape", "m2", "big"], ["matrix"]),
             h.make_node("ConstantOfShape", ["matrix"], ["ones"], value=ones),
             h.make_node("Trilu", ["ones"], ["tri"], upper=0), h.make_node("Cast", ["tri"], ["band"], to=T.BOOL),
             h.make_node("Unsqueeze", ["band", "a01"], ["band4"]), h.make_node("Where", ["band4", "x", "ninf"], ["y"])]
    inits = [_i64("m2", [-2]), _i64("big", [2**62]), _i64("a01", [0, 1]), h.make_tensor("ninf", T.FLOAT, [], [-np.inf])]
    m = h.make_model(h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2, "S", "S"]),
                                               h.make_tensor_value_info("padding", T.BOOL, [1, 1, 1, "S"])],
                                  [h.make_tensor_value_info("y", T.FLOAT, [1, 2, "S", "S"])], inits),
                     opset_imports=[h.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(m, full_check=True)
    lowered = dmlgraph.optimize(m, target="dml")
    assert "mask_where" in [r.rule for r in lowered.rewrites]
    onnx.checker.check_model(lowered.model, full_check=True)
    for n in (1, 3):
        f = {"x": np.random.default_rng(n).standard_normal((2, n, n)).astype(np.float32),
             "padding": np.ones((1, 1, 1, n), bool)}
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)[0]
        np.testing.assert_array_equal(dmlgraph.run(lowered.model, f)["y"], want)
