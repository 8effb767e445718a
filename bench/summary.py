"""README headline table, read from a kernel benchmark's JSON (no timing is done here).

``python -m bench summary [--json bench/results/kernels.json]`` prints, for float64 and
N = 1e4, 1e6, 1e7, each kernel's value and value-and-gradient times, their ratio, and the
fused kernel against jax autodiff and the numba hand loop: the table README.md shows, so
that its numbers are the ones the code produced.
"""

from __future__ import annotations

import json

from bench._timing import fmt_ratio, fmt_us
from bench.kernels import DEFAULT_JSON

SIZES = (10**4, 10**6, 10**7)


def add_arguments(p) -> None:
    p.add_argument("--json", default=DEFAULT_JSON, metavar="PATH",
                   help="kernel benchmark results (default: bench/results/kernels.json)")
    p.add_argument("--dtype", default="float64")


def main(args) -> int:
    with open(args.json) as fh:
        doc = json.load(fh)
    m = doc["machine"]
    print(f"Measured {m['date'][:10]} on {m['cpu_model']}, {m['cpu_count']} cores, "
          f"jax {m['jax']} ({m['backend']}), numba {m.get('numba')}; {args.dtype}, median "
          "per call. autodiff = jax.value_and_grad of the jax.scipy.stats log-density (for the "
          "propto rows "
          "too, i.e. with log k!; the plain formula for EAM); numba = single-thread hand "
          "loop allocating its gradient. All tables: python -m bench kernels.\n")
    print("| kernel | N | value µs | v&g µs | v&g / value | floor / value | autodiff v&g µs "
          "| autodiff / fused | numba v&g µs | fused / numba |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in doc["results"]:
        if r["dtype"] != args.dtype or r["n"] not in SIZES:
            continue
        v = r["variants"]
        base = "stats" if "stats" in r["baselines"] else r["baselines"][0]
        q = r["ratios"]
        decade = len(str(r["n"])) - 1
        print(f"| `{r['kernel']}` | 10^{decade} | {fmt_us(v['fused.value']['median'])} "
              f"| {fmt_us(v['fused.vg']['median'])} | {fmt_ratio(q['fused_vg_over_value'])} "
              f"| {fmt_ratio(q.get('floor_vg_over_value'))} "
              f"| {fmt_us(v[base + '.vg']['median'])} "
              f"| {fmt_ratio(q[base + '_vg_over_fused_vg'])} "
              f"| {fmt_us(v['numba.vg']['median'])} | {fmt_ratio(q['fused_vg_over_numba_vg'])} |")
    return 0
