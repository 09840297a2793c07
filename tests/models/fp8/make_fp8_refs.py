#!/usr/bin/env python3
"""FP8 reference data: small random-weight models whose linear layers PyTorch quantizes to
torch.float8_e4m3fn with scales in the layouts the common quantization tools write, and
PyTorch's own logits of the dequantized network; plus PyTorch's float8_e4m3fn conversions
of a sweep of floats, so arka's encoder can be checked against torch's bit for bit.

Run on a machine with PyTorch and transformers (everything runs on the CPU in float32):

    python3 tests/models/fp8/make_fp8_refs.py OUTDIR [--check path/to/arka]

OUTDIR/<name>/ gets, per model:
    config.json        transformers' own, plus the quantization_config of the layout
    model.safetensors  linear weights as F8_E4M3 with their scales (names and dtypes as the
                       tool of the layout writes them), everything else F16 (exact: the
                       drawn values are half-precision), the output head unquantized
    ids.txt, logits.bin  the token ids and transformers' float32 logits of the network whose
                       weights are the FP8 codes times their scales (code.to(float32) * scale),
                       in arka perplexity's --save-logits format
OUTDIR/e4m3_torch.bin: "ARKAE4M3", u32 n, f32 x[n], u8 cast[n] (x.to(float8_e4m3fn)),
    u8 sat[n] (x.clamp(-448, 448).to(float8_e4m3fn)), f32 value[256] (each code .to(float32)).
OUTDIR/MANIFEST.txt lists versions, layouts and file hashes.

Commit OUTDIR/* as tests/models/fp8/ (next to this script): tests/integration/
test_fp8_refs.sh then checks on every CI run that arka's CPU logits of each checkpoint match
(relative error <= 1e-3, top-1 100 %: the weights are the same values, only the summation
order differs) and tests/unit/test_model_fp8.c checks the conversions against e4m3_torch.bin.
With --check ARKA (built on this machine: cmake -S . -B build-gpu -DARKA_WITH_GATEWAY=OFF
-DARKA_WITH_CURL=OFF && cmake --build build-gpu -j) every model is also compared here and
the figures are written to OUTDIR/check.txt.

Layouts (the scale of a matrix is amax / 448 of the tensor or of each output row, the codes
(w / scale).clamp(-448, 448).to(float8_e4m3fn), as llm-compressor and the others quantize):
    ct-channel     compressed-tensors float-quantized, FP8_DYNAMIC: weight_scale BF16 [out, 1]
    ct-tensor      compressed-tensors float-quantized, FP8 static: weight_scale F32 [1],
                   input_scale F32 [1], kv_cache_scheme with self_attn.k_scale / v_scale
    fbgemm         fbgemm_fp8: weight_scale F32 [out, 1]
    autofp8        fp8, activation_scheme static: weight_scale F32 [], input_scale F32 []
    scale-inv      fp8, dynamic: weight_scale_inv F32 [out]
    qwen3          ct-channel on qwen3 (QK-norm, head_dim 32)
    mixtral        ct-channel on mixtral, per-expert names as Hub checkpoints have them, the
                   router unquantized
    phi3           ct-channel on phi3 (fused qkv_proj and gate_up_proj)
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import torch

sys.dont_write_bytecode = True  # no __pycache__ in the tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import make_refs  # noqa: E402  (tests/models/make_refs.py: configs, weights, logits format)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0

CT_ARGS = dict(num_bits=8, type="float", symmetric=True, group_size=None, block_structure=None, actorder=None,
               observer="minmax", observer_kwargs={})


def ct_config(strategy, input_acts, kv=False):
    w = dict(CT_ARGS, strategy=strategy, dynamic=False)
    q = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
         "global_compression_ratio": 1.5, "ignore": ["lm_head"], "kv_cache_scheme": None,
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": input_acts,
                                       "output_activations": None, "format": "float-quantized"}}}
    if kv:
        q["kv_cache_scheme"] = dict(CT_ARGS, strategy="tensor", dynamic=False)
    return q


DYN_TOKEN = dict(CT_ARGS, strategy="token", dynamic=True, observer=None)
STATIC_TENSOR = dict(CT_ARGS, strategy="tensor", dynamic=False)

# name: (make_refs model, per_channel, scale dtype, scale shape kind, scale suffix, input_scale, kv scales, quantization_config)
LAYOUTS = {
    "ct-channel": ("llama3", True, torch.bfloat16, "col", "weight_scale", False, False, ct_config("channel", DYN_TOKEN)),
    "ct-tensor": ("llama3", False, torch.float32, "one", "weight_scale", True, True, ct_config("tensor", STATIC_TENSOR, kv=True)),
    "fbgemm": ("llama3", True, torch.float32, "col", "weight_scale", False, False,
               {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]}),
    "autofp8": ("llama3", False, torch.float32, "scalar", "weight_scale", True, False,
                {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}),
    "scale-inv": ("llama3", True, torch.float32, "row", "weight_scale_inv", False, False,
                  {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": None}),
    "qwen3": ("qwen3", True, torch.bfloat16, "col", "weight_scale", False, False, ct_config("channel", DYN_TOKEN)),
    "mixtral": ("mixtral", True, torch.bfloat16, "col", "weight_scale", False, False, ct_config("channel", DYN_TOKEN)),
    "phi3": ("phi3", True, torch.bfloat16, "col", "weight_scale", False, False, ct_config("channel", None)),
}


def quantize(w, per_channel):
    """codes (float8_e4m3fn) and float32 scales ([rows] or [1]) of a 2-D weight"""
    w = w.detach().float()
    amax = w.abs().amax(dim=1) if per_channel else w.abs().amax().reshape(1)
    scale = amax / FP8_MAX
    q = (w / scale.reshape(-1, 1).clamp(min=torch.finfo(torch.float32).tiny)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def scale_tensor(scale, dtype, kind):
    s = scale.to(dtype)
    if kind == "col":
        return s.reshape(-1, 1)
    if kind == "row":
        return s.reshape(-1)
    if kind == "one":
        return s.reshape(1)
    return s.reshape(())  # scalar


def linear_weights(model, mixtral):
    """(file name, live 2-D weight) of every linear layer to quantize: attention and MLP
    projections and every expert; not the embeddings, the output head, norms or the router."""
    out = []
    for li, layer in enumerate(make_refs.layers(model)):
        p = f"model.layers.{li}."
        sa = layer.self_attn
        if hasattr(sa, "qkv_proj"):
            out.append((p + "self_attn.qkv_proj.weight", sa.qkv_proj.weight))
        else:
            for n in ("q_proj", "k_proj", "v_proj"):
                out.append((p + f"self_attn.{n}.weight", getattr(sa, n).weight))
        out.append((p + "self_attn.o_proj.weight", sa.o_proj.weight))
        moe = make_refs.moe_block(layer)
        if moe is not None:
            for e, (g, u, d) in enumerate(make_refs.experts_of(moe)):
                if mixtral:
                    names = [f"block_sparse_moe.experts.{e}.{w}.weight" for w in ("w1", "w3", "w2")]
                else:
                    names = [f"mlp.experts.{e}.{w}.weight" for w in ("gate_proj", "up_proj", "down_proj")]
                out += [(p + names[0], g), (p + names[1], u), (p + names[2], d)]
        elif hasattr(layer.mlp, "gate_up_proj"):
            out.append((p + "mlp.gate_up_proj.weight", layer.mlp.gate_up_proj.weight))
            out.append((p + "mlp.down_proj.weight", layer.mlp.down_proj.weight))
        else:
            for n in ("gate_proj", "up_proj", "down_proj"):
                out.append((p + f"mlp.{n}.weight", getattr(layer.mlp, n).weight))
    return out


def write_safetensors(path, tensors):
    """tensors: [(name, tensor)], F32 / F16 / BF16 / F8_E4M3 (raw bytes through uint8 views)"""
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", FP8: "F8_E4M3"}
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.dtype in (torch.bfloat16, FP8) else t.numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def build(layout, seed_max=200):
    base, per_channel, sdtype, kind, suffix, input_scale, kv, qcfg = LAYOUTS[layout]
    spec = {m[0]: m for m in make_refs.models()}[base]
    _, cls_name, cfg_name, kw, _, notes = spec
    config = make_refs.make_config(cfg_name, kw)
    n = make_refs.SEQ
    mixtral = base == "mixtral"
    for seed in range(1, seed_max):
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        model = getattr(__import__("transformers"), cls_name)(config).float().eval()
        make_refs.randomize(model, gen)
        if any(make_refs.moe_block(l) is not None for l in make_refs.layers(model)):
            make_refs.make_tie(model)
        ids = [int(x) for x in torch.randint(0, make_refs.VOCAB, (n,), generator=gen)]
        files, quantized = [], set()
        with torch.no_grad():
            for name, w in linear_weights(model, mixtral):
                q, scale = quantize(w, per_channel)
                s_file = scale_tensor(scale, sdtype, kind)
                # the network is now the codes times the scales as stored (a BF16 scale rounds)
                w.copy_(q.float() * s_file.float().reshape(-1, 1) if s_file.dim() else q.float() * s_file.float())
                base_name = name[: -len("weight")]
                files += [(name, q), (base_name + suffix, s_file)]
                if input_scale:
                    files.append((base_name + "input_scale", torch.tensor([0.05] if kind == "one" else 0.05, dtype=torch.float32)))
                quantized.add(name)
        if kv:
            for li in range(len(make_refs.layers(model))):
                for t, v in (("k", 0.02), ("v", 0.03)):
                    files.append((f"model.layers.{li}.self_attn.{t}_scale", torch.tensor(v, dtype=torch.float32)))
        logits, rgap = make_refs.run(model, ids)
        if make_refs.logit_gap(logits) >= make_refs.MIN_LOGIT_GAP and rgap >= make_refs.MIN_ROUTER_GAP:
            break
    else:
        raise SystemExit(f"{layout}: no seed gives well-separated top-1 logits and routing")
    # everything else as make_refs writes it (F16, exact), per-expert names for MoE
    fused = set()
    for li, layer in enumerate(make_refs.layers(model)):
        moe = make_refs.moe_block(layer)
        if moe is not None and hasattr(moe.experts, "gate_up_proj"):
            fused |= {f"model.layers.{li}.mlp.experts.gate_up_proj", f"model.layers.{li}.mlp.experts.down_proj"}
    for name, t in model.state_dict().items():
        if name in quantized or name in fused or (getattr(model.config, "tie_word_embeddings", False) and name == "lm_head.weight"):
            continue
        if mixtral and ".experts." in name:
            continue  # written per expert above
        if mixtral and name.endswith("mlp.gate.weight"):
            name = name.replace("mlp.gate.weight", "block_sparse_moe.gate.weight")
        files.append((name, t.half()))
    return model, ids, logits, files, qcfg, seed, notes


def e4m3_table(path):
    xs = [0.0, -0.0, 1.0, -1.0, 1.0625, 1.1875, 0.1, 2.0 ** -10, 1.5 * 2 ** -9, 7.5 * 2 ** -9, 432.0, 448.0, 464.0, 464.5,
          479.0, 480.0, 1e6, -1e6, float("inf"), float("-inf"), float("nan")]
    bits = torch.arange(0x39000000, 0x44200000, 0x2f1d, dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([torch.tensor(xs, dtype=torch.float32), bits, -bits])
    cast = x.to(FP8).view(torch.uint8)
    sat = x.clamp(-FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8)
    dec = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()
    with open(path, "wb") as f:
        f.write(b"ARKAE4M3" + struct.pack("<I", x.numel()))
        f.write(x.numpy().astype("<f4").tobytes())
        f.write(cast.numpy().tobytes())
        f.write(sat.numpy().tobytes())
        f.write(dec.numpy().astype("<f4").tobytes())
    return x.numel()


def check(arka, d, n, out):
    r = subprocess.run([arka, "perplexity", "-m", d, "--ids", os.path.join(d, "ids.txt"), "--ctx", str(n), "--first", "0",
                        "--kl-divergence-base", os.path.join(d, "logits.bin"), "--threads", "2"], capture_output=True, text=True)
    kl = [l for l in r.stdout.splitlines() if l.startswith("kl-divergence")]
    line = f"{os.path.basename(d)}: " + (kl[0] if kl and r.returncode == 0 else f"FAILED: {r.stderr.strip()}")
    print("  " + line)
    out.write(line + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--check", metavar="ARKA", help="an arka binary: compare each model with arka perplexity")
    ap.add_argument("--only", help="comma-separated layout names")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    import transformers
    manifest = [f"transformers {transformers.__version__}, torch {torch.__version__}; float32 on the CPU",
                "name: files (sha256) | model, layout | seed"]
    n_tab = e4m3_table(os.path.join(args.out, "e4m3_torch.bin"))
    manifest.append(f"e4m3_torch.bin: {n_tab} floats ({make_refs.sha256(os.path.join(args.out, 'e4m3_torch.bin'))[:16]})")
    chk = open(os.path.join(args.out, "check.txt"), "w") if args.check else None
    for layout in LAYOUTS:
        if args.only and layout not in args.only.split(","):
            continue
        model, ids, logits, files, qcfg, seed, notes = build(layout)
        d = os.path.join(args.out, layout)
        os.makedirs(d, exist_ok=True)
        model.config.save_pretrained(d)
        cp = os.path.join(d, "config.json")
        cfg = json.load(open(cp))
        cfg["quantization_config"] = qcfg
        with open(cp, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
        write_safetensors(os.path.join(d, "model.safetensors"), files)
        with open(os.path.join(d, "ids.txt"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        make_refs.write_logits(os.path.join(d, "logits.bin"), ids, logits)
        hashes = " ".join(f"{fn} ({make_refs.sha256(os.path.join(d, fn))[:16]})" for fn in sorted(os.listdir(d)))
        manifest.append(f"{layout}: {hashes} | {LAYOUTS[layout][0]}, {qcfg['quant_method']} | seed {seed}")
        print(f"{layout}: seed {seed}, {len(ids)} tokens, {sum(1 for n, t in files if t.dtype == FP8)} FP8 matrices")
        if args.check:
            check(args.check, d, len(ids), chk)
    with open(os.path.join(args.out, "MANIFEST.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")
    if chk:
        chk.close()
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(args.out) for fn in fns)
    print(f"wrote {args.out} ({total / 1048576:.2f} MiB)")


if __name__ == "__main__":
    sys.exit(main())
