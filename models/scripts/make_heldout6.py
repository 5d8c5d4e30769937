"""Build HELD-OUT round 6a: decoder families rounds 1-5 did not cover.

    /work/scratch/torchvenv/bin/python models/scripts/make_heldout6.py torch [--out DIR] [WANT ...]
    /work/scratch/torchvenv/bin/python models/scripts/make_heldout6.py variants [--out DIR] [WANT ...]
    /work/scratch/torchvenv/bin/python models/scripts/make_heldout6.py sets [--out DIR] [WANT ...]

torch 2.13 / transformers 5.23 / onnxscript 0.7.2, random weights, configs in code (no weights
downloaded), 2 layers, hidden 32, vocab 100, eager attention, sliding windows and chunks of 4 (the
long set crosses them). Each model through TorchScript (opset 17) and the dynamo exporter (opset
18) with make_heldout.py's `export` and verified against torch at every input set (rtol/atol
1e-4) by make_heldout4.py's `export_jobs`, with a flat KV cache through DynamicCache (sets
prefill, prefill_past, decode, left_padded, long, mixed_pad3):

- gpt_oss (sliding 4 / full, attention sinks, 4 experts top 2), exaone4 (sliding 4 / full),
  cohere2 (sliding 4 / full), olmo3 (sliding 4 / full), smollm3 (a no-RoPE layer), llama4 text
  (chunked local attention, chunk 4 / full, dense MLPs: a block-diagonal mask, no band), ministral
  (sliding 4), qwen3_moe (4 experts top 2), glm4, seed_oss, arcee;
- llama4 text without a cache (seq5, seq9, left_padded, long): its chunks without a past, and
  called without attention_mask (seq5, seq9, long: its masks from the sizes and position ids);
- olmo2, ernie4_5, qwen2 (use_sliding_window, sliding 4 / full), vaultgemma (sliding 4 / full),
  phimoe (sliding 4, 4 experts top 2), doge (dynamic mask, keep_window_size 4), minimax (full /
  lightning attention, block 4);
- an int32 attention_mask (exported from torch with int32 masks): cohere2 and ministral.

The MoE families use experts_implementation="batched_mm" (the default grouped_mm stops TorchScript
at aten::histc); llama4's complex rotary is swapped for the same products in real arithmetic
(`real_llama4_rope`) and its TorchScript trace casts a bool to int64 before cumsum (a CumSum of
bool, which onnxruntime refuses, otherwise).

`variants`: onnxruntime quantize_dynamic (QInt8) of exaone4_sw4_kv_ts and cohere2_sw4_kv_dynamo,
onnxconverter-common float16 (keep_io_types) of gpt_oss_sw4_kv_ts and qwen2_sw4_kv_dynamo.
`sets` (numpy only, after the others): deep_pad, past2_decode, single for every KV export (they
are compared with the original in onnxruntime, not with torch).

Exporter failures are logged in DIR/heldout_log.json (why: docs/heldout.md, Round 6).
Input sets are saved as DIR/inputs/<model>/<set>.npz, so models/scripts/heldout_report.py DIR
measures them. The files stay out of git (out/ is ignored).
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "..", "out", "heldout6")
VOCAB = 100
HYBRID = ["sliding_attention", "full_attention"]


def torch_part(out: str, want: list[str], log: list[dict]) -> None:
    import make_heldout as h1
    import make_heldout4 as h4
    import torch.nn as nn
    import transformers as tf
    from make_kv_models import Spec

    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                 pad_token_id=0, bos_token_id=0, eos_token_id=0, attn_implementation="eager")

    def build(model: str, config: str, **kw: object):  # type: ignore[no-untyped-def]
        return lambda: getattr(tf, model)(getattr(tf, config)(**{**small, **kw}))

    hf = "transformers {} (tiny random config, eager attention){}"
    kvs = ", flat KV cache through DynamicCache"
    i32 = ", int32 attention_mask"
    decoders = [
        Spec("gpt_oss_sw4_kv", hf.format("GptOssForCausalLM sliding 4 / full, sinks, 4 experts top 2", kvs),
             build("GptOssForCausalLM", "GptOssConfig", head_dim=16, sliding_window=4, layer_types=HYBRID,
                   num_local_experts=4, num_experts_per_tok=2, experts_implementation="batched_mm"), "decoder"),
        Spec("exaone4_sw4_kv", hf.format("Exaone4ForCausalLM sliding 4 / full", kvs),
             build("Exaone4ForCausalLM", "Exaone4Config", sliding_window=4, layer_types=HYBRID), "decoder"),
        Spec("cohere2_sw4_kv", hf.format("Cohere2ForCausalLM sliding 4 / full", kvs),
             build("Cohere2ForCausalLM", "Cohere2Config", head_dim=16, sliding_window=4, layer_types=HYBRID),
             "decoder"),
        Spec("olmo3_sw4_kv", hf.format("Olmo3ForCausalLM sliding 4 / full", kvs),
             build("Olmo3ForCausalLM", "Olmo3Config", sliding_window=4, layer_types=HYBRID), "decoder"),
        Spec("smollm3_kv", hf.format("SmolLM3ForCausalLM, layer 1 without RoPE", kvs),
             build("SmolLM3ForCausalLM", "SmolLM3Config", no_rope_layers=[1, 0]), "decoder"),
        Spec("llama4_chunk4_kv", hf.format("Llama4ForCausalLM text, chunked attention 4 / full, dense", kvs),
             build("Llama4ForCausalLM", "Llama4TextConfig", head_dim=16, intermediate_size_mlp=64,
                   attention_chunk_size=4, layer_types=["chunked_attention", "full_attention"],
                   no_rope_layers=[1, 0], moe_layers=[]), "decoder"),
        Spec("ministral_sw4_kv", hf.format("MinistralForCausalLM sliding 4", kvs),
             build("MinistralForCausalLM", "MinistralConfig", head_dim=16, sliding_window=4,
                   layer_types=["sliding_attention"] * 2), "decoder"),
        Spec("qwen3_moe_kv", hf.format("Qwen3MoeForCausalLM, 4 experts top 2", kvs),
             build("Qwen3MoeForCausalLM", "Qwen3MoeConfig", head_dim=16, moe_intermediate_size=32,
                   num_experts=4, num_experts_per_tok=2, experts_implementation="batched_mm"), "decoder"),
        Spec("glm4_kv", hf.format("Glm4ForCausalLM", kvs),
             build("Glm4ForCausalLM", "Glm4Config", head_dim=16), "decoder"),
        Spec("seed_oss_kv", hf.format("SeedOssForCausalLM", kvs),
             build("SeedOssForCausalLM", "SeedOssConfig", head_dim=16), "decoder"),
        Spec("arcee_kv", hf.format("ArceeForCausalLM", kvs),
             build("ArceeForCausalLM", "ArceeConfig", head_dim=16), "decoder"),
        Spec("cohere2_sw4_kv_i32", hf.format("Cohere2ForCausalLM sliding 4 / full", kvs + i32),
             build("Cohere2ForCausalLM", "Cohere2Config", head_dim=16, sliding_window=4, layer_types=HYBRID),
             "decoder_i32"),
        Spec("ministral_sw4_kv_i32", hf.format("MinistralForCausalLM sliding 4", kvs + i32),
             build("MinistralForCausalLM", "MinistralConfig", head_dim=16, sliding_window=4,
                   layer_types=["sliding_attention"] * 2), "decoder_i32"),
        # (round 6a's second group: more decoder families)
        Spec("olmo2_kv", hf.format("Olmo2ForCausalLM", kvs), build("Olmo2ForCausalLM", "Olmo2Config"), "decoder"),
        Spec("ernie4_5_kv", hf.format("Ernie4_5ForCausalLM", kvs),
             build("Ernie4_5ForCausalLM", "Ernie4_5Config", head_dim=16), "decoder"),
        Spec("qwen2_sw4_kv", hf.format("Qwen2ForCausalLM use_sliding_window, sliding 4 / full", kvs),
             build("Qwen2ForCausalLM", "Qwen2Config", use_sliding_window=True, sliding_window=4,
                   max_window_layers=1, layer_types=HYBRID), "decoder"),
        Spec("vaultgemma_sw4_kv", hf.format("VaultGemmaForCausalLM sliding 4 / full", kvs),
             build("VaultGemmaForCausalLM", "VaultGemmaConfig", head_dim=16, sliding_window=4, layer_types=HYBRID),
             "decoder"),
        Spec("phimoe_sw4_kv", hf.format("PhimoeForCausalLM sliding 4, 4 experts top 2", kvs),
             build("PhimoeForCausalLM", "PhimoeConfig", sliding_window=4, num_local_experts=4,
                   num_experts_per_tok=2, experts_implementation="batched_mm"), "decoder"),
        Spec("doge_kw4_kv", hf.format("DogeForCausalLM, dynamic mask keep_window_size 4", kvs),
             build("DogeForCausalLM", "DogeConfig", keep_window_size=4), "decoder"),
        Spec("minimax_kv", hf.format("MiniMaxForCausalLM full / lightning (linear) attention, block 4, 4 experts",
                                     kvs),
             build("MiniMaxForCausalLM", "MiniMaxConfig", head_dim=16, block_size=4,
                   layer_types=["full_attention", "linear_attention"], num_local_experts=4, num_experts_per_tok=2,
                   experts_implementation="batched_mm"), "decoder"),
    ]
    nocache = [
        Spec("llama4_chunk4_nocache", hf.format("Llama4ForCausalLM text, chunked attention 4 / full, dense",
                                                ", no cache"),
             build("Llama4ForCausalLM", "Llama4TextConfig", head_dim=16, intermediate_size_mlp=64,
                   attention_chunk_size=4, layer_types=["chunked_attention", "full_attention"],
                   no_rope_layers=[1, 0], moe_layers=[]), "nocache"),
        Spec("llama4_chunk4_nomask", hf.format("Llama4ForCausalLM text, chunked attention 4 / full, dense",
                                               ", no cache, no attention_mask (its chunks from sizes alone)"),
             build("Llama4ForCausalLM", "Llama4TextConfig", head_dim=16, intermediate_size_mlp=64,
                   attention_chunk_size=4, layer_types=["chunked_attention", "full_attention"],
                   no_rope_layers=[1, 0], moe_layers=[]), "nomask"),
    ]
    class NoMask(nn.Module):
        """(input_ids, attention_mask) -> logits with the model called without attention_mask: the
        masks are built from the sizes alone (TorchScript drops the unread input)."""

        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):  # type: ignore[no-untyped-def]
            return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits

    jobs = [(s, suffix, e) for s in [*decoders, *nocache]
            for suffix, e in (("ts", "torchscript"), ("dynamo", "dynamo"))]

    def prepare(spec: Spec) -> nn.Module:
        if spec.base.startswith("llama4"):
            real_llama4_rope()
        if spec.kind == "decoder_i32":
            spec.kind = "decoder"
            try:
                module = prepare(spec)
            finally:
                spec.kind = "decoder_i32"
            for feeds in spec.sets.values():
                feeds["attention_mask"] = feeds["attention_mask"].astype(np.int32)
            return module
        if spec.kind == "nomask":
            spec.kind = "nocache"
            try:
                module = h1.prepare(spec)
            finally:
                spec.kind = "nomask"
            for k in [k for k in spec.sets if k == "left_padded"]:
                del spec.sets[k]  # (no mask: a padded batch means nothing)
            return NoMask(module.model)
        module = h1.prepare(spec)
        if spec.kind == "decoder":
            spec.sets["mixed_pad3"] = h4.mixed_pad3(spec.sets["left_padded"])
        return module

    # make_heldout's dynamo shapes treat decoder_i32 like decoder
    h4.dynamo_shapes_as({"decoder_i32": "decoder"})
    export = h1.export

    def export_bool_cumsum(spec: Spec, module: nn.Module, exporter: str, path: str, **kw: object) -> None:
        """TorchScript writes Llama-4's left-padding count, `attention_mask.cumsum(-1)` of a bool
        mask, as a CumSum of bool, which onnxruntime refuses; torch's cumsum of bool is int64, so
        the same sum of the mask cast to int64 first (while tracing llama4 only)."""
        if exporter != "torchscript" or not spec.base.startswith("llama4"):
            return export(spec, module, exporter, path, **kw)
        import torch
        cumsum = torch.Tensor.cumsum

        def int_cumsum(self: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
            return cumsum(self.long() if self.dtype == torch.bool else self, *a, **k)
        torch.Tensor.cumsum = int_cumsum  # type: ignore[method-assign]
        try:
            return export(spec, module, exporter, path, **kw)
        finally:
            torch.Tensor.cumsum = cumsum  # type: ignore[method-assign]

    h1.export = export_bool_cumsum
    h4.export_jobs(jobs, prepare, out, want, log)


def real_llama4_rope() -> None:
    """Llama-4's rotary embedding in real arithmetic: transformers multiplies complex numbers
    (torch.polar, view_as_complex), which neither exporter converts (TorchScript: no aten::polar;
    dynamo: "No decompositions registered for the complex-valued input"). The same products,
    (a + ib)(cos + i sin) as (a cos - b sin, a sin + b cos) on the interleaved pairs."""
    import torch
    from transformers.models.llama4 import modeling_llama4 as m4

    def rope_forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        return torch.stack([freqs.cos(), freqs.sin()], dim=-1) * self.attention_scaling

    def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        f = freqs[:, :, None, :, :]
        cos, sin = f[..., 0], f[..., 1]

        def rot(x: torch.Tensor) -> torch.Tensor:
            pairs = x.float().reshape(*x.shape[:-1], -1, 2)
            a, b = pairs[..., 0], pairs[..., 1]
            return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(3).type_as(x)
        return rot(xq), rot(xk)

    m4.Llama4TextRotaryEmbedding.forward = rope_forward
    m4.apply_rotary_emb = apply_rotary_emb


def variants_part(out: str, want: list[str], log: list[dict]) -> None:
    import make_heldout as h1
    pick = lambda names, suffix: tuple(s for s in names if not want or any(w in f"{s}_{suffix}" for w in want))
    h1.VARIANTS = [("int8", "onnxruntime quantize_dynamic QInt8", h1._int8,
                    pick(("exaone4_sw4_kv_ts", "cohere2_sw4_kv_dynamo"), "int8")),
                   ("fp16", "onnxconverter-common float16 (keep_io_types)", h1._fp16,
                    pick(("gpt_oss_sw4_kv_ts", "qwen2_sw4_kv_dynamo"), "fp16"))]
    h1.variants(out, log)


def sets_part(out: str, want: list[str], log: list[dict]) -> None:
    """Three more sets for every KV export in `out` (numpy only: the report compares dmlgraph's
    outputs with the original in onnxruntime, not with torch): deep_pad (batch 2, past 3, seq 6,
    the first row's first 7 of 9 positions padded, more than the window), past2_decode (past 2,
    seq 1, inside the window), single (past 0, seq 1)."""
    import glob
    for folder in sorted(glob.glob(os.path.join(out, "inputs", "*"))):
        ref = os.path.join(folder, "prefill_past.npz")
        if not os.path.exists(ref) or (want and not any(w in os.path.basename(folder) for w in want)):
            continue
        f = dict(np.load(ref))
        rng = np.random.default_rng(11)
        for name, b, past, seq, pad in (("deep_pad", 2, 3, 6, 7), ("past2_decode", 2, 2, 1, 0), ("single", 1, 0, 1, 0)):
            feeds = {}
            for k, a in f.items():
                if k == "input_ids":
                    feeds[k] = rng.integers(1, VOCAB, (b, seq)).astype(a.dtype)
                elif k == "attention_mask":
                    feeds[k] = np.ones((b, past + seq), a.dtype)
                    feeds[k][0, :pad] = 0
                else:  # past_key_values.<i>.key / value [batch, kv heads, past, head dim]
                    feeds[k] = rng.standard_normal((b, a.shape[1], past, a.shape[3])).astype(a.dtype)
            np.savez_compressed(os.path.join(folder, name + ".npz"), **feeds)
        print(f"sets {os.path.basename(folder)}")


def main(argv: list[str] | None = None) -> int:
    import make_heldout4 as h4
    return h4.run_parts(__doc__, DEFAULT_OUT, {"torch": torch_part, "variants": variants_part, "sets": sets_part},
                        argv)


if __name__ == "__main__":
    sys.exit(main())
