"""Build HELD-OUT round 5: decoder families and export styles rounds 1-4 did not cover.

    /work/scratch/torchvenv/bin/python models/scripts/make_heldout5.py [--out DIR] [WANT ...]

torch 2.13 / transformers 5.23 / onnxscript 0.7.2, random weights, configs in code (no weights
downloaded), 2 layers, hidden 32, vocab 100, eager attention. Each model through TorchScript
(opset 17) and the dynamo exporter (opset 18) with make_heldout.py's `export` and verified
against torch at every input set (rtol/atol 1e-4) by make_heldout4.py's `export_jobs`:

- gpt_neo with attention_types global/local (window 4: the local mask is `bias ^ tril(bias, -4)`),
  codegen, starcoder2 (sliding 4), mixtral (sliding 4, 4 experts, top 2), cohere, granite, ctrl:
  with a flat KV cache through DynamicCache (sets prefill, prefill_past, decode, left_padded,
  long, mixed_pad3) and gpt_neo, ctrl, codegen without a cache (seq5, seq9, left_padded, long);
- xlnet (XLNetLMHeadModel) without memory, attn_type "uni" (its create_mask: triu/tril of ones)
  and "bi" with same_length, no-cache sets; with memory (mem_len 8, `mems` in and out, "uni",
  with and without same_length), sets prefill (empty memory), prefill_past, decode, long;
- llama with a static KV cache (transformers' StaticCache, fixed length 80, a `cache_position`
  input, as on-device exports use it): sets prefill, prefill_past, decode, left_padded, long.

mixtral (both exporters, eager experts), cohere's TorchScript export and xlnet bi's dynamo export fail in the
exporters (logged as failures in DIR/heldout_log.json; why: docs/heldout.md, Round 5).

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
DEFAULT_OUT = os.path.join(HERE, "..", "..", "out", "heldout5")
VOCAB = 100
STATIC_LEN = 80  # the static cache's length (the long set: past 8 + seq 64)


def torch_part(out: str, want: list[str], log: list[dict]) -> None:
    import make_heldout as h1
    import make_heldout4 as h4
    import make_kv_models as kv
    import torch
    import torch.nn as nn
    from make_kv_models import Spec

    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                 pad_token_id=0, bos_token_id=0, eos_token_id=0, attn_implementation="eager")

    def gpt_neo() -> nn.Module:
        from transformers import GPTNeoConfig, GPTNeoForCausalLM
        return GPTNeoForCausalLM(GPTNeoConfig(vocab_size=VOCAB, max_position_embeddings=1024, hidden_size=32,
                                              num_layers=2, attention_types=[[["global", "local"], 1]], num_heads=2,
                                              intermediate_size=64, window_size=4, attn_implementation="eager",
                                              pad_token_id=0, bos_token_id=0, eos_token_id=0))

    def codegen() -> nn.Module:
        from transformers import CodeGenConfig, CodeGenForCausalLM
        return CodeGenForCausalLM(CodeGenConfig(vocab_size=VOCAB, n_positions=256, n_ctx=256, n_embd=32, n_layer=2,
                                                n_head=4, rotary_dim=4, attn_implementation="eager",
                                                pad_token_id=0, bos_token_id=0, eos_token_id=0))

    def starcoder2() -> nn.Module:
        from transformers import Starcoder2Config, Starcoder2ForCausalLM
        return Starcoder2ForCausalLM(Starcoder2Config(**small, sliding_window=4))

    def mixtral() -> nn.Module:
        from transformers import MixtralConfig, MixtralForCausalLM
        return MixtralForCausalLM(MixtralConfig(**small, sliding_window=4, num_local_experts=4,
                                                num_experts_per_tok=2, experts_implementation="eager"))

    def cohere() -> nn.Module:
        from transformers import CohereConfig, CohereForCausalLM
        return CohereForCausalLM(CohereConfig(**small))

    def granite() -> nn.Module:
        from transformers import GraniteConfig, GraniteForCausalLM
        return GraniteForCausalLM(GraniteConfig(**small))

    def ctrl() -> nn.Module:
        from transformers import CTRLConfig, CTRLLMHeadModel
        return CTRLLMHeadModel(CTRLConfig(vocab_size=VOCAB, n_positions=256, n_embd=32, dff=64, n_layer=2, n_head=2,
                                          pad_token_id=0, attn_implementation="eager"))

    def xlnet(attn_type: str, same_length: bool) -> nn.Module:
        from transformers import XLNetConfig, XLNetLMHeadModel
        return XLNetLMHeadModel(XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2, d_inner=64,
                                            attn_type=attn_type, same_length=same_length, mem_len=None,
                                            pad_token_id=0, bos_token_id=0, eos_token_id=0))

    def xlnet_mems(same_length: bool) -> nn.Module:
        from transformers import XLNetConfig, XLNetLMHeadModel
        return XLNetLMHeadModel(XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2, d_inner=64,
                                            attn_type="uni", same_length=same_length, mem_len=8,
                                            pad_token_id=0, bos_token_id=0, eos_token_id=0))

    class XLNetMems(nn.Module):
        """XLNetLMHeadModel with memory (mem_len 8): (input_ids, mems_0, mems_1 [past, batch, 32]) ->
        (logits, new_mems_0, new_mems_1); its create_mask is triu_(ones(q, q + mlen), mlen + 1),
        plus tril(-1) of the first q columns with same_length. No attention_mask (see XLNetNoMems)."""

        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, mems_0: torch.Tensor,
                    mems_1: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = self.model(input_ids=input_ids, mems=[mems_0, mems_1], use_mems=True, return_dict=True)
            return (out.logits, *out.mems)

    def prepare_mems(spec: Spec) -> nn.Module:
        torch.manual_seed(0)
        module = XLNetMems(spec.build().eval())
        spec.input_names, spec.output_names = ["input_ids", "mems_0", "mems_1"], ["logits", "new_mems_0", "new_mems_1"]
        spec.ts_axes = {"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"},
                        **{n: {0: "past_sequence", 1: "batch"} for n in ("mems_0", "mems_1")},
                        **{n: {0: "mem_length", 1: "batch"} for n in ("new_mems_0", "new_mems_1")}}
        rng = np.random.default_rng(6)
        for name, b, past, seq in (("prefill", 1, 0, 4), ("prefill_past", 2, 5, 3), ("decode", 2, 7, 1),
                                   ("long", 1, 8, 64)):
            spec.sets[name] = {"input_ids": rng.integers(0, VOCAB, (b, seq)).astype(np.int64),
                               **{n: rng.standard_normal((past, b, 32)).astype(np.float32)
                                  for n in ("mems_0", "mems_1")}}
        return module

    def llama() -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM
        return LlamaForCausalLM(LlamaConfig(**small))

    class XLNetNoMems(nn.Module):
        """XLNetLMHeadModel without memory: (input_ids, attention_mask) -> logits."""

        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model
            # attn_type "uni" adds the padding mask in place to its [q, k, 1, 1] causal mask, which
            # fails at batch > 1 in transformers 5.23: that variant runs without attention_mask
            self.use_mask = model.config.attn_type != "uni"

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask if self.use_mask else None,
                              use_mems=False, return_dict=True).logits

    class StaticDecoder(nn.Module):
        """(input_ids, attention_mask [batch, past + seq], cache_position [seq], *flat cache of
        fixed length STATIC_LEN) -> (logits, *flat cache): transformers' StaticCache, each layer's
        buffers set from the inputs and written at cache_position (index_copy)."""

        def __init__(self, model: nn.Module, layers: int) -> None:
            super().__init__()
            self.model = model
            self.layers = layers

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache_position: torch.Tensor,
                    *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
            from transformers import StaticCache
            cache = StaticCache(config=self.model.config, max_cache_len=STATIC_LEN)
            for i, layer in enumerate(cache.layers):
                k, v = past[2 * i].clone(), past[2 * i + 1].clone()
                layer.dtype, layer.device = k.dtype, k.device
                layer.batch_size, layer.num_heads = k.shape[0], k.shape[1]
                layer.k_head_dim, layer.v_head_dim = k.shape[-1], v.shape[-1]
                layer.keys, layer.values = k, v
                layer.cumulative_length = cache_position[0].clone()
                layer.is_initialized = True
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                             cache_position=cache_position, use_cache=True, return_dict=True)
            return (out.logits, *(t for layer in cache.layers for t in (layer.keys, layer.values)))

    hf = "transformers {} (tiny random config, eager attention){}"
    kvs = ", flat KV cache through DynamicCache"
    decoders = [
        Spec("gpt_neo_local4_kv", hf.format("GPTNeoForCausalLM global / local 4", kvs), gpt_neo, "decoder"),
        Spec("codegen_kv", hf.format("CodeGenForCausalLM", kvs), codegen, "decoder"),
        Spec("starcoder2_sw4_kv", hf.format("Starcoder2ForCausalLM sliding 4", kvs), starcoder2, "decoder"),
        # (eager experts: the grouped_mm default exports in neither exporter; nor does this, see the docstring)
        Spec("mixtral_sw4_kv", hf.format("MixtralForCausalLM sliding 4, 4 experts top 2", kvs), mixtral, "decoder"),
        Spec("cohere_kv", hf.format("CohereForCausalLM", kvs), cohere, "decoder"),
        Spec("granite_kv", hf.format("GraniteForCausalLM", kvs), granite, "decoder"),
        Spec("ctrl_kv", hf.format("CTRLLMHeadModel", kvs), ctrl, "decoder"),
    ]
    nocache = [
        Spec("gpt_neo_local4_nocache", hf.format("GPTNeoForCausalLM global / local 4", ", no cache"), gpt_neo,
             "nocache"),
        Spec("ctrl_nocache", hf.format("CTRLLMHeadModel", ", no cache"), ctrl, "nocache"),
        Spec("codegen_nocache", hf.format("CodeGenForCausalLM", ", no cache"), codegen, "nocache"),
        Spec("xlnet_uni_nocache", "transformers XLNetLMHeadModel attn_type uni, no memory", lambda: xlnet("uni", False),
             "xlnet"),
        Spec("xlnet_bi_samelen_nocache", "transformers XLNetLMHeadModel attn_type bi, same_length, no memory",
             lambda: xlnet("bi", True), "xlnet"),
    ]
    mems = [Spec("xlnet_uni_mem8", "transformers XLNetLMHeadModel attn_type uni, mem_len 8, mems in and out",
                 lambda: xlnet_mems(False), "xlnet_mems"),
            Spec("xlnet_uni_samelen_mem8", "transformers XLNetLMHeadModel attn_type uni, same_length, mem_len 8, "
                 "mems in and out", lambda: xlnet_mems(True), "xlnet_mems")]
    static = [Spec("llama_static80_kv", hf.format("LlamaForCausalLM", ", StaticCache of length 80, cache_position "
                                                  "input"), llama, "static")]
    jobs = [(s, suffix, e) for s in [*decoders, *nocache, *mems, *static]
            for suffix, e in (("ts", "torchscript"), ("dynamo", "dynamo"))]

    def prepare(spec: Spec) -> nn.Module:
        if spec.kind == "xlnet_mems":
            return prepare_mems(spec)
        if spec.kind == "xlnet":
            spec.kind = "nocache"
            module = h1.prepare(spec)
            spec.kind = "xlnet"
            return XLNetNoMems(module.model)
        if spec.kind == "static":
            spec.kind = "decoder"
            module = h1.prepare(spec)
            spec.kind = "static"
            module = StaticDecoder(module.model, module.layers)
            spec.input_names.insert(2, "cache_position")
            spec.ts_axes["cache_position"] = {0: "sequence"}
            for n in spec.input_names[3:] + spec.output_names[1:]:
                spec.ts_axes[n] = {0: "batch"}  # (the cache length is fixed)
            for feeds in spec.sets.values():
                total, seq = feeds["attention_mask"].shape[1], feeds["input_ids"].shape[1]
                feeds["cache_position"] = np.arange(total - seq, total, dtype=np.int64)
                for n in spec.input_names[3:]:
                    a = feeds[n]
                    full = np.zeros((*a.shape[:2], STATIC_LEN, a.shape[3]), a.dtype)
                    full[:, :, :a.shape[2]] = a
                    feeds[n] = full
            return module
        module = h1.prepare(spec)
        if spec.kind == "decoder":
            spec.sets["mixed_pad3"] = h4.mixed_pad3(spec.sets["left_padded"])
        return module

    # make_heldout's dynamo shapes: the static kind names its dims like "cachepos" (cache_position
    # among the named arguments) and the fixed cache dims are left static
    h4.dynamo_shapes_as({"static": "cachepos"})
    del kv
    h4.export_jobs(jobs, prepare, out, want, log)


def main(argv: list[str] | None = None) -> int:
    import make_heldout4 as h4
    return h4.run_parts(__doc__, DEFAULT_OUT, {"torch": torch_part}, argv)


if __name__ == "__main__":
    sys.exit(main())
