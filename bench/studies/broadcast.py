"""eager vs fused broadcasting under reverse mode.

The gradient of f(x) = Σ exp(x_i), n = 1000. In the write-up, ReverseDiff records a lazy
broadcast element by element (2n − 1 scalar instructions on its tape) and is 16× slower than
the eager broadcast it records as one instruction; compiling the tape recovers only part of it.

In JAX the question changes shape: ``jax.grad`` traces the function once at the level of whole
arrays, so its program has the same handful of operations for any n (no per-element tape; the
study records the jaxpr's length at each n). What remains is the difference between running
those operations one by one (un-jitted, each a separate dispatch that writes a temporary) and
compiling them into one loop (``jax.jit``), and between autodiff and a fused kernel whose
gradient reuses the ``exp`` its value computed (``custom_vjp``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bench.studies._core import (
    Config,
    Study,
    Variant,
    floor_variant,
    headline_row,
    median,
    sizes,
)

NAME = "broadcast"
TITLE = "Gradient of Σ exp(x): op-by-op, jitted, fused"
# The public write-up this study answers, named and described (a sentence's object).
SOURCE = (
    'the ReverseDiff.jl GitHub issue #215 "Record Broadcast.broadcasted instead of '
    'Broadcast.broadcast", where a lazily broadcast exp is recorded element by element on '
    'the tape and its gradient runs 16× slower than the eager broadcast')
# What the study's tables measure (a sentence's object).
MEASURES = (
    'the gradient of Σ exp(x) run operation by operation, jitted, and as a fused custom '
    'rule')
# The plot's panels: (title, variants), a few lines each (figure() in _core).
PLOT_PANELS = (
    ("Operation by operation against jit", ("value", "value_eager", "grad_eager", "grad")),
    ("A fused rule against jax.grad", ("value", "grad", "fused", "vg", "fused_vg")),
)
SIZES = (10, 100, 1000, 10**4, 10**5, 10**6)
QUICK_SIZES = (10, 1000)

# The write-up's BenchmarkTools medians at n = 1000, microseconds (ReverseDiff.gradient).
SEED_US = {"eager broadcast (one tape instruction)": {1000: 10.105},
           "lazy broadcast (2n − 1 scalar instructions)": {1000: 158.858},
           "lazy broadcast, compiled tape": {1000: 54.679}}


def seed_figures() -> dict:
    e = SEED_US["eager broadcast (one tape instruction)"][1000]
    return {"us": SEED_US,
            "ratios": {k: {"1000": v[1000] / e} for k, v in SEED_US.items()},
            "ratio_to": "eager broadcast (the write-up times no value)"}


def f(x):
    return jnp.sum(jnp.exp(x))


@jax.custom_vjp
def sum_exp(x):
    """Σ exp(x) with a fused gradient: d/dx_i Σ exp(x) = exp(x_i), the terms already summed."""
    return jnp.sum(jnp.exp(x))


def _sum_exp_fwd(x):
    e = jnp.exp(x)
    return jnp.sum(e), e  # residual: the exp the value computed


def _sum_exp_bwd(e, g):
    return (g * e,)


sum_exp.defvjp(_sum_exp_fwd, _sum_exp_bwd)


def variants(x):
    return [
        Variant("value", "Σ exp(x), jit", "value", f, (x,)),
        Variant("value_eager", "Σ exp(x), op by op (no jit)", "value", f, (x,), jit=False),
        Variant("grad_eager", "jax.grad, op by op (no jit)", "gradient", jax.grad(f), (x,),
                jit=False, ad=True),
        Variant("grad", "jax.grad, jit", "gradient", jax.grad(f), (x,), ad=True),
        Variant("fused", "fused custom_vjp, jax.grad, jit", "gradient", jax.grad(sum_exp),
                (x,)),
        Variant("vg", "jax.value_and_grad, jit", "value_and_gradient", jax.value_and_grad(f),
                (x,), ad=True),
        Variant("fused_vg", "fused custom_vjp, value_and_grad, jit", "value_and_gradient",
                jax.value_and_grad(sum_exp), (x,)),
        floor_variant(x),
    ]


def run(quick: bool = False) -> dict:
    cfg = Config.make(quick)
    st = Study(NAME, TITLE, SOURCE, cfg)
    eqns = []
    for n in QUICK_SIZES if quick else SIZES:
        x = jnp.asarray(np.random.default_rng(n).standard_normal(n))
        vs = variants(x)
        out = st.prepare(n, vs)
        ref = np.exp(np.asarray(x))  # d/dx Σ exp(x) = exp(x)
        for name in ("grad_eager", "grad", "fused"):
            st.check(n, f"{name} vs exp(x)", out[name], ref, rtol=1e-14)
        for name in ("vg", "fused_vg"):
            st.check(n, f"{name} value", out[name][0], ref.sum(), rtol=1e-12)
            st.check(n, f"{name} gradient", out[name][1], ref, rtol=1e-14)
        st.time(n, vs)
        eqns.append({"n": n,
                     "grad_jaxpr_eqns": len(jax.make_jaxpr(jax.grad(f))(x).eqns),
                     "fused_grad_jaxpr_eqns": len(jax.make_jaxpr(jax.grad(sum_exp))(x).eqns),
                     "reversediff_lazy_tape_instructions": 2 * n - 1})
    st.extra["program_size"] = eqns
    res = st.result(seed_figures=seed_figures())
    res["headline"] = [headline_row(res, n, "value", "fused")
                       for n in (1000, 10**6) if n in sizes(res)]
    return res


def extra_tables(result: dict) -> list[tuple[str, str]]:
    from bench.studies._core import md_table

    rows = [[f"{e['n']:,}", str(e["grad_jaxpr_eqns"]), str(e["fused_grad_jaxpr_eqns"]),
             f"{e['reversediff_lazy_tape_instructions']:,}"]
            for e in result["extra"]["program_size"]]
    return [("Program size: operations in the traced gradient against the write-up's tape",
             md_table(["n", "jax.grad jaxpr eqns", "fused jaxpr eqns",
                       "ReverseDiff lazy-broadcast tape (2n − 1)"], rows, "rrrr"))]


def comparison(result: dict) -> list[dict]:
    n = 1000
    r = result["seed_figures"]["ratios"]
    g = median(result, n, "grad")
    return [
        {"n": n, "seed": "lazy broadcast / eager broadcast",
         "seed_ratio": r["lazy broadcast (2n − 1 scalar instructions)"]["1000"],
         "ours": "jax.grad op by op / jax.grad jit",
         "our_ratio": median(result, n, "grad_eager") / g},
        {"n": n, "seed": "compiled lazy tape / eager broadcast",
         "seed_ratio": r["lazy broadcast, compiled tape"]["1000"],
         "ours": "fused custom_vjp / jax.grad jit", "our_ratio": median(result, n, "fused") / g},
    ]
