#!/usr/bin/env python3
"""Compares two logits files of `arka perplexity --save-logits` (the format of
tests/models/*/logits.bin): the same header and tokens, then float32 rows [positions][vocab].

usage: logits_cmp.py CUR BASE
CUR may also be bare float32 rows [positions][vocab] (another program's logits, e.g.
tests/models/llamacpp_logits.c's): then they are taken as BASE's rows.
prints: "rows N top1 P % rel_mean M rel_max X kl_mean K kl_max L" where per row rel =
||cur - base|| / ||base|| and kl = KL(softmax(base) || softmax(cur)) (arka perplexity's
--kl-divergence-base definitions) and top-1 counts rows whose argmax agrees;
with numpy, rows that disagree are also described: base's margin of its top-1 over cur's choice
against the row's largest difference (at most ~1: near-ties that the difference decides).
Exit 2 when the files cannot be compared. numpy when present, else plain Python."""
import math
import struct
import sys


def load(path, like=None):
    """(vocab, tokens, rows) of an arka logits file, or of bare float32 rows shaped as `like`'s"""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"ARKALGT1":
        if like is None or len(data) % (4 * like[0]):
            raise ValueError(f"{path}: not an arka logits file" + (f" nor float32 rows of {like[0]}" if like else ""))
        vocab, toks, off = like[0], like[1], 0
    else:
        ver, vocab, ctx, first, n_chunks, _ = struct.unpack_from("<6I", data, 8)
        off = 8 + 24 + 4 * ctx * n_chunks
        toks = data[32:off]
    n = (len(data) - off) // (4 * vocab)
    try:
        import numpy as np
        return vocab, toks, np.frombuffer(data, dtype="<f4", count=n * vocab, offset=off).reshape(n, vocab)
    except ImportError:
        vals = struct.unpack_from(f"<{n * vocab}f", data, off)
        return vocab, toks, [vals[i * vocab:(i + 1) * vocab] for i in range(n)]


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    try:
        v2, t2, base = load(sys.argv[2])
        v1, t1, cur = load(sys.argv[1], (v2, t2))
    except (OSError, ValueError, struct.error) as e:
        print(f"cannot compare: {e}")
        return 2
    if v1 != v2 or t1 != t2 or len(cur) != len(base) or not len(cur):
        print(f"cannot compare: vocab {v1}/{v2}, rows {len(cur)}/{len(base)}, same tokens {t1 == t2}")
        return 2
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        a = np.asarray(cur, dtype=np.float64)
        b = np.asarray(base, dtype=np.float64)
        den = (b * b).sum(axis=1)
        num = ((a - b) ** 2).sum(axis=1)
        rel = np.where(den > 0, np.sqrt(num / np.where(den > 0, den, 1)), np.sqrt(num))
        rel = np.where(np.isfinite(a).all(axis=1), rel, np.inf)
        ia, ib = a.argmax(axis=1), b.argmax(axis=1)
        top1 = int((ia == ib).sum())
        la = a - a.max(axis=1, keepdims=True)
        la -= np.log(np.exp(la).sum(axis=1, keepdims=True))
        lb = b - b.max(axis=1, keepdims=True)
        lb -= np.log(np.exp(lb).sum(axis=1, keepdims=True))
        kl = (np.exp(lb) * (lb - la)).sum(axis=1)
        line = (f"rows {len(cur)} top1 {100.0 * top1 / len(cur):.3f} % rel_mean {rel.mean():.3g} rel_max {rel.max():.3g} "
                f"kl_mean {kl.mean():.3g} kl_max {kl.max():.3g}")
        flips = np.nonzero(ia != ib)[0]
        if len(flips):  # how close each disagreement was: base's margin of its top-1 over cur's, in units of the row's largest error
            r = np.arange(len(b))[flips]
            margin = b[r, ib[flips]] - b[r, ia[flips]]
            err = np.abs(a[flips] - b[flips]).max(axis=1)
            line += f" flips {len(flips)}: base margin / max |cur - base| at most {float((margin / np.where(err > 0, err, 1)).max()):.3g}"
        print(line)
        return 0
    def logp(x):
        m = max(x)
        s = m + math.log(sum(math.exp(v - m) for v in x))
        return [v - s for v in x]

    top1 = 0
    rels, kls = [], []
    for a, b in zip(cur, base):
        num = sum((x - y) * (x - y) for x, y in zip(a, b))
        den = sum(y * y for y in b)
        rels.append(math.sqrt(num / den) if den > 0 else math.sqrt(num))
        if not all(math.isfinite(x) for x in a):
            rels[-1] = kl = float("inf")
        else:
            la, lb = logp(a), logp(b)
            kl = sum(math.exp(q) * (q - p) for p, q in zip(la, lb))
        kls.append(kl)
        top1 += max(range(len(a)), key=lambda i: (a[i], -i)) == max(range(len(b)), key=lambda i: (b[i], -i))
    print(f"rows {len(cur)} top1 {100.0 * top1 / len(cur):.3f} % rel_mean {sum(rels) / len(rels):.3g} rel_max {max(rels):.3g} "
          f"kl_mean {sum(kls) / len(kls):.3g} kl_max {max(kls):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
