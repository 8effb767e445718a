"""a Jacobian with respect to one scalar, and a subset of the arguments.

rs(d, x) = d − (d·f(x)) / (f(x)·f(x)) f(x) with f(m)_i = exp(−1.5 (t_i − m)²) and t = −10:10
(n = 21; larger n spreads n points over the same interval). x is one scalar, d a vector, the
output a vector: the Jacobian d rs/dx is one column. Reverse mode (``jax.jacrev``) needs one
backward pass per output element (vmapped); forward mode (``jax.jacfwd``) one forward pass with
one tangent; finite differences two evaluations. Then the scalar-output variant
Σ rs(d, x)², where reverse mode is at home.

"Does JAX spend work on d when only x is asked for?" is answered by XLA's own operation count
(``compiled.cost_analysis()``) for the derivative with respect to x only and to (d, x).
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
)

NAME = "jacobian"
TITLE = "Jacobian of rs(d, x) w.r.t. the scalar x, and a subset of arguments"
# The public write-up this study answers, named and described (a sentence's object).
SOURCE = (
    'the Julia Discourse thread "Automatic differentiation performance & computing '
    'derivatives of only a subset of the arguments", where Zygote\'s Jacobian with respect '
    'to one scalar is over 50× slower than finite differences and ForwardDiff 2× faster')
# What the study's tables measure (a sentence's object).
MEASURES = (
    'the Jacobian of a vector function with respect to one scalar input, by reverse mode, '
    'forward mode and finite differences, and whether JAX spends work on an argument that '
    'is not differentiated')
# The plot's panels: (title, variants), a few lines each (figure() in _core).
PLOT_PANELS = (
    ("Jacobian d rs / dx (vector output)", ("value", "finite_diff", "jacrev_x", "jacfwd_x",
                                            "jacrev_dx")),
    ("Gradient of the scalar Σ rs²", ("s_value", "s_finite_diff", "s_grad_x", "s_jacfwd_x",
                                     "s_grad_dx")),
)
SIZES = (21, 201, 2001)
QUICK_SIZES = (21, 201)
X0 = 0.3
FD_STEP = 1e-6  # the write-up's step


def seed_figures() -> dict:
    # The write-up gives ratios in words, not times (n = 21).
    return {"us": {}, "ratios": {
        "Zygote.jacobian w.r.t. (d, x) / finite differences": {"21": 50.0},
        "ForwardDiff.derivative / finite differences": {"21": 0.5},
        "Zygote.gradient / ForwardDiff.derivative, scalar output": {"21": 8.0},
    }, "words": {
        "Zygote.jacobian w.r.t. (d, x) / finite differences": "> 50×",
        "ForwardDiff.derivative / finite differences": "≈ 0.5× (2× faster)",
        "Zygote.gradient / ForwardDiff.derivative, scalar output": "≈ 8×",
    }}


def make_rs(n: int):
    t = jnp.linspace(-10.0, 10.0, n)  # n = 21: exactly -10:10

    def f(m):
        return jnp.exp(-1.5 * (t - m) ** 2)

    def rs(d, x):
        d0 = f(x)
        return d - jnp.dot(d, d0) / jnp.dot(d0, d0) * d0

    def rs_scalar(d, x):
        r = rs(d, x)
        return jnp.dot(r, r)

    return rs, rs_scalar


def _data(n: int):
    rng = np.random.default_rng(n)
    return jnp.asarray(rng.standard_normal(n)), jnp.asarray(X0)


def variants(rs, rs_scalar, d, x):
    """(vector-output variants, scalar-output variants)."""
    h = FD_STEP

    def fd(fun):
        return lambda d, x: (fun(d, x + h) - fun(d, x)) / h

    vector = [
        Variant("value", "rs(d, x)", "value", rs, (d, x)),
        Variant("finite_diff", "finite differences, step 1e-6", "jacobian", fd(rs), (d, x)),
        Variant("jacrev_x", "jax.jacrev w.r.t. x", "jacobian", jax.jacrev(rs, argnums=1),
                (d, x), ad=True),
        Variant("jacrev_dx", "jax.jacrev w.r.t. (d, x)", "jacobian",
                jax.jacrev(rs, argnums=(0, 1)), (d, x), ad=True),
        Variant("jacfwd_x", "jax.jacfwd w.r.t. x", "jacobian", jax.jacfwd(rs, argnums=1),
                (d, x), ad=True),
        Variant("jacfwd_dx", "jax.jacfwd w.r.t. (d, x)", "jacobian",
                jax.jacfwd(rs, argnums=(0, 1)), (d, x), ad=True),
        floor_variant(d),
    ]
    scalar = [
        Variant("s_value", "Σ rs(d, x)²", "value", rs_scalar, (d, x)),
        Variant("s_finite_diff", "Σ rs², finite differences", "gradient", fd(rs_scalar),
                (d, x)),
        Variant("s_grad_x", "Σ rs², jax.grad w.r.t. x", "gradient",
                jax.grad(rs_scalar, argnums=1), (d, x), ad=True),
        Variant("s_grad_dx", "Σ rs², jax.grad w.r.t. (d, x)", "gradient",
                jax.grad(rs_scalar, argnums=(0, 1)), (d, x), ad=True),
        Variant("s_jacfwd_x", "Σ rs², jax.jacfwd w.r.t. x", "gradient",
                jax.jacfwd(rs_scalar, argnums=1), (d, x), ad=True),
    ]
    return vector, scalar


def _work(fn, args) -> dict:
    """XLA's count of the compiled function's work, and the size of its jaxpr."""
    compiled = jax.jit(fn).lower(*args).compile()
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):  # older jax: one dict per computation
        ca = ca[0] if ca else {}
    ca = ca or {}
    return {"flops": float(ca.get("flops", float("nan"))),
            "transcendentals": float(ca.get("transcendentals", float("nan"))),
            "bytes_accessed": float(ca.get("bytes accessed", float("nan"))),
            "jaxpr_eqns": len(jax.make_jaxpr(fn)(*args).eqns)}


def run(quick: bool = False) -> dict:
    cfg = Config.make(quick)
    st = Study(NAME, TITLE, SOURCE, cfg)
    work = []
    for n in QUICK_SIZES if quick else SIZES:
        rs, rs_scalar = make_rs(n)
        d, x = _data(n)
        vector, scalar = variants(rs, rs_scalar, d, x)
        out = st.prepare(n, vector + scalar)
        ref = out["jacfwd_x"]
        # Finite differences: truncation ~ step · |rs''| plus rounding ~ eps/step.
        st.check(n, "finite differences vs jacfwd", out["finite_diff"], ref, rtol=1e-4,
                 atol=1e-4)
        st.check(n, "jacrev w.r.t. x vs jacfwd", out["jacrev_x"], ref, rtol=1e-10)
        st.check(n, "jacrev w.r.t. (d, x): x column", out["jacrev_dx"][1], ref, rtol=1e-10)
        st.check(n, "jacfwd w.r.t. (d, x): x column", out["jacfwd_dx"][1], ref, rtol=1e-10)
        st.check(n, "jacrev vs jacfwd w.r.t. d", out["jacrev_dx"][0], out["jacfwd_dx"][0],
                 rtol=1e-10)
        sref = out["s_jacfwd_x"]
        st.check(n, "scalar: grad w.r.t. x vs jacfwd", out["s_grad_x"], sref, rtol=1e-10)
        st.check(n, "scalar: grad w.r.t. (d, x): x part", out["s_grad_dx"][1], sref,
                 rtol=1e-10)
        st.check(n, "scalar: finite differences vs jacfwd", out["s_finite_diff"], sref,
                 rtol=1e-4, atol=1e-4)
        st.time(n, vector)
        st.time(n, scalar)
        for v in vector + scalar:
            if v.kind != "overhead":
                work.append({"n": n, "variant": v.name, "label": v.label, **_work(v.fn, v.args)})
    st.extra["work"] = work
    res = st.result(seed_figures=seed_figures())
    res["headline"] = [headline_row(res, 21, "value", None, kinds=("jacobian",),
                                    among=("jacrev_x", "jacfwd_x"))]
    return res


def extra_tables(result: dict) -> list[tuple[str, str]]:
    return [("Work XLA counts in each compiled derivative (cost_analysis), and jaxpr size",
             work_table(result))]


def work_table(result: dict) -> str:
    """XLA's flop count of each derivative, against the value's, per n."""
    from bench.studies._core import fmt_sig, md_table

    rows = []
    for w in result["extra"]["work"]:
        base = next(x for x in result["extra"]["work"] if x["n"] == w["n"] and x["variant"] == (
            "s_value" if w["variant"].startswith("s_") else "value"))
        rows.append([f"{w['n']:,}", w["label"], fmt_sig(w["flops"], 3),
                     fmt_sig(w["flops"] / base["flops"], 3), fmt_sig(w["transcendentals"], 3),
                     fmt_sig(w["bytes_accessed"], 3), str(w["jaxpr_eqns"])])
    return md_table(["n", "variant", "XLA flops", "× value", "transcendentals", "bytes accessed",
                "jaxpr eqns"], rows, "rlrrrrr")


def work(result: dict, n: int, variant: str) -> dict:
    return next(w for w in result["extra"]["work"] if w["n"] == n and w["variant"] == variant)


def comparison(result: dict) -> list[dict]:
    n = 21
    fdt = median(result, n, "finite_diff")
    return [
        {"n": n, "seed": "Zygote.jacobian w.r.t. (d, x) / finite differences",
         "seed_ratio": 50.0, "seed_words": "> 50×",
         "ours": "jax.jacrev w.r.t. (d, x) / finite differences",
         "our_ratio": median(result, n, "jacrev_dx") / fdt},
        {"n": n, "seed": "Zygote.jacobian w.r.t. x (closure) / finite differences",
         "seed_ratio": None, "seed_words": "about the same as w.r.t. (d, x)",
         "ours": "jax.jacrev w.r.t. x / finite differences",
         "our_ratio": median(result, n, "jacrev_x") / fdt},
        {"n": n, "seed": "ForwardDiff.derivative / finite differences", "seed_ratio": 0.5,
         "seed_words": "≈ 0.5×", "ours": "jax.jacfwd w.r.t. x / finite differences",
         "our_ratio": median(result, n, "jacfwd_x") / fdt},
        {"n": n, "seed": "Zygote.gradient / ForwardDiff.derivative, scalar output",
         "seed_ratio": 8.0, "seed_words": "≈ 8×",
         "ours": "jax.grad / jax.jacfwd w.r.t. x, scalar output",
         "our_ratio": median(result, n, "s_grad_x") / median(result, n, "s_jacfwd_x")},
    ]
