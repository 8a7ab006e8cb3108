#!/usr/bin/env python3
"""Draws what bench/compare_sdpa.py measured: TFLOP/s against seqlen for each head dim, ours
beside PyTorch SDPA's FlashAttention-2 and cuDNN backends, forward and backward, causal and not;
and, where a run has them, the decode cases' bandwidth. One PNG per figure, beside the data:

  python3 bench/plot_peers.py docs/perf/h200-2026-12-01

reads RUN_DIR/peers.json (compare_sdpa.py --out) and, when present, the decode cases: the
"decode" list of peers.json or RUN_DIR/decode.json (records of B, Nk, Nq and ours_TBps,
fa2_TBps, cudnn_TBps), and writes RUN_DIR/forward.png, backward.png and decode.png.
--peers, --decode and --out name other files and folders. Needs matplotlib.
"""

import argparse
import json
import math
import os
import sys

# Who is drawn, in the JSON's names, with a label and a line style each; ours first.
PEERS = [("ours", "flashattn (ours)", "-", "o"),
         ("fa2", "FlashAttention-2 (SDPA)", "--", "s"),
         ("cudnn", "cuDNN (SDPA)", ":", "^")]
PASSES = [("fwd", "forward", "forward.png"), ("bwd", "backward", "backward.png")]


def seqlen_label(n):
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def sweep_curves(records, mode):
    """{(head_dim, causal): {peer: [(seqlen, TFLOP/s)]}} of our flash rows, sorted by seqlen;
    a measurement that is missing (a backend declined the shape) is left out."""
    curves = {}
    for r in records:
        if r.get("algo", "flash") != "flash":
            continue
        panel = curves.setdefault((r["head_dim"], r["causal"]), {p[0]: [] for p in PEERS})
        for peer, *_ in PEERS:
            value = r.get(f"{peer}_{mode}_tflops")
            if value is not None and math.isfinite(value):
                panel[peer].append((r["seqlen"], value))
    for panel in curves.values():
        for points in panel.values():
            points.sort()
    return curves


def decode_label(case):
    queries = case.get("Nq", 1)
    causal = " causal" if case.get("causal") else ""
    return (f"B{case['B']}, {seqlen_label(case['Nk'])} keys"
            + ("" if queries == 1 else f",\n{queries} queries{causal}"))


def cudnn_version(number):
    """torch.backends.cudnn.version()'s integer, MAJOR * 10000 + MINOR * 100 + PATCH for
    cuDNN 9, as "9.19.0"."""
    if not isinstance(number, int):
        return "?"
    return f"{number // 10000}.{number // 100 % 100}.{number % 100}"


def run_caption(data, with_time=True):
    caption = (f"{data.get('device', '?')}, libflashattn {data.get('libflashattn', '?')}, "
               f"torch {data.get('torch', '?')}, cuDNN {cudnn_version(data.get('cudnn'))}")
    if with_time:
        caption = f"{data.get('dtype', '?')}, {caption}, {data.get('time', '')}"
    return caption


def draw_sweep(plt, data, mode, title, path):
    curves = sweep_curves(data["sweep"], mode)
    dims = sorted({d for d, _ in curves})
    causals = sorted({c for _, c in curves})
    fig, axes = plt.subplots(len(causals), len(dims), figsize=(4.2 * len(dims), 3.4 * len(causals)),
                             sharex=True, sharey=True, squeeze=False)
    top = max((v for panel in curves.values() for pts in panel.values() for _, v in pts), default=1)
    for row, causal in enumerate(causals):
        for col, d in enumerate(dims):
            ax = axes[row][col]
            panel = curves.get((d, causal), {})
            for peer, label, style, marker in PEERS:
                points = panel.get(peer, [])
                if points:
                    ax.plot([n for n, _ in points], [v for _, v in points], style, marker=marker,
                            label=label, linewidth=1.8 if peer == "ours" else 1.3)
            seqlens = sorted({n for pts in panel.values() for n, _ in pts})
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqlens, [seqlen_label(n) for n in seqlens])
            ax.set_ylim(0, top * 1.08)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"head dim {d}{', causal' if causal else ''}", fontsize=10)
            if row == len(causals) - 1:
                ax.set_xlabel("seqlen (batch = 16k tokens / seqlen)")
            if col == 0:
                ax.set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{title}: TFLOP/s against seqlen\n{run_caption(data)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_decode(plt, cases, caption, path):
    width = 0.8 / len(PEERS)
    fig, ax = plt.subplots(figsize=(1.3 * len(cases) + 2, 3.8))
    for i, (peer, label, _, _) in enumerate(PEERS):
        xs = [j + (i - (len(PEERS) - 1) / 2) * width for j in range(len(cases))]
        values = [c.get(f"{peer}_TBps") or 0.0 for c in cases]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.set_xticks(range(len(cases)), [decode_label(c) for c in cases], fontsize=8)
    ax.set_ylabel("TB/s of K and V read")
    ax.set_ylim(0, max((c.get(f"{p[0]}_TBps") or 0.0 for c in cases for p in PEERS), default=1) * 1.12)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"Decode: bandwidth of the KV read\n{caption}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_run(peers_path, decode_path, out):
    """Writes the PNG files of a run into out; returns their names (None without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_peers: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return None

    with open(peers_path) as f:
        data = json.load(f)
    os.makedirs(out, exist_ok=True)
    written = []
    if data.get("sweep"):
        for mode, title, name in PASSES:
            draw_sweep(plt, data, mode, title.capitalize(), os.path.join(out, name))
            written.append(name)
    decode = data.get("decode")
    if not decode and decode_path and os.path.exists(decode_path):
        with open(decode_path) as f:
            decode = json.load(f)
        if isinstance(decode, dict):  # compare_sdpa.py --decode --out: the cases are one key
            decode = decode.get("decode")
    if decode:
        # The decode cases come from a script of their own: only the run's setup is theirs too.
        draw_decode(plt, decode, run_caption(data, with_time=False), os.path.join(out, "decode.png"))
        written.append("decode.png")
    if not written:
        print(f"plot_peers: {peers_path} has no sweep and no decode cases", file=sys.stderr)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="folder of a run: peers.json, optionally decode.json")
    ap.add_argument("--peers", help="compare_sdpa.py's JSON (default: RUN_DIR/peers.json)")
    ap.add_argument("--decode", help="decode cases' JSON (default: RUN_DIR/decode.json if there)")
    ap.add_argument("--out", help="folder for the PNG files (default: RUN_DIR)")
    args = ap.parse_args()
    peers_path = args.peers or os.path.join(args.run_dir, "peers.json")
    decode_path = args.decode or os.path.join(args.run_dir, "decode.json")
    out = args.out or args.run_dir
    written = plot_run(peers_path, decode_path, out)
    if not written:
        return 1
    print(f"plot_peers: wrote {', '.join(written)} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
