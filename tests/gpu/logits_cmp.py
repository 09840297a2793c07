#!/usr/bin/env python3
"""Compares two logits files of `arka perplexity --save-logits` (the format of
tests/models/*/logits.bin): the same header and tokens, then float32 rows [positions][vocab].

usage: logits_cmp.py CUR BASE
prints: "rows N top1 P % rel_mean M rel_max X" where per row rel = ||cur - base|| / ||base||
(arka perplexity's --kl-divergence-base definition) and top-1 counts rows whose argmax agrees;
with numpy, rows that disagree are also described: base's margin of its top-1 over cur's choice
against the row's largest difference (at most ~1: near-ties that the difference decides).
Exit 2 when the files cannot be compared. numpy when present, else plain Python."""
import math
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"ARKALGT1":
        raise ValueError(f"{path}: not an arka logits file")
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
        v1, t1, cur = load(sys.argv[1])
        v2, t2, base = load(sys.argv[2])
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
        line = f"rows {len(cur)} top1 {100.0 * top1 / len(cur):.3f} % rel_mean {rel.mean():.3g} rel_max {rel.max():.3g}"
        flips = np.nonzero(ia != ib)[0]
        if len(flips):  # how close each disagreement was: base's margin of its top-1 over cur's, in units of the row's largest error
            r = np.arange(len(b))[flips]
            margin = b[r, ib[flips]] - b[r, ia[flips]]
            err = np.abs(a[flips] - b[flips]).max(axis=1)
            line += f" flips {len(flips)}: base margin / max |cur - base| at most {float((margin / np.where(err > 0, err, 1)).max()):.3g}"
        print(line)
        return 0
    top1 = 0
    rels = []
    for a, b in zip(cur, base):
        num = sum((x - y) * (x - y) for x, y in zip(a, b))
        den = sum(y * y for y in b)
        rels.append(math.sqrt(num / den) if den > 0 else math.sqrt(num))
        if not all(math.isfinite(x) for x in a):
            rels[-1] = float("inf")
        top1 += max(range(len(a)), key=lambda i: (a[i], -i)) == max(range(len(b)), key=lambda i: (b[i], -i))
    print(f"rows {len(cur)} top1 {100.0 * top1 / len(cur):.3f} % rel_mean {sum(rels) / len(rels):.3g} rel_max {max(rels):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
