#!/usr/bin/env python3
"""Reference data for the architectures ArkaTensor loads: small random-weight models built
through transformers' own classes, their float32 logits for a fixed token sequence, and a
GGUF of each with llama.cpp's names and keys.

Run on a machine with PyTorch and transformers (no internet, no GPU needed: everything runs on
the CPU in float32):

    python3 tests/models/make_refs.py OUTDIR [--check path/to/arka]

OUTDIR/<name>/ gets, per model:
    config.json          transformers' own (model.config.save_pretrained)
    model.safetensors    the weights (F16, which holds the drawn values exactly) with
                         transformers' tensor names (written from the model's
                         state_dict; MoE experts as the running transformers version holds them,
                         except qwen3moe-mixed, written with the per-expert names of Hub files)
    model.gguf           the same weights (matrices F16, vectors F32) with llama.cpp's tensor names
                         and metadata
                         (Q/K rows permuted for llama-arch files, gemma norms stored as 1 + w,
                         3-D expert tensors, phi3's fused tensors)
    ids.txt              the token ids the logits are for
    logits.bin           transformers' float32 logits of every position, in arka perplexity's
                         --save-logits format ("ARKALGT1", vocab, ctx = len(ids), first 0, 1 chunk)
and OUTDIR/MANIFEST.txt lists versions, shapes, features and file hashes. The whole set is a
few MB. Commit OUTDIR/* as tests/models/ (next to this script): tests/integration/
test_model_refs.sh then checks on every CI run that arka's CPU logits from both files match
(relative error <= 1e-3, top-1 100 %).

With --check ARKA (an arka binary built on this machine: cmake -S . -B build-gpu
-DARKA_WITH_GATEWAY=OFF -DARKA_WITH_CURL=OFF && cmake --build build-gpu), every model is also
compared right here with `arka perplexity --kl-divergence-base`, and the figures are written to
OUTDIR/check.txt: a key of a newer transformers that arka refuses shows up before the commit.

Shapes are chosen so every feature shows in the logits: GQA everywhere; a head_dim apart from
hidden/heads (qwen3); QK-norm; MoE routing with a tie (expert 1 is a copy of expert 0, router
row included, so whichever a tie picks computes the same); unnormalised top-k and a dense
layer among sparse ones (qwen3moe-mixed); sliding windows of 8 over 24 tokens (gemma2's
alternating layers, gemma3's five of six, phi3's all); soft-caps small enough to bite (gemma2);
gemma3's linear-scaled global rope next to its local base; llama3, yarn and longrope scaling
with original contexts short enough to matter over 24 positions; Qwen2's biases. Weights are
re-drawn at a scale that gives logits of order 1 (transformers' 0.02 init gives near-ties), and
a seed is accepted only when no position's top-2 logits and no router's k-th/(k+1)-th
probabilities are nearly equal (other than the deliberate tie), so top-1 and routing are
well defined.
"""
import argparse
import hashlib
import json
import math
import os
import struct
import subprocess
import sys

import torch
import transformers

SEQ = 24           # tokens per reference sequence (phi3-long: 40)
VOCAB = 128
MIN_LOGIT_GAP = 2e-3   # relative to the row's logit spread
MIN_ROUTER_GAP = 1e-4  # between the k-th and (k+1)-th router probability


# ---- the models ------------------------------------------------------------------------------

def common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, attn_implementation="eager")
    base.update(kw)
    return base


def models():
    """(name, class name, config class name, config kwargs, gguf arch, notes)"""
    return [
        ("llama3", "LlamaForCausalLM", "LlamaConfig",
         common(head_dim=16, tie_word_embeddings=False, rms_norm_eps=1e-5,
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 16}, rope_theta=500000.0),
         "llama", "llama3 rope scaling (original context 16), GQA, Q/K permuted in the GGUF"),
        ("qwen2", "Qwen2ForCausalLM", "Qwen2Config",
         common(tie_word_embeddings=True, rope_theta=1000000.0),
         "qwen2", "Q/K/V biases, tied output"),
        ("qwen3", "Qwen3ForCausalLM", "Qwen3Config",
         common(head_dim=32, tie_word_embeddings=False, rope_theta=1000000.0),
         "qwen3", "QK-norm, head_dim 32 apart from 64/4, GQA"),
        ("qwen3-yarn", "Qwen3ForCausalLM", "Qwen3Config",
         common(head_dim=16, tie_word_embeddings=False, rope_theta=10000.0,
                rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}),
         "qwen3", "yarn scaling (factor 4, original context 8)"),
        ("qwen3moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
         common(head_dim=16, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
         "qwen3moe", "8 experts, top-2 renormalised, every layer sparse, routing tie (experts 0 = 1)"),
        ("qwen3moe-mixed", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
         common(head_dim=16, num_hidden_layers=3, tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1]),
         "qwen3moe", "4 experts, top-2 unnormalised, layer 1 dense; per-expert tensor names; the GGUF says "
                     "expert_weights_norm false and has a dense layer, which llama.cpp's qwen3moe does not model"),
        ("mixtral", "MixtralForCausalLM", "MixtralConfig",
         common(tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2, rope_theta=1000000.0,
                rms_norm_eps=1e-5, sliding_window=None),
         "llama", "4 experts, top-2; GGUF as llama with experts, Q/K permuted"),
        ("gemma2", "Gemma2ForCausalLM", "Gemma2Config",
         common(head_dim=16, num_hidden_layers=3, query_pre_attn_scalar=16, sliding_window=8, attn_logit_softcapping=5.0,
                final_logit_softcapping=10.0, hidden_activation="gelu_pytorch_tanh"),
         "gemma2", "windows of 8 on layers 0 and 2, soft-caps 5 / 10, GeGLU, post-norms, sqrt(d) embeddings"),
        ("gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig",
         common(head_dim=16, num_hidden_layers=6, query_pre_attn_scalar=24, sliding_window=8,
                rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                hidden_activation="gelu_pytorch_tanh"),
         "gemma3", "windows of 8 on 5 of 6 layers, QK-norm, linear-scaled global rope, local base 10000, "
                   "query_pre_attn_scalar 24 (the GGUF carries attention.scale; llama.cpp uses 1/sqrt(head_dim))"),
        ("phi3", "Phi3ForCausalLM", "Phi3Config",
         common(num_key_value_heads=4, max_position_embeddings=128, original_max_position_embeddings=32,
                sliding_window=10, rms_norm_eps=1e-5, partial_rotary_factor=0.5, pad_token_id=0,
                rope_scaling={"rope_type": "longrope", "long_factor": [1.0, 1.5, 2.0, 3.0], "short_factor": [1.0, 1.1, 1.3, 1.7]}),
         "phi3", "fused QKV and gate|up, partial rotary 0.5, longrope (short factors: 24 <= 32), window 10"),
        ("phi3-long", "Phi3ForCausalLM", "Phi3Config",
         common(num_key_value_heads=4, max_position_embeddings=128, original_max_position_embeddings=32,
                sliding_window=10, rms_norm_eps=1e-5, partial_rotary_factor=0.5, pad_token_id=0,
                rope_scaling={"rope_type": "longrope", "long_factor": [1.0, 1.5, 2.0, 3.0], "short_factor": [1.0, 1.1, 1.3, 1.7]}),
         "phi3", "as phi3 over 40 tokens: past the original context, long factors"),
    ]


def make_config(cfg_cls_name, kw):
    cls = getattr(transformers, cfg_cls_name)
    kw = dict(kw)
    # transformers 5 takes rope_parameters; 4.x rope_scaling + rope_theta. Give what the class takes.
    try:
        config = cls(**kw)
    except TypeError:
        rp = dict(kw.pop("rope_scaling", None) or {"rope_type": "default"})
        rp["rope_theta"] = kw.pop("rope_theta", 10000.0)
        config = cls(rope_parameters=rp, **kw)
    if hasattr(config, "_experts_implementation"):
        config._experts_implementation = "eager"  # transformers 5: the plain per-expert loop on the CPU
    return config


# ---- weights -------------------------------------------------------------------------------

def randomize(model, gen):
    """Weights of order 1 / sqrt(fan_in), norms around their neutral value, biases small; every
    value one a float16 holds exactly, so the files store them in half precision losslessly."""
    gemma = "gemma" in model.config.model_type
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                if "norm" in name or "layernorm" in name:
                    neutral = 0.0 if gemma else 1.0   # gemma's norms multiply by (1 + w)
                    p.copy_(neutral + 0.2 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                scale = (2.0 if (name.endswith("gate.weight") and "proj" not in name) else 1.5) / math.sqrt(fan_in)
                p.copy_(scale * torch.randn(p.shape, generator=gen))
            p.copy_(p.half().float())


def layers(model):
    return model.model.layers


def moe_block(layer):
    for attr in ("block_sparse_moe", "mlp"):
        m = getattr(layer, attr, None)
        if m is not None and hasattr(m, "experts"):
            return m
    return None


def experts_of(moe):
    """[(gate [I, H], up [I, H], down [H, I])] per expert, as views of the live parameters."""
    ex = moe.experts
    out = []
    if hasattr(ex, "gate_up_proj"):  # transformers 5: [E, 2I, H] (gate rows first), [E, H, I]
        n_i = ex.gate_up_proj.shape[1] // 2
        for e in range(ex.gate_up_proj.shape[0]):
            out.append((ex.gate_up_proj[e, :n_i], ex.gate_up_proj[e, n_i:], ex.down_proj[e]))
    else:
        for m in ex:
            if hasattr(m, "w1"):
                out.append((m.w1.weight, m.w3.weight, m.w2.weight))
            else:
                out.append((m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight))
    return out


def router_weight(moe):
    return moe.gate.weight


def make_tie(model):
    """Expert 1 := expert 0, router row included: a routing tie whose choice does not matter."""
    with torch.no_grad():
        for layer in layers(model):
            moe = moe_block(layer)
            if moe is None:
                continue
            ex = experts_of(moe)
            for a, b in zip(ex[1], ex[0]):
                a.copy_(b)
            rw = router_weight(moe)
            rw[1].copy_(rw[0])


# ---- running --------------------------------------------------------------------------------

def run(model, ids):
    gaps = []

    def hook(_mod, _inp, out):
        logits = out[0] if isinstance(out, tuple) else out
        probs = torch.softmax(logits.float().reshape(-1, logits.shape[-1]), dim=-1)
        k = model.config.num_experts_per_tok
        top = torch.sort(probs, dim=-1, descending=True)
        for row in range(probs.shape[0]):
            a, b = top.values[row, k - 1].item(), top.values[row, k].item()
            pair = {top.indices[row, k - 1].item(), top.indices[row, k].item()}
            if a == b and pair == {0, 1}:
                continue  # the deliberate tie
            gaps.append(a - b)

    handles = []
    for layer in layers(model):
        moe = moe_block(layer)
        if moe is not None:
            handles.append(moe.gate.register_forward_hook(hook))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    for h in handles:
        h.remove()
    return logits, (min(gaps) if gaps else 1.0)


def logit_gap(logits):
    top = torch.topk(logits, 2, dim=-1).values
    spread = (logits.max(dim=-1).values - logits.min(dim=-1).values).clamp(min=1e-9)
    return ((top[:, 0] - top[:, 1]) / spread).min().item()


# ---- files ---------------------------------------------------------------------------------

ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        raw = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def hf_tensors(model, per_expert):
    """The state dict as transformers saves it: tied lm_head left out; experts per expert when asked."""
    sd = model.state_dict()
    out = []
    tied = getattr(model.config, "tie_word_embeddings", False)
    skip = set()
    if per_expert:
        for li, layer in enumerate(layers(model)):
            moe = moe_block(layer)
            if moe is None or not hasattr(moe.experts, "gate_up_proj"):
                continue
            skip |= {f"model.layers.{li}.mlp.experts.gate_up_proj", f"model.layers.{li}.mlp.experts.down_proj"}
    for name, t in sd.items():
        if name in skip or (tied and name == "lm_head.weight"):
            continue
        out.append((name, t.half()))  # exact: randomize() drew half-precision values
    if per_expert:
        for li, layer in enumerate(layers(model)):
            moe = moe_block(layer)
            if moe is None or not hasattr(moe.experts, "gate_up_proj"):
                continue
            for e, (g, u, d) in enumerate(experts_of(moe)):
                out += [(f"model.layers.{li}.mlp.experts.{e}.gate_proj.weight", g.half()),
                        (f"model.layers.{li}.mlp.experts.{e}.up_proj.weight", u.half()),
                        (f"model.layers.{li}.mlp.experts.{e}.down_proj.weight", d.half())]
    return out


class Gguf:
    """GGUF v3 writer: metadata, tensors (matrices F16, vectors F32 as llama.cpp's converter
    writes them), alignment 32."""
    U32, F32, BOOL, STR, ARR = 4, 6, 7, 8, 9

    def __init__(self):
        self.kv, self.tensors = [], []

    def u32(self, k, v): self.kv.append((k, self.U32, struct.pack("<I", int(v))))
    def f32(self, k, v): self.kv.append((k, self.F32, struct.pack("<f", float(v))))
    def bool(self, k, v): self.kv.append((k, self.BOOL, struct.pack("<B", 1 if v else 0)))
    def str(self, k, v): self.kv.append((k, self.STR, self._s(v)))

    @staticmethod
    def _s(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    def tensor(self, name, t):
        t = t.detach().float().contiguous().cpu()
        half = t.dim() >= 2
        raw = (t.half() if half else t).numpy().tobytes()
        self.tensors.append((name, list(reversed(t.shape)), raw, 1 if half else 0))

    def write(self, path):
        with open(path, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
            for k, ty, val in self.kv:
                f.write(self._s(k) + struct.pack("<I", ty) + val)
            off = 0
            for name, ne, raw, ty in self.tensors:
                f.write(self._s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne))
                f.write(struct.pack("<IQ", ty, off))  # 0 F32, 1 F16
                off += len(raw) + (-len(raw) % 32)
            f.write(b"\0" * (-f.tell() % 32))
            for _, _, raw, _ in self.tensors:
                f.write(raw + b"\0" * (-len(raw) % 32))


def permute_qk(w, n_head):
    """llama.cpp's converter: HF's half-split rows into adjacent pairs, per head."""
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, 2, hd // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_gguf(path, model, arch, name):
    c = model.config
    mt = c.model_type
    gemma = mt.startswith("gemma")
    g = Gguf()
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rp = rope_params(c)
    prf = rp.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0)) or 1.0
    rope_dim = int(hd * prf)
    g.str("general.architecture", arch)
    g.str("general.name", name)
    g.u32("general.alignment", 32)
    g.str("tokenizer.ggml.model", "none")
    a = arch + "."
    g.u32(a + "vocab_size", c.vocab_size)
    g.u32(a + "context_length", c.max_position_embeddings)
    g.u32(a + "embedding_length", c.hidden_size)
    g.u32(a + "block_count", c.num_hidden_layers)
    g.u32(a + "attention.head_count", c.num_attention_heads)
    g.u32(a + "attention.head_count_kv", c.num_key_value_heads)
    g.u32(a + "attention.key_length", hd)
    g.u32(a + "attention.value_length", hd)
    g.u32(a + "rope.dimension_count", rope_dim)
    g.f32(a + "attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    n_exp = getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None) or 0
    g.u32(a + "feed_forward_length", c.intermediate_size)  # mixtral: the experts' width
    if n_exp:
        g.u32(a + "expert_count", n_exp)
        g.u32(a + "expert_used_count", c.num_experts_per_tok)
        if mt == "qwen3_moe":
            g.u32(a + "expert_feed_forward_length", c.moe_intermediate_size)
            if not c.norm_topk_prob:
                g.bool(a + "expert_weights_norm", False)
    full = rp.get("full_attention", rp) if "full_attention" in rp else rp
    g.f32(a + "rope.freq_base", full.get("rope_theta", 10000.0))
    rtype = full.get("rope_type", full.get("type", "default"))
    if rtype == "linear":
        g.str(a + "rope.scaling.type", "linear")
        g.f32(a + "rope.scaling.factor", full["factor"])
    elif rtype == "yarn":
        g.str(a + "rope.scaling.type", "yarn")
        g.f32(a + "rope.scaling.factor", full["factor"])
        g.u32(a + "rope.scaling.original_context_length", full["original_max_position_embeddings"])
    elif rtype == "llama3":
        # as llama.cpp's converter: the per-pair divisors as rope_freqs.weight
        base, f, lo, hi, orig = full["rope_theta"], full["factor"], full["low_freq_factor"], full["high_freq_factor"], full["original_max_position_embeddings"]
        div = []
        for i in range(rope_dim // 2):
            freq = 1.0 / base ** (2 * i / rope_dim)
            wl = 2 * math.pi / freq
            if wl < orig / hi:
                div.append(1.0)
            elif wl > orig / lo:
                div.append(f)
            else:
                s = (orig / wl - lo) / (hi - lo)
                div.append(1.0 / ((1 - s) / f + s))
        g.tensor("rope_freqs.weight", torch.tensor(div))
        g.u32(a + "rope.scaling.original_context_length", orig)
    elif rtype == "longrope":
        orig = getattr(c, "original_max_position_embeddings", None) or full["original_max_position_embeddings"]
        factor = full.get("factor") or c.max_position_embeddings / orig
        af = full.get("attention_factor") or (1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig)))
        g.tensor("rope_factors_long.weight", torch.tensor(full["long_factor"]))
        g.tensor("rope_factors_short.weight", torch.tensor(full["short_factor"]))
        g.f32(a + "rope.scaling.attn_factor", af)
        g.u32(a + "rope.scaling.original_context_length", orig)
    lt = getattr(c, "layer_types", None)
    slides = any(t == "sliding_attention" for t in lt) if lt else (mt not in ("qwen2", "qwen3", "qwen3_moe") or getattr(c, "use_sliding_window", False))
    if getattr(c, "sliding_window", None) and slides:
        g.u32(a + "attention.sliding_window", c.sliding_window)
    if gemma:
        if c.attn_logit_softcapping:
            g.f32(a + "attn_logit_softcapping", c.attn_logit_softcapping)
        if c.final_logit_softcapping:
            g.f32(a + "final_logit_softcapping", c.final_logit_softcapping)
        if c.query_pre_attn_scalar != hd:
            g.f32(a + "attention.scale", c.query_pre_attn_scalar ** -0.5)
        if mt == "gemma2" and not c.attn_logit_softcapping:
            raise SystemExit("gemma2 without attention soft-capping: llama.cpp's default of 50 would apply")

    def norm(t):
        return t + 1.0 if gemma else t

    m = model.model
    llama_arch = arch == "llama"
    g.tensor("token_embd.weight", m.embed_tokens.weight)
    g.tensor("output_norm.weight", norm(m.norm.weight))
    if not getattr(c, "tie_word_embeddings", False):
        g.tensor("output.weight", model.lm_head.weight)
    for li, L in enumerate(m.layers):
        b = f"blk.{li}."
        sa = L.self_attn
        g.tensor(b + "attn_norm.weight", norm(L.input_layernorm.weight))
        if hasattr(sa, "qkv_proj"):
            g.tensor(b + "attn_qkv.weight", sa.qkv_proj.weight)
        else:
            wq, wk = sa.q_proj.weight, sa.k_proj.weight
            if llama_arch:
                wq, wk = permute_qk(wq, c.num_attention_heads), permute_qk(wk, c.num_key_value_heads)
            g.tensor(b + "attn_q.weight", wq)
            g.tensor(b + "attn_k.weight", wk)
            g.tensor(b + "attn_v.weight", sa.v_proj.weight)
            for p, n in ((sa.q_proj, "attn_q"), (sa.k_proj, "attn_k"), (sa.v_proj, "attn_v")):
                if p.bias is not None:
                    g.tensor(b + n + ".bias", p.bias)
        g.tensor(b + "attn_output.weight", sa.o_proj.weight)
        if getattr(sa, "q_norm", None) is not None:
            g.tensor(b + "attn_q_norm.weight", norm(sa.q_norm.weight))
            g.tensor(b + "attn_k_norm.weight", norm(sa.k_norm.weight))
        if gemma:
            g.tensor(b + "post_attention_norm.weight", norm(L.post_attention_layernorm.weight))
            g.tensor(b + "ffn_norm.weight", norm(L.pre_feedforward_layernorm.weight))
            g.tensor(b + "post_ffw_norm.weight", norm(L.post_feedforward_layernorm.weight))
        else:
            g.tensor(b + "ffn_norm.weight", L.post_attention_layernorm.weight)
        moe = moe_block(L)
        if moe is not None:
            ex = experts_of(moe)
            g.tensor(b + "ffn_gate_inp.weight", router_weight(moe))
            g.tensor(b + "ffn_gate_exps.weight", torch.stack([e[0] for e in ex]))
            g.tensor(b + "ffn_up_exps.weight", torch.stack([e[1] for e in ex]))
            g.tensor(b + "ffn_down_exps.weight", torch.stack([e[2] for e in ex]))
        elif hasattr(L.mlp, "gate_up_proj"):
            g.tensor(b + "ffn_up.weight", L.mlp.gate_up_proj.weight)  # gate rows, then up rows
            g.tensor(b + "ffn_down.weight", L.mlp.down_proj.weight)
        else:
            g.tensor(b + "ffn_gate.weight", L.mlp.gate_proj.weight)
            g.tensor(b + "ffn_up.weight", L.mlp.up_proj.weight)
            g.tensor(b + "ffn_down.weight", L.mlp.down_proj.weight)
    g.write(path)


def rope_params(c):
    rp = getattr(c, "rope_parameters", None)
    if rp:
        return dict(rp)
    rp = dict(getattr(c, "rope_scaling", None) or {"rope_type": "default"})
    rp.setdefault("rope_theta", getattr(c, "rope_theta", 10000.0))
    if "original_max_position_embeddings" not in rp and rp.get("rope_type") in ("yarn", "llama3", "longrope"):
        rp["original_max_position_embeddings"] = getattr(c, "original_max_position_embeddings", None) or c.max_position_embeddings
    return rp


def write_logits(path, ids, logits):
    n, v = logits.shape
    with open(path, "wb") as f:
        f.write(b"ARKALGT1" + struct.pack("<6I", 1, v, n, 0, 1, 0))
        f.write(struct.pack(f"<{n}i", *ids))
        f.write(logits.contiguous().numpy().astype("<f4").tobytes())


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def check(arka, d, n, out):
    lines = []
    for what, path in (("safetensors", d), ("gguf", os.path.join(d, "model.gguf"))):
        r = subprocess.run([arka, "perplexity", "-m", path, "--ids", os.path.join(d, "ids.txt"), "--ctx", str(n), "--first", "0",
                            "--kl-divergence-base", os.path.join(d, "logits.bin"), "--threads", "2"],
                           capture_output=True, text=True)
        kl = [l for l in r.stdout.splitlines() if l.startswith("kl-divergence")]
        lines.append(f"{os.path.basename(d)} {what}: " + (kl[0] if kl and r.returncode == 0 else f"FAILED: {r.stderr.strip()}"))
    for l in lines:
        print("  " + l)
        out.write(l + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--check", metavar="ARKA", help="an arka binary: compare each model with arka perplexity")
    ap.add_argument("--only", help="comma-separated model names")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    manifest = [f"transformers {transformers.__version__}, torch {torch.__version__}; float32 on the CPU",
                "name: files (sha256) | classes | features"]
    chk = open(os.path.join(args.out, "check.txt"), "w") if args.check else None
    for name, cls_name, cfg_name, kw, arch, notes in models():
        if args.only and name not in args.only.split(","):
            continue
        n = 40 if name == "phi3-long" else SEQ
        config = make_config(cfg_name, kw)
        for seed in range(1, 200):
            gen = torch.Generator().manual_seed(seed)
            torch.manual_seed(seed)
            model = getattr(transformers, cls_name)(config).float().eval()
            randomize(model, gen)
            if any(moe_block(l) is not None for l in layers(model)):
                make_tie(model)
            ids = [int(x) for x in torch.randint(0, VOCAB, (n,), generator=gen)]
            logits, rgap = run(model, ids)
            lgap = logit_gap(logits)
            if lgap >= MIN_LOGIT_GAP and rgap >= MIN_ROUTER_GAP:
                break
        else:
            raise SystemExit(f"{name}: no seed gives well-separated top-1 logits and routing")
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        model.config.save_pretrained(d)
        write_safetensors(os.path.join(d, "model.safetensors"), hf_tensors(model, per_expert=name == "qwen3moe-mixed"))
        write_gguf(os.path.join(d, "model.gguf"), model, arch, name)
        with open(os.path.join(d, "ids.txt"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        write_logits(os.path.join(d, "logits.bin"), ids, logits)
        files = " ".join(f"{fn} ({sha256(os.path.join(d, fn))[:16]})" for fn in sorted(os.listdir(d)))
        manifest.append(f"{name}: {files} | {cls_name} / {cfg_name}, seed {seed}, {n} tokens, top-1 gap {lgap:.3g}, "
                        f"router gap {rgap:.3g} | {notes}")
        print(f"{name}: seed {seed}, {n} tokens, logits {tuple(logits.shape)}, top-1 gap {lgap:.3g}, router gap {rgap:.3g}")
        if args.check:
            check(args.check, d, n, chk)
    with open(os.path.join(args.out, "MANIFEST.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")
    if chk:
        chk.close()
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(args.out) for fn in fns)
    print(f"wrote {args.out} ({total / 1048576:.2f} MiB)")


if __name__ == "__main__":
    sys.exit(main())
