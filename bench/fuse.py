"""fuse benchmark: kernels built with ``fusedlp.fuse`` vs jax autodiff of the same density.

For every kernel built with :func:`fusedlp.fuse` (and a ``fuse``-built normal, against the
hand-written :func:`fusedlp.normal_lpdf`), float64, N = 10^3 ... 10^6 by decades, this
times in one run, jitted, after compilation:

* **fused** — the kernel: value, and value-and-gradient with respect to every parameter;
* **autodiff** — ``jax.value_and_grad`` of ``jnp.sum`` of the ``jax.scipy.stats`` log-density
  (or the plain formula where jax.scipy.stats has none): the same value and gradient;
* **autodiff[f]** — ``jax.value_and_grad`` of ``jnp.sum(vmap(f))`` for the kernel's *own*
  element function ``f`` (edge verdicts and all), with no custom rule: what a user gets
  without ``fuse`` for the same formula;
* **fuse[grad]** — the same kernel with fuse's forward rule switched to reverse mode per
  element (``vmap(value_and_grad(f))``), the design alternative: value-and-gradient only;
* for the normal: **hand** — ``fusedlp.normal_lpdf``, the hand-derived rule.

The workload is a regression-like one: the location-type parameter is a vector (one per
observation), the shape-type parameters are scalars, and all of them are differentiated.
Before timing, every variant's value and gradient is compared with autodiff (rtol 1e-9); a
disagreement aborts the run. Where fuse's value path is the plain sum (most cases), the fused
value and autodiff[f]'s value compile to the same program (compared as optimized HLO text):
that pair is an A/A test, and the targets table reports its ratios as the run's own noise.
Timing is ``bench/_timing.py``'s: round-robin over variants, ``block_until_ready`` per call,
median reported. JAX's asynchronous CPU dispatch is off.

Run ``python -m bench fuse --help``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import jax
import numpy as np

from bench import _timing
from bench._timing import NOISE, fmt_ratio, fmt_us



class CorrectnessError(RuntimeError):
    """A fused kernel and autodiff disagree: nothing is timed."""


@dataclass
class Case:
    key: str
    title: str
    workload: str
    make: Callable  # (n, rng) -> (params tuple (differentiated), data tuple), numpy float64
    fused: Callable  # (params, data) -> scalar
    autodiff: Callable  # (params, data) -> scalar
    fused_grad_mode: Callable  # the same kernel with fuse's reverse-mode-per-element rule
    autodiff_own: Callable  # jnp.sum(vmap(f)) of the kernel's own f, no rule: plain autodiff
    hand: Callable | None = None


def _cases() -> list[Case]:
    import jax.numpy as jnp
    import jax.scipy.special as jsp
    import jax.scipy.stats as jst

    import fusedlp
    from fusedlp import binomial, gamma, negative_binomial, student_t
    from fusedlp._fuse import fuse, kernel

    def refuse(element, mode="grad", **kw):  # the same element function, another mode
        return kernel(element, mode=mode, **kw)

    half_log_2pi = 0.5 * math.log(2 * math.pi)

    def normal_element(x, loc, scale):
        z = (x - loc) / scale
        return -0.5 * z * z - jnp.log(scale) - half_log_2pi

    fuse_normal = fuse(normal_element)
    fuse_normal_grad = kernel(normal_element, mode="grad")
    fuse_normal_auto = kernel(normal_element, mode="autodiff")

    def normal_make(n, rng):
        loc = rng.normal(0.0, 0.5, n)
        return (loc, np.float64(1.3)), (0.3 + loc + rng.normal(0.0, 1.3, n),)

    def t_make(n, rng):
        loc = rng.normal(0.0, 0.5, n)
        return (np.float64(4.0), loc, np.float64(1.3)), (loc + 1.3 * rng.standard_t(4.0, n),)

    def gamma_make(n, rng):
        rate = rng.uniform(0.5, 2.0, n)
        return (np.float64(2.5), rate), (rng.gamma(2.5, 1.0 / rate),)

    def nb_make(n, rng):
        mean = rng.uniform(0.5, 5.0, n)
        phi = 2.0
        return (mean, np.float64(phi)), (
            rng.negative_binomial(phi, phi / (mean + phi)).astype(np.int32),)

    def bern_make(n, rng):
        eta = rng.normal(0.0, 2.0, n)
        return (eta,), ((rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(np.int32),)

    def binom_make(n, rng):
        eta = rng.normal(0.0, 1.0, n)
        trials = rng.integers(1, 20, n)
        return (eta,), (rng.binomial(trials, 1 / (1 + np.exp(-eta))).astype(np.int32),
                        trials.astype(np.int32))

    def _nb_plain(k, mean, phi):
        return jnp.sum(jsp.gammaln(k + phi) - jsp.gammaln(phi) + jsp.xlogy(k, mean)
                       - k * jnp.log(mean + phi) - phi * jnp.log1p(mean / phi))

    st_t, st_a = (refuse(student_t._student_t_element, m) for m in ("grad", "autodiff"))
    ga_g, ga_a = (refuse(gamma._gamma_element, m) for m in ("grad", "autodiff"))
    nb_g, nb_a = (refuse(negative_binomial._negative_binomial_element, m, data=("k",))
                  for m in ("grad", "autodiff"))
    be_g, be_a = (refuse(binomial._bernoulli_logit_element, m, data=("y",))
                  for m in ("grad", "autodiff"))
    bi_g, bi_a = (refuse(binomial._binomial_logit_element, m, data=("k", "n"))
                  for m in ("grad", "autodiff"))
    del student_t, gamma, negative_binomial, binomial

    return [
        Case("fuse_normal", "fuse-built normal vs normal_lpdf", "y ~ N(loc_i, 1.3); "
             "d/d(loc vector, scale scalar); fused = fuse(-z^2/2 - log scale - log(2pi)/2)",
             normal_make,
             lambda p, d: fuse_normal(d[0], *p),
             lambda p, d: jnp.sum(jst.norm.logpdf(d[0], *p)),
             lambda p, d: fuse_normal_grad(d[0], *p),
             lambda p, d: fuse_normal_auto(d[0], *p),
             hand=lambda p, d: fusedlp.normal_lpdf(d[0], *p)),
        Case("student_t", "student_t_lpdf(x, df, loc, scale)",
             "d/d(df scalar, loc vector, scale scalar); autodiff of jax.scipy.stats.t.logpdf",
             t_make,
             lambda p, d: fusedlp.student_t_lpdf(d[0], *p),
             lambda p, d: jnp.sum(jst.t.logpdf(d[0], *p)),
             lambda p, d: st_t(d[0], *p),
             lambda p, d: st_a(d[0], *p)),
        Case("gamma", "gamma_lpdf(x, shape, rate)",
             "d/d(shape scalar, rate vector); autodiff of jax.scipy.stats.gamma.logpdf"
             "(x, shape, scale=1/rate)",
             gamma_make,
             lambda p, d: fusedlp.gamma_lpdf(d[0], *p),
             lambda p, d: jnp.sum(jst.gamma.logpdf(d[0], p[0], scale=1.0 / p[1])),
             lambda p, d: ga_g(d[0], *p),
             lambda p, d: ga_a(d[0], *p)),
        Case("negative_binomial", "negative_binomial_lpmf(k, mean, concentration)",
             "d/d(mean vector, concentration scalar), k int32; autodiff of "
             "jax.scipy.stats.nbinom.logpmf(k, phi, phi/(mean+phi))",
             nb_make,
             lambda p, d: fusedlp.negative_binomial_lpmf(d[0], *p),
             lambda p, d: jnp.sum(jst.nbinom.logpmf(d[0], p[1], p[1] / (p[0] + p[1]))),
             lambda p, d: nb_g(d[0], *p),
             lambda p, d: nb_a(d[0], *p)),
        Case("negative_binomial_propto", "negative_binomial_lpmf(..., normalized=False)",
             "as above without log k!; autodiff of the plain formula gammaln(k+phi) - "
             "gammaln(phi) + xlogy(k, mean) - k log(mean+phi) - phi log1p(mean/phi)",
             nb_make,
             lambda p, d: fusedlp.negative_binomial_lpmf(d[0], *p, normalized=False),
             lambda p, d: _nb_plain(d[0].astype(p[0].dtype), *p),
             lambda p, d: nb_g(d[0], *p, normalized=False),
             lambda p, d: nb_a(d[0], *p, normalized=False)),
        Case("bernoulli_logit", "bernoulli_logit_lpmf(y, logit)",
             "d/d(logit vector), y int32; autodiff of the plain y*eta - softplus(eta) "
             "(jax.scipy.stats.bernoulli.logpmf(y, expit(eta)) is not stable)",
             bern_make,
             lambda p, d: fusedlp.bernoulli_logit_lpmf(d[0], *p),
             lambda p, d: jnp.sum(d[0] * p[0] - jax.nn.softplus(p[0])),
             lambda p, d: be_g(d[0], *p),
             lambda p, d: be_a(d[0], *p)),
        Case("binomial_logit", "binomial_logit_lpmf(k, n, logit)",
             "d/d(logit vector), k, n int32 (n in 1..19); autodiff of "
             "jax.scipy.stats.binom.logpmf(k, n, expit(eta))",
             binom_make,
             lambda p, d: fusedlp.binomial_logit_lpmf(d[0], d[1], *p),
             lambda p, d: jnp.sum(jst.binom.logpmf(d[0], d[1], jax.nn.sigmoid(p[0]))),
             lambda p, d: bi_g(d[0], d[1], *p),
             lambda p, d: bi_a(d[0], d[1], *p)),
    ]


def _variants(case: Case) -> dict[str, Callable]:
    """name -> f(params, data) returning the value or (value, grads)."""
    vg = jax.value_and_grad  # grads w.r.t. the params tuple (argument 0)
    out = {
        "fused.value": case.fused,
        "fused.vg": vg(case.fused),
        "autodiff.value": case.autodiff,
        "autodiff.vg": vg(case.autodiff),
        "fuse[grad].vg": vg(case.fused_grad_mode),
        "autodiff[f].value": case.autodiff_own,
        "autodiff[f].vg": vg(case.autodiff_own),
    }
    if case.hand is not None:
        out["hand.value"] = case.hand
        out["hand.vg"] = vg(case.hand)
    return out


def _check(case: Case, n: int, outputs: dict) -> dict:
    ref_v, ref_g = outputs["autodiff.vg"]
    ref_g = [np.asarray(g, np.float64) for g in jax.tree_util.tree_leaves(ref_g)]
    problems, errs = [], {}
    for name, out in outputs.items():
        v, g = (out, None) if name.endswith(".value") else out
        rel = abs(float(v) - float(ref_v)) / max(abs(float(ref_v)), 1e-300)
        errs[name] = {"value_rel_err": rel}
        if not rel <= 1e-9:
            problems.append(f"{name}: value {float(v)!r} vs autodiff {float(ref_v)!r}")
        if g is not None:
            for a, b in zip(jax.tree_util.tree_leaves(g), ref_g):
                a = np.asarray(a, np.float64)
                scale = float(np.max(np.abs(b))) if b.size else 1.0
                if a.shape != b.shape or not np.allclose(a, b, rtol=1e-9, atol=1e-9 * scale):
                    problems.append(f"{name}: gradient differs from autodiff")
    if problems:
        raise CorrectnessError(f"{case.key} N={n}: " + "; ".join(problems))
    return errs


def bench_one(case: Case, n: int, cfg: dict) -> dict:
    import jax.numpy as jnp

    rng = np.random.default_rng([20240602, n, len(case.key)])
    params, data = case.make(n, rng)
    params = tuple(jnp.asarray(p) for p in params)
    data = tuple(jnp.asarray(d) for d in data)
    fns, compile_s = {}, {}
    for name, f in _variants(case).items():
        jitted, lower_s, comp_s = _timing.aot_compile(f, params, data)
        fns[name] = jitted
        compile_s[name] = lower_s + comp_s
    outputs = {name: jax.device_get(f(params, data)) for name, f in fns.items()}
    errs = _check(case, n, outputs)
    # Where fuse's value path is the plain sum, the fused value and autodiff[f]'s value are
    # one program compiled twice: an A/A pair, whose timing ratio shows this run's noise.
    same = (_timing.program_text(case.fused, params, data)
            == _timing.program_text(case.autodiff_own, params, data))
    stats = _timing.time_interleaved(
        {name: partial(f, params, data) for name, f in fns.items()},
        min_repeats=cfg["min_repeats"], min_total=cfg["min_total"],
        max_total=cfg["max_total"])
    med = {name: s.median for name, s in stats.items()}
    ratios = {
        "autodiff_value_over_fused_value": med["autodiff.value"] / med["fused.value"],
        "autodiff_vg_over_fused_vg": med["autodiff.vg"] / med["fused.vg"],
        "fused_vg_over_fused_value": med["fused.vg"] / med["fused.value"],
        "fusegrad_vg_over_fused_vg": med["fuse[grad].vg"] / med["fused.vg"],
        "autodiff_f_value_over_fused_value": med["autodiff[f].value"] / med["fused.value"],
        "autodiff_f_vg_over_fused_vg": med["autodiff[f].vg"] / med["fused.vg"],
    }
    if "hand.vg" in med:
        ratios["fused_vg_over_hand_vg"] = med["fused.vg"] / med["hand.vg"]
        ratios["fused_value_over_hand_value"] = med["fused.value"] / med["hand.value"]
    return {"case": case.key, "kernel": case.title, "workload": case.workload, "n": n,
            "dtype": "float64",
            "variants": {name: {**stats[name].as_dict(), "compile_s": compile_s[name]}
                         for name in fns},
            "ratios": ratios, "check": errs, "value_programs_identical": same}


def _md(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(
        "---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _n(n: int) -> str:
    return f"10^{round(math.log10(n))}"


def tables(results: list[dict]) -> str:
    def med(r, v):
        return r["variants"][v]["median"]

    rows = []
    for r in results:
        if r["case"] == "fuse_normal":
            continue
        q = r["ratios"]
        rows.append([f"`{r['kernel']}`", _n(r["n"]), fmt_us(med(r, "fused.value")),
                     fmt_us(med(r, "autodiff.value")),
                     fmt_ratio(q["autodiff_value_over_fused_value"]),
                     fmt_us(med(r, "fused.vg")), fmt_us(med(r, "autodiff.vg")),
                     fmt_ratio(q["autodiff_vg_over_fused_vg"]),
                     fmt_ratio(q["autodiff_f_value_over_fused_value"]),
                     fmt_ratio(q["autodiff_f_vg_over_fused_vg"]),
                     fmt_ratio(q["fused_vg_over_fused_value"]),
                     fmt_ratio(q["fusegrad_vg_over_fused_vg"])])
    out = ["### fuse-built kernels vs jax autodiff (float64, median µs per call)\n",
           ("autodiff = jax.value_and_grad of jnp.sum of the jax.scipy.stats log-density (plain "
            "formula where noted); autodiff[f] = the same of jnp.sum(vmap(f)) for the kernel's "
            "own element function f, no custom rule; ratios > 1: fused is faster. "
            "fuse[grad]/fused: the same kernel with fuse's rule in reverse mode per element "
            "instead of forward mode (> 1: forward mode, the default, is faster).\n"),
           _md(["kernel", "N", "fused value", "autodiff value", "autodiff/fused value",
                "fused v&g", "autodiff v&g", "autodiff/fused v&g", "autodiff[f]/fused value",
                "autodiff[f]/fused v&g", "fused v&g/value", "fuse[grad]/fused v&g"], rows), ""]
    rows = []
    for r in results:
        if r["case"] != "fuse_normal":
            continue
        q = r["ratios"]
        rows.append([_n(r["n"]), fmt_us(med(r, "hand.value")), fmt_us(med(r, "fused.value")),
                     fmt_us(med(r, "hand.vg")), fmt_us(med(r, "fused.vg")),
                     fmt_ratio(q["fused_vg_over_hand_vg"]), fmt_us(med(r, "autodiff.vg")),
                     fmt_ratio(q["autodiff_vg_over_fused_vg"]),
                     fmt_ratio(q["autodiff_f_vg_over_fused_vg"]),
                     fmt_ratio(q["fusegrad_vg_over_fused_vg"])])
    if rows:
        out += ["### fuse-built normal vs the hand-written normal_lpdf (float64, µs)\n",
                ("y ~ N(loc_i, 1.3), d/d(loc vector, scale scalar); fuse-normal = "
                 "`fuse(lambda x, loc, scale: -0.5*z*z - log(scale) - log(2pi)/2)`.\n"),
                _md(["N", "normal_lpdf value", "fuse value", "normal_lpdf v&g", "fuse v&g",
                     "fuse/normal_lpdf v&g", "autodiff v&g", "autodiff/fuse v&g",
                     "autodiff[f]/fuse v&g", "fuse[grad]/fuse v&g"], rows), ""]
    return "\n".join(out)


def evaluate_targets(results: list[dict]) -> list[dict]:
    targets = []
    m = [(r["n"], r["ratios"]["fused_vg_over_hand_vg"]) for r in results
         if r["case"] == "fuse_normal" and r["n"] >= 10**4]
    if m:
        targets.append({
            "target": "fuse-built normal v&g within 1.2x of normal_lpdf at N >= 1e4",
            "met": all(x <= 1.2 for _, x in m),
            "detail": ", ".join(f"N={_n(n)}: {x:.2f}x" for n, x in m)})
    aa = [(r["case"], r["n"], r["ratios"]["autodiff_f_value_over_fused_value"])
          for r in results if r.get("value_programs_identical")]
    if aa:
        out = [x for x in aa if abs(x[2] - 1) > NOISE]
        targets.append({
            "target": "A/A noise: the same compiled program timed as two variants (fused "
                      "value vs autodiff[f] value, where fuse's value is the plain sum)",
            "met": None,
            "detail": f"{len(aa)} pairs, ratio {min(x[2] for x in aa):.2f}-"
                      f"{max(x[2] for x in aa):.2f}; outside 1 +- {NOISE:.2f}: " + (
                          ", ".join(f"{c} {_n(n)} ({x:.2f})" for c, n, x in out) or "none")})
    # "Autodiff of the same formula", read both ways: of the kernel's own element function
    # (what fuse itself adds or costs), and of the jax.scipy.stats / plain formulation (which
    # has no edge verdicts of its own).
    for key, what in (("autodiff_f", ("autodiff of its own element function f "
                                      "(jnp.sum(vmap(f)))")),
                      ("autodiff", "autodiff of the jax.scipy.stats (or plain) formula")):
        m = [(r["case"], r["n"], kind, r["ratios"][f"{key}_{kind}_over_fused_{kind}"])
             for r in results for kind in ("value", "vg")]
        if not m:
            continue
        bad = [x for x in m if x[3] < 1 - NOISE]
        worst = min(m, key=lambda x: x[3])
        targets.append({
            "target": f"no fuse-built kernel slower than {what} beyond noise ({NOISE:.0%})",
            "met": not bad,
            "detail": f"worst {key}/fused = {worst[3]:.2f} ({worst[0]} {worst[2]} "
                      f"N={_n(worst[1])})" + ("; below: " + ", ".join(
                          f"{c} {k} {_n(n)} ({x:.2f})" for c, n, k, x in bad) if bad else "")})
    for key, what in (("autodiff", "autodiff"), ("autodiff_f", "autodiff[f]")):
        wins = [(r["case"], r["n"], r["ratios"][f"{key}_vg_over_fused_vg"]) for r in results
                if r["ratios"][f"{key}_vg_over_fused_vg"] > 1 + NOISE]
        targets.append({
            "target": f"where fuse wins (v&g, {what}/fused > {1 + NOISE:.2f})", "met": None,
            "detail": ", ".join(f"{c} {_n(n)}: {x:.2f}x" for c, n, x in wins) or "nowhere"})
    return targets


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="N = 10^3, 10^4 and few repeats (well under a minute)")
    _timing.add_json_argument(p, "fuse.json")
    p.add_argument("--kernels", default=None,
                   help="comma-separated subset of the case keys (default: all)")
    p.add_argument("--max-n", type=float, default=1e6, help="largest N (default 1e6)")


def main(args) -> int:
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    cases = _cases()
    if args.kernels:
        keys = [k.strip() for k in args.kernels.split(",") if k.strip()]
        unknown = sorted(set(keys) - {c.key for c in cases})
        if unknown:
            raise SystemExit(f"unknown kernel(s) {unknown}; choose from "
                             f"{','.join(c.key for c in cases)}")
        cases = [c for c in cases if c.key in keys]
    top = min(args.max_n, 1e4) if args.quick else args.max_n
    sizes = [10**e for e in range(3, 7) if 10**e <= top * (1 + 1e-9)]
    cfg = ({"min_repeats": 5, "min_total": 0.02, "max_total": 0.1} if args.quick else
           {"min_repeats": 7, "min_total": 0.2, "max_total": 1.0})
    machine = _timing.machine_info()
    log = partial(print, file=sys.stderr, flush=True)
    log(f"# fuse benchmark on {machine['cpu_model']} ({machine['cpu_count']} cores), "
        f"jax {machine['jax']} {machine['backend']}; sizes {sizes}")
    t_start = time.perf_counter()
    results = []
    for case in cases:
        for n in sizes:
            t0 = time.perf_counter()
            r = bench_one(case, n, cfg)
            results.append(r)
            log(f"  {case.key:26s} N={n:<8d} fused v&g "
                f"{fmt_us(r['variants']['fused.vg']['median']):>8s} µs  autodiff/fused "
                f"{r['ratios']['autodiff_vg_over_fused_vg']:.2f}  "
                f"({time.perf_counter() - t0:.1f} s)")
    wall = time.perf_counter() - t_start
    targets = evaluate_targets(results)
    print("## fusedlp.fuse benchmark\n")
    print(f"{machine['date']}: {machine['cpu_model']}, {machine['cpu_count']} cores; "
          f"jax/jaxlib {machine['jax']}/{machine['jaxlib']} ({machine['backend']}), float64. "
          f"Wall time {wall:.0f} s; load average at start "
          f"{machine.get('load_average_1_5_15min')}.\n")
    print(tables(results))
    print(_timing.targets_md(targets))
    if args.json:
        _timing.write_json(args.json, {
            "benchmark": "fusedlp.fuse", "machine": machine,
            "config": {**cfg, "quick": bool(args.quick)}, "sizes": sizes,
            "results": results, "targets": targets}, wall)
        log(f"# wrote {args.json} ({wall:.0f} s)")
    return 0
