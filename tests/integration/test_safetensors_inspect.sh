#!/usr/bin/env bash
# `arka inspect DIR` on Hugging Face checkpoints written here with python3's struct module:
# a qwen2 (BF16, QKV biases, tied embeddings, one shard) and a llama (F16, two shards + index,
# llama3 rope scaling), then a broken one (one-line error, exit 1).
set -euo pipefail
ARKA_BIN=${ARKA_BIN:-build/bin/arka}
tmp=$(mktemp -d /tmp/arka-st-inspect-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; echo "0 passed, 1 failed"; exit 1; }

python3 - "$tmp" <<'PY'
import json, os, struct, sys
root = sys.argv[1]

def enc(dtype, vals):
    if dtype == "F32": return struct.pack("<%df" % len(vals), *vals)
    if dtype == "F16": return struct.pack("<%de" % len(vals), *vals)
    if dtype == "BF16": return b"".join(struct.pack("<f", v)[2:] for v in vals)
    raise ValueError(dtype)

def write_shard(path, tensors):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, dtype, shape in tensors:
        n = 1
        for d in shape: n *= d
        data = enc(dtype, [((i * 7 + len(name)) % 33 - 16) / 16.0 for i in range(n)])
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

def model(dim, layers, heads, kv, ff, vocab, wdt, ndt, bias, lm_head):
    hd = dim // heads
    t = [("model.embed_tokens.weight", wdt, [vocab, dim])]
    for l in range(layers):
        p = "model.layers.%d." % l
        t += [(p + "input_layernorm.weight", ndt, [dim]),
              (p + "self_attn.q_proj.weight", wdt, [heads * hd, dim]),
              (p + "self_attn.k_proj.weight", wdt, [kv * hd, dim]),
              (p + "self_attn.v_proj.weight", wdt, [kv * hd, dim]),
              (p + "self_attn.o_proj.weight", wdt, [dim, heads * hd]),
              (p + "post_attention_layernorm.weight", ndt, [dim]),
              (p + "mlp.gate_proj.weight", wdt, [ff, dim]),
              (p + "mlp.up_proj.weight", wdt, [ff, dim]),
              (p + "mlp.down_proj.weight", wdt, [dim, ff])]
        if bias:
            t += [(p + "self_attn.q_proj.bias", ndt, [heads * hd]), (p + "self_attn.k_proj.bias", ndt, [kv * hd]),
                  (p + "self_attn.v_proj.bias", ndt, [kv * hd])]
    t.append(("model.norm.weight", ndt, [dim]))
    if lm_head: t.append(("lm_head.weight", wdt, [vocab, dim]))
    return t

d = os.path.join(root, "qwen2")
os.makedirs(d)
json.dump({"model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 64, "max_position_embeddings": 1024,
           "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True, "rope_scaling": None,
           "_name_or_path": "tiny-qwen2"}, open(os.path.join(d, "config.json"), "w"))
write_shard(os.path.join(d, "model.safetensors"), model(32, 2, 4, 2, 48, 64, "BF16", "BF16", True, False))

d = os.path.join(root, "llama")
os.makedirs(d)
json.dump({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
           "num_key_value_heads": 4, "intermediate_size": 40, "vocab_size": 48, "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}, open(os.path.join(d, "config.json"), "w"))
t = model(32, 3, 4, 4, 40, 48, "F16", "F32", False, True)
half = len(t) // 2
names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
write_shard(os.path.join(d, names[0]), t[:half])
write_shard(os.path.join(d, names[1]), t[half:])
json.dump({"metadata": {}, "weight_map": {n: names[0] if i < half else names[1] for i, (n, _, _) in enumerate(t)}},
          open(os.path.join(d, "model.safetensors.index.json"), "w"))

d = os.path.join(root, "broken")
os.makedirs(d)
json.dump({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
           "intermediate_size": 40, "vocab_size": 48}, open(os.path.join(d, "config.json"), "w"))
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", 1 << 40) + b"{}")
PY

passed=0
out=$("$ARKA_BIN" inspect "$tmp/qwen2") || fail "inspect qwen2 exited $?"
for want in "(safetensors)" "name: tiny-qwen2" "architecture: qwen2" "dim (n_embd): 32" "layers: 2" "heads: 4" \
            "kv heads: 2" "head dim: 8" "ffn dim: 48" "vocab: 64" "context (trained): 1024" "rms eps: 1e-06" \
            "layout half-split" "base 1e+06" "qkv bias: yes" "output: tied to token_embd"; do
    grep -qF -- "$want" <<<"$out" || fail "qwen2: '$want' not in output:
$out"
    passed=$((passed + 1))
done

out=$("$ARKA_BIN" inspect "$tmp/llama") || fail "inspect llama exited $?"
for want in "(safetensors)" "architecture: llama" "layers: 3" "kv heads: 4" "vocab: 48" "layout half-split" \
            "scaling llama3 factor 8" "qkv bias: no" "output: separate"; do
    grep -qF -- "$want" <<<"$out" || fail "llama: '$want' not in output:
$out"
    passed=$((passed + 1))
done
# The single-file form with config.json beside it.
"$ARKA_BIN" inspect "$tmp/qwen2/model.safetensors" | grep -F "architecture: qwen2" >/dev/null || fail "inspect FILE.safetensors"
passed=$((passed + 1))

set +e
err=$("$ARKA_BIN" inspect "$tmp/broken" 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" = 1 ] || fail "broken: exit $rc, want 1"
[ "$(printf '%s\n' "$err" | wc -l)" = 1 ] || fail "broken: error is not one line: $err"
grep -qF "$tmp/broken/model.safetensors: header length" <<<"$err" || fail "broken: unexpected error: $err"
passed=$((passed + 3))
echo "$passed passed, 0 failed"
