"""fusedlp.summary against statsmodels on data sets statsmodels ships, and fusedlp.pointwise.

Each reference is computed here by statsmodels, fitted to a tight tolerance; fusedlp's fits
use their defaults (Newton: every model here has at most 21 parameters). Parity: parameters
to 1e-6, standard errors to 1e-4, and z, p-values, intervals, log-likelihood, AIC and BIC.
"""

from __future__ import annotations

import functools
import sys
import warnings

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import fusedlp

sm = pytest.importorskip("statsmodels.api")


def binomial_glm(params, X, k, n):
    return fusedlp.binomial_logit_lpmf(k, n, X @ params["beta"])


def logit(params, X, y):
    return fusedlp.bernoulli_logit_lpmf(y, X @ params["beta"])


def gamma_log_link(params, X, y, shape):
    return fusedlp.gamma_lpdf(y, shape, shape * jnp.exp(-(X @ params["beta"])))


def nb2(params, X, k):
    return fusedlp.negative_binomial_lpmf(k, jnp.exp(X @ params["beta"]), 1.0 / params["alpha"])


def assert_parity(s, ref, coef, alpha=0.05):
    """``s``: a FitSummary whose parameters, flattened, are statsmodels' ``ref.params``."""
    d = s.to_dict()
    np.testing.assert_allclose(d["coef"], ref.params, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(d["std_err"], ref.bse, rtol=1e-4)
    np.testing.assert_allclose(d["z"], ref.tvalues, rtol=1e-4)
    np.testing.assert_allclose(d["p_value"], ref.pvalues, rtol=1e-3, atol=1e-12)
    ci = np.asarray(ref.conf_int(alpha))
    # a bound is coef -/+ q se: off by as much as coef's 1e-6 and se's 1e-4 allow
    slack = 1e-6 * np.abs(coef) + 4e-4 * np.asarray(ref.bse)
    assert np.all(np.abs(d["ci_lower"] - ci[:, 0]) <= slack)
    assert np.all(np.abs(d["ci_upper"] - ci[:, 1]) <= slack)
    np.testing.assert_allclose(d["loglik"], ref.llf, rtol=1e-10)
    np.testing.assert_allclose(d["aic"], ref.aic, rtol=1e-10)
    bic = ref.bic_llf if hasattr(ref, "bic_llf") else ref.bic
    np.testing.assert_allclose(d["bic"], bic, rtol=1e-10)


def test_star98_binomial_glm_with_unscaled_covariates():
    data = sm.datasets.star98.load()
    X = sm.add_constant(data.exog, prepend=True).to_numpy(np.float64)
    k, fail = (data.endog[c].to_numpy(np.float64) for c in ("NABOVE", "NBELOW"))
    ref = sm.GLM(np.column_stack([k, fail]), X, family=sm.families.Binomial()).fit(tol=1e-13)
    res = fusedlp.fit(binomial_glm, {"beta": np.zeros(X.shape[1])}, X, k, k + fail)
    assert bool(res.converged), repr(res)
    s = fusedlp.summary(binomial_glm, res, X, k, k + fail, nobs=X.shape[0])
    assert_parity(s, ref, ref.params)


def test_spector_logit():
    data = sm.datasets.spector.load()
    X = sm.add_constant(data.exog, prepend=True).to_numpy(np.float64)
    y = data.endog.to_numpy(np.float64)
    ref = sm.Logit(y, X).fit(method="newton", tol=1e-14, disp=0)
    res = fusedlp.fit(logit, {"beta": np.zeros(X.shape[1])}, X, y)
    assert bool(res.converged), repr(res)
    assert_parity(fusedlp.summary(logit, res, X, y, nobs=len(y), alpha=0.1), ref, ref.params,
                  alpha=0.1)


def test_scotland_gamma_glm_with_log_link():
    """statsmodels' GLM holds the gamma shape at 1 / (its Pearson scale) and, with
    ``optim_hessian="oim"``, reports the observed information: so does this fit."""
    data = sm.datasets.scotland.load()
    X = sm.add_constant(data.exog, prepend=True).to_numpy(np.float64)
    y = data.endog.to_numpy(np.float64)
    family = sm.families.Gamma(link=sm.families.links.Log())
    irls = sm.GLM(y, X, family=family).fit(tol=1e-13)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # statsmodels' note that newton's gtol was met early
        ref = sm.GLM(y, X, family=family).fit(method="newton", start_params=irls.params,
                                              scale=irls.scale, optim_hessian="oim",
                                              maxiter=50, disp=0)
    shape = 1.0 / irls.scale
    init = {"beta": np.r_[np.log(y.mean()), np.zeros(X.shape[1] - 1)]}
    res = fusedlp.fit(gamma_log_link, init, X, y, shape)
    assert bool(res.converged), repr(res)
    np.testing.assert_allclose(res.params["beta"], irls.params, rtol=1e-6)
    assert_parity(fusedlp.summary(gamma_log_link, res, X, y, shape, nobs=len(y)), ref,
                  irls.params)


def test_randhie_negative_binomial_nb2():
    from statsmodels.discrete.discrete_model import NegativeBinomial

    data = sm.datasets.randhie.load()
    X = sm.add_constant(data.exog, prepend=True).to_numpy(np.float64)[:4000]
    k = data.endog.to_numpy(np.float64)[:4000]
    model = NegativeBinomial(k, X, loglike_method="nb2")
    start = model.fit(disp=0, maxiter=500).params
    ref = model.fit(start_params=start, method="newton", tol=1e-14, maxiter=100, disp=0)
    init = {"beta": np.zeros(X.shape[1]), "alpha": 1.0}
    res = fusedlp.fit(nb2, init, X, k)
    assert bool(res.converged), repr(res)
    s = fusedlp.summary(nb2, res, X, k, nobs=len(k))
    # ravel_pytree orders dict keys: alpha first, then beta; statsmodels puts alpha last
    assert s.to_dict()["name"][:2] == ["alpha", "beta[0]"]
    order = np.r_[np.arange(1, X.shape[1] + 1), 0]
    d = s.to_dict()
    ref_params = np.asarray(ref.params)
    for key in ("coef", "std_err", "z", "p_value", "ci_lower", "ci_upper"):
        d[key] = d[key][order]
    np.testing.assert_allclose(d["coef"], ref_params, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(d["std_err"], ref.bse, rtol=1e-4)
    np.testing.assert_allclose(d["z"], ref.tvalues, rtol=1e-4)
    np.testing.assert_allclose(d["p_value"], ref.pvalues, rtol=1e-3, atol=1e-12)
    ci = np.asarray(ref.conf_int())
    np.testing.assert_allclose(np.c_[d["ci_lower"], d["ci_upper"]], ci, rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose([d["loglik"], d["aic"], d["bic"]], [ref.llf, ref.aic, ref.bic],
                               rtol=1e-10)


# ================================================================ the table and its forms


def normal_model(params, y):
    return fusedlp.normal_lpdf(y, params["mu"], jnp.exp(params["log_sigma"]))


def test_table_rows_are_named_from_pytree_paths_and_frame_matches():
    y = jnp.array([1.0, 2.0, 4.0, 5.0, 3.5])
    params = {"beta": jnp.zeros(2), "log_phi": 0.0}

    def loglik(p, y):
        return fusedlp.normal_lpdf(y, p["beta"][0] + p["beta"][1], jnp.exp(p["log_phi"])) \
            - 0.5 * p["beta"][1] ** 2

    res = fusedlp.fit(loglik, params, y)
    s = fusedlp.summary(loglik, res, y, nobs=5)
    text = str(s)
    for name in ("beta[0]", "beta[1]", "log_phi", "Log-likelihood", "AIC", "BIC",
                 "P>|z|", "[0.025", "0.975]"):
        assert name in text
    frame = s.to_frame()
    assert list(frame.index) == ["beta[0]", "beta[1]", "log_phi"]
    np.testing.assert_allclose(frame["std_err"].to_numpy(),
                               jax.flatten_util.ravel_pytree(
                                   fusedlp.standard_errors(loglik, res.params, y))[0])
    no_nobs = fusedlp.summary(loglik, res, y)
    assert np.isnan(no_nobs.bic) and "BIC: —" in str(no_nobs)


def test_top_level_sequences_are_named_params_and_a_huge_z_keeps_its_column():
    from fusedlp.inference import parameter_names

    assert parameter_names((jnp.zeros(2), 1.0)) == ["params[0][0]", "params[0][1]",
                                                    "params[1]"]
    assert parameter_names(jnp.zeros(2)) == ["params[0]", "params[1]"]
    y = jnp.array([1.0, 2.0, 4.0, 5.0]) * 1e-9 + 1e3  # loc about 1e10 of its SE
    res = fusedlp.fit(normal_model, {"mu": 1e3, "log_sigma": jnp.log(1e-9)}, y)
    lines = str(fusedlp.summary(normal_model, res, y)).splitlines()
    mu, = (line for line in lines if line.startswith("mu "))
    log_sigma, = (line for line in lines if line.startswith("log_sigma "))
    assert "e+" in mu and len(mu) == len(log_sigma) == len(lines[-1])


def test_to_frame_without_pandas_says_how_to_get_it(monkeypatch):
    """pandas is optional (the ``frames`` extra): both to_frame methods say so by name."""
    y = jnp.array([1.0, 2.0, 4.0])

    def loglik(p, y):
        return fusedlp.normal_lpdf(y, p["mu"], 1.0)

    res = fusedlp.fit(loglik, {"mu": 0.0}, y)
    s = fusedlp.summary(loglik, res, y)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas then raises
    for obj, name in ((res, "FitResult"), (s, "FitSummary")):
        with pytest.raises(ImportError, match=rf"{name}.to_frame needs pandas .*frames"):
            obj.to_frame()


def test_a_newton_result_carries_its_hessian_and_summary_uses_it(rng):
    """A Newton fit's result holds the Hessian its last verdict was formed from; summary
    takes it and the fit's value instead of tracing the objective again, and gives the
    table that forming both again from ``result.params`` gives."""
    y = rng.normal(1.0, 2.0, size=40)
    init = {"mu": 0.0, "log_sigma": 0.0}
    res = fusedlp.fit(normal_model, init, y)
    flat, unravel = jax.flatten_util.ravel_pytree(res.params)
    want = fusedlp.hessian(lambda v: normal_model(unravel(v), y))(flat)
    np.testing.assert_allclose(res.hessian, want, rtol=1e-12)

    traces = []

    def counted(p, y):
        traces.append(1)
        return normal_model(p, y)

    from_fit = fusedlp.summary(counted, res, y, nobs=40)
    assert not traces  # the objective was not evaluated
    again = fusedlp.summary(counted, res.params, y, nobs=40)
    assert traces
    for got, exp in zip(jax.tree.leaves(from_fit), jax.tree.leaves(again)):
        np.testing.assert_allclose(got, exp, rtol=1e-12)

    # minimised: the result's Hessian is the objective's own (unnegated)
    def negated(p, y):
        return -normal_model(p, y)

    low = fusedlp.fit(negated, init, y, maximize=False)
    np.testing.assert_allclose(low.hessian, -want, rtol=1e-8)
    s = fusedlp.summary(negated, low, y, nobs=40, maximize=False)
    for got, exp in zip(jax.tree.leaves(s), jax.tree.leaves(again)):
        np.testing.assert_allclose(got, exp, rtol=1e-6)
    # gradient methods carry none: summary forms it
    lbfgs = fusedlp.fit(normal_model, init, y, optimizer="lbfgs")
    assert lbfgs.hessian is None and lbfgs.to_dict()["hessian"] is None
    s = fusedlp.summary(normal_model, lbfgs, y, nobs=40)
    np.testing.assert_allclose(s.se["mu"], again.se["mu"], rtol=1e-5)


def test_summary_under_jit_and_vmap_equals_single_summaries(rng):
    ys = rng.normal(rng.uniform(-1, 1, size=(4, 1)), 2.0, size=(4, 40))
    init = {"mu": 0.0, "log_sigma": 0.0}

    def one(y):
        res = fusedlp.fit(normal_model, init, y)
        return fusedlp.summary(normal_model, res, y, nobs=40)

    batched = jax.jit(jax.vmap(one))(ys)
    for i in range(4):
        single = one(ys[i])
        for got, want in zip(jax.tree.leaves(batched), jax.tree.leaves(single)):
            np.testing.assert_allclose(got[i], want, rtol=1e-10)
    with pytest.raises(ValueError, match="select one first"):
        str(batched)
    # a batch of fits passed to summary outside vmap: said so, not a shape error in cho_solve
    fits = jax.vmap(lambda y: fusedlp.fit(normal_model, init, y))(ys)
    with pytest.raises(ValueError, match=r"a batch of \(4,\) fits \(from vmap\)"):
        fusedlp.summary(normal_model, fits, ys, nobs=40)
    picked = fusedlp.summary(normal_model, jax.tree.map(lambda a: a[2], fits), ys[2], nobs=40)
    np.testing.assert_allclose(picked.se["mu"], batched.se["mu"][2], rtol=1e-10)


def test_summary_at_a_non_finite_objective_is_nan_with_a_warning():
    y = jnp.array([1.0, 2.0, 4.0])
    bad = {"mu": 0.0, "log_sigma": jnp.inf}
    with pytest.warns(RuntimeWarning, match="not finite"):
        s = fusedlp.summary(normal_model, bad, y)
    assert all(np.all(np.isnan(leaf)) for leaf in jax.tree.leaves(s.se))
    with pytest.warns(RuntimeWarning, match="not finite"):
        se = fusedlp.standard_errors(normal_model, bad, y)
    assert all(np.all(np.isnan(leaf)) for leaf in jax.tree.leaves(se))


def test_summary_warns_where_the_fit_did_not_converge(rng):
    y = rng.normal(1.0, 2.0, size=50)
    init = {"mu": 0.0, "log_sigma": 0.0}
    short = fusedlp.fit(normal_model, init, y, max_steps=1)
    assert int(short.status) == fusedlp.FitStatus.MAX_STEPS
    with pytest.warns(RuntimeWarning, match="MAX_STEPS, not CONVERGED"):
        fusedlp.summary(normal_model, short, y, nobs=50)
    done = fusedlp.fit(normal_model, init, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fusedlp.summary(normal_model, done, y, nobs=50)


@pytest.mark.parametrize("nobs", [0, -5, 200.5])
def test_summary_nobs_must_be_a_positive_whole_number(nobs):
    y = jnp.array([1.0, 2.0, 4.0])
    with pytest.raises(ValueError, match="nobs must be a positive whole number"):
        fusedlp.summary(normal_model, {"mu": 2.0, "log_sigma": 0.0}, y, nobs=nobs)


# =============================================================================== pointwise

KERNEL_CASES = {
    "normal_lpdf": (fusedlp.normal_lpdf, lambda r: (r.normal(size=6), 0.3, 1.7)),
    "poisson_lpmf": (fusedlp.poisson_lpmf, lambda r: (r.poisson(3.0, 6), r.uniform(1, 4, 6))),
    "poisson_log_lpmf": (fusedlp.poisson_log_lpmf, lambda r: (r.poisson(3.0, 6), r.normal(size=6))),
    "gamma_lpdf": (fusedlp.gamma_lpdf, lambda r: (r.gamma(2.0, size=6), 2.5, r.uniform(1, 2, 6))),
    "negative_binomial_lpmf": (fusedlp.negative_binomial_lpmf,
                               lambda r: (r.poisson(4.0, 6), r.uniform(1, 5, 6), 3.0)),
    "student_t_lpdf": (fusedlp.student_t_lpdf, lambda r: (r.normal(size=6), 4.0, 0.5, 2.0)),
    "bernoulli_logit_lpmf": (fusedlp.bernoulli_logit_lpmf,
                             lambda r: (r.integers(0, 2, 6), r.normal(size=6))),
    "binomial_logit_lpmf": (fusedlp.binomial_logit_lpmf,
                            lambda r: (r.integers(0, 5, 6), 5, r.normal(size=6))),
}


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_pointwise_terms_sum_to_the_kernel(name, rng):
    kernel, make = KERNEL_CASES[name]
    args = [np.asarray(a, np.float64) for a in make(rng)]
    terms = fusedlp.pointwise(kernel, *args)
    assert terms.shape == (6,)
    np.testing.assert_allclose(jnp.sum(terms), kernel(*args), rtol=1e-12)
    for i in (0, 5):  # and each term is the kernel on that one element
        one = [a if a.ndim == 0 else a[i] for a in args]
        np.testing.assert_allclose(terms[i], kernel(*one), rtol=1e-12)


def test_pointwise_options_keywords_and_a_fused_kernel(rng):
    k, eta = rng.poisson(2.0, size=(3, 4)), rng.normal(size=4)  # broadcast to (3, 4)
    terms = fusedlp.pointwise(fusedlp.poisson_log_lpmf, k, log_rate=eta, normalized=False)
    assert terms.shape == (3, 4)
    np.testing.assert_allclose(jnp.sum(terms), fusedlp.poisson_log_lpmf(
        k, jnp.broadcast_to(eta, (3, 4)), normalized=False), rtol=1e-12)

    @functools.partial(fusedlp.fuse, data=("x",))
    def laplace(x, loc, scale):
        return -jnp.abs(x - loc) / scale - jnp.log(2 * scale)

    x = rng.normal(size=5)
    np.testing.assert_allclose(jnp.sum(fusedlp.pointwise(laplace, x, 0.2, 1.5)),
                               laplace(x, 0.2, 1.5), rtol=1e-12)
    with pytest.raises(TypeError, match="per site"):
        fusedlp.pointwise(fusedlp.eam_energy, np.ones((2, 3)))


def test_pointwise_any_fused_signature_and_the_kernels_own_checks(rng):
    """Fused element functions with positional-only parameters, ``*params`` or
    ``**options`` map as the kernel itself is called; the kernel's checks run first, with
    its messages: shapes always, values where validation is on."""
    x = rng.normal(size=5)

    def star(x, *p):
        return -((x - p[0]) ** 2) / p[1]

    def options(x, loc, **kw):
        return -((x - loc) ** 2) * kw.get("s", 1.0)

    cases = [(fusedlp.fuse(lambda x, loc, /: -((x - loc) ** 2)), (x, 0.1), {}),
             (fusedlp.fuse(star), (x, 0.1, 2.0), {}),
             (fusedlp.fuse(options), (x, 0.1), {"s": 2.0})]
    for kernel, args, kw in cases:
        terms = fusedlp.pointwise(kernel, *args, **kw)
        assert terms.shape == (5,)
        np.testing.assert_allclose(jnp.sum(terms), kernel(*args, **kw), rtol=1e-12)
    with pytest.raises(ValueError, match="`loc` with shape"):
        fusedlp.pointwise(fusedlp.normal_lpdf, x, jnp.zeros(2))
    with pytest.raises(ValueError, match="`scale` must be finite and > 0"):
        fusedlp.pointwise(fusedlp.normal_lpdf, x, 0.0, -1.0, validate_args=True)
    with fusedlp.validation(), pytest.raises(ValueError, match="non-negative integer"):
        fusedlp.pointwise(fusedlp.poisson_lpmf, np.array([1.5]), 1.0)
    assert np.all(np.isnan(fusedlp.pointwise(fusedlp.normal_lpdf, x, 0.0, -1.0)))


def test_pointwise_maps_arrays_given_by_name_after_a_skipped_default(rng):
    """An array given by name after a parameter left at its default is broadcast and
    mapped like the others (it was passed whole to every element call: each term summed
    over all the scales)."""
    x, scale = rng.normal(size=(4, 3)), rng.uniform(0.5, 2.0, size=(4, 1))
    np.testing.assert_allclose(fusedlp.pointwise(fusedlp.normal_lpdf, x, scale=scale),
                               scipy.stats.norm.logpdf(x, 0.0, scale), rtol=1e-12)
    assert fusedlp.pointwise(fusedlp.normal_lpdf, x[0], scale=scale).shape == (4, 3)
    np.testing.assert_allclose(fusedlp.pointwise(fusedlp.student_t_lpdf, x, 3.0, scale=scale),
                               scipy.stats.t.logpdf(x, 3.0, 0.0, scale), rtol=1e-12)
    laplace = fusedlp.fuse(lambda x, loc=0.0, scale=1.0: -jnp.abs(x - loc) / scale
                           - jnp.log(2 * scale))
    np.testing.assert_allclose(fusedlp.pointwise(laplace, x, scale=scale),
                               scipy.stats.laplace.logpdf(x, 0.0, scale), rtol=1e-12)


def test_pointwise_validation_setting_and_lists():
    """validate_args=None is the global setting, as for the kernels; a list of booleans is
    the Bernoulli's outcome, as the kernel reads it."""
    with fusedlp.validation(), pytest.raises(ValueError, match="`rate`"):
        fusedlp.pointwise(fusedlp.poisson_lpmf, [1, 2], [1.0, -1.0], validate_args=None)
    np.testing.assert_allclose(fusedlp.pointwise(fusedlp.bernoulli_logit_lpmf, [True, False],
                                                 0.0), [-np.log(2.0)] * 2, rtol=1e-15)
