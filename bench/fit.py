"""Fit benchmark: per-step cost of fusedlp.fit's compiled loop against the alternatives.

The model is a normal fit, ``objective(params, y) = normal_lpdf(y, loc, exp(log_scale))``
with scalar ``loc`` and ``log_scale``, at N = 100 and N = 10^6 observations (float64). For
each N, in one run and timed round-robin:

* **fit** — ``jax.jit(partial(fusedlp.fit, objective, optimizer=optax.adam(...),
  max_steps=K, tol=0, atol=0))``: K Adam steps in one compiled ``lax.while_loop``;
  per-step cost = time / K;
* **python loop** — K calls from Python of a jitted optax step (value-and-gradient, Adam
  update, ``apply_updates``), what one writes without ``fit``; per-step cost = time / K;
* **v&g** — one call of ``jax.jit(jax.value_and_grad(objective))``: the floor a step
  cannot go below (at large N), and the per-call dispatch cost (at small N);
* **loop floor** — a ``lax.fori_loop`` of K bare gradient steps (value-and-gradient and
  ``params += lr / N * grad``; no optax, no checks, no history): the least any compiled
  JAX loop around this objective costs per step;
* **numba v&g** — a single-threaded ``@njit(fastmath=True)`` loop forming the value and
  both partials in one pass (no allocation), called from Python: the hand-written
  reference. Timed ``timeit``-style (10^4 back-to-back calls per sample): at small N one
  call takes well under a microsecond, where a per-call timer reads mostly itself;
* **numba Adam** — the same v&g and Adam written out in one ``@njit`` loop of K steps:
  what a fully hand-written fit costs per step (no status, no history).

``tol = atol = 0`` and a start far from the optimum make every fit run exactly K steps
(checked). Before timing, fit's K-step answer is compared with the Python loop's and the
jax value-and-gradient with numba's. A second table times the default fit (fit's default optimizer, Newton for
this two-parameter model, and default tolerance) to convergence. JAX's asynchronous CPU dispatch is off, as in ``bench kernels``.

Targets: at N = 100, fit's per-step cost <= 3 x the numba value-and-gradient call; at
N = 10^6, within 1.2 x of one jitted value-and-gradient call.

Run ``python -m bench fit --help``.
"""

from __future__ import annotations

import math
import sys
import time
from functools import partial

import jax
import numpy as np

from bench import _timing
from bench._timing import fmt_ratio, fmt_us

HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
LEARNING_RATE = 1e-4  # small, and loc starts 10 sd away: no fit converges or stalls in K steps
INIT = {"loc": 10.0, "log_scale": 0.0}


def objective(params, y):
    import jax.numpy as jnp

    import fusedlp

    return fusedlp.normal_lpdf(y, params["loc"], jnp.exp(params["log_scale"]))


def _numba_fns():
    """numba v&g of the normal model in (loc, log_scale), and an Adam loop around it."""
    from numba import njit

    @njit(fastmath=True)
    def vg(loc, log_scale, y):
        inv2 = math.exp(-2.0 * log_scale)
        s1 = 0.0
        s2 = 0.0
        for i in range(y.shape[0]):
            d = y[i] - loc
            s1 += d
            s2 += d * d
        n = y.shape[0]
        value = -0.5 * s2 * inv2 - n * (log_scale + HALF_LOG_2PI)
        return value, s1 * inv2, s2 * inv2 - n  # d/dloc, d/dlog_scale

    @njit(fastmath=True)
    def adam(loc, log_scale, y, steps, lr):
        # optax.adam defaults: b1 = 0.9, b2 = 0.999, eps = 1e-8; minimises -loglik
        b1, b2, eps = 0.9, 0.999, 1e-8
        m1 = m2 = v1 = v2 = 0.0
        c1 = c2 = 1.0
        value = 0.0
        for _ in range(steps):
            value, g1, g2 = vg(loc, log_scale, y)
            g1, g2 = -g1, -g2
            m1 = b1 * m1 + (1 - b1) * g1
            m2 = b1 * m2 + (1 - b1) * g2
            v1 = b2 * v1 + (1 - b2) * g1 * g1
            v2 = b2 * v2 + (1 - b2) * g2 * g2
            c1 *= b1
            c2 *= b2
            loc -= lr * (m1 / (1 - c1)) / (math.sqrt(v1 / (1 - c2)) + eps)
            log_scale -= lr * (m2 / (1 - c1)) / (math.sqrt(v2 / (1 - c2)) + eps)
        return loc, log_scale, value

    return vg, adam


def _per_call_timeit(fn, number: int, repeat: int) -> _timing.Stats:
    """Per-call seconds of ``fn()`` from ``repeat`` samples of ``number`` back-to-back calls."""
    import timeit

    fn()
    samples = timeit.Timer(fn).repeat(repeat=repeat, number=number)
    return _timing.Stats.of(np.asarray(samples) / number)


def steps_for(n: int, quick: bool) -> int:
    """K: enough steps to amortise what fit does once (the value and gradient at the start,
    the final restore check), few enough that a call takes well under a second."""
    k = int(min(2000, max(50, 2e5 / n)))
    return max(10, k // 4) if quick else k


def bench_one(n: int, cfg: dict, numba_vg, numba_adam) -> dict:
    import jax.numpy as jnp
    import optax

    import fusedlp

    rng = np.random.default_rng([cfg["seed"], n])
    y_np = rng.normal(0.0, 1.0, size=n)
    y = jnp.asarray(y_np)
    init = {k: jnp.asarray(v, jnp.float64) for k, v in INIT.items()}
    K = steps_for(n, cfg["quick"])
    adam = optax.adam(LEARNING_RATE)

    fit_k = partial(fusedlp.fit, objective, optimizer=adam, max_steps=K, tol=0.0, atol=0.0)
    fit_j, fit_lower, fit_compile = _timing.aot_compile(fit_k, init, y)

    def step(params, state, y):
        value, grad = jax.value_and_grad(objective)(params, y)
        updates, state = adam.update(jax.tree.map(jnp.negative, grad), state, params)
        return optax.apply_updates(params, updates), state, value

    state0 = adam.init(init)
    step_j, step_lower, step_compile = _timing.aot_compile(step, init, state0, y)

    def python_loop():
        params, state = init, state0
        for _ in range(K):
            params, state, value = step_j(params, state, y)
        return params, value

    vg_j, vg_lower, vg_compile = _timing.aot_compile(jax.value_and_grad(objective), init, y)

    def loop_floor(params, y):
        def body(_, carry):
            params, _ = carry
            value, grad = jax.value_and_grad(objective)(params, y)
            # lr / n keeps the iterates ordinary numbers: with a plain lr they overflow,
            # and inf / 0 arithmetic runs at another speed than the fit it is compared with
            step = LEARNING_RATE / n
            return jax.tree.map(lambda p, g: p + step * g, params, grad), value

        return jax.lax.fori_loop(0, K, body, (params, jnp.zeros((), y.dtype)))

    floor_j, _, _ = _timing.aot_compile(loop_floor, init, y)
    t0 = time.perf_counter()
    numba_vg(INIT["loc"], INIT["log_scale"], y_np)
    numba_adam(INIT["loc"], INIT["log_scale"], y_np, 1, LEARNING_RATE)
    numba_first = time.perf_counter() - t0

    # ---- correctness, before any timing
    res = fit_j(init, y)
    if int(res.num_steps) != K or int(res.status) != fusedlp.FitStatus.MAX_STEPS:
        raise RuntimeError(f"N={n}: fit ran {int(res.num_steps)} steps "
                           f"(status {fusedlp.FitStatus(int(res.status)).name}), not {K}")
    loop_params, _ = python_loop()
    for key in INIT:
        np.testing.assert_allclose(res.params[key], loop_params[key], rtol=1e-9,
                                   err_msg=f"N={n}: fit vs python loop, {key}")
    value, grad = vg_j(init, y)
    ref = numba_vg(INIT["loc"], INIT["log_scale"], y_np)
    np.testing.assert_allclose([value, grad["loc"], grad["log_scale"]], ref, rtol=1e-10,
                               err_msg=f"N={n}: jax v&g vs numba v&g")
    hand = numba_adam(INIT["loc"], INIT["log_scale"], y_np, K, LEARNING_RATE)
    np.testing.assert_allclose(hand[:2], [res.params["loc"], res.params["log_scale"]],
                               rtol=1e-9, err_msg=f"N={n}: fit vs numba Adam loop")

    calls = {
        "fit": partial(fit_j, init, y),
        "python_loop": python_loop,
        "loop_floor": partial(floor_j, init, y),
        "vg": partial(vg_j, init, y),
        "numba_adam": partial(numba_adam, INIT["loc"], INIT["log_scale"], y_np, K,
                              LEARNING_RATE),
    }
    stats = _timing.time_interleaved(calls, min_repeats=cfg["min_repeats"],
                                     min_total=cfg["min_total"], max_total=cfg["max_total"])
    number = max(1, int(1e4 * 100 / n)) if n <= 10**4 else 3
    stats["numba_vg"] = _per_call_timeit(
        partial(numba_vg, INIT["loc"], INIT["log_scale"], y_np), number=number,
        repeat=cfg["min_repeats"])
    per_step = {
        "fit": stats["fit"].median / K,
        "python_loop": stats["python_loop"].median / K,
        "loop_floor": stats["loop_floor"].median / K,
        "vg": stats["vg"].median,
        "numba_vg": stats["numba_vg"].median,
        "numba_adam": stats["numba_adam"].median / K,
    }

    # ---- the default fit (fit's default optimizer) to convergence
    default_fit = partial(fusedlp.fit, objective)
    dflt_j, dflt_lower, dflt_compile = _timing.aot_compile(default_fit, init, y)
    dflt = dflt_j(init, y)
    dstats = _timing.time_interleaved({"default_fit": partial(dflt_j, init, y)},
                                      min_repeats=cfg["min_repeats"],
                                      min_total=cfg["min_total"], max_total=cfg["max_total"])
    return {
        "n": n,
        "steps": K,
        "variants": {name: s.as_dict() for name, s in stats.items()},
        "per_step_s": per_step,
        "ratios": {
            "fit_over_numba_vg": per_step["fit"] / per_step["numba_vg"],
            "fit_over_numba_adam": per_step["fit"] / per_step["numba_adam"],
            "fit_over_vg": per_step["fit"] / per_step["vg"],
            "fit_over_loop_floor": per_step["fit"] / per_step["loop_floor"],
            "python_loop_over_fit": per_step["python_loop"] / per_step["fit"],
        },
        "compile_s": {
            "fit": fit_lower + fit_compile, "python_loop_step": step_lower + step_compile,
            "vg": vg_lower + vg_compile, "numba_first_call": numba_first,
            "default_fit": dflt_lower + dflt_compile,
        },
        "default_fit": {
            "optimizer": "fusedlp.fit default",
            "status": fusedlp.FitStatus(int(dflt.status)).name,
            "num_steps": int(dflt.num_steps),
            "grad_norm": float(dflt.grad_norm),
            "loc_error": float(dflt.params["loc"]) - float(y_np.mean()),
            "stats": dstats["default_fit"].as_dict(),
        },
    }


def evaluate_targets(results: list[dict]) -> list[dict]:
    targets = []
    for r in results:
        if r["n"] == 100:
            x = r["ratios"]["fit_over_numba_vg"]
            targets.append({"target": "N = 100: fit per step <= 3 x numba v&g call",
                            "met": x <= 3.0, "measured": x,
                            "detail": f"{fmt_us(r['per_step_s']['fit'])} µs vs "
                                      f"{fmt_us(r['per_step_s']['numba_vg'])} µs: {x:.3g}x"})
        if r["n"] == 10**6:
            x = r["ratios"]["fit_over_vg"]
            targets.append({"target": "N = 1e6: fit per step <= 1.2 x jitted v&g call",
                            "met": x <= 1.2, "measured": x,
                            "detail": f"{fmt_us(r['per_step_s']['fit'])} µs vs "
                                      f"{fmt_us(r['per_step_s']['vg'])} µs: {x:.3g}x"})
    return targets


def _md(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _n(n: int) -> str:
    return f"10^{round(math.log10(n))}" if n >= 1000 else str(n)


def tables(results: list[dict]) -> str:
    out = ["### Per-step cost, normal fit (float64, Adam, tol = 0: exactly K steps)\n",
           "fit, python loop, loop floor, numba Adam: median time of K steps / K. v&g "
           "(jitted jax.value_and_grad), numba v&g (called from Python): median per call.\n"]
    header = ["N", "K", "fit µs/step", "python loop µs/step", "loop floor µs/step",
              "v&g µs/call", "numba v&g µs/call", "numba Adam µs/step", "fit / numba v&g",
              "fit / v&g", "fit / loop floor", "python loop / fit"]
    rows = []
    for r in results:
        p, q = r["per_step_s"], r["ratios"]
        rows.append([_n(r["n"]), str(r["steps"]), fmt_us(p["fit"]), fmt_us(p["python_loop"]),
                     fmt_us(p["loop_floor"]), fmt_us(p["vg"]), fmt_us(p["numba_vg"]),
                     fmt_us(p["numba_adam"]), fmt_ratio(q["fit_over_numba_vg"]),
                     fmt_ratio(q["fit_over_vg"]), fmt_ratio(q["fit_over_loop_floor"]),
                     fmt_ratio(q["python_loop_over_fit"])])
    out.append(_md(header, rows))
    out.append("\n### Default fit (fit's default optimizer and tol) from loc = 10 sd away, to "
               "convergence\n")
    header = ["N", "status", "steps", "ms/fit", "µs/step", "compile s (fit, default)",
              "compile s (fit, Adam)"]
    rows = []
    for r in results:
        d = r["default_fit"]
        rows.append([_n(r["n"]), d["status"], str(d["num_steps"]),
                     _timing.fmt_sig(d["stats"]["median"] * 1e3),
                     fmt_us(d["stats"]["median"] / max(d["num_steps"], 1)),
                     _timing.fmt_sig(r["compile_s"]["default_fit"]),
                     _timing.fmt_sig(r["compile_s"]["fit"])])
    out.append(_md(header, rows))
    return "\n".join(out) + "\n"


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="a quarter of the steps and few repeats (well under a minute)")
    _timing.add_json_argument(p, "fit.json")
    p.add_argument("--sizes", default="100,1e6",
                   help="comma-separated N (default 100,1e6: the two with targets)")
    p.add_argument("--async-dispatch", action="store_true",
                   help="keep JAX's default asynchronous CPU dispatch (default here: off)")
    p.add_argument("--min-time", type=float, default=None,
                   help="seconds of timed calls per variant and size (default 0.5; quick 0.05)")


def main(args) -> int:
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_enable_async_dispatch", bool(args.async_dispatch))
    sizes = [int(float(s)) for s in args.sizes.split(",") if s.strip()]
    cfg = {"sizes": sizes, "quick": bool(args.quick), "async_dispatch": bool(args.async_dispatch),
           "learning_rate": LEARNING_RATE, "init": INIT, "seed": 20240601,
           "min_repeats": 5 if args.quick else 7,
           "min_total": 0.05 if args.quick else 0.5, "max_total": 0.2 if args.quick else 2.0}
    if args.min_time is not None:
        cfg["min_total"] = args.min_time
        cfg["max_total"] = max(cfg["max_total"], args.min_time)
    machine = _timing.machine_info()
    log = partial(print, file=sys.stderr, flush=True)
    log(f"# fit benchmark on {machine['cpu_model']} ({machine['cpu_count']} cores), "
        f"jax {machine['jax']} {machine['backend']}, numba {machine.get('numba')}")
    numba_vg, numba_adam = _numba_fns()
    t_start = time.perf_counter()
    results = []
    for n in sizes:
        t0 = time.perf_counter()
        r = bench_one(n, cfg, numba_vg, numba_adam)
        results.append(r)
        p = r["per_step_s"]
        log(f"  N={n:<9d} K={r['steps']:<5d} fit {fmt_us(p['fit'])} µs/step, python loop "
            f"{fmt_us(p['python_loop'])}, v&g {fmt_us(p['vg'])}, numba v&g "
            f"{fmt_us(p['numba_vg'])}, numba Adam {fmt_us(p['numba_adam'])} "
            f"({time.perf_counter() - t0:.1f} s)")
    wall = time.perf_counter() - t_start
    targets = evaluate_targets(results)

    print("## fusedlp fit benchmark\n")
    print(f"{machine['date']}: {machine['cpu_model']}, {machine['cpu_count']} cores "
          f"({machine['platform']}); jax/jaxlib {machine['jax']}/{machine['jaxlib']} "
          f"({machine['backend']}), numba {machine.get('numba')}. Wall time {wall:.0f} s.\n")
    print(tables(results))
    if targets:
        print(_timing.targets_md(targets))
    if args.json:
        _timing.write_json(args.json, {
            "benchmark": "fusedlp fit",
            "machine": machine,
            "config": cfg,
            "method": ("normal fit, scalar loc and log_scale, float64; fit and python loop "
                       "run K Adam steps (tol = atol = 0), per step = median / K; the "
                       "variants of one N timed round-robin (bench/_timing.py), except the "
                       "numba value-and-gradient call, timed after them with timeit (many "
                       "calls per sample: one takes microseconds); jax AOT compiled; median "
                       "reported, min/IQR kept"),
            "results": results,
            "targets": targets,
        }, wall)
        log(f"# wrote {args.json} ({wall:.0f} s)")
    return 0
