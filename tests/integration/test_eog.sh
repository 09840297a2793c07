#!/usr/bin/env bash
# The end of generation has one definition (text/tok.h, tok_eog_ids): `arka generate` and
# `arka serve` stop at the same tokens, for a GGUF model and a safetensors model alike.
#
# Two models whose every logit is 0, so greedy decoding picks id 0 at every step, and id 0 is an
# end-of-generation token that is not the model's EOS:
#   - eot.gguf: stories260K with token 0 renamed "<unk>" -> "<EOT>" (a control token, a known
#     end of turn) and output_norm zeroed (byte patches of the real file);
#   - st/: a safetensors llama with all-zero weights and a byte-level tokenizer.json whose id 0
#     is the special token <|im_end|> and whose eos_token is <|endoftext|> (id 257).
# Both commands must stop after that one token (finish "stop"). The server also honours
# ignore_eos (the sequence runs to max_tokens) and min_tokens (the end is masked in the sampler
# until then). Prints "N passed, N failed".
set -uo pipefail
ROOT=${ARKA_ROOT:-$(pwd)}
BIN=${ARKA_BIN:-$ROOT/build/bin/arka}
STORIES=$ROOT/../shared/models/stories260K.gguf
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
[ -x "$BIN" ] || { echo "FAIL: $BIN not built"; echo "0 passed, 1 failed"; exit 1; }
[ -f "$STORIES" ] || { echo "FAIL: $STORIES missing"; echo "0 passed, 1 failed"; exit 1; }
"$BIN" serve --help >/dev/null 2>&1 || { echo "arka serve is not part of this build"; exit 77; }
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
. "$ROOT/tests/integration/serve_lib.sh"

python3 - "$STORIES" "$TMP" <<'PY' || { echo "FAIL: could not write the models"; echo "0 passed, 1 failed"; exit 1; }
import json, os, struct, sys
src, tmp = sys.argv[1], sys.argv[2]

# ---- eot.gguf: walk the GGUF header to the token list, the token types and output_norm ----
b = bytearray(open(src, "rb").read())
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(t, o):
    if t in SIZES: return o + SIZES[t]
    if t == 8: return o + 8 + struct.unpack_from("<Q", b, o)[0]
    et, n = struct.unpack_from("<IQ", b, o)
    o += 12
    if et in SIZES: return o + n * SIZES[et]
    for _ in range(n): o = skip(et, o)
    return o
assert b[:4] == b"GGUF"
n_t, n_kv = struct.unpack_from("<QQ", b, 8)
o, kv, align = 24, {}, 32
for _ in range(n_kv):
    kl = struct.unpack_from("<Q", b, o)[0]
    key = b[o + 8:o + 8 + kl].decode()
    t = struct.unpack_from("<I", b, o + 8 + kl)[0]
    kv[key] = (t, o + 12 + kl)
    if key == "general.alignment": align = struct.unpack_from("<I", b, o + 12 + kl)[0]
    o = skip(t, o + 12 + kl)
tensors = {}
for _ in range(n_t):
    nl = struct.unpack_from("<Q", b, o)[0]
    name = b[o + 8:o + 8 + nl].decode()
    o += 8 + nl
    nd = struct.unpack_from("<I", b, o)[0]
    dims = struct.unpack_from("<%dQ" % nd, b, o + 4)
    ty, off = struct.unpack_from("<IQ", b, o + 4 + 8 * nd)
    tensors[name] = (dims, ty, off)
    o += 4 + 8 * nd + 12
data = (o + align - 1) // align * align
_, p = kv["tokenizer.ggml.tokens"]               # array header (u32 type, u64 n), then strings
assert b[p + 12:p + 12 + 8 + 5] == struct.pack("<Q", 5) + b"<unk>"
b[p + 20:p + 25] = b"<EOT>"
_, p = kv["tokenizer.ggml.token_type"]
assert struct.unpack_from("<I", b, p)[0] == 5       # INT32 elements
struct.pack_into("<i", b, p + 12, 3)                # token 0: CONTROL
dims, ty, off = tensors["output_norm.weight"]
assert ty == 0                                      # F32
b[data + off:data + off + 4 * dims[0]] = bytes(4 * dims[0])
open(os.path.join(tmp, "eot.gguf"), "wb").write(b)

# ---- st/: an all-zero safetensors llama with a byte-level tokenizer ----
d = os.path.join(tmp, "st")
os.makedirs(d)
V, D, F, H = 258, 16, 32, 2
json.dump({"model_type": "llama", "hidden_size": D, "num_hidden_layers": 1, "num_attention_heads": H,
           "num_key_value_heads": H, "intermediate_size": F, "vocab_size": V, "max_position_embeddings": 256,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}, open(os.path.join(d, "config.json"), "w"))
shapes = [("model.embed_tokens.weight", [V, D]), ("model.layers.0.input_layernorm.weight", [D]),
          ("model.layers.0.self_attn.q_proj.weight", [D, D]), ("model.layers.0.self_attn.k_proj.weight", [D, D]),
          ("model.layers.0.self_attn.v_proj.weight", [D, D]), ("model.layers.0.self_attn.o_proj.weight", [D, D]),
          ("model.layers.0.post_attention_layernorm.weight", [D]), ("model.layers.0.mlp.gate_proj.weight", [F, D]),
          ("model.layers.0.mlp.up_proj.weight", [F, D]), ("model.layers.0.mlp.down_proj.weight", [D, F]),
          ("model.norm.weight", [D]), ("lm_head.weight", [V, D])]
header, off = {}, 0
for name, shape in shapes:
    n = 4
    for x in shape: n *= x
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
    off += n
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + bytes(off))
# GPT-2's byte-to-unicode map; byte k is id k + 1, so that id 0 is free for <|im_end|>
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, extra = bs[:], 0
for x in range(256):
    if x not in bs:
        bs.append(x); cs.append(256 + extra); extra += 1
byte_char = dict(zip(bs, map(chr, cs)))
vocab = {byte_char[x]: x + 1 for x in range(256)}
added = [{"id": 0, "content": "<|im_end|>", "special": True}, {"id": 257, "content": "<|endoftext|>", "special": True}]
tok = {"version": "1.0", "added_tokens": added, "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
       "post_processor": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab, "merges": []}}
json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
json.dump({"eos_token": "<|endoftext|>", "bos_token": None, "add_bos_token": False},
          open(os.path.join(d, "tokenizer_config.json"), "w"))
PY

metric() { curl -s "$URL/metrics" | awk -v n="arka:$1" '$1 ~ "^"n"[{ ]" || $1 == n {print $2; exit}'; }
# completion BODY: POST /v1/completions; sets CODE and leaves the body in $TMP/body
completion() { CODE=$(curl -s -o "$TMP/body" -w '%{http_code}' "$URL/v1/completions" -d "$1"); }
jget() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {"d": d}))' "$TMP/body" "$1" 2>/dev/null; }

for M in "$TMP/eot.gguf" "$TMP/st"; do
    name=$(basename "$M")
    # arka generate: one token, id 0, finish stop
    "$BIN" generate -m "$M" -p "hello" -n 20 --temp 0 --ids >"$TMP/gen.out" 2>"$TMP/gen.err"
    check '[ "$(cat "$TMP/gen.out")" = 0 ] && grep -q "finish: stop" "$TMP/gen.err"' \
        "$name: generate should stop at id 0: $(cat "$TMP/gen.out") / $(tail -1 "$TMP/gen.err")"
    # arka serve: the same token ends the completion
    MODEL=$M
    if ! start "$name" --log-level warn --served-model-name m; then bad "$name: server did not start"; continue; fi
    completion '{"model":"m","prompt":"hello","max_tokens":20,"temperature":0}'
    check '[ "$CODE" = 200 ] && [ "$(jget "d[\"usage\"][\"completion_tokens\"]")" = 1 ] && [ "$(jget "d[\"choices\"][0][\"finish_reason\"]")" = stop ] && [ "$(jget "d[\"choices\"][0][\"text\"]")" = "" ]' \
        "$name: serve should stop after the end-of-generation token: $CODE $(cat "$TMP/body")"
    # ignore_eos: the end-of-generation ids are no stop ids; the sequence runs to max_tokens
    completion '{"model":"m","prompt":"hello","max_tokens":20,"temperature":0,"ignore_eos":true}'
    check '[ "$CODE" = 200 ] && [ "$(jget "d[\"usage\"][\"completion_tokens\"]")" = 20 ] && [ "$(jget "d[\"choices\"][0][\"finish_reason\"]")" = length ]' \
        "$name: ignore_eos should run to max_tokens: $CODE $(cat "$TMP/body")"
    # min_tokens: the end cannot be drawn for 5 tokens (the executor masks it), then it is
    completion '{"model":"m","prompt":"hello","max_tokens":20,"temperature":0,"min_tokens":5,"logprobs":1}'
    check '[ "$CODE" = 200 ] && [ "$(jget "d[\"usage\"][\"completion_tokens\"]")" = 6 ] && [ "$(jget "d[\"choices\"][0][\"finish_reason\"]")" = stop ]' \
        "$name: min_tokens 5 should stop after 6 tokens: $CODE $(cat "$TMP/body")"
    check '[ "$(jget "len(d[\"choices\"][0][\"logprobs\"][\"tokens\"])")" = 6 ] && python3 -c "import json,math,sys; lp=json.load(open(sys.argv[1]))[\"choices\"][0][\"logprobs\"][\"token_logprobs\"]; sys.exit(0 if all(math.isfinite(x) for x in lp) else 1)" "$TMP/body"' \
        "$name: min_tokens logprobs: $(cat "$TMP/body")"
    completion '{"model":"m","prompt":"hello","max_tokens":4,"min_tokens":5}'
    check '[ "$CODE" = 400 ] && [ "$(jget "d[\"error\"][\"param\"]")" = min_tokens ]' "$name: min_tokens > max_tokens: $CODE $(cat "$TMP/body")"
    kill "$SPID"; wait "$SPID" 2>/dev/null
done

echo "$pass passed, $fail failed"
[ $fail = 0 ]
