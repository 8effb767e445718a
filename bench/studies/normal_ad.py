"""AD backends on the normal log-density.

f(θ) = Σ_i log N(y_i | θ_i, s) with y ~ N(2, 1), s = 1 and θ ~ N(0, 1); the gradient with
respect to the vector θ by reverse mode (``jax.grad``), forward mode (``jax.jacfwd``: one
tangent per element of θ), complex step and finite differences (n + 1 evaluations, all
batched with ``vmap``), NumPyro's ``Normal.log_prob`` under ``jax.grad``, and
``fusedlp.normal_lpdf``. Forward mode, complex step and finite differences build n × n
arrays, so they are run up to n = 1000 only.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.stats import norm

import fusedlp
from bench.studies._core import Config, Study, Variant, floor_variant, headline_row, sizes

NAME = "normal_ad"
TITLE = "AD backends on the normal log-density: ∇θ Σ log N(y_i | θ_i, s)"
# The public write-up this study answers, named and described (a sentence's object).
SOURCE = (
    'the GitHub gist "Automatic Differentiation Benchmarks" (luiarthur, November 2022), '
    'which times Tracker, ReverseDiff, Zygote, ForwardDiff and complex-step gradients of a '
    'normal log-density in Julia')
# What the study's tables measure (a sentence's object).
MEASURES = (
    'the gradient of a normal log-likelihood with respect to its n means, by every '
    "differentiation mode JAX has, against the value's own cost")
# The plot's panels: (title, variants), a few lines each (figure() in _core).
PLOT_PANELS = (
    ("Every way to the gradient", ("value", "reverse", "forward", "complex_step", "finite_diff")),
    ("fusedlp against jax.grad", ("value", "reverse", "fused", "reverse_vg", "fused_vg")),
)
SIZES = (10, 100, 1000, 10**4, 10**5, 10**6)
QUICK_SIZES = (10, 100, 1000)
DENSE_MAX_N = 1000  # forward mode, complex step and FD materialise n x n arrays
SCALE = 1.0

# The write-up's @btime medians (Julia 1.8, their machine), microseconds.
SEED_US = {
    "f (value)": {10: 0.10636, 100: 0.72562, 1000: 7.058},
    "Tracker (reverse)": {10: 13.962, 100: 18.124, 1000: 58.194},
    "ReverseDiff (reverse)": {10: 1.026, 100: 4.828, 1000: 42.516},
    "Zygote (reverse)": {10: 2.092, 100: 5.455, 1000: 37.722},
    "ForwardDiff (forward)": {10: 0.743102, 100: 29.474, 1000: 2513.0},
    "complex step": {10: 1.101, 100: 50.554, 1000: 9184.0},
}


def seed_figures() -> dict:
    v = SEED_US["f (value)"]
    return {"us": SEED_US,
            "ratios": {k: {str(n): t / v[n] for n, t in d.items()} for k, d in SEED_US.items()}}


def _data(n: int):
    rng = np.random.default_rng(n)
    y = jnp.asarray(rng.standard_normal(n) * SCALE + 2.0)
    theta = jnp.asarray(rng.standard_normal(n))
    return y, theta


def variants(y, theta):
    """Every way of getting f(θ) or ∇f(θ) that the study times.

    The data y are an argument of every function, never a constant captured by a closure:
    XLA would fold whatever depends on y alone into the compiled program, and the timing
    would no longer be that of the function a user calls with their data.
    """
    s = SCALE
    n = y.shape[0]

    def f(theta, y):  # what one writes with jax.scipy.stats
        return jnp.sum(norm.logpdf(y, theta, s))

    def f_plain(theta, y):  # the write-up's normlpdf(z) = -(log 2π + z²)/2; analytic: complex-safe
        z = (theta - y) / s
        return jnp.sum(-0.5 * (math.log(2 * math.pi) + z * z))

    def grad_complex_step(theta, y, h=1e-20):  # Im f(θ + i h e_j) / h for every j
        basis = jnp.eye(n, dtype=theta.dtype)
        return jax.vmap(lambda e: jnp.imag(f_plain(theta + 1j * h * e, y)) / h)(basis)

    def grad_finite_diff(theta, y):  # forward differences, h = √eps · max(1, |θ_j|)
        h = jnp.sqrt(jnp.finfo(theta.dtype).eps) * jnp.maximum(1.0, jnp.abs(theta))
        f0 = f(theta, y)
        return jax.vmap(lambda e, hj: (f(theta + hj * e, y) - f0) / hj)(
            jnp.eye(n, dtype=theta.dtype), h)

    def f_numpyro(theta, y):
        import numpyro.distributions as dist

        return jnp.sum(dist.Normal(theta, s).log_prob(y))

    def f_fused(theta, y):
        return fusedlp.normal_lpdf(y, theta, s)

    a = (theta, y)
    vs = [
        Variant("value", "f(θ), jax.scipy.stats", "value", f, a),
        Variant("reverse", "jax.grad (reverse mode)", "gradient", jax.grad(f), a, ad=True),
        Variant("forward", "jax.jacfwd (forward mode)", "gradient", jax.jacfwd(f), a, ad=True),
        Variant("complex_step", "complex step", "gradient", grad_complex_step, a),
        Variant("finite_diff", "finite differences", "gradient", grad_finite_diff, a),
        Variant("numpyro", "NumPyro Normal.log_prob, jax.grad", "gradient", jax.grad(f_numpyro),
                a, ad=True),
        Variant("fused", "fusedlp.normal_lpdf, jax.grad", "gradient", jax.grad(f_fused), a),
        Variant("reverse_vg", "jax.value_and_grad (reverse mode)", "value_and_gradient",
                jax.value_and_grad(f), a, ad=True),
        Variant("fused_vg", "fusedlp.normal_lpdf, value_and_grad", "value_and_gradient",
                jax.value_and_grad(f_fused), a),
        floor_variant(theta),
    ]
    if n > DENSE_MAX_N:
        vs = [v for v in vs if v.name not in ("forward", "complex_step", "finite_diff")]
    return vs


def run(quick: bool = False) -> dict:
    cfg = Config.make(quick)
    st = Study(NAME, TITLE, SOURCE, cfg)
    for n in QUICK_SIZES if quick else SIZES:
        y, theta = _data(n)
        vs = variants(y, theta)
        out = st.prepare(n, vs)
        ref = out["fused"]
        st.check(n, "value vs fused value", out["value"], out["fused_vg"][0], rtol=1e-12)
        for v in vs:
            if v.kind == "gradient" and v.name != "fused":
                # Finite differences lose √eps·|f| to cancellation: tolerance to match.
                fd = v.name == "finite_diff"
                st.check(n, f"{v.name} gradient vs fused", out[v.name], ref,
                         rtol=1e-6 if fd else 1e-12,
                         atol=1e-7 * max(1.0, abs(float(out["value"]))) if fd else 0.0)
        st.check(n, "fused value_and_grad gradient", out["fused_vg"][1], ref, rtol=1e-12)
        st.check(n, "autodiff value_and_grad gradient", out["reverse_vg"][1], ref, rtol=1e-12)
        st.time(n, vs)
        if n > DENSE_MAX_N:
            for name, label in (("forward", "jax.jacfwd (forward mode)"),
                                ("complex_step", "complex step"),
                                ("finite_diff", "finite differences")):
                st.skip(n, name, label, "gradient", f"not run: n × n array at n = {n:,}",
                        ad=name == "forward")
    res = st.result(seed_figures=seed_figures())
    res["headline"] = [headline_row(res, n, "value", "fused")
                       for n in (1000, 10**6) if n in sizes(res)]
    return res


def comparison(result: dict) -> list[dict]:
    """The write-up's gradient/value ratios beside ours, at the write-up's sizes."""
    pairs = (("Zygote (reverse)", "reverse"), ("ReverseDiff (reverse)", "reverse"),
             ("ForwardDiff (forward)", "forward"), ("complex step", "complex_step"))
    from bench.studies._core import median, row

    out = []
    for n in (10, 100, 1000):
        v = median(result, n, "value")
        for seed_label, ours in pairs:
            out.append({"n": n, "seed": f"{seed_label} / value",
                        "seed_ratio": result["seed_figures"]["ratios"][seed_label][str(n)],
                        "ours": row(result, n, ours)["label"],
                        "our_ratio": median(result, n, ours) / v})
        out.append({"n": n, "seed": "—", "seed_ratio": None,
                    "ours": row(result, n, "fused")["label"],
                    "our_ratio": median(result, n, "fused") / v})
    return out
