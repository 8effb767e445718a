"""fusedlp.fit and fusedlp.standard_errors: closed forms, statsmodels, lstsq, EAM, edges, jit/vmap.

x64 is on (conftest.py). Fits take the default optimizer (L-BFGS) unless a test is about
another one. Every distinct (objective, optimizer, max_steps, shapes) compiles one loop, about
a second: the objectives are module-level functions and the normal data have one shape, N,
so that tests share compilations.
"""

from __future__ import annotations

import functools
import math

import chex
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fusedlp
from fusedlp import FitResult, FitStatus

N = 100  # observations in every normal data set

# ============================================================== objectives (shared)


def poisson_rate_loglik(params, k):
    return fusedlp.poisson_lpmf(k, params["rate"])


def normal_loglik(params, y):
    return fusedlp.normal_lpdf(y, params["loc"], params["scale"])


def normal_log_scale_loglik(params, y):
    return fusedlp.normal_lpdf(y, params["loc"], jnp.exp(params["log_scale"]))


def poisson_regression_loglik(params, X, k):
    return fusedlp.poisson_log_lpmf(k, X @ params["beta"])


def linear_regression_loglik(params, X, y):
    return fusedlp.normal_lpdf(y, X @ params["beta"], jnp.exp(params["log_scale"]))


def eam_energies(theta, r):
    """Energies of configurations r[c] (sites x neighbours) with rho(r) = A exp(-beta r)."""
    density = (jnp.exp(theta["log_A"]), jnp.exp(theta["log_beta"]))
    return jax.vmap(lambda rc: fusedlp.eam_energy(rc, density=density))(r)


def eam_sum_of_squares(theta, r, e_ref):
    return jnp.sum((eam_energies(theta, r) - e_ref) ** 2)


def leaves_close(got, want, rtol, atol=0.0):
    chex.assert_trees_all_equal_structs(got, want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


# ====================================================================== closed forms


def test_poisson_rate_mle_is_the_sample_mean_with_closed_form_se(rng):
    k = rng.poisson(3.2, size=400)
    res = fusedlp.fit(poisson_rate_loglik, {"rate": 1.0}, k)
    assert isinstance(res, FitResult)
    assert bool(res.converged) and int(res.status) == FitStatus.CONVERGED
    lam = k.mean()
    np.testing.assert_allclose(res.params["rate"], lam, rtol=1e-8)
    np.testing.assert_allclose(res.value, poisson_rate_loglik(res.params, k), rtol=1e-14)
    se = fusedlp.standard_errors(poisson_rate_loglik, res.params, k)
    np.testing.assert_allclose(se["rate"], math.sqrt(lam / k.size), rtol=1e-6)


def test_normal_mle_is_mean_and_population_sd_with_closed_form_se(rng):
    y = rng.normal(1.5, 2.0, size=N)
    res = fusedlp.fit(normal_loglik, {"loc": 0.0, "scale": 1.0}, y)
    assert bool(res.converged)
    mu, sd, n = y.mean(), y.std(ddof=0), y.size
    np.testing.assert_allclose(res.params["loc"], mu, rtol=1e-8)
    np.testing.assert_allclose(res.params["scale"], sd, rtol=1e-8)
    se = fusedlp.standard_errors(normal_loglik, res.params, y)
    np.testing.assert_allclose(se["loc"], sd / math.sqrt(n), rtol=1e-6)
    np.testing.assert_allclose(se["scale"], sd / math.sqrt(2 * n), rtol=1e-6)


# ============================================================== statsmodels / lstsq


def cpunish():
    """statsmodels' capital-punishment counts (17 US states), as in its GLM example:
    log of violent crime; income in thousands of dollars (better scaled for L-BFGS)."""
    sm = pytest.importorskip("statsmodels.api")
    data = sm.datasets.cpunish.load()
    exog = data.exog.copy()
    exog["INCOME"] = exog["INCOME"] / 1000.0
    exog["VC100k96"] = np.log(exog["VC100k96"])
    X = sm.add_constant(exog, prepend=True).to_numpy(np.float64)
    return sm, X, data.endog.to_numpy(np.float64)


def test_poisson_regression_matches_statsmodels_glm():
    sm, X, k = cpunish()
    ref = sm.GLM(k, X, family=sm.families.Poisson()).fit(tol=1e-14)
    res = fusedlp.fit(poisson_regression_loglik, {"beta": np.zeros(X.shape[1])}, X, k)
    assert bool(res.converged), FitStatus(int(res.status)).name
    assert int(res.num_steps) < 200
    np.testing.assert_allclose(res.params["beta"], ref.params, rtol=1e-6)
    np.testing.assert_allclose(res.value, ref.llf, rtol=1e-12)
    se = fusedlp.standard_errors(poisson_regression_loglik, res.params, X, k)
    np.testing.assert_allclose(se["beta"], ref.bse, rtol=1e-4)


def test_normal_linear_regression_matches_lstsq(rng):
    n, p = 250, 4
    X = np.column_stack([np.ones(n), rng.normal(size=(n, p - 1))])
    y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + rng.normal(0.0, 0.7, size=n)
    beta, rss, *_ = np.linalg.lstsq(X, y, rcond=None)
    init = {"beta": np.zeros(p), "log_scale": 0.0}
    res = fusedlp.fit(linear_regression_loglik, init, X, y)
    assert bool(res.converged)
    np.testing.assert_allclose(res.params["beta"], beta, rtol=1e-7)
    np.testing.assert_allclose(np.exp(2 * res.params["log_scale"]), rss[0] / n, rtol=1e-7)
    # the classical (X^T X)^-1 sigma^2 standard errors, sigma^2 the MLE RSS / n
    se = fusedlp.standard_errors(linear_regression_loglik, res.params, X, y)
    want = np.sqrt(np.diag(np.linalg.inv(X.T @ X)) * rss[0] / n)
    np.testing.assert_allclose(se["beta"], want, rtol=1e-6)


# =============================================================================== EAM


def test_eam_recovers_density_parameters_from_energies(rng):
    true = {"log_A": np.log(0.8), "log_beta": np.log(1.5)}
    r = rng.uniform(0.5, 2.5, size=(12, 4, 8))  # 12 configurations x 4 sites x 8 neighbours
    e_ref = eam_energies(true, r)
    start = {"log_A": true["log_A"] + 0.4, "log_beta": true["log_beta"] - 0.3}
    res = fusedlp.fit(eam_sum_of_squares, start, r, e_ref, maximize=False)
    assert bool(res.converged), FitStatus(int(res.status)).name
    leaves_close(res.params, true, rtol=1e-6, atol=1e-8)
    assert float(res.value) >= 0.0 and float(res.value) < 1e-12  # unnegated: the minimum
    assert float(res.history[0]) > float(res.value)


# ============================================================================= edges


def test_divergent_learning_rate_ends_diverged_with_finite_params(rng):
    y = rng.normal(1.0, 1.0, size=N)
    # the first step sends scale far below zero: the objective is NaN there
    res = fusedlp.fit(normal_loglik, {"loc": 0.0, "scale": 3.0}, y,
                      optimizer=optax.sgd(1e3), max_steps=100)
    assert int(res.status) == FitStatus.DIVERGED
    assert not bool(res.converged)
    for leaf in (*jax.tree.leaves(res.params), res.value, res.grad_norm):
        assert np.isfinite(leaf)
    np.testing.assert_allclose(res.value, normal_loglik(res.params, y), rtol=1e-14)
    steps = int(res.num_steps)
    assert np.all(np.isfinite(res.history[: steps + 1]))
    assert np.all(np.isnan(res.history[steps + 1:]))


@pytest.mark.parametrize("kind", ["definite", "ill_conditioned", "indefinite", "flat"])
def test_modified_newton_step_is_its_eigenvalue_definition(rng, kind):
    """The Newton step equals its definition, computed here by NumPy: the eigenvalues of
    D^-1 H D^-1 by absolute value, those at or below n eps times the largest raised to
    sqrt(eps) times it (and flagged singular), the rest inverted exactly however small
    (a guard for a faster route to the same step: a Cholesky path for clearly definite
    Hessians was measured and left out, since it cost more compile time than it saved)."""
    from fusedlp.fitting import _modified_newton

    n = 5
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    w = {"definite": [4.0, 2.0, 1.0, 0.5, 0.1], "ill_conditioned": [3.0, 1.0, 1.0, 1.0, 1e-12],
         "indefinite": [3.0, 1.0, -0.5, 0.2, 0.1], "flat": [3.0, 1.0, 1.0, 0.5, 0.0]}[kind]
    scale = np.diag(10.0 ** rng.uniform(-3, 3, size=n))  # units that differ widely
    H = scale @ (Q * w) @ Q.T @ scale
    g = rng.normal(size=n)
    got = _modified_newton(jnp.asarray(g), jnp.asarray(H))

    d = np.sqrt(np.abs(np.diag(H)))
    lam, V = np.linalg.eigh(H / np.outer(d, d))
    a = np.abs(lam)
    kept = a > n * np.finfo(float).eps * a.max()
    inverse = 1.0 / np.where(kept, a, np.sqrt(np.finfo(float).eps) * a.max())
    c = V.T @ (g / d)
    # the ill-conditioned step is as accurate as its condition number (1e12) allows
    rtol = 1e-3 if kind == "ill_conditioned" else 1e-8
    np.testing.assert_allclose(got.direction, -(V @ (c * inverse)) / d, rtol=rtol)
    np.testing.assert_allclose(got.decrement2, np.sum(c * c * inverse), rtol=rtol)
    assert bool(got.singular) == (kind == "flat")


def test_newton_divergence_restores_the_last_iterate_with_its_hessian():
    """Newton's first step lands near mu = 3, where the value is finite but the gradient
    is NaN (above 2.5, sqrt's infinite slope at 0 times maximum's zero one): the step is
    rejected, and params, value and the Hessian that ride in the result are all those of
    the start."""

    def loglik(p):
        return -((p["mu"] - 3.0) ** 2) + 1e-300 * jnp.sqrt(jnp.maximum(2.5 - p["mu"], 0.0))

    res = fusedlp.fit(loglik, {"mu": 0.0})
    assert int(res.status) == FitStatus.DIVERGED and int(res.num_steps) == 0
    assert float(res.params["mu"]) == 0.0 and float(res.value) == float(loglik(res.params))
    np.testing.assert_allclose(res.hessian, [[-2.0]], rtol=1e-12)


def test_non_finite_start_raises_naming_the_cause_and_is_diverged_when_traced(rng):
    y = rng.normal(size=N)
    # a kernel's validation names the argument (the objective called once more, eagerly)
    with pytest.raises(ValueError, match=r"not finite at init_params.*a kernel says: "
                                         r"normal_lpdf: argument `scale` must be finite"):
        fusedlp.fit(normal_loglik, {"loc": 0.0, "scale": -1.0}, y)
    # without a kernel to say why, the usual causes are listed
    with pytest.raises(ValueError, match=r"not finite at init_params.*outside the parameters"):
        fusedlp.fit(lambda p, y: jnp.sum(jnp.log(p["s"] * y**2)), {"s": -1.0}, y)
    res = jax.jit(functools.partial(fusedlp.fit, normal_loglik))({"loc": 0.0, "scale": -1.0}, y)
    assert int(res.status) == FitStatus.DIVERGED and int(res.num_steps) == 0
    assert not bool(res.converged) and float(res.params["scale"]) == -1.0
    assert np.all(np.isnan(res.history))  # history[0]: the (NaN) objective at init_params


def test_counts_outside_the_support_raise_naming_the_kernel():
    """statsmodels' `fair` data: `affairs` is not an integer in about a third of the rows."""
    sm = pytest.importorskip("statsmodels.api")
    data = sm.datasets.fair.load_pandas().data
    k = data["affairs"].to_numpy()
    assert np.any(k != np.floor(k))
    X = sm.add_constant(data[["rate_marriage", "age", "yrs_married"]]).to_numpy(np.float64)
    first = int(np.argmax(k != np.floor(k)))
    with pytest.raises(ValueError, match=rf"poisson_log_lpmf: argument `k` must hold "
                                         rf"non-negative integer counts.* k\[{first}\] ="):
        fusedlp.fit(poisson_regression_loglik, {"beta": np.zeros(X.shape[1])}, X, k)


@pytest.mark.parametrize("which, bad", [(0, np.nan), (0, np.inf), (1, -np.inf)])
def test_non_finite_data_raise_naming_the_argument(which, bad):
    X, y = np.ones((5, 2)), np.ones(5)
    args = [X, y]
    args[which] = args[which].copy()
    args[which].flat[3] = bad
    with pytest.raises(ValueError, match=rf"data\[{which}\].*finite"):
        fusedlp.fit(linear_regression_loglik, {"beta": np.zeros(2), "log_scale": 0.0}, *args)


def test_empty_data_and_non_finite_init_raise(rng):
    with pytest.raises(ValueError, match=r"data\[0\] is empty"):
        fusedlp.fit(normal_loglik, {"loc": 0.0, "scale": 1.0}, np.ones(0))
    with pytest.raises(ValueError, match=r"init_params\['loc'\]"):
        fusedlp.fit(normal_loglik, {"loc": np.nan, "scale": 1.0}, np.ones(3))
    with pytest.raises(ValueError, match=r"data\[0\]\['y'\]"):  # pytree data: the path
        fusedlp.fit(lambda p, d: normal_loglik(p, d["y"]), {"loc": 0.0, "scale": 1.0},
                    {"y": np.array([1.0, np.nan])})
    y = rng.normal(size=N)
    y[7] = np.nan
    with pytest.raises(ValueError, match=r"objective is not finite at init_params"):
        fusedlp.fit(normal_loglik, {"loc": 0.0, "scale": 1.0}, y, validate=False)


def test_single_observation_scale_is_not_reported_converged():
    # one observation: the likelihood grows without bound as log_scale -> -inf, with a
    # constant gradient -1 in log_scale (L-BFGS ends STALLED near log_scale = -37)
    init = {"loc": 0.0, "log_scale": 0.0}
    res = fusedlp.fit(normal_log_scale_loglik, init, np.array([1.3]))
    assert not bool(res.converged)
    assert int(res.status) in (FitStatus.DIVERGED, FitStatus.MAX_STEPS, FitStatus.STALLED)
    assert all(np.isfinite(leaf) for leaf in jax.tree.leaves(res.params))


# ================================================================ loop and contract


def test_history_max_steps_and_fields(rng):
    y = rng.normal(size=N)
    res = fusedlp.fit(normal_loglik, {"loc": 0.0, "scale": 1.0}, y)
    steps = int(res.num_steps)
    assert res.history.shape == (1001,)
    assert float(res.history[0]) == float(normal_loglik({"loc": 0.0, "scale": 1.0}, y))
    assert float(res.history[steps]) == float(res.value)
    assert np.all(np.isnan(res.history[steps + 1:]))
    assert np.all(np.diff(res.history[: steps + 1]) >= 0)  # the line search ascends
    assert float(res.grad_norm) <= 1e-8 * (1 + abs(float(res.value)))

    # tol = atol = 0: a fixed number of steps
    short = fusedlp.fit(normal_loglik, {"loc": 0.0, "scale": 1.0}, y, max_steps=2, tol=0.0,
                        atol=0.0)
    assert int(short.status) == FitStatus.MAX_STEPS and int(short.num_steps) == 2
    assert short.history.shape == (3,) and np.all(np.isfinite(short.history))
    none = fusedlp.fit(normal_loglik, {"loc": 0.0, "scale": 1.0}, y, max_steps=0)
    assert int(none.status) == FitStatus.MAX_STEPS and int(none.num_steps) == 0


def test_converged_at_the_start_takes_no_step(rng):
    k = rng.poisson(3.2, size=400)
    res = fusedlp.fit(poisson_rate_loglik, {"rate": k.mean()}, k)
    assert bool(res.converged) and int(res.num_steps) == 0


def test_tolerance_semantics_of_gradient_methods(rng):
    y = rng.normal(size=N)
    init = {"loc": 3.0, "scale": 3.0}
    lbfgs = functools.partial(fusedlp.fit, normal_loglik, optimizer="lbfgs")
    loose = lbfgs(init, y, tol=1e-2, atol=0.0)  # same compilation
    tight = lbfgs(init, y)
    assert bool(loose.converged) and bool(tight.converged)
    assert float(loose.grad_norm) <= 1e-2 * abs(float(loose.value))
    assert int(loose.num_steps) < int(tight.num_steps)
    big = lbfgs(init, y, tol=0.0, atol=1e6)
    assert bool(big.converged) and int(big.num_steps) == 0


def newton_decrement(objective, params, *data):
    """sqrt(g^T (-H)^-1 g) of a log-likelihood, with NumPy's solve."""
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    g = jax.grad(lambda v: objective(unravel(v), *data))(flat)
    H = fusedlp.hessian(lambda v: objective(unravel(v), *data))(flat)
    return math.sqrt(float(np.asarray(g) @ np.linalg.solve(-np.asarray(H), np.asarray(g))))


def test_tolerance_semantics_of_newton(rng):
    y = rng.normal(size=N)
    init = {"loc": 3.0, "scale": 3.0}
    loose = fusedlp.fit(normal_loglik, init, y, optimizer="newton", tol=1e-2)
    tight = fusedlp.fit(normal_loglik, init, y)  # the default for two parameters
    assert bool(loose.converged) and bool(tight.converged)
    assert newton_decrement(normal_loglik, loose.params, y) <= 1e-2
    assert newton_decrement(normal_loglik, tight.params, y) <= math.sqrt(np.finfo(float).eps)
    assert int(loose.num_steps) < int(tight.num_steps)
    # in standard-error units: the loose fit is within 1e-2 standard errors of the MLE
    se = fusedlp.standard_errors(normal_loglik, tight.params, y)
    assert abs(float(loose.params["loc"] - tight.params["loc"])) <= 1e-2 * float(se["loc"])


def test_plain_gradient_transformation(rng):
    y = rng.normal(2.0, 1.0, size=N)
    res = fusedlp.fit(normal_log_scale_loglik, {"loc": 0.0, "log_scale": 0.0}, y,
                      optimizer=optax.adam(0.05), max_steps=3000, tol=1e-6)
    assert bool(res.converged)
    np.testing.assert_allclose(res.params["loc"], y.mean(), rtol=1e-5)


def test_minimize_energy_convention():
    def energy(x, c):
        return jnp.sum((x - c) ** 2) + 1.0

    res = fusedlp.fit(energy, jnp.zeros(3), jnp.array([1.0, -2.0, 0.5]), maximize=False)
    assert bool(res.converged)
    np.testing.assert_allclose(res.params, [1.0, -2.0, 0.5], rtol=1e-8)
    np.testing.assert_allclose(res.value, 1.0, rtol=1e-12)  # the energy, not its negative


def test_float32(rng):
    y = rng.normal(1.5, 2.0, size=N).astype(np.float32)
    init = {"loc": np.float32(0.0), "scale": np.float32(1.0)}
    res = fusedlp.fit(normal_loglik, init, y)
    assert bool(res.converged)
    assert res.params["loc"].dtype == np.float32 and res.value.dtype == np.float32
    np.testing.assert_allclose(res.params["scale"], y.astype(np.float64).std(), rtol=1e-4)


# ==================================================================== jit and vmap


def test_vmap_over_64_data_sets_equals_64_single_fits(rng):
    ys = rng.normal(rng.uniform(-2, 2, size=(64, 1)), 1.5, size=(64, N))
    init = {"loc": 0.0, "log_scale": 0.0}
    # progress=True is switched off under vmap: no bar, the same compilation
    batched = jax.vmap(functools.partial(fusedlp.fit, normal_log_scale_loglik, progress=True),
                       in_axes=(None, 0))(init, ys)
    assert batched.params["loc"].shape == (64,) and batched.history.shape == (64, 1001)
    assert bool(jnp.all(batched.converged))
    for i in range(64):
        single = fusedlp.fit(normal_log_scale_loglik, init, ys[i])
        assert int(batched.num_steps[i]) == int(single.num_steps)
        leaves_close(jax.tree.map(lambda a: a[i], batched.params), single.params, rtol=1e-10)
    # tol = 1e-8 relative to |value| ~ n: loc is good to about 1e-8 of the scale
    np.testing.assert_allclose(batched.params["loc"], ys.mean(axis=1), rtol=0, atol=1e-7)


def test_vmap_over_initial_values(rng):
    y = rng.normal(size=N)
    inits = {"loc": jnp.linspace(-3, 3, 5), "log_scale": jnp.linspace(-1, 1, 5)}
    res = jax.vmap(lambda p: fusedlp.fit(normal_log_scale_loglik, p, y))(inits)
    assert bool(jnp.all(res.converged))
    np.testing.assert_allclose(res.params["loc"], np.full(5, y.mean()), rtol=1e-8)


def test_jit_of_fit_matches_fit_and_repeats_are_bitwise_identical():
    _, X, k = cpunish()
    init = {"beta": np.zeros(X.shape[1])}
    a = fusedlp.fit(poisson_regression_loglik, init, X, k)
    b = fusedlp.fit(poisson_regression_loglik, init, X, k)
    chex.assert_trees_all_equal(a, b)  # bitwise, history and all
    jitted = jax.jit(functools.partial(fusedlp.fit, poisson_regression_loglik))
    c = jitted(init, X, k)
    chex.assert_trees_all_equal(c, jitted(init, X, k))
    leaves_close(c.params, a.params, rtol=1e-9)


def test_loop_is_traced_once_per_shape(rng):
    traces = []

    def loglik(params, y):
        traces.append(None)
        return fusedlp.normal_lpdf(y, params["loc"], jnp.exp(params["log_scale"]))

    init = {"loc": 0.0, "log_scale": 0.0}
    y1, y2 = rng.normal(size=30), rng.normal(3.0, 2.0, size=30)
    r1 = fusedlp.fit(loglik, init, y1)
    n = len(traces)
    r2 = fusedlp.fit(loglik, init, y2)
    assert len(traces) == n  # the second call runs the compiled loop: no retrace
    assert float(r1.params["loc"]) != float(r2.params["loc"])

    def run(init, y):
        return fusedlp.fit(loglik, init, y)

    once = jax.jit(chex.assert_max_traces(run, n=1))
    once(init, y1)
    once(init, y2)  # AssertionError on a second trace
    # traced data are not validated: NaN makes the fit diverge instead of raising
    y_nan = y2.copy()
    y_nan[3] = np.nan
    res = once(init, y_nan)
    assert int(res.status) == FitStatus.DIVERGED and not bool(res.converged)


# ========================================================================== progress


def test_progress_bar_from_inside_the_loop(rng, capsys):
    pytest.importorskip("tqdm")
    y = rng.normal(size=N)
    init = {"loc": 0.0, "scale": 1.0}
    res = fusedlp.fit(normal_loglik, init, y, progress=1)
    jax.effects_barrier()
    err = capsys.readouterr().err
    assert f"{int(res.num_steps)}/1000" in err and "grad_norm" in err
    n = int(res.num_steps)
    assert "100%" in err and f"{n}/{n}" in err  # closed at the steps taken: the whole run
    chex.assert_trees_all_equal(res, fusedlp.fit(normal_loglik, init, y))
    # the compiled loop runs again: a fresh bar from step 0
    fusedlp.fit(normal_loglik, init, y, progress=1)
    jax.effects_barrier()
    assert f"{int(res.num_steps)}/1000" in capsys.readouterr().err


# ==================================================================== standard errors


def test_standard_errors_nan_with_warning_where_not_positive_definite():
    y = jnp.array([1.0, 2.0, 4.0, 5.0])
    at_min = {"loc": 3.0, "scale": 10.0}  # d2/dscale2 > 0 here: not a maximum
    with pytest.warns(RuntimeWarning, match="not positive definite"):
        se = fusedlp.standard_errors(normal_loglik, at_min, y)
    assert all(np.isnan(leaf) for leaf in jax.tree.leaves(se))
    traced = jax.jit(functools.partial(fusedlp.standard_errors, normal_loglik))(at_min, y)
    assert all(np.isnan(leaf) for leaf in jax.tree.leaves(traced))  # no warning: traced


def test_standard_errors_docstring_example_and_minimize_convention():
    y = jnp.array([1.0, 2.0, 4.0, 5.0])
    p = {"loc": 3.0, "scale": float(np.sqrt(2.5))}
    se = fusedlp.standard_errors(normal_loglik, p, y)
    np.testing.assert_allclose(se["loc"], math.sqrt(2.5) / 2, rtol=1e-12)
    nll = lambda p, y: -normal_loglik(p, y)  # noqa: E731
    leaves_close(fusedlp.standard_errors(nll, p, y, maximize=False), se, rtol=1e-14)


# ============================================== newton, runaway objectives, printing


def unbounded_log_growth(params, x):
    """log(1 + theta^2): no maximum, and a gradient that vanishes as theta grows."""
    return jnp.log1p(params["theta"] ** 2) + 0.0 * jnp.sum(x)


def unbounded_linear(params, x):
    return params["theta"] * jnp.sum(x)


@pytest.mark.parametrize("optimizer", ["newton", "lbfgs", "adam", "sgd"])
@pytest.mark.parametrize("objective", [unbounded_log_growth, unbounded_linear])
def test_a_runaway_objective_is_never_converged(objective, optimizer):
    opt = {"adam": optax.adam(0.5), "sgd": optax.sgd(0.6)}.get(optimizer, optimizer)
    res = fusedlp.fit(objective, {"theta": 1.0}, jnp.array([1.0, 2.0]), optimizer=opt,
                      max_steps=300)
    assert not bool(res.converged), repr(res)
    assert int(res.status) in (FitStatus.MAX_STEPS, FitStatus.DIVERGED, FitStatus.STALLED)


def test_the_issues_sgd_runaway_is_not_converged():
    """sgd(0.6) on a normal mean overshoots further every step: |f| grows without bound."""
    res = fusedlp.fit(lambda p, x: fusedlp.normal_lpdf(x, p["mu"], 1.0), {"mu": 0.0},
                      jnp.array([1.0, 2.0, 4.0, 7.0]), optimizer=optax.sgd(0.6))
    assert not bool(res.converged)
    assert abs(float(res.params["mu"])) > 1e6  # it did run away


def runaway_to_a_limit(params, x):
    """-exp(-theta): the supremum 0 is approached as theta runs off to infinity."""
    return -jnp.exp(-params["theta"]) + 0.0 * jnp.sum(x)


def quartic(params, x):
    """-theta^4: a maximum at 0 with zero curvature (a singular Hessian)."""
    return -params["theta"] ** 4 + 0.0 * jnp.sum(x)


@pytest.mark.parametrize("objective", [runaway_to_a_limit, quartic])
def test_newton_whose_decrement_falls_only_as_the_curvature_vanishes_ends_singular(objective):
    # Newton's decrement reaches tol on both (the objective flattens), but its steps stop
    # shrinking quadratically: a step of length 1 every time towards infinity, and 1/3 of
    # the distance to 0 on the quartic (fitting._singular)
    res = fusedlp.fit(objective, {"theta": 1.0}, jnp.array([1.0]))
    assert int(res.status) == FitStatus.SINGULAR and not bool(res.converged), repr(res)
    assert int(res.num_steps) > 10  # it ran on until the decrement met tol


def test_perfectly_separated_logit_is_singular_single_and_vmapped_and_summary_warns():
    # The log-likelihood tends to 0 as the slope runs off to infinity: no finite MLE
    # (statsmodels' Logit ends these data not converged, with a ConvergenceWarning). The
    # overlapping member must still converge, to statsmodels' estimate.
    sm = pytest.importorskip("statsmodels.api")
    x = np.linspace(-2.0, 2.0, 40)
    X = np.column_stack([np.ones_like(x), x])
    separated = (x > 0.1).astype(np.float64)
    overlapping = separated.copy()
    overlapping[[5, 30]] = 1.0 - overlapping[[5, 30]]

    def loglik(params, X, y):
        return fusedlp.bernoulli_logit_lpmf(y, X @ params["beta"])

    init = {"beta": jnp.zeros(2)}
    single = fusedlp.fit(loglik, init, X, separated)
    assert int(single.status) == FitStatus.SINGULAR, repr(single)
    assert float(single.params["beta"][1]) > 50.0  # it did run away
    with pytest.warns(RuntimeWarning, match="SINGULAR"):
        fusedlp.summary(loglik, single, X, separated, nobs=40)
    ys = jnp.stack([jnp.asarray(separated), jnp.asarray(overlapping)])
    batched = jax.jit(jax.vmap(lambda y: fusedlp.fit(loglik, init, X, y)))(ys)
    assert [int(v) for v in batched.status] == [FitStatus.SINGULAR, FitStatus.CONVERGED]
    assert int(batched.num_steps[0]) == int(single.num_steps)
    ref = sm.Logit(overlapping, X).fit(disp=0, tol=1e-12)
    np.testing.assert_allclose(batched.params["beta"][1], ref.params, rtol=1e-6)


def star98():
    """statsmodels' star98: a binomial GLM with 20 covariates on very different scales."""
    sm = pytest.importorskip("statsmodels.api")
    data = sm.datasets.star98.load()
    X = sm.add_constant(data.exog, prepend=True).to_numpy(np.float64)
    k, fail = (data.endog[c].to_numpy(np.float64) for c in ("NABOVE", "NBELOW"))
    return sm, X, k, k + fail


def binomial_regression_loglik(params, X, k, n):
    return fusedlp.binomial_logit_lpmf(k, n, X @ params["beta"])


def test_newton_converges_on_star98_where_lbfgs_runs_out_of_steps():
    sm, X, k, n = star98()
    ref = sm.GLM(np.column_stack([k, n - k]), X, family=sm.families.Binomial()).fit(tol=1e-13)
    init = {"beta": np.zeros(X.shape[1])}
    newton = fusedlp.fit(binomial_regression_loglik, init, X, k, n)  # the default: Newton
    assert bool(newton.converged) and int(newton.num_steps) < 20, repr(newton)
    np.testing.assert_allclose(newton.params["beta"], ref.params, rtol=1e-6)
    lbfgs = fusedlp.fit(binomial_regression_loglik, init, X, k, n, optimizer="lbfgs",
                        max_steps=200)
    assert not bool(lbfgs.converged)  # the scales defeat it (the issue's motivation)


def test_newton_is_exact_on_ill_conditioned_regular_designs():
    """Longley's data (NIST's certified least-squares test: scaled condition number of the
    Hessian 2e9) and a Poisson GLM on a raw quadratic in calendar years (6e10): Newton
    converges to statsmodels' estimates. (With the eigenvalues floored at sqrt(eps), the
    weak direction crawled: STALLED after 389 steps and MAX_STEPS, 0.65 SE off.)"""
    sm = pytest.importorskip("statsmodels.api")
    data = sm.datasets.longley.load()
    X = sm.add_constant(data.exog, prepend=True).to_numpy(np.float64)
    y = data.endog.to_numpy(np.float64)
    ols = sm.OLS(y, X).fit()
    res = fusedlp.fit(linear_regression_loglik, {"beta": np.zeros(X.shape[1]),
                                                 "log_scale": 0.0}, X, y)
    assert bool(res.converged), repr(res)
    np.testing.assert_allclose(res.params["beta"], ols.params, rtol=1e-6)
    np.testing.assert_allclose(res.value, ols.llf, rtol=1e-12)

    year = np.repeat(np.arange(1990.0, 2021.0), 10)
    X = np.column_stack([np.ones_like(year), year, year**2])
    k = np.random.default_rng(3).poisson(np.exp(1 + 0.05 * (year - 2005)
                                                - 0.002 * (year - 2005) ** 2))
    ref = sm.GLM(k, X, family=sm.families.Poisson()).fit(tol=1e-14, maxiter=1000)
    res = fusedlp.fit(poisson_regression_loglik, {"beta": np.zeros(3)}, X, k)
    assert bool(res.converged) and int(res.num_steps) < 20, repr(res)
    np.testing.assert_allclose(res.params["beta"], ref.params, rtol=1e-6)
    np.testing.assert_allclose(res.value, ref.llf, rtol=1e-12)


@pytest.mark.parametrize("n_obs", [300, 200_000])
def test_a_collinear_design_ends_singular_and_summary_warns(n_obs):
    """An exactly collinear column: the optimum is not unique (the Hessian is singular),
    so the fit ends SINGULAR, not CONVERGED, in a few steps (the step along the null
    direction is damped), and summary says so."""
    rng = np.random.default_rng(n_obs)
    x = rng.normal(size=(n_obs, 3))
    X = np.column_stack([np.ones(n_obs), x, 2.0 * x[:, 0] - 0.5 * x[:, 1] + 1.0])
    k = rng.poisson(np.exp(0.3 + x @ np.array([0.2, -0.1, 0.3])))
    res = fusedlp.fit(poisson_regression_loglik, {"beta": np.zeros(5)}, X, k)
    assert int(res.status) == FitStatus.SINGULAR and int(res.num_steps) < 10, repr(res)
    with pytest.warns(RuntimeWarning, match="SINGULAR"):
        fusedlp.summary(poisson_regression_loglik, res, X, k, nobs=n_obs)


def test_newton_under_vmap_equals_single_fits(rng):
    n, p, batch = 200, 3, 16
    X = np.column_stack([np.ones(n), rng.normal(size=(n, p - 1))])
    betas = rng.normal(0.0, 0.5, size=(batch, p))
    ks = rng.poisson(np.exp(betas @ X.T))
    init = {"beta": jnp.zeros(p)}
    fit1 = functools.partial(fusedlp.fit, poisson_regression_loglik, optimizer="newton")
    batched = jax.jit(jax.vmap(fit1, in_axes=(None, None, 0)))(init, X, ks)
    assert bool(jnp.all(batched.converged))
    for i in range(batch):
        single = fit1(init, X, ks[i])
        assert int(batched.num_steps[i]) == int(single.num_steps)
        np.testing.assert_allclose(batched.params["beta"][i], single.params["beta"], rtol=1e-10)


def test_newton_search_after_a_rejected_full_step_single_and_vmapped_agree():
    # From x = 0 the full Newton step of k x - exp(x) is to x = k - 1: exp(999) overflows
    # at k = 1000, so the fit halves. A single fit forms loss, gradient and Hessian at the
    # full step, then searches and recentres; a vmapped one searches first (fitting's
    # _newton_loop): the two must take the same steps to the same optimum, log k.
    def loglik(params, k):
        return k * params["x"] - jnp.exp(params["x"])

    init = {"x": jnp.zeros(())}
    ks = jnp.array([1000.0, 3.0, 1e-3])
    batched = jax.jit(jax.vmap(lambda k: fusedlp.fit(loglik, init, k)))(ks)
    for i, k in enumerate(ks):
        single = fusedlp.fit(loglik, init, k)
        assert bool(single.converged) and bool(batched.converged[i])
        assert int(single.num_steps) == int(batched.num_steps[i])
        np.testing.assert_allclose(batched.params["x"][i], single.params["x"], rtol=1e-12)
        np.testing.assert_allclose(single.params["x"], np.log(float(k)), rtol=1e-10)
        np.testing.assert_allclose(batched.history[i], single.history, rtol=1e-12)
    assert int(batched.num_steps[0]) > int(batched.num_steps[1])  # it searched


def test_a_finished_member_does_not_prolong_a_vmapped_newton_fit():
    # Under vmap the loop runs while any member runs. Member 0 stalls at once: -|x| + x/1000
    # has a slope but no curvature at x = 0, and every step along it lowers the objective,
    # so its search halves 30 times and gives up. Member 1 converges in 15 steps. Had the
    # stalled member kept searching in every later pass, the batch would have evaluated
    # the objective 30 times more per pass (482 evaluations, not at most 66).
    calls = []

    def loglik(params, c):
        x = params["x"]
        value = jnp.where(c < 0, -jnp.abs(x) + 1e-3 * x, -((x - c) ** 4 + (x - c) ** 2))
        jax.debug.callback(lambda v: calls.append(None), value)
        return value

    init = {"x": jnp.zeros(())}
    cs = jnp.array([-1.0, 50.0])
    single = []
    for c in cs:
        calls.clear()
        jax.block_until_ready(fusedlp.fit(loglik, init, c))
        single.append(len(calls))
    calls.clear()
    res = jax.block_until_ready(jax.vmap(lambda c: fusedlp.fit(loglik, init, c))(cs))
    assert [fusedlp.FitStatus(int(s)).name for s in res.status] == ["STALLED", "CONVERGED"]
    assert list(res.num_steps) == [0, 15]  # a search that finds no step takes none
    # a batched debug callback runs once per member: evaluations of the batch's objective
    assert len(calls) / len(cs) <= sum(single), (len(calls) / len(cs), single)


def test_newton_loop_is_traced_once(rng):
    traces = []

    def loglik(params, y):
        traces.append(None)
        return fusedlp.normal_lpdf(y, params["loc"], jnp.exp(params["log_scale"]))

    run = jax.jit(chex.assert_max_traces(
        lambda init, y: fusedlp.fit(loglik, init, y, optimizer="newton"), n=1))
    init = {"loc": 0.0, "log_scale": 0.0}
    a = run(init, rng.normal(size=30))
    n = len(traces)  # the places of the objective in the one compiled loop
    b = run(init, rng.normal(3.0, 2.0, size=30))  # AssertionError on a second trace
    assert bool(a.converged) and bool(b.converged)
    assert len(traces) == n  # the second call runs the compiled loop: no retrace


def test_result_prints_status_by_name_and_converts_to_numpy(rng):
    k = rng.poisson(3.2, size=50)
    res = fusedlp.fit(poisson_rate_loglik, {"rate": 1.0}, k)
    assert "status=FitStatus.CONVERGED" in repr(res) and "Array(" not in repr(res)
    status = fusedlp.FitStatus(int(res.status))
    assert str(status) == f"{status}" == "FitStatus.CONVERGED" and status == 0
    d = res.to_dict()
    assert d["status"] == "CONVERGED" and isinstance(d["params"]["rate"], np.ndarray)
    batch = jax.vmap(lambda k: fusedlp.fit(poisson_rate_loglik, {"rate": 1.0}, k))(
        np.stack([k, k + 1]))
    assert "status={CONVERGED: 2}" in repr(batch)
    assert list(batch.to_dict()["status"]) == ["CONVERGED", "CONVERGED"]


def test_result_converts_to_a_frame_one_row_per_fit(rng):
    k = rng.poisson(3.2, size=(3, 50))
    ks = np.stack([k, k + 1])  # a 2 x 3 batch of fits

    def loglik(params, k):
        return fusedlp.poisson_lpmf(k, params["rate"]) + fusedlp.normal_lpdf(
            params["w"], 0.0, 10.0)

    init = {"rate": 1.0, "w": jnp.zeros(2)}
    one = fusedlp.fit(loglik, init, k[0]).to_frame()
    assert list(one.columns) == ["rate", "w[0]", "w[1]", "value", "grad_norm", "num_steps",
                                 "converged", "status"]
    assert one.shape == (1, 8) and one["status"].item() == "CONVERGED"
    fit_all = jax.vmap(jax.vmap(lambda k: fusedlp.fit(loglik, init, k)))
    batch = fit_all(ks)
    frame = batch.to_frame()
    assert frame.shape == (6, 8) and frame.index[4] == (1, 1)
    np.testing.assert_allclose(frame["rate"], np.ravel(batch.params["rate"]))
    np.testing.assert_allclose(frame.loc[(1, 2), "rate"], ks[1, 2].mean(), rtol=1e-5)
    assert list(frame["status"]) == ["CONVERGED"] * 6


def test_to_frame_refuses_a_parameter_named_like_a_result_column(rng):
    y = rng.normal(size=20)
    res = fusedlp.fit(lambda p, y: fusedlp.normal_lpdf(y, p["value"], jnp.exp(p["status"])),
                      {"value": 0.0, "status": 0.0}, y)
    with pytest.raises(ValueError, match=r"\['status', 'value'\] would clash"):
        res.to_frame()


def test_float32_params_with_a_float64_objective_fit_in_float32(rng):
    """Under x64, float64 data make the objective float64; float32 params keep the loop
    in float32 (with every optimizer), as close to the float64 fit as float32 allows."""
    X = np.column_stack([np.ones(200), rng.normal(size=200)])
    k = rng.poisson(np.exp(X @ np.array([0.5, 0.3]))).astype(np.float64)
    want = fusedlp.fit(poisson_regression_loglik, {"beta": np.zeros(2)}, X, k)
    for optimizer in ("newton", "lbfgs", optax.adam(0.05)):
        res = fusedlp.fit(poisson_regression_loglik, {"beta": np.zeros(2, np.float32)}, X, k,
                          optimizer=optimizer, max_steps=2000)
        assert bool(res.converged), (optimizer, repr(res))
        assert res.params["beta"].dtype == np.float32 and res.value.dtype == np.float32
        np.testing.assert_allclose(res.params["beta"], want.params["beta"], rtol=2e-3)


@pytest.mark.parametrize("setting, match", [
    ({"tol": -1.0}, "tol must be >= 0"), ({"atol": float("nan")}, "atol must be >= 0"),
    ({"max_steps": True}, "max_steps must be a non-negative int"),
    ({"progress": 0.5}, "progress must be"), ({"progress": -3}, "progress must be"),
])
def test_invalid_settings_raise_naming_them(setting, match):
    with pytest.raises(ValueError, match=match):
        fusedlp.fit(poisson_rate_loglik, {"rate": 1.0}, np.ones(3), **setting)


def test_unknown_optimizer_name_raises():
    with pytest.raises(ValueError, match="'newton', 'lbfgs'"):
        fusedlp.fit(poisson_rate_loglik, {"rate": 1.0}, np.ones(3), optimizer="bfgs")
