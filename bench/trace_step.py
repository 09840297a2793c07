#!/usr/bin/env python3
"""Reads a step trace (bench_engine --cuda-trace N --cuda-trace-file F, a build configured with
-DARKA_CUDA_TRACE=ON; F may be gzipped) and prints where the decode step's time goes, per kernel
of a layer:

  gap    from the end of the kernel before (its last CTA) to this kernel's first CTA past the
         programmatic wait: the dependency's latency
  span   from that first CTA past the wait to this kernel's last CTA's end
  tail   from the median CTA's end to the last one's
  early  how long before the wait its first CTA was resident (work PDL overlaps)
  waves  the spread of the CTAs' waits over the median CTA's own time (wait to end): about 0
         when every CTA was resident at once, 1 or more when CTAs waited for others to leave
  res    the most CTAs of the launch resident on one SM at once

A launch is the run of consecutive CTAs of one kind; a CTA index seen again starts the next
launch of that kind (two GEMVs in a row: a fused matrix whose parts differ in type). Layers are
found around the attention launches: a layer starts at the norm before its first GEMV and holds
norm1, qkv (a second part: "qkv+"), rope, attn (and its merge), wo, norm2, then the FFN: its
last GEMV is "down", a GEMV before it "gate|up" (the MoE router's: "router"), the activation
kernel "act" ("gate|up+act" when the gate|up GEMV computes it: no GEMV between norm2 and it).
Launches outside the layers are "(step) <kind>".

usage: trace_step.py TRACE.csv[.gz] [--launches]
"""
import csv
import gzip
import sys
from collections import defaultdict

# the kinds kernels record: KC_TR_* in kernels/cuda/kcuda.h
KINDS = {1: "embed", 2: "norm", 3: "gemv", 4: "gemvq", 5: "rope", 6: "attn", 7: "attn_merge", 8: "swiglu",
         9: "gather", 10: "gemmq", 11: "other"}
GEMVS = ("gemv", "gemvq", "gemmq")


def launches(rows):
    # consecutive runs of one kind, in the order the CTAs started
    out = []
    for r in sorted(rows, key=lambda r: r["t_entry"]):
        if not out or out[-1]["kind"] != r["kind"] or r["cta"] in out[-1]["seen"]:
            out.append({"kind": r["kind"], "ctas": [], "seen": set()})
        out[-1]["ctas"].append(r)
        out[-1]["seen"].add(r["cta"])
    for l in out:
        c = l["ctas"]
        l["entry"] = min(r["t_entry"] for r in c)
        waits = [r["t_wait"] or r["t_entry"] for r in c]
        l["wait0"], l["wait1"] = min(waits), max(waits)
        ends = sorted(r["t_end"] for r in c)
        l["end"] = ends[-1]
        l["end_med"] = ends[len(ends) // 2]
        l["n"] = len(c)
        own = sorted(r["t_end"] - (r["t_wait"] or r["t_entry"]) for r in c)
        l["cta_med"] = own[len(own) // 2]
        ev = sorted([(r["t_entry"], 1, r["sm"]) for r in c] + [(r["t_end"], -1, r["sm"]) for r in c])
        cur, most = defaultdict(int), 0
        for _, d, sm in ev:
            cur[sm] += d
            most = max(most, cur[sm])
        l["res"] = most
    out.sort(key=lambda l: (l["wait0"], l["end"]))
    return out


def label(kinds):
    """A name for each launch: its role in its layer, or "(step) kind"."""
    names = ["(step) " + k for k in kinds]
    attn = [i for i, k in enumerate(kinds) if k == "attn"]
    starts = []
    for a in attn:  # back over rope and the qkv GEMVs to the norm before them
        i = a - 1
        while i >= 0 and kinds[i] in GEMVS + ("rope", "other"):
            i -= 1
        starts.append(i if i >= 0 and kinds[i] == "norm" else i + 1)
    for li, s in enumerate(starts):
        end = starts[li + 1] if li + 1 < len(starts) else len(kinds)
        a = attn[li]
        if li + 1 == len(starts):  # the last layer ends before the step's own tail (gather, final norm, head)
            e = a + 1
            while e < len(kinds) and kinds[e] != "gather":
                e += 1
            end = e
        seen_gemv = 0
        for i in range(s, a):
            k = kinds[i]
            if k == "norm":
                names[i] = "norm1"
            elif k in GEMVS:
                names[i] = "qkv" if not seen_gemv else "qkv+"
                seen_gemv += 1
            else:
                names[i] = k
        names[a] = "attn"
        after = list(range(a + 1, end))
        norms = [i for i in after if kinds[i] == "norm"]
        n2 = norms[0] if norms else end
        for i in after:
            k = kinds[i]
            if i < n2:
                names[i] = "wo" if k in GEMVS else k
        ffn = [i for i in after if i > n2]
        gemvs = [i for i in ffn if kinds[i] in GEMVS]
        if n2 < end:
            names[n2] = "norm2"
        for i in ffn:
            k = kinds[i]
            if k in GEMVS:
                names[i] = "down" if i == gemvs[-1] else ("router" if k == "gemvq" and i + 1 < len(kinds) and kinds[i + 1] == "other" else "gate|up")
            elif k == "swiglu":
                names[i] = "gate|up+act" if not any(j < i for j in gemvs if names[j] == "gate|up") else "act"
            elif k == "norm":
                names[i] = "norm3"
            else:
                names[i] = k
    return names


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = [{k: int(v) for k, v in r.items()} for r in csv.DictReader(f)]
    if not rows:
        sys.exit("no records")
    ls = launches(rows)
    t0 = ls[0]["wait0"]
    total = ls[-1]["end"] - t0
    print(f"{len(rows)} CTAs in {len(ls)} launches, first wait to last end {total / 1000:.1f} us")
    names = label([KINDS.get(l["kind"], str(l["kind"])) for l in ls])
    agg = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0])
    prev_end = None
    for l, name in zip(ls, names):
        gap = (l["wait0"] - prev_end) if prev_end is not None else 0
        span = l["end"] - l["wait0"]
        l["gap"], l["span"] = gap, span
        l["waves"] = (l["wait1"] - l["wait0"]) / l["cta_med"] if l["cta_med"] > 0 else 0.0
        a = agg[name]
        a[0] += 1
        a[1] += gap
        a[2] += span
        a[3] += l["end"] - l["end_med"]
        a[4] += l["wait0"] - l["entry"]
        a[5] = max(a[5], l["n"])
        a[6] += l["waves"]
        a[7] = max(a[7], l["res"])
        prev_end = l["end"]
    if "--launches" in sys.argv:
        for l, name in zip(ls, names):
            print(f"{name:14s} ctas {l['n']:5d} gap {l['gap'] / 1000:7.2f} span {l['span'] / 1000:7.2f} "
                  f"last-wait {(l['wait1'] - l['wait0']) / 1000:6.2f} tail {(l['end'] - l['end_med']) / 1000:6.2f} "
                  f"cta {l['cta_med'] / 1000:6.2f} res {l['res']:2d}")
    print(f"{'kernel':14s} {'n':>4s} {'ctas':>6s} {'gap us':>8s} {'span us':>8s} {'tail us':>8s} {'early us':>8s} "
          f"{'waves':>6s} {'res':>4s} {'total us':>9s} {'share':>6s}")
    order = sorted(agg.items(), key=lambda kv: names.index(kv[0]))
    sg = ss = 0
    for name, (n, gap, span, tail, early, ctas, waves, res) in order:
        tot = gap + span
        sg += gap
        ss += span
        print(f"{name:14s} {n:4d} {ctas:6d} {gap / n / 1000:8.2f} {span / n / 1000:8.2f} {tail / n / 1000:8.2f} "
              f"{early / n / 1000:8.2f} {waves / n:6.2f} {res:4d} {tot / 1000:9.1f} {100 * tot / total:5.1f}%")
    print(f"sum of gaps {sg / 1000:.1f} us, of spans {ss / 1000:.1f} us")


if __name__ == "__main__":
    main()
