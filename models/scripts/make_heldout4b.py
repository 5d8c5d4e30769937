"""Held-out round 4, second helper (branch `heldout4`): kinds make_heldout4.py does not build.

    /work/scratch/torchvenv/bin/python models/scripts/make_heldout4b.py [--out DIR] [WANT ...]

torch 2.13 / transformers 5.23 (random weights, configs in code):
  * bart_sdpa_full_nocache: a whole BART (encoder, causal decoder, cross attention) with **sdpa**
    attention on a right-padded encoder batch, through dynamo 18, dynamo 23 (SDPA becomes ONNX's
    `Attention` with the padding / causal mask as its input) and dynamo 23 with optimize=False;
  * bart_sdpa_decoder_kv: BART sdpa's decoder step with a self-attention cache and cross attention
    to a right-padded encoder, and qwen2_mixed_sw4_sdpa_kv (layer 0 full, layer 1 sliding 4, sdpa,
    with the mixed padding set), each through TorchScript, dynamo 18, 23 and 23 with optimize=False;
  * gemma3_sw4_sdpa_kv_fp16: float16 (`model.half()`) Gemma3 sdpa with sliding 4 / global layers and
    a KV cache, TorchScript and dynamo 18, with the batch-3 mixed left padding set.
Reuses make_heldout4.py's round (its wrappers come from make_heldout.py / make_kv_models.py);
input sets are saved as DIR/inputs/<model>/<set>.npz for heldout_report.py.
"""
from __future__ import annotations

import os
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
import make_heldout4 as h4  # noqa: E402

VOCAB = h4.VOCAB


def run(out: str, want: list[str], log: list[dict]) -> None:
    import make_heldout as h1
    import torch
    import torch.nn as nn
    from make_kv_models import Spec

    def bart_sdpa() -> nn.Module:
        from transformers import BartConfig, BartForConditionalGeneration
        return BartForConditionalGeneration(BartConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=256,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, attn_implementation="sdpa"))

    def gemma3_half() -> nn.Module:
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig
        return Gemma3ForCausalLM(Gemma3TextConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=256, pad_token_id=0, bos_token_id=0, eos_token_id=0,
            head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
            layer_types=["sliding_attention", "full_attention"], attn_implementation="sdpa")).half()

    def qwen2_sdpa() -> nn.Module:
        from transformers import Qwen2Config, Qwen2ForCausalLM
        return Qwen2ForCausalLM(Qwen2Config(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=256, use_sliding_window=True, sliding_window=4,
            max_window_layers=1, attn_implementation="sdpa"))

    class SdpaCausalPast(nn.Module):
        """scaled_dot_product_attention(q, cat(past_k, k), cat(past_v, v), is_causal=True): a query
        shorter than the keys, where torch's is_causal is the top-left tril (diagonal 0)."""

        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(16, 48)

        def forward(self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor) -> tuple[torch.Tensor, ...]:
            b, s, _ = x.shape
            q, k, v = (t.reshape(b, s, 2, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
            k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return y.transpose(1, 2).flatten(2), k, v

    causal_past = Spec("sdpaiscausal_past", SdpaCausalPast.__doc__ or "", SdpaCausalPast, "plainpast")
    bart = Spec("bart_sdpa_full_nocache", "transformers BartForConditionalGeneration (sdpa), encoder + decoder, "
                "no cache, right-padded encoder batch", bart_sdpa, "seq2seq_nocache")
    gemma = Spec("gemma3_sw4_sdpa_kv_fp16", "transformers Gemma3ForCausalLM sliding 4 / global (sdpa), flat KV "
                 "cache through DynamicCache, model.half()", gemma3_half, "decoder")
    bart_kv = Spec("bart_sdpa_decoder_kv", "transformers BartForConditionalGeneration (sdpa) decoder step, flat "
                   "self-attention cache, cross attention to a right-padded encoder_attention_mask", bart_sdpa,
                   "seq2seq")
    qwen2 = Spec("qwen2_mixed_sw4_sdpa_kv", "transformers Qwen2ForCausalLM (sdpa), layer 0 full / layer 1 sliding 4, "
                 "flat KV cache through DynamicCache", qwen2_sdpa, "decoder")
    every = (("ts", "torchscript"), ("dynamo", "dynamo"), ("dynamo23", "dynamo23"), ("dynamo23raw", "dynamo23raw"))
    jobs = [(bart, s, s) for s in ("dynamo", "dynamo23", "dynamo23raw")] + [(gemma, "ts", "torchscript"),
                                                                            (gemma, "dynamo", "dynamo")]
    jobs += [(s, suffix, e) for s in (bart_kv, qwen2, causal_past) for suffix, e in every]

    def prepare(spec: Spec) -> nn.Module:
        if spec.kind == "plainpast":
            torch.manual_seed(0)
            spec.input_names, spec.output_names = ["x", "past_k", "past_v"], ["y", "present_k", "present_v"]
            past = {0: "batch", 2: "past_sequence"}
            spec.ts_axes = {"x": {0: "batch", 1: "sequence"}, "past_k": past, "past_v": past,
                            "y": {0: "batch", 1: "sequence"}}
            rng = np.random.default_rng(6)
            for name, b, t, p in (("seq6", 1, 6, 0), ("prefill_past", 2, 3, 5), ("past7_seq1", 2, 1, 7),
                                  ("past3_seq9", 1, 9, 3)):  # (prefill_past: the export set)
                spec.sets[name] = {"x": rng.standard_normal((b, t, 16)).astype(np.float32),
                                   "past_k": rng.standard_normal((b, 2, p, 8)).astype(np.float32),
                                   "past_v": rng.standard_normal((b, 2, p, 8)).astype(np.float32)}
            return spec.build()
        if spec.kind == "seq2seq":
            module = h1.prepare(spec)
            for feeds in spec.sets.values():  # the first row's encoder is right-padded by 2 of 5
                if feeds["encoder_attention_mask"].shape[0] > 1:
                    feeds["encoder_attention_mask"][0, -2:] = 0
            return module
        if spec.kind == "decoder":
            module = h1.prepare(spec)
            spec.sets["mixed_pad3"] = h4.mixed_pad3(spec.sets["left_padded"])
            if "fp16" in spec.base:
                h4.half_feeds(spec)
            return module
        return h4.prepare_seq2seq_nocache(spec)

    h4.export_jobs(jobs, prepare, out, want, log)


def main(argv: list[str] | None = None) -> int:
    return h4.run_parts(__doc__, os.path.join(h4.HERE, "..", "..", "out", "heldout4b"), {"run": run}, argv)


if __name__ == "__main__":
    sys.exit(main())
