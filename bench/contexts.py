"""Each kernel's value-and-gradient against autodiff of jax.scipy.stats, in every calling context.

A kernel is called from many places: a jitted loss with the data as arguments, a closure
over concrete data (what ``jax.jit(lambda p: loglik(p, data))`` and NumPyro's MCMC do by
default), a vmapped batch of small problems, a ``lax.while_loop`` (``fit``, NUTS), with
int32 or int64 counts. For every kernel and size this times, in one run and round-robin,
fusedlp's value-and-gradient and that of the baseline a user would otherwise write
(autodiff of ``jax.scipy.stats``; autodiff of the plain formula for ``normalized=False``),
in each context, and reports baseline time / fusedlp time (above 1, fusedlp is faster):

* ``args i32`` / ``args i64``: data passed as ``jit`` arguments, counts as int32 / int64
  (continuous data: float64 in both);
* ``closed``: data closed over (compile-time constants);
* ``vmap x10``: a vmapped batch of 10 problems of N/10 each;
* ``while x5``: five gradient steps inside a ``lax.fori_loop``, data as arguments;
* ``scalar``: the gradient with respect to scalar parameters only (all partials are
  reductions), data as arguments;
* ``grad alone``: ``jax.grad`` without the value (an optax step, a user's own loop), data
  as arguments, int32 counts.

It also reports each compiled program's XLA temporaries
(``compiled.memory_analysis().temp_size_in_bytes``) in units of one N-sized float64 array,
fusedlp beside the baseline, and a NumPyro row: the potential energy's value-and-gradient
of a Poisson regression with the likelihood as NumPyro's own ``Poisson`` against fusedlp's
kernel in ``numpyro.factor``.

Run ``python -m bench contexts --help``.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial

import jax
import numpy as np

from bench import _timing

CONTEXTS = ("args_i32", "args_i64", "closed", "vmap10", "while5", "scalar", "grad")
HEADINGS = {"args_i32": "args i32", "args_i64": "args i64", "closed": "closed",
            "vmap10": "vmap x10", "while5": "while x5", "scalar": "scalar",
            "grad": "grad alone"}
# Targets of issue 15: every cell at or above the noise floor, the median at or above 1.
FLOOR, MEDIAN_TARGET, NUMPYRO_TARGET = 0.9, 1.0, 1.3


@dataclass(frozen=True)
class Case:
    """``fused(data, *params)`` / ``baseline(data, *params)``: the log-density. ``make(n, rng)``
    gives ``(data, vector, params)``: the vector contexts pass ``params`` with entry
    ``vector_at`` replaced by ``vector``; the scalar context passes ``params`` as arrays."""

    name: str
    make: object
    fused: object
    baseline: object
    vector_at: int
    baseline_name: str


def _cases() -> list[Case]:
    import jax.numpy as jnp
    import jax.scipy.special as jsp
    import jax.scipy.stats as jst

    import fusedlp

    def counts(n, rng):
        return (rng.poisson(4.0, n),)

    def count_data(n, rng):
        eta = rng.normal(1.0, 0.3, n)
        return counts(n, rng), eta

    def poisson(n, rng):
        d, eta = count_data(n, rng)
        return d, np.exp(eta), (4.0,)

    def poisson_log(n, rng):
        d, eta = count_data(n, rng)
        return d, eta, (1.4,)

    def nb(n, rng):
        d, eta = count_data(n, rng)
        return d, np.exp(eta), (4.0, 3.0)

    def continuous(n, rng):
        return (rng.normal(0.3, 1.3, n),), rng.normal(0.0, 0.3, n), (0.0, 1.3)

    def t_data(n, rng):
        return (rng.standard_t(5.0, n) * 1.3,), rng.normal(0.0, 0.3, n), (5.0, 0.0, 1.3)

    def gamma(n, rng):
        return (rng.gamma(2.5, 1 / 1.5, n),), rng.uniform(1.0, 2.0, n), (2.5, 1.5)

    def bernoulli(n, rng):
        eta = rng.normal(0.0, 1.0, n)
        return ((rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(np.int64),), eta, (0.2,)

    def binomial(n, rng):
        trials = rng.integers(1, 20, n)
        eta = rng.normal(0.0, 1.0, n)
        return (rng.binomial(trials, 1 / (1 + np.exp(-eta))), trials), eta, (0.2,)

    def nb_prob(mean, conc):
        return conc / (mean + conc)

    return [
        Case("normal", continuous, lambda d, loc, scale: fusedlp.normal_lpdf(d[0], loc, scale),
             lambda d, loc, scale: jnp.sum(jst.norm.logpdf(d[0], loc, scale)), 0,
             "norm.logpdf"),
        Case("poisson", poisson, lambda d, rate: fusedlp.poisson_lpmf(d[0], rate),
             lambda d, rate: jnp.sum(jst.poisson.logpmf(d[0], rate)), 0, "poisson.logpmf"),
        Case("poisson_log", poisson_log, lambda d, eta: fusedlp.poisson_log_lpmf(d[0], eta),
             lambda d, eta: jnp.sum(jst.poisson.logpmf(d[0], jnp.exp(eta))), 0,
             "poisson.logpmf(k, exp(eta))"),
        Case("poisson_log, normalized=False", poisson_log,
             lambda d, eta: fusedlp.poisson_log_lpmf(d[0], eta, normalized=False),
             lambda d, eta: jnp.sum(d[0] * eta - jnp.exp(eta)), 0, "k*eta - exp(eta)"),
        Case("negative_binomial", nb,
             lambda d, mean, conc: fusedlp.negative_binomial_lpmf(d[0], mean, conc),
             lambda d, mean, conc: jnp.sum(jst.nbinom.logpmf(d[0], conc, nb_prob(mean, conc))),
             0, "nbinom.logpmf(k, phi, phi/(mu+phi))"),
        Case("student_t", t_data,
             lambda d, df, loc, scale: fusedlp.student_t_lpdf(d[0], df, loc, scale),
             lambda d, df, loc, scale: jnp.sum(jst.t.logpdf(d[0], df, loc, scale)), 1,
             "t.logpdf"),
        Case("gamma", gamma, lambda d, shape, rate: fusedlp.gamma_lpdf(d[0], shape, rate),
             lambda d, shape, rate: jnp.sum(jst.gamma.logpdf(d[0], shape, scale=1.0 / rate)),
             1, "gamma.logpdf(x, a, scale=1/rate)"),
        Case("bernoulli_logit", bernoulli, lambda d, eta: fusedlp.bernoulli_logit_lpmf(d[0], eta),
             lambda d, eta: jnp.sum(jst.bernoulli.logpmf(d[0], jsp.expit(eta))), 0,
             "bernoulli.logpmf(y, expit(eta))"),
        Case("binomial_logit", binomial,
             lambda d, eta: fusedlp.binomial_logit_lpmf(d[0], d[1], eta),
             lambda d, eta: jnp.sum(jst.binom.logpmf(d[0], d[1], jsp.expit(eta))), 0,
             "binom.logpmf(k, n, expit(eta))"),
    ]


def _programs(fn, at, data, vec, scalars) -> dict:
    """Each context's (compiled program, its arguments)."""
    import jax.numpy as jnp

    def loss(v, d):  # the parameter at `at` is the vector; the others keep their values
        return fn(d, *scalars[:at], v, *scalars[at + 1:])

    def vg(d, v):
        return jax.value_and_grad(loss)(v, d)

    def grad(d, v):
        return jax.grad(loss)(v, d)

    def as_int(a, dt):
        return jnp.asarray(a.astype(dt) if a.dtype.kind == "i" else a)

    d32 = tuple(as_int(a, np.int32) for a in data)
    d64 = tuple(as_int(a, np.int64) for a in data)
    v = jnp.asarray(vec)
    s = tuple(jnp.asarray(x, jnp.float64) for x in scalars)

    def steps(d, v):  # a gradient ascent inside a loop, as a fit or a sampler calls it
        def body(_, carry):
            v, _ = carry
            val, g = vg(d, v)
            return v + 1e-9 * g, val
        return jax.lax.fori_loop(0, 5, body, (v, jnp.zeros((), v.dtype)))

    batched = tuple(a.reshape(10, -1) for a in d32)
    concrete = tuple(np.asarray(a) for a in d32)
    progs = {
        "args_i32": (vg, (d32, v)),
        "args_i64": (vg, (d64, v)),
        "closed": (lambda v: vg(concrete, v), (v,)),
        "vmap10": (jax.vmap(vg), (batched, v.reshape(10, -1))),
        "while5": (steps, (d32, v)),
        "scalar": (lambda d, s: jax.value_and_grad(lambda s: fn(d, *s))(s), (d32, s)),
        "grad": (grad, (d32, v)),
    }
    out = {}
    for ctx, (f, args) in progs.items():
        compiled = jax.jit(f).lower(*args).compile()
        mem = compiled.memory_analysis()
        out[ctx] = (partial(compiled, *args), getattr(mem, "temp_size_in_bytes", None))
    return out


def bench_case(case: Case, n: int, cfg: dict) -> dict:
    rng = np.random.default_rng(0)
    data, vec, scalars = case.make(n, rng)
    fused = _programs(case.fused, case.vector_at, data, vec, scalars)
    base = _programs(case.baseline, case.vector_at, data, vec, scalars)
    # the same numbers from both before anything is timed
    for ctx in [c for c in CONTEXTS if c != "grad"]:
        (fv, fg), (bv, bg) = fused[ctx][0](), base[ctx][0]()
        if ctx == "while5":  # (parameters after five steps, last value)
            fv, fg, bv, bg = fg, fv, bg, bv
        fv, bv = np.sum(np.asarray(fv)), np.sum(np.asarray(bv))  # vmap10: ten values
        if not np.allclose(float(fv), float(bv), rtol=1e-8):
            raise RuntimeError(f"{case.name} {ctx}: value {float(fv)} vs baseline {float(bv)}")
        for a, b in zip(jax.tree.leaves(fg), jax.tree.leaves(bg)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8,
                                       err_msg=f"{case.name} {ctx}: gradient")
    np.testing.assert_allclose(np.asarray(fused["grad"][0]()), np.asarray(base["grad"][0]()),
                               rtol=1e-6, atol=1e-8, err_msg=f"{case.name} grad: gradient")
    row = {"kernel": case.name, "baseline": case.baseline_name, "n": n, "contexts": {}}
    for ctx in CONTEXTS:
        stats = _timing.time_interleaved(
            {"fusedlp": fused[ctx][0], "baseline": base[ctx][0]},
            min_repeats=cfg["min_repeats"], min_total=cfg["min_total"],
            max_total=cfg["max_total"])
        f, b = stats["fusedlp"].median, stats["baseline"].median
        row["contexts"][ctx] = {
            "fusedlp_s": f, "baseline_s": b, "ratio": b / f,
            "temp_arrays_fusedlp": _arrays(fused[ctx][1], n),
            "temp_arrays_baseline": _arrays(base[ctx][1], n)}
    return row


def _arrays(nbytes, n) -> float | None:
    return None if nbytes is None else nbytes / (8.0 * n)


def numpyro_row(n: int, cfg: dict, normalized: bool = True) -> dict:
    """A Poisson regression's potential energy, value and gradient, as NumPyro's sampler
    evaluates it at every leapfrog step: NumPyro's own Poisson against a fusedlp factor,
    normalized or, as docs/jax-and-numpyro.md advises for a sampler (the dropped log k!
    does not depend on the parameters), with ``normalized=False``."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    import scipy.special
    from numpyro.infer.util import initialize_model

    import fusedlp

    p = 5
    rng = np.random.default_rng(3)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, p - 1))])
    y = rng.poisson(np.exp(X @ rng.normal(0.0, 0.3, size=p)))

    def model(X, y, fused):
        b = numpyro.sample("beta", dist.Normal(0.0, 5.0).expand([p]).to_event(1))
        eta = X @ b
        if fused:
            numpyro.factor("loglik", fusedlp.poisson_log_lpmf(y, eta, normalized=normalized))
        else:
            numpyro.sample("y", dist.Poisson(jnp.exp(eta)), obs=y)

    calls, values = {}, {}
    for name, fused in (("fusedlp", True), ("numpyro", False)):
        info, potential_fn, _, _ = initialize_model(jax.random.key(0), partial(model, fused=fused),
                                                    model_args=(X, y))
        z = {"beta": jnp.full(p, 0.1)}
        compiled = jax.jit(jax.value_and_grad(potential_fn)).lower(z).compile()
        calls[name] = partial(compiled, z)
        values[name] = float(calls[name]()[0])
    # the potential is minus the log-density: without log k! it is smaller by sum log k!
    dropped = 0.0 if normalized else float(np.sum(scipy.special.gammaln(y + 1.0)))
    if not np.isclose(values["fusedlp"] + dropped, values["numpyro"], rtol=1e-9):
        raise RuntimeError(f"NumPyro potentials differ: {values}, dropped {dropped}")
    stats = _timing.time_interleaved(calls, min_repeats=cfg["min_repeats"],
                                     min_total=cfg["min_total"], max_total=cfg["max_total"])
    f, b = stats["fusedlp"].median, stats["numpyro"].median
    return {"n": n, "p": p, "normalized": normalized, "fusedlp_s": f, "numpyro_s": b,
            "ratio": b / f}


def _numpyro_kernel(r: dict) -> str:
    # rows written before the normalized=False row have no "normalized": they were normalized
    return "poisson_log_lpmf" + ("" if r.get("normalized", True) else ", normalized=False")


def numpyro_line(r: dict) -> str:
    return (f"NumPyro: Poisson regression N = {r['n']:,} x {r['p']}, the potential energy's "
            f"value and gradient: NumPyro's own Poisson {r['numpyro_s'] * 1e6:.0f} µs, fusedlp "
            f"({_numpyro_kernel(r)}) in numpyro.factor {r['fusedlp_s'] * 1e6:.0f} µs: "
            f"{r['ratio']:.2f}x.")


def evaluate_targets(rows: list[dict], numpyro: list[dict]) -> list[dict]:
    ratios = [c["ratio"] for r in rows for c in r["contexts"].values()]
    worst = min(((c["ratio"], r["kernel"], r["n"], ctx) for r in rows
                 for ctx, c in r["contexts"].items()), default=None)
    over = [(r["kernel"], r["n"], ctx) for r in rows for ctx, c in r["contexts"].items()
            if c["temp_arrays_fusedlp"] is not None
            and c["temp_arrays_fusedlp"] > c["temp_arrays_baseline"] + 0.5]
    targets = [
        {"target": f"every context >= {FLOOR} x autodiff of jax.scipy.stats",
         "detail": (f"min {worst[0]:.2f} ({worst[1]}, N={worst[2]:,}, {HEADINGS[worst[3]]})"
                      if worst else "n/a"),
         "met": bool(worst and worst[0] >= FLOOR)},
        {"target": f"median >= {MEDIAN_TARGET}",
         "detail": f"{statistics.median(ratios):.2f}" if ratios else "n/a",
         "met": bool(ratios and statistics.median(ratios) >= MEDIAN_TARGET)},
        {"target": "XLA temporaries never above the baseline's",
         "detail": f"{len(over)} of {len(ratios)} programs above", "met": not over},
    ]
    for r in numpyro:
        targets.append({"target": (f"NumPyro potential (N={r['n']:,}, {_numpyro_kernel(r)})"
                                   f" >= {NUMPYRO_TARGET} x"),
                        "detail": f"{r['ratio']:.2f}", "met": r["ratio"] >= NUMPYRO_TARGET})
    return targets


def _present(rows: list[dict]) -> list[str]:
    """The contexts every row has (a run before the "grad" context has six)."""
    return [c for c in CONTEXTS if all(c in r["contexts"] for r in rows)]


def table(rows: list[dict]) -> str:
    shown = _present(rows)
    head = "| kernel | baseline | N | " + " | ".join(HEADINGS[c] for c in shown) + " |"
    lines = [head, "|---|---|---:|" + "---:|" * len(shown)]
    for r in rows:
        cells = [f"{r['contexts'][c]['ratio']:.2f}" for c in shown]
        lines.append(f"| {r['kernel']} | `{r['baseline']}` | {r['n']:,} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def temporaries_table(rows: list[dict]) -> str:
    shown = _present(rows)
    head = "| kernel | N | " + " | ".join(HEADINGS[c] for c in shown) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(shown)]

    def cell(c):
        f, b = c["temp_arrays_fusedlp"], c["temp_arrays_baseline"]
        return "n/a" if f is None else f"{f:.1f} / {b:.1f}"

    for r in rows:
        lines.append(f"| {r['kernel']} | {r['n']:,} | "
                     + " | ".join(cell(r["contexts"][c]) for c in shown) + " |")
    return "\n".join(lines)


def selected_cases(kernels: str | None) -> list[Case]:
    """The cases named in ``kernels`` (a ``--kernels`` value: comma-separated), all if None;
    an unknown name ends the run with the list of known ones."""
    cases = _cases()
    if not kernels:
        return cases
    wanted = {k.strip() for k in kernels.split(",")}
    unknown = wanted - {c.name for c in cases}
    if unknown:
        raise SystemExit(f"unknown kernel(s) {sorted(unknown)}; choose from "
                         + ", ".join(c.name for c in cases))
    return [c for c in cases if c.name in wanted]


def run_cases(cases, sizes, bench, log, describe) -> list[dict]:
    """``bench(case, n)`` for every case and size, in order; each row logged as the case,
    N, ``describe(row)`` and the seconds it took."""
    rows = []
    for case in cases:
        for n in sizes:
            t0 = time.perf_counter()
            rows.append(bench(case, n))
            log(f"  {case.name:32s} N={n:<9,d} {describe(rows[-1])}  "
                f"({time.perf_counter() - t0:.0f} s)")
    return rows


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="N = 10^4 only, few repeats, NumPyro at N = 10^4 (a smoke run)")
    p.add_argument("--sizes", default="1e5,1e6", help="comma-separated N (default 1e5,1e6)")
    p.add_argument("--kernels", default=None,
                   help="comma-separated subset of kernel names (default: all)")
    _timing.add_json_argument(p, "contexts.json")
    _timing.add_layout_argument(p)


def main(args) -> int:
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    layouts = _timing.use_layout(args.layout)
    sizes = [10_000] if args.quick else [int(float(s)) for s in args.sizes.split(",")]
    cfg = ({"min_repeats": 3, "min_total": 0.02, "max_total": 0.2} if args.quick else
           {"min_repeats": 15, "min_total": 0.3, "max_total": 3.0})
    log = partial(print, file=sys.stderr, flush=True)
    machine = _timing.machine_info()
    t_start = time.perf_counter()
    rows = run_cases(selected_cases(args.kernels), sizes, partial(bench_case, cfg=cfg), log,
                     lambda row: " ".join(f"{c['ratio']:.2f}" for c in row["contexts"].values()))
    numpyro = [numpyro_row(10_000 if args.quick else 100_000, cfg, normalized)
               for normalized in (True, False)]
    wall = time.perf_counter() - t_start
    targets = evaluate_targets(rows, numpyro)
    print("## fusedlp in every calling context\n")
    where = machine.get("accelerator", {}).get("device_kind") or (
        f"{machine['cpu_model']}, {machine['cpu_count']} cores")
    print(f"{machine['date']}: {where}; jax "
          f"{machine['jax']} ({machine['backend']}), float64, fusedlp's {layouts} layouts. "
          f"Wall time {wall:.0f} s.\n")
    print("Value and gradient, baseline time / fusedlp time (above 1, fusedlp is faster); "
          "the baseline is autodiff of the named jax.scipy.stats density (of the plain "
          "formula for normalized=False). Contexts: data as jit arguments with int32 / int64 "
          "counts; data closed over; a vmapped batch of 10 problems of N/10; five gradient "
          "steps in a lax.fori_loop; the gradient with respect to scalar parameters only.\n")
    print(table(rows) + "\n")
    print("XLA temporaries of each compiled program, in N-sized float64 arrays, "
          "fusedlp / baseline:\n")
    print(temporaries_table(rows) + "\n")
    for r in numpyro:
        print(numpyro_line(r) + "\n")
    print(_timing.targets_md(targets, "Targets (this run)"))
    if args.json:
        _timing.write_json(args.json, {
            "benchmark": "fusedlp contexts", "machine": machine,
            "config": {"sizes": sizes, **cfg, "quick": args.quick, "layouts": layouts},
            "method": ("jit, AOT lower+compile; per context, fusedlp and the baseline timed "
                       "round-robin in a random order each round; median per-call seconds"),
            "rows": rows, "numpyro": numpyro, "targets": targets}, wall)
        log(f"# wrote {args.json} ({wall:.0f} s)")
    return 0
