"""Build HELD-OUT round 10: families and sizes no round has exported.

    /work/scratch/torchvenv/bin/python models/scripts/make_heldout10.py torch [--out DIR] [WANT ...]
    /work/scratch/torchvenv/bin/python models/scripts/make_heldout10.py deep [--out DIR] [WANT ...]

torch 2.13 / transformers 5.23 / onnxscript, random weights, configs in code (no weights
downloaded), hidden 32, vocab 100, eager attention, windows of 4 where a family has one. Each model
through TorchScript (opset 17, `_ts`) and the dynamo exporter (opset 18, `_dynamo`) with
make_heldout.py's `export` and make_heldout4.py's `export_jobs` (verified against torch at every
input set, rtol/atol 1e-4), with a flat KV cache through DynamicCache where the family's cache is
one (sets prefill, prefill_past, decode, left_padded, long, mixed_pad3) and without a cache
(seq5, seq9, left_padded, long):

- `torch`: longt5 (local attention, radius 4; transient-global, block 4: whole encoder-decoder
  without a cache on a right-padded encoder batch, and the decoder step with a cache),
  bigbird_pegasus (block_sparse, block 8, which falls back to full attention below 9 blocks: every
  set here is shorter), lfm2 (conv + attention), deepseek_v3 (MLA, dense layers), gemma3n text
  (sliding 4 / full), hunyuan_v1_dense, dots1 (sliding 4 / full, dense layers), and the mamba
  hybrids jamba, bamba, falcon_h1, zamba2 (their caches are not a DynamicCache: the KV wrapper is
  tried and its failure logged);
- `deep`: llama and mistral (sliding 4), 24 layers, hidden 32, with a KV cache, both exporters.

What fails to export is logged in DIR/heldout_log.json with its error (docs/heldout.md, Round 10).
Input sets are saved as DIR/inputs/<model>/<set>.npz, so models/scripts/heldout_report.py DIR
measures them (default DIR out/heldout10, git-ignored).
"""

from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "..", "out", "heldout10")
VOCAB = 100
HYBRID = ["sliding_attention", "full_attention"]
BOTH = (("ts", "torchscript"), ("dynamo", "dynamo"))


def _small(**kw: object) -> dict:
    return dict(dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                     pad_token_id=0, bos_token_id=0, eos_token_id=0, attn_implementation="eager"), **kw)


def builders() -> dict[str, object]:
    import transformers as t
    from make_heldout6b import tuple_encoder_outputs

    def causal(model: str, config: str, **kw: object) -> object:
        return lambda: getattr(t, model)(getattr(t, config)(**_small(**kw)))

    def longt5(kind: str) -> object:
        def build() -> object:
            config = t.LongT5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
                                    num_heads=2, local_radius=4, global_block_size=4, encoder_attention_type=kind,
                                    relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                                    attn_implementation="eager")
            return tuple_encoder_outputs(t.LongT5ForConditionalGeneration(config))
        return build

    def bigbird() -> object:
        config = t.BigBirdPegasusConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                        decoder_ffn_dim=64, max_position_embeddings=256, attention_type="block_sparse",
                                        block_size=8, num_random_blocks=1, pad_token_id=0, bos_token_id=2,
                                        eos_token_id=1, decoder_start_token_id=0, attn_implementation="eager")
        return tuple_encoder_outputs(t.BigBirdPegasusForConditionalGeneration(config))

    mamba = dict(mamba_d_state=8, mamba_d_conv=4, mamba_expand=2)
    return {
        "longt5_local4": longt5("local"),
        "longt5_tglobal4": longt5("transient-global"),
        "bigbird_pegasus_bs8": bigbird,
        "lfm2": causal("Lfm2ForCausalLM", "Lfm2Config", layer_types=["conv", "full_attention"]),
        # (MLA caches its latents: kv_nope [b, 1, s, kv_lora_rank] as keys, k_rot [b, 1, s, rope dim] as
        #  values; both 16 so the flat cache has one shape)
        "deepseek_v3": causal("DeepseekV3ForCausalLM", "DeepseekV3Config", num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=16,
                              qk_rope_head_dim=16, qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4,
                              num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=32,
                              first_k_dense_replace=2),
        "gemma3n_sw4": causal("Gemma3nForCausalLM", "Gemma3nTextConfig", head_dim=16, sliding_window=4,
                              layer_types=HYBRID, vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8,
                              num_kv_shared_layers=0, laurel_rank=4, altup_num_inputs=2,
                              activation_sparsity_pattern=[0.0, 0.0], intermediate_size=[64, 64]),
        "hunyuan_dense": causal("HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config", head_dim=16),
        "dots1_sw4": causal("Dots1ForCausalLM", "Dots1Config", sliding_window=4, layer_types=HYBRID,
                            n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                            first_k_dense_replace=2),
        "jamba": causal("JambaForCausalLM", "JambaConfig", attn_layer_period=2, attn_layer_offset=1,
                        expert_layer_period=2, expert_layer_offset=1, num_experts=2, num_experts_per_tok=1,
                        experts_implementation="batched_mm",
                        mamba_dt_rank=4, **mamba),
        "bamba": causal("BambaForCausalLM", "BambaConfig", attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16,
                        mamba_n_groups=1, mamba_chunk_size=4, **mamba),
        "falcon_h1": causal("FalconH1ForCausalLM", "FalconH1Config", mamba_n_heads=4, mamba_d_head=16,
                            mamba_n_groups=1, mamba_chunk_size=4, mamba_d_ssm=64, head_dim=16,
                            mamba_d_state=8, mamba_d_conv=4, mamba_expand=2),
        "zamba2": causal("Zamba2ForCausalLM", "Zamba2Config", layers_block_type=["mamba", "hybrid"],
                         n_mamba_heads=4, mamba_ngroups=1, chunk_size=4, use_mamba_kernels=False,
                         num_mem_blocks=1, adapter_rank=4, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2),
        "llama_l24": causal("LlamaForCausalLM", "LlamaConfig", num_hidden_layers=24),
        "mistral_sw4_l24": causal("MistralForCausalLM", "MistralConfig", num_hidden_layers=24, sliding_window=4),
    }


def _specs(part: str) -> list:
    from make_kv_models import Spec
    b = builders()
    hf = "transformers {} (tiny random config, eager attention){}"
    kvs = ", flat KV cache through DynamicCache"
    if part == "deep":
        return [Spec(f"{k}_kv", hf.format(k, f", 24 layers{kvs}"), b[k], "decoder")
                for k in ("llama_l24", "mistral_sw4_l24")]
    specs = []
    for k in ("longt5_local4", "longt5_tglobal4", "bigbird_pegasus_bs8"):
        specs.append(Spec(f"{k}_full_nocache", hf.format(k, ", encoder + decoder, no cache, padded encoder batch"),
                          b[k], "seq2seq_nocache"))
        specs.append(Spec(f"{k}_decoder_kv", hf.format(k, " decoder step" + kvs), b[k], "seq2seq"))
    specs.append(Spec("bigbird_pegasus_bs8_static64", hf.format(
        "bigbird_pegasus_bs8", ", encoder + decoder, no cache, static [2, 64] encoder: block-sparse attention"),
        b["bigbird_pegasus_bs8"], "seq2seq_static64"))
    for k in ("lfm2", "deepseek_v3", "gemma3n_sw4", "hunyuan_dense", "dots1_sw4", "jamba", "bamba", "falcon_h1",
              "zamba2"):
        specs.append(Spec(f"{k}_kv", hf.format(k, kvs), b[k], "decoder"))
        specs.append(Spec(f"{k}_nocache", hf.format(k, ", no cache"), b[k], "nocache"))
    return specs


def static64(module: object, spec: object) -> object:
    """Every set [2, 64] (the encoder) and [2, 6] (the decoder), fixed sizes: BigBird's block-sparse
    path runs only above its global + sliding + random blocks (7 of 8 here), and its trace is for
    one length."""
    import numpy as np
    spec.ts_axes = {}
    rng = np.random.default_rng(10)
    spec.sets.clear()
    for name, pad in (("seq64", 0), ("right_padded", 13)):
        mask = np.ones((2, 64), np.int64)
        mask[0, 64 - pad:] = 0
        spec.sets[name] = {"input_ids": rng.integers(3, VOCAB, (2, 64)).astype(np.int64), "attention_mask": mask,
                           "decoder_input_ids": rng.integers(3, VOCAB, (2, 6)).astype(np.int64)}
    spec.sets["seq9"] = spec.sets["seq64"]  # (the export set: make_heldout's export takes seq9)
    return module


def _part(part: str):  # type: ignore[no-untyped-def]
    def run(out: str, want: list[str], log: list[dict]) -> None:
        import make_heldout as h1
        from make_heldout4 import export_jobs, mixed_pad3, prepare_seq2seq_nocache

        def prepare(spec: object) -> object:
            if spec.kind == "seq2seq_nocache":
                return prepare_seq2seq_nocache(spec)
            if spec.kind == "seq2seq_static64":  # (no dynamic axes: 64 = 8 blocks of 8, block-sparse)
                return static64(prepare_seq2seq_nocache(spec), spec)
            module = h1.prepare(spec)
            if spec.kind == "decoder":
                spec.sets["mixed_pad3"] = mixed_pad3(spec.sets["left_padded"])
            return module

        export_jobs([(s, suffix, e) for s in _specs(part) for suffix, e in BOTH], prepare, out, want, log)
    return run


def main(argv: list[str] | None = None) -> int:
    import make_heldout4 as h4
    return h4.run_parts(__doc__, DEFAULT_OUT, {"torch": _part("torch"), "deep": _part("deep")}, argv)


if __name__ == "__main__":
    sys.exit(main())
