"""Build HELD-OUT round 11: static caches, chunked attention and the sliding families no round exported.

    /work/scratch/torchvenv/bin/python models/scripts/make_heldout11.py static [--out DIR] [WANT ...]
    /work/scratch/torchvenv/bin/python models/scripts/make_heldout11.py dynamic [--out DIR] [WANT ...]
    /work/scratch/torchvenv/bin/python models/scripts/make_heldout11.py cut [--out DIR]

torch 2.13 / transformers 5.23 / onnxscript, random weights, configs in code (no weights downloaded),
hidden 32, vocab 100, eager attention, windows and chunks of 4. TorchScript (opset 17, `_ts`) and the
dynamo exporter (opset 18, `_dynamo`) through make_heldout.py's `export` and make_heldout4.py's
`export_jobs` (verified against torch at every input set, rtol/atol 1e-4).

- `static`: transformers.integrations.executorch's `TorchExportableModuleWithStaticCache` forward
  (every layer a `StaticLayer(max_cache_len)`, sliding layers included, as that wrapper replaces
  them; `cumulative_length` set from `cache_position[0]`; attention_mask None), with the cache tensors
  as inputs and outputs instead of buffers: (input_ids [1, s], cache_position [s], past [1, kv, 16, d]
  per layer) -> (logits, present ...), max_cache_len 16. Sets: `prefill` (positions 0-4, empty cache),
  `prefill_past` (5-7, 0-4 filled), `decode` (9), `decode_last` (15, the last slot).
  `_hybrid` exports keep the sliding layers' `StaticSlidingWindowLayer` (gemma2/3's HybridCache: a
  ring of 4 slots) traced at a decode whose window has wrapped (position 9); that layer keeps its
  position as a Python int, so the trace is right at position 9 only: its sets decode there.
- `dynamic`: the new sliding families with the corpus's flat DynamicCache (sets prefill,
  prefill_past, decode, left_padded, long, mixed_pad3) and llama4 text (chunk 4) without a cache too
  (llama4's complex rotary in real arithmetic, make_heldout6's `real_llama4_rope`).

- `cut`: the mask cone of mistral_sw4_hybrid_ts into tests/data (a test's model, no torch needed).

What fails is logged in DIR/heldout_log.json with its error (docs/heldout.md, Round 11). Input sets
are saved as DIR/inputs/<model>/<set>.npz for models/scripts/heldout_report.py DIR (default
out/heldout11, git-ignored).
"""

from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "..", "out", "heldout11")
MAX_CACHE = 16
HYBRID = ["sliding_attention", "full_attention"]
BOTH = (("ts", "torchscript"), ("dynamo", "dynamo"))
# (name, positions start, length, filled slots) of the static sets; the hybrid ones decode after a wrap
STATIC_SETS = (("prefill", 0, 5), ("prefill_past", 5, 3), ("decode", 9, 1), ("decode_last", 15, 1))
# (a HybridCache export is right only at the position it was traced at: its sliding layer's
#  position is a Python int, so the rotary positions and the window are constants of the trace;
#  at 12 and 15 the exports differ from torch by 0.019-0.13, docs/heldout.md, Round 11)
# `_fixed4`: every size fixed (executorch's programs are traced for one chunk length): 4 positions
FIXED4_SETS = (("prefill", 0, 4), ("prefill_past", 5, 4), ("last", 12, 4))
HYBRID_SETS = (("prefill_past", 9, 1), ("decode9_other", 9, 1))


def builders() -> dict[str, object]:
    import transformers as t
    from make_heldout10 import _small

    def causal(model: str, config: str, **kw: object) -> object:
        return lambda: getattr(t, model)(getattr(t, config)(**_small(**kw)))

    g = dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=4, layer_types=HYBRID)
    return {
        "llama": causal("LlamaForCausalLM", "LlamaConfig"),
        "mistral_sw4": causal("MistralForCausalLM", "MistralConfig", sliding_window=4),
        "gemma2_sw4": causal("Gemma2ForCausalLM", "Gemma2Config", **g),
        "gemma3_sw4": causal("Gemma3ForCausalLM", "Gemma3TextConfig", **g),
        "qwen2_sw4": causal("Qwen2ForCausalLM", "Qwen2Config", use_sliding_window=True, sliding_window=4,
                            max_window_layers=1),
        "phi3_sw4": causal("Phi3ForCausalLM", "Phi3Config", sliding_window=4),
        "starcoder2_sw4": causal("Starcoder2ForCausalLM", "Starcoder2Config", sliding_window=4),
        "exaone4_sw4": causal("Exaone4ForCausalLM", "Exaone4Config", sliding_window=4, layer_types=HYBRID),
        "olmo3_sw4": causal("Olmo3ForCausalLM", "Olmo3Config", sliding_window=4, layer_types=HYBRID),
        "llama4_chunk4": causal("Llama4ForCausalLM", "Llama4TextConfig", attention_chunk_size=4, head_dim=16,
                                intermediate_size_mlp=64, num_local_experts=2, interleave_moe_layer_step=2,
                                no_rope_layers=[1, 0], layer_types=["chunked_attention", "full_attention"]),
    }


def static_module(model: object, hybrid: bool) -> object:
    """TorchExportableModuleWithStaticCache's forward, the cache passed in and returned."""
    import torch

    class StaticCacheDecoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.sliding_position = 0  # (a HybridCache's sliding layer keeps its position as a Python int)

        def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor,
                    *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
            from transformers import StaticCache
            from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer
            cache = StaticCache(config=self.model.config, max_cache_len=MAX_CACHE)
            tracing = torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()
            position = self.sliding_position if tracing else int(cache_position[0])  # (traced at the export set)
            for i, layer in enumerate(cache.layers):
                if not hybrid and isinstance(layer, StaticSlidingWindowLayer):
                    cache.layers[i] = layer = StaticLayer(MAX_CACHE)
                keys, values = past[2 * i].clone(), past[2 * i + 1].clone()
                layer.lazy_initialization(keys, values)
                layer.keys, layer.values = keys, values
                layer.cumulative_length = cache_position[0].clone()
                if isinstance(layer, StaticSlidingWindowLayer):
                    layer.cumulative_length_int = position
            out = self.model(input_ids=input_ids, attention_mask=None, past_key_values=cache, use_cache=True,
                             return_dict=True)
            return (out.logits, *[t for layer in cache.layers for t in (layer.keys, layer.values)])

    return StaticCacheDecoder()


def prepare_static(spec: object, hybrid: bool) -> object:
    import numpy as np
    import torch
    torch.manual_seed(0)
    module = static_module(spec.build().eval(), hybrid)
    config = module.model.config
    from transformers import StaticCache
    from transformers.cache_utils import StaticSlidingWindowLayer
    probe = StaticCache(config=config, max_cache_len=MAX_CACHE)
    slots = [(min(4, MAX_CACHE) if hybrid and isinstance(la, StaticSlidingWindowLayer) else MAX_CACHE)
             for la in probe.layers]
    kvh = config.num_key_value_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    past = [f"past_key_values.{i}.{k}" for i in range(len(slots)) for k in ("key", "value")]
    spec.input_names = ["input_ids", "cache_position", *past]
    spec.output_names = ["logits"] + [n.replace("past_key_values", "present") for n in past]
    spec.ts_axes = {"input_ids": {1: "sequence"}, "cache_position": {0: "sequence"}, "logits": {1: "sequence"}}
    spec.kind = "cachepos"  # (make_heldout's dynamo shapes: the named inputs, then *past)
    rng = np.random.default_rng(11)
    fixed = spec.base.endswith("_fixed4")
    if fixed:
        spec.ts_axes = {}
    for name, start, seq in (HYBRID_SETS if hybrid else FIXED4_SETS if fixed else STATIC_SETS):
        feeds = {"input_ids": rng.integers(0, 100, (1, seq)).astype(np.int64),
                 "cache_position": np.arange(start, start + seq, dtype=np.int64)}
        for i, n in enumerate(slots):
            for k in ("key", "value"):
                a = np.zeros((1, kvh, n, d), np.float32)
                filled = n if n < MAX_CACHE else start  # (a wrapped ring is full; a static cache up to start)
                a[:, :, :filled] = rng.standard_normal((1, kvh, filled, d))
                feeds[f"past_key_values.{i}.{k}"] = a
        spec.sets[name] = feeds
    if hybrid:
        module.sliding_position = 9
    return module


def _specs(part: str) -> list:
    from make_kv_models import Spec
    b = builders()
    hf = "transformers {} (tiny random config, eager attention){}"
    if part == "static":
        st = ", static cache (max_cache_len 16) as executorch's TorchExportableModuleWithStaticCache, cache as inputs"
        hy = ", HybridCache (StaticSlidingWindowLayer, ring of 4) traced at a wrapped decode, cache as inputs"
        specs = [Spec(f"{k}_static", hf.format(k, st), b[k], "static") for k in b]
        specs += [Spec(f"{k}_hybrid", hf.format(k, hy), b[k], "hybrid") for k in ("gemma2_sw4", "gemma3_sw4",
                                                                                  "mistral_sw4")]
        fx = ", static cache (max_cache_len 16), every size fixed (4 positions a run), cache as inputs"
        specs += [Spec(f"{k}_static_fixed4", hf.format(k, fx), b[k], "static") for k in ("llama", "mistral_sw4",
                                                                                           "llama4_chunk4")]
        return specs
    kvs = ", flat KV cache through DynamicCache"
    specs = [Spec(f"{k}_kv", hf.format(k, kvs), b[k], "decoder")
             for k in ("qwen2_sw4", "phi3_sw4", "starcoder2_sw4", "exaone4_sw4", "olmo3_sw4", "llama4_chunk4")]
    specs.append(Spec("llama4_chunk4_nocache", hf.format("llama4_chunk4", ", no cache"), b["llama4_chunk4"],
                      "nocache"))
    return specs


def _part(part: str):  # type: ignore[no-untyped-def]
    def run(out: str, want: list[str], log: list[dict]) -> None:
        import make_heldout as h1
        from make_heldout4 import export_jobs, mixed_pad3

        def prepare(spec: object) -> object:
            if spec.base.startswith("llama4"):
                from make_heldout6 import real_llama4_rope
                real_llama4_rope()  # (its complex rotary: neither exporter converts it)
            if spec.kind in ("static", "hybrid", "cachepos"):
                hybrid = spec.base.endswith("_hybrid")
                return prepare_static(spec, hybrid)
            module = h1.prepare(spec)
            if spec.kind == "decoder":
                spec.sets["mixed_pad3"] = mixed_pad3(spec.sets["left_padded"])
            return module

        export_jobs([(s, suffix, e) for s in _specs(part) for suffix, e in BOTH], prepare, out, want, log)
    return run


def cut(out: str, want: list[str], log: list[dict]) -> None:
    """tests/data/mistral_sw4_hybrid_mask_ts.onnx: mistral_sw4_hybrid_ts's mask cone and its first
    Add to the scores (input_ids and the scores in, 24 KB), for tests/test_symbolic.py."""
    import onnx.utils
    dest = os.path.join(HERE, "..", "..", "tests", "data", "mistral_sw4_hybrid_mask_ts.onnx")
    attn = "/model/model/layers.0/self_attn/"
    onnx.utils.extract_model(os.path.join(out, "mistral_sw4_hybrid_ts.onnx"), dest,
                             ["input_ids", attn + "Mul_12_output_0"], [attn + "Add_2_output_0"])


def main(argv: list[str] | None = None) -> int:
    import make_heldout4 as h4
    return h4.run_parts(__doc__, DEFAULT_OUT, {"static": _part("static"), "dynamic": _part("dynamic"), "cut": cut},
                        argv)


if __name__ == "__main__":
    sys.exit(main())
