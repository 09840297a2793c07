#!/usr/bin/env python3
"""Builds a Hugging Face LlamaForCausalLM from the tensors of a GGUF file (F32/F16/BF16/Q8_0/Q4_0,
dequantized to float32) and compares its logits with logits dumped by gpu_dump_logits.

GGUF stores attn_q/attn_k rows permuted for adjacent-pair RoPE (llama.cpp's converter); HF's
Llama rotates half-split pairs, so the permutation is undone here. Agreement therefore also
checks that our RoPE layout handling is right.

usage: hf_compare.py MODEL.gguf IDS.txt OURS.f32 [OURS2.f32 ...]
Prints relative error and top-1 agreement per file; exit 1 if any is over 1e-2 or under 99 %.
"""
import struct
import sys

import numpy as np
import torch

GGUF_SCALAR = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}


class Reader:
    def __init__(self, buf):
        self.b, self.p = buf, 0

    def take(self, fmt):
        v = struct.unpack_from('<' + fmt, self.b, self.p)
        self.p += struct.calcsize('<' + fmt)
        return v[0]

    def string(self):
        n = self.take('Q')
        s = bytes(self.b[self.p:self.p + n]).decode('utf-8', 'replace')
        self.p += n
        return s

    def value(self, t):
        if t in GGUF_SCALAR:
            return self.take(GGUF_SCALAR[t])
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take('I'), self.take('Q')
            return [self.value(et) for _ in range(n)]
        raise ValueError(f'bad type {t}')


def dequant(raw, typ, n):
    if typ == 0:
        return np.frombuffer(raw, dtype='<f4', count=n).astype(np.float32)
    if typ == 1:
        return np.frombuffer(raw, dtype='<f2', count=n).astype(np.float32)
    if typ == 30:
        u = np.frombuffer(raw, dtype='<u2', count=n).astype(np.uint32) << 16
        return u.view(np.float32)
    if typ == 8:  # Q8_0: f16 d + 32 x int8
        blk = np.frombuffer(raw, dtype=np.uint8, count=n // 32 * 34).reshape(-1, 34)
        d = blk[:, :2].copy().view('<f2').astype(np.float32)
        q = blk[:, 2:].view(np.int8).astype(np.float32)
        return (q * d).reshape(-1)
    if typ == 2:  # Q4_0: f16 d + 16 bytes; low nibbles are elements 0..15, high 16..31
        blk = np.frombuffer(raw, dtype=np.uint8, count=n // 32 * 18).reshape(-1, 18)
        d = blk[:, :2].copy().view('<f2').astype(np.float32)
        qs = blk[:, 2:]
        q = np.concatenate([(qs & 15).astype(np.int8) - 8, (qs >> 4).astype(np.int8) - 8], axis=1).astype(np.float32)
        return (q * d).reshape(-1)
    raise ValueError(f'tensor type {typ} not handled')


def load_gguf(path):
    buf = memoryview(open(path, 'rb').read())
    r = Reader(buf)
    assert r.take('I') == 0x46554747
    r.take('I')
    n_t, n_kv = r.take('Q'), r.take('Q')
    meta = {}
    for _ in range(n_kv):
        k = r.string()
        meta[k] = r.value(r.take('I'))
    infos = []
    for _ in range(n_t):
        name = r.string()
        nd = r.take('I')
        ne = [r.take('Q') for _ in range(nd)]
        infos.append((name, ne, r.take('I'), r.take('Q')))
    align = meta.get('general.alignment', 32)
    base = (r.p + align - 1) // align * align
    tensors = {}
    for name, ne, typ, off in infos:
        n = int(np.prod(ne))
        a = dequant(buf[base + off:], typ, n)
        tensors[name] = a.reshape(list(reversed(ne)))  # numpy shape: [ne1, ne0]
    return meta, tensors


def unpermute(w, n_head):
    # GGUF rows (adjacent pairs) back to HF rows (half split)
    out, inp = w.shape
    hd = out // n_head
    return w.reshape(n_head, hd // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def main():
    from transformers import LlamaConfig, LlamaForCausalLM
    path, ids_path, outs = sys.argv[1], sys.argv[2], sys.argv[3:]
    meta, t = load_gguf(path)
    a = meta['general.architecture']
    n_head = meta[f'{a}.attention.head_count']
    n_kv = meta.get(f'{a}.attention.head_count_kv', n_head)
    n_embd = meta[f'{a}.embedding_length']
    vocab = t['token_embd.weight'].shape[0]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=n_embd, intermediate_size=meta[f'{a}.feed_forward_length'],
                      num_hidden_layers=meta[f'{a}.block_count'], num_attention_heads=n_head, num_key_value_heads=n_kv,
                      max_position_embeddings=meta.get(f'{a}.context_length', 2048),
                      rms_norm_eps=meta.get(f'{a}.attention.layer_norm_rms_epsilon', 1e-5),
                      rope_theta=meta.get(f'{a}.rope.freq_base', 10000.0),
                      tie_word_embeddings='output.weight' not in t, attention_bias=False, mlp_bias=False)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    sd = {'model.embed_tokens.weight': t['token_embd.weight'], 'model.norm.weight': t['output_norm.weight'],
          'lm_head.weight': t.get('output.weight', t['token_embd.weight'])}
    for i in range(cfg.num_hidden_layers):
        p, q = f'blk.{i}.', f'model.layers.{i}.'
        sd[q + 'self_attn.q_proj.weight'] = unpermute(t[p + 'attn_q.weight'], n_head)
        sd[q + 'self_attn.k_proj.weight'] = unpermute(t[p + 'attn_k.weight'], n_kv)
        sd[q + 'self_attn.v_proj.weight'] = t[p + 'attn_v.weight']
        sd[q + 'self_attn.o_proj.weight'] = t[p + 'attn_output.weight']
        sd[q + 'mlp.gate_proj.weight'] = t[p + 'ffn_gate.weight']
        sd[q + 'mlp.up_proj.weight'] = t[p + 'ffn_up.weight']
        sd[q + 'mlp.down_proj.weight'] = t[p + 'ffn_down.weight']
        sd[q + 'input_layernorm.weight'] = t[p + 'attn_norm.weight']
        sd[q + 'post_attention_layernorm.weight'] = t[p + 'ffn_norm.weight']
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=False)
    model = model.cuda().eval()
    ids = [int(x) for x in open(ids_path).read().split()]
    with torch.no_grad():
        ref = model(torch.tensor([ids]).cuda()).logits[0].double().cpu().numpy()
    ok = True
    for o in outs:
        ours = np.fromfile(o, dtype='<f4').reshape(len(ids), vocab).astype(np.float64)
        rel = np.linalg.norm(ours - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-30)
        agree = float(np.mean(ours.argmax(1) == ref.argmax(1)))
        print(f'{o} vs transformers: rel err mean {rel.mean():.2e} max {rel.max():.2e}, top-1 agreement {100 * agree:.2f}%')
        ok &= rel.max() <= 1e-2 and agree >= 0.99
    print('hf_compare:', 'PASS' if ok else 'FAIL')
    sys.exit(0 if ok else 1)


if __name__ == '__main__':
    main()
