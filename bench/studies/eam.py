"""an EAM-style potential, hand gradient vs reverse AD.

E(x) = F(Σ_i ρ(x_i)) with ρ(r) = exp(−3(r + 1)), F(p) = p² + p³ + p⁴/4 and x ~ U(0, 1),
n = 100 and 1000 (and 10⁶). Variants: the value; the write-up's hand gradient ``deam!``
transcribed to JAX (it evaluates the exp twice, once for ρ and once for ρ′); naive
``jax.grad``; ``fusedlp.eam_energy``; and a numba loop standing in for the write-up's
LoopVectorization loop (one pass storing ρ(x_i) and summing, one pass scaling by F′).

The write-up's author evaluates this model millions of times on small inputs, so the study also
times a batch of B evaluations at n = 100 in one call (``vmap``, or one fusedlp call on a
(B, n) array of sites), reported per evaluation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

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

NAME = "eam"
TITLE = "EAM potential F(Σ ρ(x_i)): value, hand gradient, AD, fused, numba"
# The public write-up this study answers, named and described (a sentence's object).
SOURCE = (
    'the Julia Discourse thread "Zygote Performance", where a hand-optimised gradient of an'
    ' EAM-style (embedded-atom) potential is compared with Zygote')
# What the study's tables measure (a sentence's object).
MEASURES = (
    'the value and gradient of the potential F(Σ ρ(x_i)): the hand gradient, jax.grad, '
    'fusedlp.eam_energy and a numba loop, one site at a time and batched')
# The plot's panels: (title, variants), a few lines each (figure() in _core).
PLOT_PANELS = (
    ("The gradient", ("value", "deam", "naive", "fused")),
    ("Value and gradient against a numba loop", ("value", "fused_vg", "numba_value",
                                                  "numba_vg")),
)
SIZES = (100, 1000, 10**4, 10**5, 10**6)
QUICK_SIZES = (100, 1000)
BATCH, QUICK_BATCH = 10_000, 1000
BATCH_N = 100

# One consistent run in the write-up (a reply that timed both sizes), BenchmarkTools medians, µs.
SEED_US = {
    "E (value)": {100: 0.825692, 1000: 7.938},
    "deam (hand gradient, allocating)": {100: 1.810, 1000: 17.662},
    "Zygote naive": {100: 7.599, 1000: 62.225},
    "Zygote, sum adjoint hack": {100: 2.443, 1000: 23.422},
    "Zygote, ForwardDiff broadcast (best AD)": {100: 1.945, 1000: 11.130},
}


def seed_figures() -> dict:
    e = SEED_US["E (value)"]
    return {"us": SEED_US,
            "ratios": {k: {str(n): t / e[n] for n, t in d.items()} for k, d in SEED_US.items()},
            "other": "hand SIMD loop (value + gradient) 0.111 µs at n = 100 on an AVX-512 "
                     "machine (another author; no value time on that machine)"}


def eam(x):
    rho = jnp.sum(jnp.exp(-3.0 * (x + 1.0)))
    return rho**2 + rho**3 + 0.25 * rho**4


def deam(x):
    """The write-up's ``deam!`` in JAX: ρ summed, then ρ′(x_n) F′(ρ) with ρ′ = −3 exp(...) again."""
    rho = jnp.sum(jnp.exp(-3.0 * (x + 1.0)))
    dF = 2 * rho + 3 * rho**2 + rho**3
    return -3.0 * jnp.exp(-3.0 * (x + 1.0)) * dF


def _numba():
    from numba import njit

    from bench.kernels import _numba_eam

    fns = _numba_eam(np.float64)
    vg = fns["vg"]

    @njit(fastmath=True)
    def batched_vg(X):  # the write-up's two-pass loop per site, writing into one (B, n) output
        E = np.empty(X.shape[0])
        G = np.empty_like(X)
        for b in range(X.shape[0]):
            p = 0.0
            for j in range(X.shape[1]):
                e = np.exp(-3.0 * (X[b, j] + 1.0))
                G[b, j] = e
                p += e
            p2 = p * p
            c = -3.0 * (2.0 * p + 3.0 * p2 + p2 * p)  # rho'(x) F'(p) = -3 rho(x) F'(p)
            for j in range(X.shape[1]):
                G[b, j] *= c
            E[b] = p2 + p2 * p + 0.25 * p2 * p2
        return E, G

    return fns["value"], vg, batched_vg


def variants(x, nb_value, nb_vg):
    fused = fusedlp.eam_energy
    return [
        Variant("value", "E(x), jax", "value", eam, (x,)),
        Variant("deam", "the write-up's deam! in JAX (hand gradient)", "gradient", deam, (x,)),
        Variant("naive", "jax.grad (naive reverse mode)", "gradient", jax.grad(eam), (x,),
                ad=True),
        Variant("fused", "fusedlp.eam_energy, jax.grad", "gradient", jax.grad(fused), (x,)),
        Variant("fused_vg", "fusedlp.eam_energy, value_and_grad", "value_and_gradient",
                jax.value_and_grad(fused), (x,)),
        Variant("numba_value", "numba loop (one thread), value", "value", nb_value, (np.asarray(x),),
                jit=False),
        Variant("numba_vg", "numba loop (one thread), value and gradient", "value_and_gradient", nb_vg,
                (np.asarray(x),), jit=False),
        floor_variant(x),
    ]


def batched_variants(X, nb_batched):
    fused = fusedlp.eam_energy
    return [
        Variant("b_value", "batch: vmap(E)", "value", jax.vmap(eam), (X,)),
        Variant("b_deam", "batch: vmap(deam!)", "gradient", jax.vmap(deam), (X,)),
        Variant("b_naive", "batch: vmap(jax.grad(E))", "gradient", jax.vmap(jax.grad(eam)),
                (X,), ad=True),
        Variant("b_fused", "batch: vmap(jax.grad(fusedlp.eam_energy))", "gradient",
                jax.vmap(jax.grad(fused)), (X,)),
        Variant("b_fused_sites", "batch: jax.grad(fusedlp.eam_energy) on (B, n) sites",
                "gradient", jax.grad(fused), (X,)),
        Variant("b_numba_vg", "batch: numba loop over B (one thread), value and gradient",
                "value_and_gradient", nb_batched, (np.asarray(X),), jit=False),
    ]


def run(quick: bool = False) -> dict:
    cfg = Config.make(quick)
    st = Study(NAME, TITLE, SOURCE, cfg)
    nb_value, nb_vg, nb_batched = _numba()
    for n in QUICK_SIZES if quick else SIZES:
        x = jnp.asarray(np.random.default_rng(n).uniform(0.0, 1.0, n))
        vs = variants(x, nb_value, nb_vg)
        out = st.prepare(n, vs)
        ref = out["fused"]
        st.check(n, "fused value vs E", out["fused_vg"][0], out["value"], rtol=1e-12)
        st.check(n, "numba value vs E", out["numba_value"], out["value"], rtol=1e-10)
        st.check(n, "numba v&g value vs E", out["numba_vg"][0], out["value"], rtol=1e-10)
        for name in ("deam", "naive"):
            st.check(n, f"{name} vs fused gradient", out[name], ref, rtol=1e-12)
        st.check(n, "fused v&g gradient", out["fused_vg"][1], ref, rtol=1e-12)
        st.check(n, "numba gradient vs fused", out["numba_vg"][1], ref, rtol=1e-10)
        st.time(n, vs)

    B = QUICK_BATCH if quick else BATCH
    X = jnp.asarray(np.random.default_rng(B).uniform(0.0, 1.0, (B, BATCH_N)))
    vs = batched_variants(X, nb_batched)
    out = st.prepare(BATCH_N, vs)
    ref = out["b_fused"]
    for name in ("b_deam", "b_naive", "b_fused_sites"):
        st.check(BATCH_N, f"{name} vs vmap fused", out[name], ref, rtol=1e-12)
    st.check(BATCH_N, "batched numba gradient", out["b_numba_vg"][1], ref, rtol=1e-10)
    st.check(BATCH_N, "batched numba value", out["b_numba_vg"][0], out["b_value"], rtol=1e-10)
    st.time(BATCH_N, vs, per=B)
    st.extra["batch"] = B

    res = st.result(seed_figures=seed_figures())
    res["headline"] = [headline_row(res, n, "value", "fused")
                       for n in (1000, 10**6) if n in sizes(res)]
    return res


def comparison(result: dict) -> list[dict]:
    r = result["seed_figures"]["ratios"]
    out = []
    for n in (100, 1000):
        v = median(result, n, "value")
        out += [
            {"n": n, "seed": "deam (hand gradient) / E",
             "seed_ratio": r["deam (hand gradient, allocating)"][str(n)],
             "ours": "deam! in JAX / E", "our_ratio": median(result, n, "deam") / v},
            {"n": n, "seed": "Zygote naive / E", "seed_ratio": r["Zygote naive"][str(n)],
             "ours": "jax.grad / E", "our_ratio": median(result, n, "naive") / v},
            {"n": n, "seed": "best Zygote (ForwardDiff broadcast) / E",
             "seed_ratio": r["Zygote, ForwardDiff broadcast (best AD)"][str(n)],
             "ours": "fusedlp.eam_energy gradient / E",
             "our_ratio": median(result, n, "fused") / v},
        ]
    return out
