"""A generator's sizes are the model's own where it holds them (issue 25 item 4): `DimKeys` traces a
tensor's sizes back to the reads they come from, and the portable output runs fewer kernels than
the original in onnxruntime for every KV decoder of models/."""
from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import dmlgraph
from dmlgraph.io import onnx_io
from dmlgraph.io.dim_keys import DimKeys, entry_keys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KV_DECODERS = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(ROOT, "models", "*_kv_*.onnx")))


def _relative_positions(query_len: str = "s") -> onnx.ModelProto:
    """T5's [S, P + S] relative positions: Range(S) against Range of the cache's length after the
    new keys (Reshape(MatMul(x)) to [B, S, -1, 4], transposed) are concatenated to the past."""
    x = h.make_tensor_value_info("x", T.FLOAT, ["b", "s", 8])
    other = h.make_tensor_value_info("other", T.FLOAT, ["b", query_len, 8])
    past = h.make_tensor_value_info("past", T.FLOAT, ["b", 2, "p", 4])
    c = {"i0": 0, "i1": 1, "i2": 2, "zero": 0, "one": 1}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in c.items()]
    inits += [numpy_helper.from_array(np.array([k], np.int64), f"a{k}") for k in (0, 1, 2)]
    inits += [numpy_helper.from_array(np.array([-1], np.int64), "m1"), numpy_helper.from_array(np.array([4], np.int64), "c4"),
              numpy_helper.from_array(np.ones((8, 8), np.float32), "w")]
    nodes = [
        h.make_node("Shape", ["x"], ["sx"]), h.make_node("Gather", ["sx", "i0"], ["b"], axis=0),
        h.make_node("Gather", ["sx", "i1"], ["s"], axis=0),
        h.make_node("Unsqueeze", ["b", "a0"], ["b1"]), h.make_node("Unsqueeze", ["s", "a0"], ["s1"]),
        h.make_node("Concat", ["b1", "s1", "m1", "c4"], ["kshape"], axis=0),
        h.make_node("MatMul", ["x", "w"], ["k0"]), h.make_node("Reshape", ["k0", "kshape"], ["k1"]),
        h.make_node("Transpose", ["k1"], ["k"], perm=[0, 2, 1, 3]),
        h.make_node("Concat", ["past", "k"], ["present"], axis=2),
        h.make_node("Shape", ["present"], ["sp"]), h.make_node("Gather", ["sp", "i2"], ["t"], axis=0),
        h.make_node("Range", ["zero", "t", "one"], ["keys"]),
        h.make_node("Shape", ["other"], ["so"]), h.make_node("Gather", ["so", "i1"], ["s_other"], axis=0),
        h.make_node("Range", ["zero", "s", "one"], ["queries"]),
        h.make_node("Range", ["zero", "s_other", "one"], ["queries_other"]),
        h.make_node("Range", ["one", "t", "one"], ["keys_from_1"]),
        h.make_node("Unsqueeze", ["keys", "a0"], ["row"]), h.make_node("Unsqueeze", ["queries", "a1"], ["col"]),
        h.make_node("Unsqueeze", ["queries_other", "a1"], ["col_other"]),
        h.make_node("Unsqueeze", ["keys_from_1", "a0"], ["row_from_1"]),
        h.make_node("Sub", ["row", "col"], ["rel"]), h.make_node("Sub", ["row", "col_other"], ["rel_other"]),
        h.make_node("Sub", ["row_from_1", "col"], ["rel_from_1"]),
        h.make_node("Shape", ["past"], ["spast"]), h.make_node("Gather", ["spast", "a2"], ["p"], axis=0),
        h.make_node("Gather", ["sx", "a1"], ["s_vec"], axis=0), h.make_node("Add", ["p", "s_vec"], ["ps"]),
        h.make_node("Concat", ["s_vec", "ps"], ["sizes"], axis=0),  # (the sizes `SizeBuilder.vector` builds)
    ]
    outs = [h.make_tensor_value_info(n, T.INT64, [None, None]) for n in ("rel", "rel_other", "rel_from_1")]
    outs.append(h.make_tensor_value_info("sizes", T.INT64, [2]))
    graph = h.make_graph(nodes, "g", [x, other, past], outs, inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


def test_dim_keys_trace_sizes_to_their_reads_not_their_names():
    """Shape(rel) holds [S, P + S] read from x and the past, as the sizes vector built from the
    same reads does; the same Range of another input's size named "s" does not (names are not
    proof), nor does a Range starting at 1 (its length is not its limit)."""
    g = onnx_io.import_model(_relative_positions())
    keys = DimKeys(g)
    rel = keys.dims(g.values["rel"])
    sizes = entry_keys(g, g.values["sizes"], 0, lambda v: keys.dims(v))
    assert rel is not None and rel == sizes and len(rel) == 2
    assert rel[0] == ("dim", "x", 1) and rel[1][0] == "add"  # (the past's length plus x's)
    other = keys.dims(g.values["rel_other"])
    assert other is not None and other[0] != rel[0] and other[1] == rel[1]
    from_1 = keys.dims(g.values["rel_from_1"])
    assert from_1 is not None and from_1[1] != rel[1]


def _ort_nodes(model: str | bytes, tmp_path, tag: str) -> int:
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.optimized_model_filepath = str(tmp_path / f"{tag}.onnx")
    ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    return len(onnx.load(opts.optimized_model_filepath).graph.node)


@pytest.mark.parametrize("name", KV_DECODERS)
def test_the_portable_output_runs_fewer_kernels_than_the_original(name, tmp_path):
    """Nodes of onnxruntime's optimized model (ORT_ENABLE_ALL, CPU): the portable output's are
    strictly fewer than the original's (t5_decoder_kv_ts: 239 and 239 before its generator read
    the model's Shape(Sub) of its relative positions, 235 after)."""
    path = os.path.join(ROOT, "models", f"{name}.onnx")
    portable = dmlgraph.optimize(path, target="onnx").model.SerializeToString()
    assert _ort_nodes(portable, tmp_path, "portable") < _ort_nodes(path, tmp_path, "original")


def test_t5s_band_reads_the_shape_of_its_relative_positions():
    """The relative-position band's generator is sized by the model's own `Shape(Sub)` (kept: the
    bucket's zeros read it), on both targets: no Concat, Add or Gather of ours for it."""
    path = os.path.join(ROOT, "models", "t5_decoder_kv_ts.onnx")
    source = {o for n in onnx.load(path, load_external_data=False).graph.node for o in n.output if n.op_type == "Shape"}
    for target in ("onnx", "dml"):
        # (on onnx the band is declined by default, 2 kernels more than the Less: test_site_kernels.py)
        model = dmlgraph.optimize(path, target=target, allow_growth=target == "onnx").model
        made = {o: n for n in model.graph.node for o in n.output}
        gen = [n for n in model.graph.node if n.output[0].endswith("SelfAttention/Less_output_0__dm_full")
               or (n.op_type == "DiagonalMatrix1" and n.output[0].endswith("SelfAttention/Less_output_0"))]
        assert len(gen) == 1, target
        sizes = gen[0].input[0] if gen[0].op_type == "ConstantOfShape" else gen[0].input[1]
        assert sizes in source and made[sizes].op_type == "Shape", (target, sizes)


def _gathered_padding() -> onnx.ModelProto:
    """The dynamo exporter's causal & padding mask (phi3, gpt2), no value_info: the padding is a
    GatherND of attention_mask at [batch, kv] index pairs expanded to `Shape(Max(b, kv))`, whose
    output onnx's inference cannot size; And the causal band, expanded to [B, 1, S, P + S]."""
    n = h.make_node
    nodes = [
        n("Shape", ["past_key"], ["sp"], start=2, end=3), n("Squeeze", ["sp"], ["P"]),
        n("Shape", ["input_ids"], ["ss"], start=1, end=2), n("Squeeze", ["ss"], ["S"]),
        n("Shape", ["attention_mask"], ["sb"], start=0, end=1), n("Squeeze", ["sb"], ["B"]),
        n("Add", ["P", "S"], ["T"]), n("Range", ["zero", "T", "one"], ["kv"]),
        n("Unsqueeze", ["kv", "ax012"], ["kv4"]),
        n("Range", ["zero", "S", "one"], ["q"]), n("Add", ["q", "P"], ["qp"]),
        n("Unsqueeze", ["qp", "ax013"], ["q4"]), n("LessOrEqual", ["kv4", "q4"], ["causal"]),
        n("Cast", ["attention_mask"], ["amb"], to=T.BOOL),
        n("Range", ["zero", "B", "one"], ["bidx"]), n("Unsqueeze", ["bidx", "ax123"], ["b4"]),
        n("Max", ["b4", "kv4"], ["m"]), n("Shape", ["m"], ["sm"]),
        n("Expand", ["b4", "sm"], ["bi"]), n("Expand", ["kv4", "sm"], ["ki"]),
        n("Unsqueeze", ["bi", "m1"], ["bi5"]), n("Unsqueeze", ["ki", "m1"], ["ki5"]),
        n("Concat", ["bi5", "ki5"], ["idx"], axis=-1), n("GatherND", ["amb", "idx"], ["pad"]),
        n("And", ["causal", "pad"], ["keep"]),
        n("Reshape", ["T", "m1"], ["T1"]), n("Concat", ["sb", "c1", "ss", "T1"], ["target"], axis=0),
        n("Expand", ["keep", "target"], ["mask"]), n("Where", ["mask", "zf", "ninf"], ["bias"]),
        n("Add", ["scores", "bias"], ["y"]),
    ]
    inits = [h.make_tensor("zero", T.INT64, [], [0]), h.make_tensor("one", T.INT64, [], [1]),
             h.make_tensor("m1", T.INT64, [1], [-1]), h.make_tensor("c1", T.INT64, [1], [1]),
             h.make_tensor("ax012", T.INT64, [3], [0, 1, 2]), h.make_tensor("ax013", T.INT64, [3], [0, 1, 3]),
             h.make_tensor("ax123", T.INT64, [3], [1, 2, 3]), h.make_tensor("zf", T.FLOAT, [], [0.0]),
             h.make_tensor("ninf", T.FLOAT, [], [float("-inf")])]
    g = h.make_graph(nodes, "gathered_padding",
                     [h.make_tensor_value_info("input_ids", T.INT64, ["batch", "sequence"]),
                      h.make_tensor_value_info("attention_mask", T.INT64, ["batch", "past + sequence"]),
                      h.make_tensor_value_info("past_key", T.FLOAT, ["batch", 1, "past", 4]),
                      h.make_tensor_value_info("scores", T.FLOAT, ["batch", 1, "sequence", "past + sequence"])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["batch", 1, "sequence", "past + sequence"])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_a_gathernd_padding_keeps_the_sizes_it_is_gathered_at():
    """GatherND's output is the indices' sizes but the last, then data's after the indexed axes
    (`DimKeys`): the padding is [B, 1, 1, P + S] by the reads that make it, so the mask's Expand
    to [B, 1, S, P + S] is the band as it is, lowered on dml without a sizes vector of ours
    (before: declined "would add 1 node"), and right at past 0, 4 with padding and decode."""
    model = _gathered_padding()
    g = onnx_io.import_model(model)
    s, p, b = ("dim", "input_ids", 1), ("dim", "past_key", 2), ("dim", "attention_mask", 0)
    assert DimKeys(g).dims(g.values["pad"]) == [b, ("c", 1), ("c", 1), ("add", *sorted((p, s), key=repr))]
    result = dmlgraph.optimize(model, target="dml")
    assert result.counts["mask_view"] == 1 and not result.declined, [d.reason for d in result.declined]
    rng = np.random.default_rng(0)
    for past, seq in ((0, 5), (4, 3), (6, 1)):
        mask = np.ones((2, past + seq), np.int64)
        mask[0, :2] = 0
        feeds = {"input_ids": np.zeros((2, seq), np.int64), "attention_mask": mask,
                 "past_key": np.zeros((2, 1, past, 4), np.float32),
                 "scores": rng.standard_normal((2, 1, seq, past + seq)).astype(np.float32)}
        assert dmlgraph.validate(model, result, feeds, exact=True).ok
