"""Build HELD-OUT round 6b: encoder, encoder-decoder and vision families rounds 1-5 did not cover.

    /work/scratch/torchvenv/bin/python models/scripts/make_heldout6b.py torch [--out DIR] [WANT ...]
    /work/scratch/torchvenv/bin/python models/scripts/make_heldout6b.py variants [--out DIR] [WANT ...]

torch 2.13 / transformers 5.23, random weights, configs built in code (2 layers, hidden 32, vocab
100, eager attention unless `_sdpa`), each through TorchScript (opset 17, `_ts`) and the dynamo
exporter (opset 18, `_dynamo`; `_dynamo23raw`: opset 23, where sdpa becomes ONNX's `Attention`,
onnxscript's optimizer off), verified against torch in onnxruntime (rtol / atol 1e-4) at every
input set by make_kv_models.verify (make_heldout4.export_jobs):

  * encoders, input_ids + attention_mask -> last_hidden_state (make_heldout5b.prepare_encoder:
    seq5, seq9, right_padded, long 40, pad3; plus seq1, one token, and left_padded, a batch of 2
    of 8 whose first row is left-padded by 3): ModernBERT with local_attention 4 (layer 0 a
    two-sided sliding window |i - j| <= 2 combined with padding, layer 1 global), eager, sdpa (also
    at opset 23, `_dynamo23raw`) and in float16 from torch (`model.half()`, eager and sdpa,
    verified at 1e-2); DeBERTa-v2 (relative positions), ESM (rotary), RoBERTa (eager and sdpa),
    Electra, DistilBERT, MPNet (relative buckets): padding-only masks;
  * ModernBERT exported with static shapes (no dynamic axes, every set [2, 16]: seq9 unpadded,
    right_padded, pad_both);
  * ModernBertDecoder (local_attention 4 / global) with a flat KV cache (make_kv_models' decoder
    sets plus make_heldout4's mixed_pad3);
  * whole encoder-decoders without a cache on a right-padded encoder batch
    (make_heldout4.prepare_seq2seq_nocache): T5Gemma (sliding window 4 / full in both stacks, the
    encoder's window two-sided), NLLB-MoE (4 experts, every layer sparse);
  * their decoder steps with a flat self-attention cache (make_kv_models' seq2seq kind): T5Gemma,
    NLLB-MoE;
  * vision without masks, pixel_values [b, 3, 32, 32] -> last_hidden_state
    (make_heldout5b.prepare_vision): Dinov2, CLIP vision.

`variants`: onnxruntime's transformer optimizer (model_type "bert", opt_level 1 and 2) of the
RoBERTa and ModernBERT TorchScript exports built by `torch`, and onnxruntime's quantize_dynamic
(QInt8) of both ModernBERT exports (their sources' input sets).

What fails to export (logged, not measured): ModernBERT sdpa in float16 under TorchScript (a file
onnxruntime refuses: LayerNormalization's T bound to float and float16); NLLB-MoE under both
exporters (TorchScript traces its top-2 routing: 3.1e-3 off torch at another length; torch.export
stops in its router's `_apply`: "Cannot swap t1 because it has weakref associated with it").

Names given as WANT select models by substring. Input sets are saved as DIR/inputs/<model>/<set>.npz,
so `models/scripts/heldout_report.py DIR` measures them (default DIR out/heldout6b, git-ignored).
A model that cannot be built or exported is logged (DIR/heldout_log.json) with its error.
"""

from __future__ import annotations

import os
import shutil
import sys
import traceback
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "..", "out", "heldout6b")
VOCAB = 100
_ENC = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=256)


def tuple_encoder_outputs(model: object, moe: bool = False) -> object:
    """T5Gemma and NLLB-MoE read encoder_outputs.last_hidden_state (NLLB-MoE its router_logits
    too): make_kv_models' decoder step passes a tuple (BART's convention), wrapped here into a
    BaseModelOutput (MoEModelOutput)."""
    from transformers.modeling_outputs import BaseModelOutput, MoEModelOutput
    forward = model.forward

    def wrapped(*args: object, encoder_outputs: object = None, **kw: object) -> object:
        if isinstance(encoder_outputs, tuple):
            encoder_outputs = (MoEModelOutput if moe else BaseModelOutput)(last_hidden_state=encoder_outputs[0])
        return forward(*args, encoder_outputs=encoder_outputs, **kw)

    model.forward = wrapped
    return model


def builders() -> dict[str, object]:
    import transformers as t

    def modernbert(impl: str) -> object:
        return lambda: t.ModernBertModel(t.ModernBertConfig(
            **_ENC, local_attention=4, layer_types=["sliding_attention", "full_attention"], pad_token_id=0,
            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, attn_implementation=impl))

    def t5gemma() -> object:
        side = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                    max_position_embeddings=256, sliding_window=4, layer_types=["sliding_attention",
                                                                                "full_attention"],
                    pad_token_id=0, eos_token_id=1, bos_token_id=2)
        config = t.T5GemmaConfig(encoder=dict(side), decoder=dict(side), vocab_size=VOCAB,
                                 attn_implementation="eager")  # (sdpa: "does not support ... yet")
        model = t.T5GemmaForConditionalGeneration(config)
        model.config.d_model = 32  # (make_kv_models' seq2seq kind reads the encoder width from d_model)
        model.config.decoder_start_token_id = 2
        return tuple_encoder_outputs(model)

    def nllb_moe() -> object:
        config = t.NllbMoeConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=1024,
            num_experts=4, expert_capacity=64, encoder_sparse_step=1, decoder_sparse_step=1,
            encoder_layerdrop=0.0, decoder_layerdrop=0.0, dropout=0.0, attention_dropout=0.0,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, attn_implementation="eager")
        return tuple_encoder_outputs(t.NllbMoeForConditionalGeneration(config), moe=True)

    return {
        "modernbert_lw4": modernbert("eager"),
        "modernbert_lw4_sdpa": modernbert("sdpa"),
        "modernbert_lw4_fp16": lambda: modernbert("eager")().half(),
        "modernbert_lw4_sdpa_fp16": lambda: modernbert("sdpa")().half(),
        "modernbert_decoder_lw4": lambda: t.ModernBertDecoderForCausalLM(t.ModernBertDecoderConfig(
            **_ENC, local_attention=4, layer_types=["sliding_attention", "full_attention"], pad_token_id=0,
            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, attn_implementation="eager")),
        "t5gemma_sw4": t5gemma,
        "nllb_moe": nllb_moe,
        "deberta_v2": lambda: t.DebertaV2Model(t.DebertaV2Config(
            **_ENC, relative_attention=True, position_buckets=8, max_relative_positions=16,
            pos_att_type=["p2c", "c2p"], pad_token_id=0, attn_implementation="eager")),
        "esm": lambda: t.EsmModel(t.EsmConfig(
            **_ENC, position_embedding_type="rotary", pad_token_id=1, mask_token_id=3, token_dropout=False,
            attn_implementation="eager"), add_pooling_layer=False),
        "roberta": lambda: t.RobertaModel(t.RobertaConfig(**_ENC, pad_token_id=1, attn_implementation="eager"),
                                          add_pooling_layer=False),
        "roberta_sdpa": lambda: t.RobertaModel(t.RobertaConfig(**_ENC, pad_token_id=1, attn_implementation="sdpa"),
                                               add_pooling_layer=False),
        "electra": lambda: t.ElectraModel(t.ElectraConfig(
            **_ENC, embedding_size=16, pad_token_id=0, attn_implementation="eager")),
        "distilbert": lambda: t.DistilBertModel(t.DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=256,
            pad_token_id=0, attn_implementation="eager")),
        "mpnet": lambda: t.MPNetModel(t.MPNetConfig(**_ENC, pad_token_id=1,
                                                    attn_implementation="eager"), add_pooling_layer=False),
        "dinov2": lambda: t.Dinov2Model(t.Dinov2Config(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, image_size=32, patch_size=4,
            attn_implementation="eager")),
        "clip_vision": lambda: t.CLIPVisionModel(t.CLIPVisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
            patch_size=4, attn_implementation="eager")),
    }


def torch_part(out: str, want: list[str], log: list[dict]) -> None:
    import make_heldout as h1
    from make_heldout4 import export_jobs, mixed_pad3, prepare_seq2seq_nocache
    from make_heldout5b import prepare_encoder, prepare_vision
    from make_kv_models import Spec

    b = builders()
    hf = "transformers {} (tiny random config, {} attention){}"
    both = (("ts", "torchscript"), ("dynamo", "dynamo"))
    specs = [
        Spec("modernbert_lw4_encoder", hf.format("ModernBertModel local_attention 4 / global", "eager",
                                                 ", encoder, last_hidden_state"), b["modernbert_lw4"], "encoder"),
        Spec("modernbert_lw4_sdpa_encoder", hf.format("ModernBertModel local_attention 4 / global", "sdpa",
                                                      ", encoder, last_hidden_state"), b["modernbert_lw4_sdpa"],
             "encoder"),
        Spec("modernbert_lw4_fp16_encoder", hf.format("ModernBertModel local_attention 4 / global", "eager",
                                                      ", encoder, last_hidden_state, model.half()"),
             b["modernbert_lw4_fp16"], "encoder"),
        Spec("modernbert_lw4_sdpa_fp16_encoder", hf.format("ModernBertModel local_attention 4 / global", "sdpa",
                                                           ", encoder, last_hidden_state, model.half()"),
             b["modernbert_lw4_sdpa_fp16"], "encoder"),
        Spec("modernbert_lw4_static16_encoder", hf.format("ModernBertModel local_attention 4 / global", "eager",
                                                          ", encoder, static shapes [2, 16]"),
             b["modernbert_lw4"], "encoder_static"),
        Spec("roberta_sdpa_encoder", hf.format("RobertaModel", "sdpa", ", encoder, last_hidden_state"),
             b["roberta_sdpa"], "encoder"),
    ]
    specs += [Spec(f"{k}_encoder", hf.format(k, "eager", ", encoder, last_hidden_state"), b[k], "encoder")
              for k in ("deberta_v2", "esm", "roberta", "electra", "distilbert", "mpnet")]
    specs += [Spec("modernbert_decoder_lw4_kv", hf.format("ModernBertDecoderForCausalLM local_attention 4 / global",
                                                          "eager", ", flat KV cache through DynamicCache"),
                   b["modernbert_decoder_lw4"], "decoder")]
    specs += [Spec(f"{k}_full_nocache", hf.format(k, "eager", ", encoder + decoder, no cache, padded encoder batch"),
                   b[k], "seq2seq_nocache") for k in ("t5gemma_sw4", "nllb_moe")]
    specs += [Spec(f"{k}_decoder_kv", hf.format(k, "eager", " decoder step, flat KV cache through DynamicCache"),
                   b[k], "seq2seq") for k in ("t5gemma_sw4", "nllb_moe")]
    specs += [Spec(k, hf.format(k, "eager", ", pixel_values -> last_hidden_state"), b[k], "vision")
              for k in ("dinov2", "clip_vision")]
    jobs = [(s, suffix, e) for s in specs for suffix, e in both]
    jobs.append((specs[1], "dynamo23raw", "dynamo23raw"))

    def prepare(spec: Spec) -> object:
        if spec.kind == "seq2seq_nocache":
            return prepare_seq2seq_nocache(spec)
        if spec.kind == "vision":
            return prepare_vision(spec)
        if spec.kind == "encoder_static":  # (no dynamic axes: every set [2, 16], padded differently)
            spec.kind = "encoder"
            module = prepare_encoder(spec)
            spec.kind = "encoder_static"
            spec.ts_axes = {}
            rng = np.random.default_rng(12)
            spec.sets.clear()
            for name, pads in (("seq9", (0, 0)), ("right_padded", (5, 0)), ("pad_both", (3, 11))):
                mask = np.ones((2, 16), np.int64)
                for row, pad in enumerate(pads):
                    mask[row, 16 - pad:] = 0
                spec.sets[name] = {"input_ids": rng.integers(2, VOCAB, (2, 16)).astype(np.int64),
                                   "attention_mask": mask}
            return module
        if spec.kind == "encoder":
            module = prepare_encoder(spec)
            rng = np.random.default_rng(11)
            spec.sets["seq1"] = {"input_ids": rng.integers(2, VOCAB, (1, 1)).astype(np.int64),
                                 "attention_mask": np.ones((1, 1), np.int64)}
            mask = np.ones((2, 8), np.int64)
            mask[0, :3] = 0
            spec.sets["left_padded"] = {"input_ids": rng.integers(2, VOCAB, (2, 8)).astype(np.int64),
                                        "attention_mask": mask}
            return module
        module = h1.prepare(spec)
        if spec.kind == "decoder":
            spec.sets["mixed_pad3"] = mixed_pad3(spec.sets["left_padded"])
        return module

    export_jobs(jobs, prepare, out, want, log)


def variants(out: str, want: list[str], log: list[dict]) -> None:
    """onnxruntime's transformer optimizer (bert, opt_level 1 and 2) of this round's RoBERTa and
    ModernBERT TorchScript exports, and quantize_dynamic (QInt8) of both ModernBERT exports,
    measured at their sources' sets."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    def ortopt(level: int) -> object:
        def run(src: str, dst: str) -> None:
            opt = optimizer.optimize_model(src, model_type="bert", num_heads=2, hidden_size=32, opt_level=level,
                                           optimization_options=FusionOptions("bert"))
            opt.model.ir_version = min(opt.model.ir_version, 10)
            opt.save_model_to_file(dst)
        return run

    def int8(src: str, dst: str) -> None:
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        m = onnx.load(dst)
        m.ir_version = min(m.ir_version, 10)
        onnx.save(m, dst)

    jobs = [(s, f"ortopt{level}", ortopt(level), f"onnxruntime.transformers.optimizer (bert, opt_level {level})")
            for s in ("roberta_encoder_ts", "modernbert_lw4_encoder_ts") for level in (1, 2)]
    jobs += [(s, "int8", int8, "onnxruntime.quantization.quantize_dynamic (QInt8)")
             for s in ("modernbert_lw4_encoder_ts", "modernbert_lw4_encoder_dynamo")]
    for source, suffix, make, how in jobs:
        name = f"{source}_{suffix}"
        if want and not any(w in name for w in want):
            continue
        path = os.path.join(out, name + ".onnx")
        entry = {"name": name, "file": name + ".onnx", "source": f"{how} of {source}.onnx"}
        try:
            make(os.path.join(out, source + ".onnx"), path)
            shutil.copytree(os.path.join(out, "inputs", source), os.path.join(out, "inputs", name),
                            dirs_exist_ok=True)
            ops = sorted({n.op_type for n in onnx.load(path).graph.node})
            entry.update(ok=True, bytes=os.path.getsize(path), ops=ops)
            print(f"OK   {name}: {entry['bytes']} bytes, fused: {[o for o in ops if 'Attention' in o]}", flush=True)
        except Exception as e:  # noqa: BLE001 (recorded, not hidden)
            entry.update(ok=False, error=f"{type(e).__name__}: {str(e).strip()[:400]}",
                         trace=traceback.format_exc()[-800:])
            print(f"FAIL {name}: {entry['error']}", flush=True)
        log[:] = [e for e in log if e["name"] != name] + [entry]


def main(argv: list[str] | None = None) -> int:
    import make_heldout4 as h4
    return h4.run_parts(__doc__, DEFAULT_OUT, {"torch": torch_part, "variants": variants}, argv)


if __name__ == "__main__":
    sys.exit(main())
