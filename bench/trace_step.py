#!/usr/bin/env python3
"""Reads a step trace (bench_engine --cuda-trace N --cuda-trace-file F, a build configured with
-DARKA_CUDA_TRACE=ON) and prints where the decode step's time goes, per kernel of a layer:

  gap   from the end of the kernel before (its last CTA) to this kernel's first CTA past the
        programmatic wait: the dependency's latency
  span  from that first CTA past the wait to this kernel's last CTA's end
  early how long before the wait its first CTA was resident (work PDL overlaps)

usage: trace_step.py TRACE.csv [--launches]
"""
import csv
import sys
from collections import defaultdict

# the kinds kernels record: KC_TR_* in kernels/cuda/kcuda.h
KINDS = {1: "embed", 2: "norm", 3: "gemv", 4: "gemvq", 5: "rope", 6: "attn", 7: "attn_merge", 8: "swiglu",
         9: "gather", 10: "gemmq", 11: "other"}


def launches(rows):
    rows.sort(key=lambda r: (r["t_wait"] or r["t_entry"], r["t_end"]))
    out = []
    for r in rows:
        if not out or out[-1]["kind"] != r["kind"]:
            out.append({"kind": r["kind"], "ctas": []})
        out[-1]["ctas"].append(r)
    for l in out:
        c = l["ctas"]
        l["entry"] = min(r["t_entry"] for r in c)
        waits = [r["t_wait"] for r in c if r["t_wait"]] or [r["t_entry"] for r in c]
        l["wait0"], l["wait1"] = min(waits), max(waits)
        ends = sorted(r["t_end"] for r in c)
        l["end"] = ends[-1]
        l["end_med"] = ends[len(ends) // 2]
        l["n"] = len(c)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        rows = [{k: int(v) for k, v in r.items()} for r in csv.DictReader(f)]
    if not rows:
        sys.exit("no records")
    ls = launches(rows)
    t0 = ls[0]["wait0"]
    total = ls[-1]["end"] - t0
    print(f"{len(rows)} CTAs in {len(ls)} launches, first wait to last end {total / 1000:.1f} us")
    # the layer pattern: what repeats between the first two norms after the embedding
    kinds = [KINDS.get(l["kind"], str(l["kind"])) for l in ls]
    norms = [i for i, k in enumerate(kinds) if k == "norm"]
    period = None
    if len(norms) >= 3:
        # a layer holds two norms: from norm 0 to norm 2
        period = norms[2] - norms[0]
    names = []
    if period:
        base = norms[0]
        pat = kinds[base:base + period]
        labels = []
        gemv_names = ["qkv", "wo", "gate|up", "down"]
        gi = ni = 0
        for k in pat:
            if k in ("gemv", "gemvq", "gemmq"):
                labels.append(gemv_names[gi] if gi < 4 else f"gemv{gi}")
                gi += 1
            elif k == "norm":
                labels.append(f"norm{ni + 1}")
                ni += 1
            else:
                labels.append(k)
        for i, k in enumerate(kinds):
            if i >= base and (i - base) < period * ((len(kinds) - base) // period) and kinds[i] == pat[(i - base) % period]:
                names.append(labels[(i - base) % period])
            else:
                names.append("(step) " + k)
    else:
        names = kinds
    agg = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0, 0])
    prev_end = None
    for l, name in zip(ls, names):
        gap = (l["wait0"] - prev_end) if prev_end is not None else 0
        span = l["end"] - l["wait0"]
        tail = l["end"] - l["end_med"]
        early = l["wait0"] - l["entry"]
        a = agg[name]
        a[0] += 1
        a[1] += gap
        a[2] += span
        a[3] += tail
        a[4] += early
        a[5] = l["n"]
        l["gap"], l["span"] = gap, span
        prev_end = l["end"]
    if "--launches" in sys.argv:
        for l, name in zip(ls, names):
            print(f"{name:14s} ctas {l['n']:5d} gap {l['gap'] / 1000:7.2f} span {l['span'] / 1000:7.2f} "
                  f"last-wait {(l['wait1'] - l['wait0']) / 1000:6.2f} tail {(l['end'] - l['end_med']) / 1000:6.2f}")
    print(f"{'kernel':14s} {'n':>4s} {'ctas':>6s} {'gap us':>8s} {'span us':>8s} {'tail us':>8s} {'early us':>8s} "
          f"{'total us':>9s} {'share':>6s}")
    order = sorted(agg.items(), key=lambda kv: names.index(kv[0]))
    sg = ss = 0
    for name, (n, gap, span, tail, early, ctas) in order:
        tot = gap + span
        sg += gap
        ss += span
        print(f"{name:14s} {n:4d} {ctas:6d} {gap / n / 1000:8.2f} {span / n / 1000:8.2f} {tail / n / 1000:8.2f} "
              f"{early / n / 1000:8.2f} {tot / 1000:9.1f} {100 * tot / total:5.1f}%")
    print(f"sum of gaps {sg / 1000:.1f} us, of spans {ss / 1000:.1f} us")


if __name__ == "__main__":
    main()
