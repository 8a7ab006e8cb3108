"""The small attention every binding's example computes: batch 1, seqlen 16, heads 2, head_dim 8,
causal, inputs from a fixed linear congruential generator, on the CPU; checked against a naive
float64 loop. Prints OK and the largest difference."""
import math

import numpy as np

import flashattn

B, N, H, D = 1, 16, 2, 8


def lcg_values(count, state):
    """count values in [-1, 1) from the LCG x = (1103515245 x + 12345) mod 2^31."""
    out = []
    for _ in range(count):
        state = (1103515245 * state + 12345) % (1 << 31)
        out.append(state / (1 << 30) - 1.0)
    return np.array(out, dtype=np.float32).reshape(B, N, H, D), state


def naive(q, k, v):
    out = np.zeros((B, N, H, D))
    for b in range(B):
        for h in range(H):
            for i in range(N):
                s = [sum(float(q[b, i, h, c]) * float(k[b, j, h, c]) for c in range(D)) / math.sqrt(D)
                     for j in range(i + 1)]  # causal: keys j <= i
                m = max(s)
                p = [math.exp(x - m) for x in s]
                for j, pj in enumerate(p):
                    out[b, i, h] += pj / sum(p) * v[b, j, h].astype(np.float64)
    return out


q, state = lcg_values(B * N * H * D, 1)
k, state = lcg_values(B * N * H * D, state)
v, state = lcg_values(B * N * H * D, state)

out = flashattn.attention(q, k, v, causal=True)

error = float(np.abs(out - naive(q, k, v)).max())
if not error < 1e-5:
    raise SystemExit("FAILED: max error %g" % error)
print("OK python: max error %.3g" % error)
