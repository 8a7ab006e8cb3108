#!/usr/bin/env python3
"""The speed targets the CUDA kernels are held to, checked against measured runs.

Reads the JSON that bench/compare_sdpa.py (--out; with --decode for the decode targets) and
bench/compare_flex.py (--out) write, and prints one line per target: the measured ratio, the
target, and whether it is met. Nothing is measured here; run it anywhere.

    python3 bench/targets.py --peers peers.json [--flex flex.json] [--misses-only]

Targets (every figure measured in one process beside the peer it is compared with):
  forward, backward   ours / cuDNN >= 1.0 at seqlen >= 2k, >= 0.9 below (each sweep shape)
  GPT-2 medium        ours forward+backward time <= cuDNN's (causal and not)
  decode              ours / cuDNN >= 1.0 in K+V bandwidth (each decode shape); a paged cache
                      (pages of 16 and 64 rows) >= 0.95 x the contiguous one
  variants            window, ALiBi, sinks >= 0.9 x our plain causal, softcap >= 0.8 x, forward
                      and backward; each above FlexAttention's figure for the same variant
                      (sinks: its plain causal, FlexAttention having none)
"""
import argparse
import json
import sys

LONG_SEQLEN = 2048            # from here on the sweep's shapes are held to >= 1.0 x cuDNN
SHORT_RATIO, LONG_RATIO = 0.9, 1.0
PAGED_RATIO = 0.95            # a paged cache against the contiguous one
VARIANT_RATIO = {"window": 0.9, "alibi": 0.9, "sinks": 0.9, "softcap": 0.8}
FLEX_PEER_CASE = {"sinks": "causal (no sinks)"}  # FlexAttention's row each variant meets


class Report:
    def __init__(self, misses_only):
        self.misses_only = misses_only
        self.met = self.missed = 0

    def check(self, what, value, target, higher_is_better=True):
        ok = value >= target if higher_is_better else value <= target
        self.met += ok
        self.missed += not ok
        if ok and self.misses_only:
            return
        sign = ">=" if higher_is_better else "<="
        print(f"  {'met   ' if ok else 'MISSED'} {what:<46} {value:8.3f}  (target {sign} {target:g})")


def check_sweep(peers, report):
    for mode in ("fwd", "bwd"):
        print(f"{'forward' if mode == 'fwd' else 'backward'}: ours / cuDNN, TFLOP/s in one process")
        rows = [r for r in peers.get("sweep", []) if r.get("algo", "flash") == "flash"]
        for r in sorted(rows, key=lambda r: (r["head_dim"], r["causal"], r["seqlen"])):
            ours, cudnn = r.get(f"ours_{mode}_tflops"), r.get(f"cudnn_{mode}_tflops")
            if not ours or not cudnn:
                continue
            target = LONG_RATIO if r["seqlen"] >= LONG_SEQLEN else SHORT_RATIO
            what = f"d{r['head_dim']} N{r['seqlen']} {'causal' if r['causal'] else 'not causal'}"
            report.check(what, ours / cudnn, target)


def check_gpt2(peers, report):
    rows = peers.get("gpt2_medium", [])
    if not rows:
        return
    print("GPT-2 medium forward+backward: ours / cuDNN time (lower is better)")
    for causal in (False, True):
        ms = {r["name"]: r.get("fwdbwd_ms") for r in rows if r["causal"] == causal}
        if ms.get("ours flash") and ms.get("torch cuDNN"):
            report.check("causal" if causal else "not causal",
                         ms["ours flash"] / ms["torch cuDNN"], 1.0, higher_is_better=False)


def check_decode(peers, report):
    rows = peers.get("decode", [])
    if not rows:
        return
    print(f"decode: K+V bandwidth (pages {peers.get('decode_pages', 'shuffled')})")
    for r in rows:
        shape = f"B{r['B']} Nk{r['Nk']} Nq{r['Nq']}{' causal' if r['causal'] else ''}"
        if r.get("ours_TBps") and r.get("cudnn_TBps"):
            report.check(f"{shape}: ours / cuDNN", r["ours_TBps"] / r["cudnn_TBps"], LONG_RATIO)
        for rows_per_page in (16, 64):
            paged = r.get(f"ours_paged{rows_per_page}_TBps")
            if paged and r.get("ours_TBps"):
                report.check(f"{shape}: pages of {rows_per_page} / contiguous",
                             paged / r["ours_TBps"], PAGED_RATIO)


def check_variants(flex, report):
    print("variants: ours / our plain causal; ours / FlexAttention (TFLOP/s over visible pairs)")
    by = {(r["peer"], r["case"], r["d"]): r for r in flex}
    for d in sorted({r["d"] for r in flex}):
        plain = by.get(("ours", "causal", d))
        for case, ratio in VARIANT_RATIO.items():
            ours = by.get(("ours", case, d))
            if ours is None:
                continue
            flex_row = by.get(("flex", FLEX_PEER_CASE.get(case, case), d))
            for mode in ("fwd", "bwd"):
                mine = ours.get(f"{mode}_tflops")
                if plain and plain.get(f"{mode}_tflops"):
                    report.check(f"d{d} {case} {mode}: / plain causal",
                                 mine / plain[f"{mode}_tflops"], ratio)
                if flex_row and flex_row.get(f"{mode}_tflops"):
                    report.check(f"d{d} {case} {mode}: / FlexAttention",
                                 mine / flex_row[f"{mode}_tflops"], 1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", help="bench/compare_sdpa.py's JSON")
    ap.add_argument("--flex", help="bench/compare_flex.py's JSON")
    ap.add_argument("--misses-only", action="store_true", help="print only the targets missed")
    args = ap.parse_args()
    if not args.peers and not args.flex:
        ap.error("give --peers, --flex or both")
    report = Report(args.misses_only)
    if args.peers:
        with open(args.peers) as f:
            peers = json.load(f)
        print(f"{args.peers}: {peers.get('device', '?')}, {peers.get('dtype', '?')}, "
              f"{peers.get('time', '?')}")
        check_sweep(peers, report)
        check_gpt2(peers, report)
        check_decode(peers, report)
    if args.flex:
        with open(args.flex) as f:
            check_variants(json.load(f), report)
    print(f"\n{report.met} targets met, {report.missed} missed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
