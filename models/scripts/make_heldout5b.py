"""Build HELD-OUT round 5b: encoder, encoder-decoder and vision families rounds 1-4 did not cover.

    /work/scratch/torchvenv/bin/python models/scripts/make_heldout5b.py [--out DIR] [WANT ...]

torch 2.13 / transformers 5.23, random weights, configs built in code (2 layers, hidden 32, vocab
100, eager attention), each through TorchScript (opset 17, `_ts`) and the dynamo exporter (opset 18,
`_dynamo`), verified against torch in onnxruntime (rtol / atol 1e-4) at every input set by
make_kv_models.verify (make_heldout4.export_jobs):

  * whole encoder-decoders without a cache on a right-padded encoder batch
    (make_heldout4.prepare_seq2seq_nocache: seq5, seq9, right_padded, long): pegasus, mbart,
    m2m_100, blenderbot, led (Longformer encoder-decoder, attention_window 4), prophetnet;
  * their decoder steps with a flat self-attention cache (make_kv_models' seq2seq kind: prefill,
    prefill_past, decode, left_padded, long): pegasus, mbart, m2m_100, blenderbot, speech2text;
  * encoders, input_ids + attention_mask -> last_hidden_state (seq5, seq9, right_padded, long 40,
    pad3: a batch of 3 right-padded by 0, 2 and 5 of 11): longformer (attention_window 4:
    sliding-chunk attention whose invalid corners are a flipped triangle,
    `ones(w, w + 1).tril().flip(dims=[0])`), bigbird (`original_full`, what block sparse falls back
    to at these lengths), funnel, reformer (local attention, chunk 4, one chunk before, causal);
  * swin (window 2, shifted windows: the shift mask is a block pattern), pixel_values [b, 3, 32, 32]
    -> last_hidden_state, batch 1 (set `seq5`) and 2 (`seq9`).

Longformer, LED and Reformer chunk with Python ints (TorchScript bakes the traced batch and length
in), so their sets are all batch 2 and encoder length 12 (`fixed_length`), Longformer verified at
1e-3 (its export is 4.6e-4 off torch everywhere). What fails to export (logged, not measured):
dynamo Longformer / LED (a data-dependent guard), ProphetNet under dynamo, Reformer under
TorchScript, Funnel under both (docs/heldout.md).

Names given as WANT select models by substring. Input sets are saved as DIR/inputs/<model>/<set>.npz,
so `models/scripts/heldout_report.py DIR` measures them (default DIR out/heldout5b, git-ignored).
A model that cannot be built or exported is logged (DIR/heldout_log.json) with its error.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "..", "out", "heldout5b")
VOCAB = 100
_S2S = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=256,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, attn_implementation="eager")


def builders() -> dict[str, object]:
    import transformers as t

    def s2s(config: str, model: str, **extra: object) -> object:
        return lambda: getattr(t, model)(getattr(t, config)(**{**_S2S, **extra}))

    return {
        "pegasus": s2s("PegasusConfig", "PegasusForConditionalGeneration"),
        "mbart": s2s("MBartConfig", "MBartForConditionalGeneration"),
        # (sinusoidal tables of 1024: dynamo's dims go to 512, and a table of 256 guards the length)
        "m2m100": s2s("M2M100Config", "M2M100ForConditionalGeneration", max_position_embeddings=1024),
        "blenderbot": s2s("BlenderbotConfig", "BlenderbotForConditionalGeneration"),
        "led": s2s("LEDConfig", "LEDForConditionalGeneration", attention_window=4, max_encoder_position_embeddings=256,
                   max_decoder_position_embeddings=256),
        "prophetnet": lambda: t.ProphetNetForConditionalGeneration(t.ProphetNetConfig(
            vocab_size=VOCAB, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=2,
            num_decoder_layers=2, num_encoder_attention_heads=2, num_decoder_attention_heads=2, ngram=2,
            num_buckets=8, relative_max_distance=32, max_position_embeddings=256, pad_token_id=1, bos_token_id=0,
            eos_token_id=2, decoder_start_token_id=0)),
        "speech2text": lambda: t.Speech2TextForConditionalGeneration(t.Speech2TextConfig(
            **{k: v for k, v in _S2S.items() if k != "max_position_embeddings"}, max_source_positions=64,
            max_target_positions=1024, num_conv_layers=2, input_feat_per_channel=8, input_channels=1,
            conv_channels=16, conv_kernel_sizes=[5, 5])),
        "longformer": lambda: t.LongformerModel(t.LongformerConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            attention_window=4, max_position_embeddings=256, pad_token_id=1), add_pooling_layer=False),
        "bigbird": lambda: t.BigBirdModel(t.BigBirdConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=256, attention_type="original_full", pad_token_id=0), add_pooling_layer=False),
        "funnel": lambda: t.FunnelBaseModel(t.FunnelConfig(
            vocab_size=VOCAB, d_model=32, n_head=2, d_head=16, d_inner=64, block_sizes=[1, 1], num_decoder_layers=1,
            pad_token_id=0)),
        "reformer": lambda: t.ReformerModel(t.ReformerConfig(
            vocab_size=VOCAB, hidden_size=32, num_attention_heads=2, attention_head_size=16, feed_forward_size=64,
            attn_layers=["local", "local"], local_attn_chunk_length=4, local_num_chunks_before=1,
            local_num_chunks_after=0, is_decoder=True, axial_pos_embds=False, max_position_embeddings=256,
            pad_token_id=0, eos_token_id=2)),
        "swin": lambda: t.SwinModel(t.SwinConfig(
            image_size=32, patch_size=2, num_channels=3, embed_dim=16, depths=[2], num_heads=[2], window_size=2,
            attn_implementation="eager"), add_pooling_layer=False),
    }


def prepare_vision(spec: object) -> object:
    """pixel_values [batch, 3, H, W] -> last_hidden_state; dims batch, height, width."""
    import torch
    import torch.nn as nn

    class Vision(nn.Module):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=pixel_values, return_dict=True).last_hidden_state

    torch.manual_seed(0)
    module = Vision(spec.build().eval())
    spec.input_names, spec.output_names = ["pixel_values"], ["last_hidden_state"]
    spec.ts_axes = {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"}}
    rng = np.random.default_rng(6)
    for name, b in (("seq9", 2), ("seq5", 1)):  # (export uses seq9; swin's window grid is fixed by its size)
        spec.sets[name] = {"pixel_values": rng.standard_normal((b, 3, 32, 32)).astype(np.float32)}
    return module


def prepare_encoder(spec: object) -> object:
    """make_kv_models' encoder kind (seq5, seq9, right_padded) plus long (seq 40) and a
    batch of 3 right-padded by 0, 2 and 5 of 11."""
    import make_kv_models as kv
    module = kv.prepare(spec)
    rng = np.random.default_rng(8)
    spec.sets["long"] = {"input_ids": rng.integers(2, VOCAB, (1, 40)).astype(np.int64),
                         "attention_mask": np.ones((1, 40), np.int64)}
    mask = np.ones((3, 11), np.int64)
    mask[1, 9:] = 0
    mask[2, 6:] = 0
    spec.sets["pad3"] = {"input_ids": rng.integers(2, VOCAB, (3, 11)).astype(np.int64), "attention_mask": mask}
    return module


def fixed_length(spec: object, length: int = 12) -> None:
    """Longformer / LED: every set at batch 2 and encoder length 12 (a multiple of the attention
    window). Their chunking computes its shapes with Python ints, so TorchScript bakes the traced
    batch and length in (onnxruntime's Gather goes out of bounds at any other), and torch.export stops
    on a data-dependent guard; the sets keep their padding and decoder lengths."""
    rng = np.random.default_rng(9)
    for name, feeds in spec.sets.items():
        for k, a in feeds.items():
            feeds[k] = np.concatenate([a, a])[:2] if a.shape[0] != 2 else a
        mask = np.ones((2, length), np.int64)
        pad = {"right_padded": 3, "long": 5, "pad3": 6}.get(name, 0)
        mask[0, length - pad:] = 0
        feeds["input_ids"] = rng.integers(3, VOCAB, (2, length)).astype(np.int64)
        feeds["attention_mask"] = mask
    for name in ("input_ids", "attention_mask", "last_hidden_state", "decoder_input_ids", "logits"):
        if name in spec.ts_axes:
            spec.ts_axes[name] = {ax: n for ax, n in spec.ts_axes[name].items() if ax == 1 and name in (
                "decoder_input_ids", "logits")}


def torch_part(out: str, want: list[str], log: list[dict]) -> None:
    import make_heldout as h1
    from make_heldout4 import export_jobs, prepare_seq2seq_nocache
    from make_kv_models import Spec

    b = builders()
    hf = "transformers {} (tiny random config, eager attention){}"
    specs = [Spec(f"{k}_full_nocache", hf.format(k, ", encoder + decoder, no cache, padded encoder batch"), b[k],
                  "seq2seq_nocache") for k in ("pegasus", "mbart", "m2m100", "blenderbot", "led", "prophetnet")]
    specs += [Spec(f"{k}_decoder_kv", hf.format(k, " decoder step, flat KV cache through DynamicCache"), b[k],
                   "seq2seq") for k in ("pegasus", "mbart", "m2m100", "blenderbot", "speech2text")]
    specs += [Spec(f"{k}_encoder", hf.format(k, ", encoder, last_hidden_state"), b[k], "encoder")
              for k in ("longformer", "bigbird", "funnel", "reformer")]
    specs += [Spec("swin_w2", hf.format("SwinModel window 2 (shifted windows)", ", last_hidden_state"), b["swin"],
                   "vision")]
    jobs = [(s, suffix, e) for s in specs for suffix, e in (("ts", "torchscript"), ("dynamo", "dynamo"))]

    def prepare(spec: Spec) -> object:
        if spec.kind == "seq2seq_nocache":
            return prepare_seq2seq_nocache(spec)
        if spec.kind == "vision":
            return prepare_vision(spec)
        if spec.kind == "encoder":
            return prepare_encoder(spec)
        return h1.prepare(spec)

    def prepare_fixed(spec: Spec) -> object:
        module = prepare(spec)
        fixed_length(spec)
        return module

    fixed = ("longformer", "led", "reformer")  # (sliding-chunk attention: exported at one encoder length)
    export_jobs([j for j in jobs if not j[0].base.startswith(fixed)], prepare, out, want, log)
    import make_kv_models as kv
    verify = kv.verify
    # Longformer's TorchScript export differs from torch by up to 4.6e-4 at every position, padded
    # or not (float rounding of its chunked matmuls): verified at 1e-3 (docs/heldout.md); the rest 1e-4
    kv.verify = lambda spec, module, path, tol=1e-4: verify(
        spec, module, path, tol=max(tol, 1e-3) if spec.base.startswith("longformer") else tol)
    try:
        export_jobs([j for j in jobs if j[0].base.startswith(fixed)], prepare_fixed, out, want, log)
    finally:
        kv.verify = verify


def main(argv: list[str] | None = None) -> int:
    import make_heldout4 as h4
    return h4.run_parts(__doc__, DEFAULT_OUT, {"torch": torch_part}, argv)


if __name__ == "__main__":
    sys.exit(main())
