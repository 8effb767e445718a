"""Hessians: each kernel's ``fusedlp.hessian`` against ``jax.hessian`` of autodiff.

Curvature is what a Newton fit, ``fusedlp.summary``'s standard errors and a Laplace
approximation pay for on every call. For every kernel (the cases of ``python -m bench
contexts``, the same densities and data), float64, data as ``jit`` arguments, this times in
one run, round-robin after compilation:

* **fused** — :func:`fusedlp.hessian` (reverse over reverse, through the kernel's own rules);
* **autodiff** — ``jax.hessian`` (forward over reverse) of ``jnp.sum`` of the
  ``jax.scipy.stats`` log-density (the plain formula for ``normalized=False``): what a user
  without fusedlp calls.

Two workloads per kernel:

* ``scalar`` — the Hessian with respect to every parameter, each a scalar (a 1x1 to 3x3
  matrix: all second partials are reductions over the data);
* ``glm`` — the Hessian with respect to 5 regression coefficients, the vector parameter
  being ``X @ beta`` through the kernel's natural link (exp for a rate, a mean or the gamma's
  rate, the identity otherwise), the other parameters held at fixed values.

Both Hessians are compared before anything is timed (relative to the largest entry,
1e-7); a disagreement aborts the run. Compile time (lower + compile) is reported for each.

Run ``python -m bench hessian --help``.
"""

from __future__ import annotations

import statistics
import sys
import time
from functools import partial

import jax
import numpy as np

from bench import _timing
from bench._timing import fmt_ratio, fmt_sig, fmt_us

WORKLOADS = ("scalar", "glm")
P_GLM = 5
# the vector parameter through exp (a rate or mean must be positive); identity otherwise
EXP_LINK = ("poisson", "negative_binomial", "gamma")


def _programs(case, n: int, rng) -> dict:
    """Per workload: (fused hessian fn, autodiff hessian fn, args)."""
    import jax.numpy as jnp

    data, vec, scalars = case.make(n, rng)
    data = tuple(jnp.asarray(a.astype(np.int32) if a.dtype.kind == "i" else a) for a in data)
    theta = jnp.asarray(scalars, jnp.float64)
    at = case.vector_at

    def scalar_ll(fn):
        return lambda theta, d: fn(d, *theta)

    # glm: X @ beta through the link, started where the vector parameter's values lie
    X = np.column_stack([np.ones(n), rng.normal(0.0, 1.0, (n, P_GLM - 1))])
    exp_link = any(case.name.startswith(k) for k in EXP_LINK)
    center = np.log(np.mean(vec)) if exp_link else float(np.mean(vec))
    beta = jnp.asarray([center, 0.1, -0.1, 0.05, 0.02])
    others = tuple(float(s) for s in scalars)

    def glm_ll(fn):
        def ll(beta, d, X):
            eta = X @ beta
            v = jnp.exp(eta) if exp_link else eta
            return fn(d, *others[:at], v, *others[at + 1:])
        return ll

    return {"scalar": (scalar_ll(case.fused), scalar_ll(case.baseline), (theta, data)),
            "glm": (glm_ll(case.fused), glm_ll(case.baseline), (beta, data, jnp.asarray(X)))}


def bench_case(case, n: int, cfg: dict) -> dict:
    import fusedlp

    rng = np.random.default_rng(0)
    row = {"kernel": case.name, "baseline": case.baseline_name, "n": n, "workloads": {}}
    for wl, (fused_ll, base_ll, args) in _programs(case, n, rng).items():
        calls, compile_s, hs = {}, {}, {}
        for name, h in (("fused", fusedlp.hessian(fused_ll)), ("autodiff", jax.hessian(base_ll))):
            jitted, lower_s, comp_s = _timing.aot_compile(h, *args)
            calls[name] = partial(jitted, *args)
            compile_s[name] = lower_s + comp_s
            hs[name] = np.asarray(calls[name]())
        scale = np.max(np.abs(hs["autodiff"]))
        err = float(np.max(np.abs(hs["fused"] - hs["autodiff"])) / scale)
        if not np.isfinite(err) or err > 1e-7:
            raise RuntimeError(f"{case.name} {wl} N={n}: Hessians differ by {err:.2e} of the "
                               f"largest entry\nfused {hs['fused']}\nautodiff {hs['autodiff']}")
        stats = _timing.time_interleaved(calls, min_repeats=cfg["min_repeats"],
                                         min_total=cfg["min_total"], max_total=cfg["max_total"])
        f, b = stats["fused"].median, stats["autodiff"].median
        row["workloads"][wl] = {
            "size": int(hs["fused"].shape[0]), "fused_s": f, "autodiff_s": b, "ratio": b / f,
            "compile_fused_s": compile_s["fused"], "compile_autodiff_s": compile_s["autodiff"],
            "max_rel_diff": err,
            "timing": {k: v.as_dict() for k, v in stats.items()}}
    return row


def table(rows: list[dict]) -> str:
    lines = ["| kernel | N | workload | size | fused µs | autodiff µs | autodiff / fused "
             "| compile fused s | compile autodiff s |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        for wl in WORKLOADS:
            w = r["workloads"][wl]
            lines.append(
                f"| {r['kernel']} | {r['n']:,} | {wl} | {w['size']}x{w['size']} "
                f"| {fmt_us(w['fused_s'])} | {fmt_us(w['autodiff_s'])} | {fmt_ratio(w['ratio'])} "
                f"| {fmt_sig(w['compile_fused_s'], 2)} | {fmt_sig(w['compile_autodiff_s'], 2)} |")
    return "\n".join(lines)


def overview(rows: list[dict]) -> list[dict]:
    """The run in a few numbers (measurements, not targets: the issues set none here)."""
    out = []
    for wl in WORKLOADS:
        ratios = [(r["workloads"][wl]["ratio"], r["kernel"], r["n"]) for r in rows]
        if not ratios:
            continue
        lo, hi = min(ratios), max(ratios)
        out.append({
            "target": f"{wl}: autodiff / fused", "met": None,
            "detail": (f"median {statistics.median(x[0] for x in ratios):.2f}; "
                       f"lowest {lo[0]:.2f} ({lo[1]}, N={lo[2]:,}), "
                       f"highest {hi[0]:.2f} ({hi[1]}, N={hi[2]:,})")})
    return out


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true", help="N = 10^4 only, few repeats")
    p.add_argument("--sizes", default="1e4,1e6", help="comma-separated N (default 1e4,1e6)")
    p.add_argument("--kernels", default=None,
                   help="comma-separated subset of kernel names (default: all)")
    _timing.add_json_argument(p, "hessian.json")


def main(args) -> int:
    from bench import contexts

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    sizes = [10_000] if args.quick else [int(float(s)) for s in args.sizes.split(",")]
    cfg = ({"min_repeats": 3, "min_total": 0.02, "max_total": 0.2} if args.quick else
           {"min_repeats": 11, "min_total": 0.3, "max_total": 3.0})
    log = partial(print, file=sys.stderr, flush=True)
    machine = _timing.machine_info()
    t_start = time.perf_counter()
    rows = contexts.run_cases(
        contexts.selected_cases(args.kernels), sizes, partial(bench_case, cfg=cfg), log,
        lambda row: " ".join(f"{wl} {w['ratio']:.2f}" for wl, w in row["workloads"].items()))
    wall = time.perf_counter() - t_start
    summary = overview(rows)
    print("## Hessians: fusedlp.hessian against jax.hessian of autodiff\n")
    print(f"{machine['date']}: {machine['cpu_model']}, {machine['cpu_count']} cores; jax "
          f"{machine['jax']} ({machine['backend']}), float64. Wall time {wall:.0f} s.\n")
    print(table(rows) + "\n")
    print(_timing.targets_md(summary, "This run"))
    if args.json:
        _timing.write_json(args.json, {
            "benchmark": "fusedlp hessian", "machine": machine,
            "config": {"sizes": sizes, **cfg, "quick": args.quick, "p_glm": P_GLM},
            "method": ("jit, AOT lower+compile; fused and autodiff timed round-robin in a "
                       "random order each round; median per-call seconds"),
            "rows": rows, "overview": summary}, wall)
        log(f"# wrote {args.json} ({wall:.0f} s)")
    return 0
