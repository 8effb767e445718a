"""gradient of a Poisson log-likelihood.

L(λ) = Σ_i log Poisson(c_i | λ_i) with c ~ Poisson(1.2) (integers) and λ ~ U(0, 1),
n = 1000 (and 10⁶); value, gradient and value-and-gradient with respect to λ, jitted and
not: autodiff of ``jax.scipy.stats.poisson.logpmf`` (the write-up's JAX code), NumPyro's
``Poisson.log_prob``, ``fusedlp.poisson_lpmf`` normalized and not (``normalized=False`` drops
−log c!, which the gradient never needs), and a numba loop.

The write-up's puzzle, "the gradient is faster than the value under ``jit``", has a plain cause:
the value needs log c! (``lgamma``, the dearest operation here); its gradient c/λ − 1 does not,
and XLA deletes what the gradient does not use.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.stats import poisson

import fusedlp
from bench.studies._core import (
    Config,
    Study,
    Variant,
    floor_variant,
    headline_row,
    median,
    sizes,
)

NAME = "poisson"
TITLE = "Poisson log-likelihood ∇λ Σ log Poisson(c_i | λ_i)"
# The public write-up this study answers, named and described (a sentence's object).
SOURCE = (
    'the Julia Discourse thread "Speeding up gradient of logpdf", where a Poisson log-'
    "likelihood's gradient costs 15–30× its value in ReverseDiff while JAX's jitted "
    'gradient is faster than its value')
# What the study's tables measure (a sentence's object).
MEASURES = (
    'the value and gradient of a Poisson log-likelihood with respect to its n rates, jitted'
    ' and not: jax.scipy.stats, NumPyro, fusedlp and a numba loop')
# The plot's panels: (title, variants), a few lines each (figure() in _core).
PLOT_PANELS = (
    ("The gradient, jitted", ("value", "grad", "fused")),
    ("Value and gradient together", ("value", "vg", "fused_vg", "propto_vg", "numba_vg")),
    ("Without jit", ("value", "value_eager", "grad_eager", "fused_eager")),
)
SIZES = (1000, 10**4, 10**5, 10**6)
QUICK_SIZES = (1000,)

# The write-up's figures at n = 1000, µs: its JAX %timeit means, and the last consistent Julia
# run (one machine): f, ReverseDiff on a compiled tape, Enzyme.
SEED_US = {
    "JAX value (jit)": {1000: 27.0},
    "JAX grad (jit)": {1000: 9.01},
    "JAX value (no jit)": {1000: 1830.0},
    "JAX grad (no jit)": {1000: 11900.0},
    "Julia value": {1000: 25.021},
    "ReverseDiff, compiled tape, broadcast": {1000: 49.711},
    "Enzyme": {1000: 25.530},
}


def seed_figures() -> dict:
    jv, julia = SEED_US["JAX value (jit)"][1000], SEED_US["Julia value"][1000]
    ratios = {}
    for k, d in SEED_US.items():
        base = jv if k.startswith("JAX") else julia
        ratios[k] = {"1000": d[1000] / base}
    return {"us": SEED_US, "ratios": ratios,
            "ratio_to": "JAX rows: the JAX jitted value; Julia rows: the Julia value"}


def _data(n: int):
    rng = np.random.default_rng(n)
    c = jnp.asarray(rng.poisson(1.2, n).astype(np.int32))
    lam = jnp.asarray(rng.uniform(0.0, 1.0, n))
    return c, lam


def _numba():
    from bench.kernels import _numba_poisson

    return (_numba_poisson(np.float64, True), _numba_poisson(np.float64, False))


def variants(c, lam, nb):
    """Every route the study times; each takes (λ, c).

    The counts c are an argument of every function, never a constant captured by a closure:
    XLA would otherwise fold log c! into the compiled program at compile time and the
    "value" would no longer compute it.
    """

    def stats(lam, c):
        return jnp.sum(poisson.logpmf(c, lam))

    def fused(lam, c):
        return fusedlp.poisson_lpmf(c, lam)

    def propto(lam, c):
        return fusedlp.poisson_lpmf(c, lam, normalized=False)

    def numpyro(lam, c):
        import numpyro.distributions as dist

        return jnp.sum(dist.Poisson(lam).log_prob(c))

    nb_norm, nb_propto = nb
    a = (lam, c)
    c_np, lam_np = np.asarray(c), np.asarray(lam)
    vg = jax.value_and_grad
    return [
        Variant("value", "jax.scipy.stats, value", "value", stats, a),
        Variant("grad", "jax.scipy.stats, jax.grad", "gradient", jax.grad(stats), a, ad=True),
        Variant("vg", "jax.scipy.stats, value_and_grad", "value_and_gradient", vg(stats), a,
                ad=True),
        Variant("value_eager", "jax.scipy.stats, value, no jit", "value", stats, a, jit=False),
        Variant("grad_eager", "jax.scipy.stats, jax.grad, no jit", "gradient", jax.grad(stats),
                a, jit=False, ad=True),
        Variant("numpyro", "NumPyro Poisson.log_prob, jax.grad", "gradient", jax.grad(numpyro),
                a, ad=True),
        Variant("fused_value", "fusedlp.poisson_lpmf, value", "value", fused, a),
        Variant("fused", "fusedlp.poisson_lpmf, jax.grad", "gradient", jax.grad(fused), a),
        Variant("fused_vg", "fusedlp.poisson_lpmf, value_and_grad", "value_and_gradient",
                vg(fused), a),
        Variant("fused_eager", "fusedlp.poisson_lpmf, jax.grad, no jit", "gradient",
                jax.grad(fused), a, jit=False),
        Variant("propto_value", "fusedlp.poisson_lpmf normalized=False, value", "value",
                propto, a),
        Variant("propto", "fusedlp.poisson_lpmf normalized=False, jax.grad", "gradient",
                jax.grad(propto), a),
        Variant("propto_vg", "fusedlp.poisson_lpmf normalized=False, value_and_grad",
                "value_and_gradient", vg(propto), a),
        Variant("numba_value", "numba loop (one thread), value", "value", nb_norm["value"], (lam_np, c_np),
                jit=False),
        Variant("numba_vg", "numba loop (one thread), value and gradient", "value_and_gradient",
                nb_norm["vg"], (lam_np, c_np), jit=False),
        Variant("numba_propto_vg", "numba loop (one thread), value (no log c!) and gradient",
                "value_and_gradient", nb_propto["vg"], (lam_np, c_np), jit=False),
        floor_variant(lam),
    ]


def run(quick: bool = False) -> dict:
    from scipy.special import gammaln

    cfg = Config.make(quick)
    st = Study(NAME, TITLE, SOURCE, cfg)
    nb = _numba()
    for n in QUICK_SIZES if quick else SIZES:
        c, lam = _data(n)
        vs = variants(c, lam, nb)
        out = st.prepare(n, vs)
        ref_grad = np.asarray(c) / np.asarray(lam) - 1.0  # d/dλ (c log λ − λ − log c!)
        log_fact = float(np.sum(gammaln(np.asarray(c, np.float64) + 1.0)))
        value = out["value"]
        for name in ("grad", "grad_eager", "numpyro", "fused", "fused_eager", "propto"):
            st.check(n, f"{name} vs c/λ − 1", out[name], ref_grad, rtol=1e-12)
        for name in ("vg", "fused_vg", "propto_vg"):
            st.check(n, f"{name} gradient vs c/λ − 1", out[name][1], ref_grad, rtol=1e-12)
        for name in ("numba_vg", "numba_propto_vg"):
            st.check(n, f"{name} gradient vs c/λ − 1", out[name][1], ref_grad, rtol=1e-10)
        for name, got in (("fused value", out["fused_value"]), ("fused v&g", out["fused_vg"][0]),
                          ("eager value", out["value_eager"]), ("stats v&g", out["vg"][0])):
            st.check(n, f"{name} vs jax.scipy.stats value", got, value, rtol=1e-12)
        st.check(n, "numba value", out["numba_value"], value, rtol=1e-10)
        st.check(n, "propto value + Σ log c! vs value", float(out["propto_value"]) - log_fact,
                 value, rtol=1e-12)
        st.check(n, "numba propto value + Σ log c!", float(out["numba_propto_vg"][0]) - log_fact,
                 value, rtol=1e-10)
        st.time(n, vs)
    res = st.result(seed_figures=seed_figures())
    res["headline"] = [headline_row(res, n, "value", "fused")
                       for n in (1000, 10**6) if n in sizes(res)]
    return res


def comparison(result: dict) -> list[dict]:
    n = 1000
    r = result["seed_figures"]["ratios"]
    v = median(result, n, "value")
    ve = median(result, n, "value_eager")
    return [
        {"n": n, "seed": "JAX grad / value, jit", "seed_ratio": r["JAX grad (jit)"]["1000"],
         "ours": "jax.scipy.stats jax.grad / value, jit",
         "our_ratio": median(result, n, "grad") / v},
        {"n": n, "seed": "JAX grad / value, no jit",
         "seed_ratio": SEED_US["JAX grad (no jit)"][1000] / SEED_US["JAX value (no jit)"][1000],
         "ours": "jax.scipy.stats jax.grad / value, no jit",
         "our_ratio": median(result, n, "grad_eager") / ve},
        {"n": n, "seed": "Enzyme / Julia value", "seed_ratio": r["Enzyme"]["1000"],
         "ours": "fusedlp.poisson_lpmf gradient / jax.scipy.stats value",
         "our_ratio": median(result, n, "fused") / v},
        {"n": n, "seed": "ReverseDiff (best) / Julia value",
         "seed_ratio": r["ReverseDiff, compiled tape, broadcast"]["1000"],
         "ours": "fusedlp.poisson_lpmf value_and_grad / its value",
         "our_ratio": median(result, n, "fused_vg") / median(result, n, "fused_value")},
    ]
