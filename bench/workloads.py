"""Whole jobs side by side: fusedlp against statsmodels, glum and NumPyro's own likelihoods.

Each workload is a job a user runs from start to finish (fit, then the inference that
follows), timed as a whole against what the user would otherwise run, in one process (but
for the "run again" column, which times fresh ones):

* **many GLMs** — B Poisson regressions of 500 observations x 4 coefficients, with their
  inference tables: ``jit(vmap(fit + summary))`` against a Python loop over statsmodels' GLM
  (IRLS, with standard errors) and over glum (timed on a subset of the fits and
  extrapolated per fit: its per-fit overhead dominates, and the whole loop would take
  minutes);
* **one big GLM** — a Poisson regression of 200,000 x 20 with covariates spanning 1e-2 to
  1e3 in scale, + :func:`fusedlp.summary`: against statsmodels' GLM + standard errors and
  glum + its covariance matrix;
* **logit** (statsmodels' ``spector``) and **NB2** (``randhie``): fit + summary against
  statsmodels' ``Logit`` / ``NegativeBinomial(loglike_method="nb2")``;
* **EAM fit** — the README's EAM parameter fit: Newton against L-BFGS (steps and time);
* **NUTS** — NumPyro NUTS on a Poisson and a logistic regression with N = 1e5: the model's
  likelihood as NumPyro's own distribution against a fusedlp kernel in ``numpyro.factor``
  (the Poisson's both as written by default and with ``normalized=False``, as README
  advises for a sampler); time per leapfrog step after warm-up (the samplers' runs in
  turn, five rounds, the median run), and the posterior means.

fusedlp columns: **warm** is the median of repeated calls of the compiled job, **compile**
the one-off ``jit(...).lower().compile()`` time, **cold** their sum (what a one-off fit
pays), **run again** the job in a fresh process reading its program from JAX's persistent
compilation cache, which an earlier process filled (`rerun_times`: imports excluded, one
sample each; not in ``--quick``).
Ratios are baseline time / fusedlp time: above 1, fusedlp is faster. Estimates are compared
with a statsmodels fit to a tight tolerance (untimed). Calls are timed round-robin
as in every bench module (bench/_timing.py); JAX's asynchronous CPU dispatch is off.

Run ``python -m bench workloads --help``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import jax
import numpy as np

from bench import _timing

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------- models


def poisson_glm(params, X, k):
    import fusedlp

    return fusedlp.poisson_log_lpmf(k, X @ params["beta"])


def logit_model(params, X, y):
    import fusedlp

    return fusedlp.bernoulli_logit_lpmf(y, X @ params["beta"])


def nb2_model(params, X, k):
    import jax.numpy as jnp

    import fusedlp

    return fusedlp.negative_binomial_lpmf(k, jnp.exp(X @ params["beta"]), 1.0 / params["alpha"])


def _max_rel(got, want) -> float:
    got, want = np.asarray(got, float), np.asarray(want, float)
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-300)))


def _time(calls: dict, cfg: dict) -> dict:
    return _timing.time_interleaved(calls, min_repeats=cfg["repeats"], min_total=0.0,
                                    max_total=cfg["max_total"], collect=1.0)


def _first_call(job, *args):
    """``(job(*args), seconds, device copies of args)``: the compiled job's first call, on
    the data as NumPy arrays, as a one-off job has them (the copy to the device included),
    and jax arrays of them for the warm calls after it: a job called again holds its data
    on the device."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(job(*args))
    return out, time.perf_counter() - t0, jax.device_put(args)


def _row(name, fused_warm, compile_s, baselines, agreement, extra=None, rerun=None,
         first_s=None) -> dict:
    """One workload's row: fusedlp's warm/compile/cold and each baseline's time + ratios;
    cold is a one-off job in this process: tracing, compiling and the first call
    (``first_s``; the warm time where there is none). With ``rerun`` (`rerun_times`), the
    job in a fresh process, also with a filled compilation cache, and its ratios too."""
    cold = compile_s + (fused_warm if first_s is None else first_s)
    row = {"workload": name, "fusedlp_warm_s": fused_warm, "fusedlp_compile_s": compile_s,
           "fusedlp_first_call_s": first_s, "fusedlp_cold_s": cold,
           "baselines": {b: {"s": t, "ratio_warm": t / fused_warm, "ratio_cold": t / cold}
                         for b, t in baselines.items()},
           "agreement": agreement, **(extra or {})}
    if rerun is not None:
        row["fusedlp_rerun"] = rerun
        for b in row["baselines"].values():
            b["ratio_rerun"] = b["s"] / rerun["cached"]["total_s"]
    return row


# ------------------------------------------------------- a script run a second time


def _rerun(name: str, cfg: dict, log) -> dict | None:
    """`rerun_times` of a job, except in a quick run (two more processes per job)."""
    if cfg["quick"]:
        return None
    out = rerun_times(name, cfg)
    log(f"  {name} in a fresh process: {out['first']['total_s']:.2f} s, run again with the "
        f"compilation cache {out['cached']['total_s']:.2f} s")
    return out


def _configure_jax() -> None:
    """float64, and synchronous CPU dispatch (a call returns when its work is done): the
    settings of every run, in this process or a fresh one (`fresh_process_times`)."""
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def _job(name: str, cfg: dict):
    """The job (fn, args) named ``name``: "many", "big", or a statsmodels data set."""
    if name == "many":
        return many_glms_job(cfg)
    if name == "big":
        return big_glm_job(cfg)
    return statsmodels_model_job(name)


def fresh_process_times(name: str, cfg: dict, cache_dir: str) -> dict:
    """In this (fresh) process: the job's tracing and lowering, compiling (or reading the
    compiled program from JAX's persistent cache in ``cache_dir``) and first call, each
    timed once, as a script that fits once pays them."""
    _configure_jax()
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    fn, args = _job(name, cfg)
    job, lower_s, compile_s = _timing.aot_compile(fn, *args)
    t0 = time.perf_counter()
    jax.block_until_ready(job(*args))
    first_call_s = time.perf_counter() - t0
    return {"lower_s": lower_s, "compile_s": compile_s, "first_call_s": first_call_s,
            "total_s": lower_s + compile_s + first_call_s}


def rerun_times(name: str, cfg: dict) -> dict:
    """`fresh_process_times` of job ``name`` in two new Python processes sharing a new,
    empty persistent compilation cache: the first compiles and fills it (a script's first
    run), the second reads it (the same script run again: it still traces and lowers)."""
    code = ("import json, sys; from bench import workloads; print(json.dumps("
            "workloads.fresh_process_times(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3])))")
    runs = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", code, name, json.dumps(cfg), cache_dir],
                                 cwd=_ROOT, capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                raise RuntimeError(f"the {name!r} job in a fresh process failed "
                                   f"(exit {out.returncode}):\n{out.stderr[-3000:]}")
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"first": runs[0], "cached": runs[1]}


# ------------------------------------------------------------------------ many GLMs


def many_glms_job(cfg: dict):
    """The many-GLMs job (a vmapped fit + summary) and its data: ``(fn, (X, k))``."""
    import jax.numpy as jnp

    import fusedlp

    B, n, p = cfg["many_B"], 500, 4
    rng = np.random.default_rng(1)
    X = np.concatenate([np.ones((B, n, 1)), rng.normal(size=(B, n, p - 1))], axis=2)
    betas = rng.normal(0.0, 0.4, size=(B, p))
    ks = rng.poisson(np.exp(np.einsum("bnp,bp->bn", X, betas))).astype(np.float64)
    init = {"beta": jnp.zeros(p)}

    def one(X, k):
        res = fusedlp.fit(poisson_glm, init, X, k)
        return res, fusedlp.summary(poisson_glm, res, X, k, nobs=n)

    return jax.vmap(one), (X, ks)


def many_glms(cfg: dict, log) -> dict:
    import statsmodels.api as sm
    from glum import GeneralizedLinearRegressor

    job_fn, (X, ks) = many_glms_job(cfg)
    B, n, p = X.shape
    job, lower_s, compile_s = _timing.aot_compile(job_fn, X, ks)
    (res, s), first_s, dev = _first_call(job, X, ks)
    n_glum = cfg["glum_subset"]

    def statsmodels_loop():
        out = []
        for b in range(B):
            r = sm.GLM(ks[b], X[b], family=sm.families.Poisson()).fit()
            out.append((r.params, r.bse))
        return out

    def glum_loop():
        out = []
        for b in range(n_glum):
            m = GeneralizedLinearRegressor(family="poisson", alpha=0, fit_intercept=False)
            m.fit(X[b], ks[b])
            out.append((m.coef_, np.sqrt(np.diag(m.covariance_matrix(X[b], ks[b])))))
        return out

    ref = [sm.GLM(ks[b], X[b], family=sm.families.Poisson()).fit(tol=1e-13) for b in range(B)]
    ref_params = np.stack([r.params for r in ref])
    ref_bse = np.stack([r.bse for r in ref])
    stats = _time({"fusedlp": functools.partial(job, *dev), "statsmodels": statsmodels_loop,
                   "glum_subset": glum_loop}, cfg)
    glum_params = np.stack([c for c, _ in glum_loop()])
    glum_per_fit = stats["glum_subset"].median / n_glum
    warm = stats["fusedlp"].median
    log(f"  many GLMs: fusedlp {warm:.3f} s, statsmodels {stats['statsmodels'].median:.2f} s")
    return _row(
        f"{B:,} Poisson GLMs x {n} obs x {p} coef + summary", warm, lower_s + compile_s,
        {"statsmodels": stats["statsmodels"].median, "glum (extrapolated)": glum_per_fit * B},
        {"converged": int(np.sum(np.asarray(res.converged))), "of": B,
         "params_max_rel_vs_statsmodels": _max_rel(res.params["beta"], ref_params),
         "se_max_rel_vs_statsmodels": _max_rel(s.se["beta"], ref_bse),
         "glum_params_max_rel_vs_statsmodels": _max_rel(glum_params, ref_params[:n_glum]),
         "newton_steps_median": float(np.median(np.asarray(res.num_steps)))},
        {"glum_subset": n_glum, "timing": {k: v.as_dict() for k, v in stats.items()}},
        _rerun("many", cfg, log), first_s)


# ------------------------------------------------------------------------- big GLM


def big_glm_job(cfg: dict):
    """The big-GLM job (fit + summary) and its data: ``(fn, (X, k))``."""
    import jax.numpy as jnp

    import fusedlp

    n, p = cfg["big_n"], 20
    rng = np.random.default_rng(2)
    scales = np.logspace(-2, 3, p - 1)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, p - 1)) * scales])
    beta = np.r_[0.5, rng.normal(0.0, 0.15, size=p - 1) / scales]
    k = rng.poisson(np.exp(X @ beta)).astype(np.float64)
    init = {"beta": jnp.zeros(p)}

    def job_fn(X, k):
        res = fusedlp.fit(poisson_glm, init, X, k)
        return res, fusedlp.summary(poisson_glm, res, X, k, nobs=n)

    return job_fn, (X, k)


def big_glm(cfg: dict, log) -> dict:
    import jax.numpy as jnp
    import statsmodels.api as sm
    from glum import GeneralizedLinearRegressor

    import fusedlp

    job_fn, (X, k) = big_glm_job(cfg)
    n, p = X.shape
    init = {"beta": jnp.zeros(p)}  # for the L-BFGS fit below
    job, lower_s, compile_s = _timing.aot_compile(job_fn, X, k)
    (res, s), first_s, dev = _first_call(job, X, k)

    def statsmodels_job():
        r = sm.GLM(k, X, family=sm.families.Poisson()).fit()
        return r.params, r.bse, r.llf

    def glum_job():
        m = GeneralizedLinearRegressor(family="poisson", alpha=0, fit_intercept=False)
        m.fit(X, k)
        return m.coef_, np.sqrt(np.diag(m.covariance_matrix(X, k)))

    ref = sm.GLM(k, X, family=sm.families.Poisson()).fit(tol=1e-13)
    sm_default = sm.GLM(k, X, family=sm.families.Poisson()).fit()
    glum_coef, _ = glum_job()
    stats = _time({"fusedlp": functools.partial(job, *dev), "statsmodels": statsmodels_job,
                   "glum": glum_job}, cfg)
    warm = stats["fusedlp"].median
    log(f"  big GLM: fusedlp {warm:.3f} s ({int(res.num_steps)} steps), statsmodels "
        f"{stats['statsmodels'].median:.2f} s, glum {stats['glum'].median:.2f} s")
    lbfgs = fusedlp.fit(poisson_glm, init, X, k, optimizer="lbfgs")
    return _row(
        f"Poisson GLM {n:,} x {p}, scales 1e-2..1e3, + summary", warm, lower_s + compile_s,
        {"statsmodels": stats["statsmodels"].median, "glum": stats["glum"].median},
        {"status": fusedlp.FitStatus(int(res.status)).name, "newton_steps": int(res.num_steps),
         "params_max_rel_vs_statsmodels": _max_rel(res.params["beta"], ref.params),
         "se_max_rel_vs_statsmodels": _max_rel(s.se["beta"], ref.bse),
         "statsmodels_default_tol_params_max_rel": _max_rel(sm_default.params, ref.params),
         "glum_params_max_rel_vs_statsmodels": _max_rel(glum_coef, ref.params),
         "lbfgs_status": fusedlp.FitStatus(int(lbfgs.status)).name,
         "lbfgs_steps": int(lbfgs.num_steps),
         "lbfgs_params_max_rel_vs_statsmodels": _max_rel(lbfgs.params["beta"], ref.params)},
        {"timing": {k: v.as_dict() for k, v in stats.items()}}, _rerun("big", cfg, log),
        first_s)


# ----------------------------------------------------------------- logit and NB2


def _statsmodels_data(name: str):
    """(X with a constant, y) of statsmodels' ``spector`` or ``randhie`` data set."""
    import statsmodels.api as sm

    ds = getattr(sm.datasets, name).load()
    return (sm.add_constant(ds.exog, prepend=True).to_numpy(np.float64),
            ds.endog.to_numpy(np.float64))


def statsmodels_model_job(name: str):
    """The logit (``spector``) or NB2 (``randhie``) job, fit + summary, and its data:
    ``(fn, (X, y))``."""
    import jax.numpy as jnp

    import fusedlp

    X, y = _statsmodels_data(name)
    model, init = {"spector": (logit_model, {"beta": jnp.zeros(X.shape[1])}),
                   "randhie": (nb2_model, {"beta": jnp.zeros(X.shape[1]),
                                           "alpha": jnp.ones(())})}[name]

    def job_fn(X, y):
        res = fusedlp.fit(model, init, X, y)
        return res, fusedlp.summary(model, res, X, y, nobs=X.shape[0])

    return job_fn, (X, y)


def statsmodels_models(cfg: dict, log) -> list[dict]:
    import statsmodels.api as sm
    from statsmodels.discrete.discrete_model import NegativeBinomial

    import fusedlp

    rows = []
    jobs = {name: statsmodels_model_job(name) for name in ("spector", "randhie")}
    Xs, ys = jobs["spector"][1]
    Xr, kr = jobs["randhie"][1]
    cases = [
        ("logit, spector (32 x 4)", "spector",
         lambda: sm.Logit(ys, Xs).fit(disp=0),
         lambda: sm.Logit(ys, Xs).fit(method="newton", tol=1e-14, disp=0), lambda d: d),
        ("NB2, randhie (20,190 x 10)", "randhie",
         lambda: NegativeBinomial(kr, Xr, loglike_method="nb2").fit(disp=0, maxiter=500),
         None, lambda d: np.r_[d[1:], d[0]]),  # fusedlp orders alpha first
    ]
    for name, dataset, sm_fit, sm_tight, order in cases:
        job_fn, data = jobs[dataset]
        job, lower_s, compile_s = _timing.aot_compile(job_fn, *data)
        (res, s), first_s, dev = _first_call(job, *data)

        def statsmodels_job(sm_fit=sm_fit):
            r = sm_fit()
            return r.params, r.bse, r.conf_int()

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            first = sm_fit()
            ref = (sm_tight() if sm_tight else
                   NegativeBinomial(kr, Xr, loglike_method="nb2").fit(
                       start_params=first.params, method="newton", tol=1e-14, maxiter=100,
                       disp=0))
            stats = _time({"fusedlp": functools.partial(job, *dev),
                           "statsmodels": statsmodels_job}, cfg)
        d = s.to_dict()
        warm = stats["fusedlp"].median
        log(f"  {name}: fusedlp {warm * 1e3:.1f} ms, statsmodels "
            f"{stats['statsmodels'].median * 1e3:.1f} ms")
        rows.append(_row(
            name + " + summary", warm, lower_s + compile_s,
            {"statsmodels": stats["statsmodels"].median},
            {"status": fusedlp.FitStatus(int(res.status)).name,
             "newton_steps": int(res.num_steps),
             "params_max_rel_vs_statsmodels": _max_rel(order(d["coef"]), ref.params),
             "se_max_rel_vs_statsmodels": _max_rel(order(d["std_err"]), ref.bse),
             "loglik_rel_diff": abs(d["loglik"] - ref.llf) / abs(ref.llf),
             "statsmodels_default_params_max_rel": _max_rel(first.params, ref.params)},
            {"timing": {k: v.as_dict() for k, v in stats.items()}}, _rerun(dataset, cfg, log),
            first_s))
    return rows


# ------------------------------------------------------------------------- EAM fit


def eam_fit(cfg: dict, log) -> dict:
    """The README's EAM fit: density (A, beta) and the embedding's c3, c4 from energies."""
    import jax.numpy as jnp

    import fusedlp

    rng = np.random.default_rng(0)
    r = rng.uniform(0.5, 2.5, size=(12, 4, 8))

    def energies(theta, r):
        density = (jnp.exp(theta["log_A"]), jnp.exp(theta["log_beta"]))
        embedding = jnp.stack([0.0, 1.0, theta["c3"], theta["c4"]])
        return jax.vmap(lambda rc: fusedlp.eam_energy(rc, density=density,
                                                      embedding=embedding))(r)

    truth = {"log_A": np.log(0.8), "log_beta": np.log(1.5), "c3": 1.0, "c4": 0.25}
    e_ref = energies(truth, r)

    def squared_error(theta, r, e_ref):
        return jnp.sum((energies(theta, r) - e_ref) ** 2)

    start = {k: jnp.asarray(v, jnp.float64)
             for k, v in {"log_A": 0.0, "log_beta": 0.0, "c3": 0.5, "c4": 0.5}.items()}
    out, calls = {}, {}
    for opt in ("newton", "lbfgs"):
        fn = functools.partial(fusedlp.fit, squared_error, optimizer=opt, maximize=False)
        job, lower_s, compile_s = _timing.aot_compile(fn, start, r, e_ref)
        res, first_s, _ = _first_call(job, start, r, e_ref)
        err = max(abs(float(res.params[k]) - float(v)) for k, v in truth.items())
        out[opt] = {"status": fusedlp.FitStatus(int(res.status)).name,
                    "steps": int(res.num_steps), "compile_s": lower_s + compile_s,
                    "first_call_s": first_s,
                    "max_abs_error_vs_truth": err}
        calls[opt] = functools.partial(job, start, r, e_ref)
    stats = _time(calls, cfg)
    for opt in out:
        out[opt]["warm_s"] = stats[opt].median
    log(f"  EAM: newton {out['newton']['steps']} steps {stats['newton'].median * 1e3:.2f} ms, "
        f"lbfgs {out['lbfgs']['steps']} steps {stats['lbfgs'].median * 1e3:.2f} ms")
    return _row("EAM potential fit (12 configurations), Newton vs L-BFGS", out["newton"]["warm_s"],
                out["newton"]["compile_s"], {"fusedlp L-BFGS": out["lbfgs"]["warm_s"]},
                {"newton": out["newton"], "lbfgs": out["lbfgs"]},
                {"lbfgs_compile_s": out["lbfgs"]["compile_s"]},
                first_s=out["newton"]["first_call_s"])


# ---------------------------------------------------------------------------- NUTS


def nuts(cfg: dict, log) -> list[dict]:
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    import fusedlp

    n, p = cfg["nuts_n"], 5
    rng = np.random.default_rng(3)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, p - 1))])
    beta = rng.normal(0.0, 0.3, size=p)
    eta = X @ beta
    data = {"poisson": rng.poisson(np.exp(eta)).astype(np.float64),
            "logistic": (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(np.float64)}

    def model(X, y, family, fused, normalized):
        b = numpyro.sample("beta", dist.Normal(0.0, 5.0).expand([p]).to_event(1))
        eta = X @ b
        if fused:
            ll = (fusedlp.poisson_log_lpmf(y, eta, normalized=normalized)
                  if family == "poisson" else fusedlp.bernoulli_logit_lpmf(y, eta))
            numpyro.factor("loglik", ll)
        elif family == "poisson":
            numpyro.sample("y", dist.Poisson(jnp.exp(eta)), obs=y)
        else:
            numpyro.sample("y", dist.BernoulliLogits(eta), obs=y)

    # the Poisson factor as a new user writes it, and with normalized=False, as README and
    # docs/jax-and-numpyro.md advise for a sampler (the dropped log k! holds no parameter).
    # NumPyro's own Poisson model is one sampler, the baseline of both Poisson rows.
    variants = {("poisson", "numpyro"): (False, True), ("poisson", "fusedlp"): (True, True),
                ("poisson", "fusedlp, normalized=False"): (True, False),
                ("logistic", "numpyro"): (False, True), ("logistic", "fusedlp"): (True, True)}
    samplers, res = {}, {}
    for (family, who), (fused, normalized) in variants.items():
        mcmc = MCMC(NUTS(functools.partial(model, family=family, fused=fused,
                                           normalized=normalized)),
                    num_warmup=cfg["nuts_warmup"], num_samples=cfg["nuts_samples"],
                    progress_bar=False)
        y = data[family]
        t0 = time.perf_counter()
        mcmc.warmup(jax.random.key(0), X, y)
        warmup_s = time.perf_counter() - t0
        kernel, warm = mcmc.sampler, mcmc.last_state

        def draws(state, kernel=kernel, y=y):
            # NUTS's transitions from the warmed-up state, in one compiled scan; the data
            # closed over, as MCMC.run has them (jit_model_args=False, its default)
            def step(s, _):
                s = kernel.sample(s, (X, y), {})
                return s, (s.z["beta"], s.num_steps)
            return jax.lax.scan(step, state, None, length=cfg["nuts_samples"])[1]

        # compiled once, ahead of the timing: MCMC.run jits its sampling loop anew on every
        # call (numpyro 0.22's fori_collect passes a new jit object as a static argument),
        # so timing MCMC.run would time that compile each round
        compiled, lower_s, compile_s = _timing.aot_compile(draws, warm)
        samplers[f"{family}: {who}"] = functools.partial(compiled, warm)
        res[family, who] = {"warmup_s_incl_compile": warmup_s,
                            "sampling_trace_s": lower_s, "sampling_compile_s": compile_s}
    # every sampler once per round, in a fresh random order, so that a slow phase of the
    # host falls on all of them alike (bench/_timing.py); the median run per sampler. Every
    # run starts from the same warmed-up state: the same draws and steps each time.
    stats = _timing.time_interleaved(samplers, min_repeats=cfg["nuts_rounds"], min_total=0.0,
                                     max_total=0.0, collect=1.0)
    for (family, who) in variants:
        beta_draws, num_steps = (np.asarray(a) for a in samplers[f"{family}: {who}"]())
        steps = int(np.sum(num_steps))
        st = stats[f"{family}: {who}"]
        res[family, who].update(
            sampling_s=st.median, sampling_timing=st.as_dict(), leapfrog_steps=steps,
            s_per_leapfrog=st.median / steps, posterior_mean=beta_draws.mean(0).tolist(),
            posterior_sd=beta_draws.std(0).tolist())

    rows = []
    for (family, who), (fused, normalized) in variants.items():
        if not fused:
            continue
        a, b = res[family, "numpyro"], res[family, who]
        z = np.abs(np.subtract(a["posterior_mean"], b["posterior_mean"])) / np.asarray(
            a["posterior_sd"])
        name = f"NUTS {family} regression" + ("" if normalized else ", normalized=False")
        log(f"  {name}: numpyro {a['s_per_leapfrog'] * 1e6:.0f} us/leapfrog, fusedlp "
            f"{b['s_per_leapfrog'] * 1e6:.0f} us/leapfrog")
        rows.append(_row(
            f"{name}, N = {n:,}: per leapfrog step", b["s_per_leapfrog"], 0.0,
            {"NumPyro's own likelihood": a["s_per_leapfrog"]},
            {"max_posterior_mean_diff_in_sd": float(z.max())},
            {"nuts": {"numpyro": a, "fusedlp": b}, "rounds": cfg["nuts_rounds"]}))
    return rows


# ------------------------------------------------------------------------- report


def evaluate_targets(rows: list[dict]) -> list[dict]:
    targets = []
    many, big = rows[0], rows[1]
    for row, warm_t, cold_t, label in ((many, 15.0, 1.5, "2,000 GLMs"),
                                       (big, 5.0, 1.0, "big GLM")):
        b = row["baselines"]["statsmodels"]
        targets.append({"target": f"{label}: >= {warm_t:g}x statsmodels warm",
                        "met": b["ratio_warm"] >= warm_t, "measured": b["ratio_warm"],
                        "detail": f"{b['s']:.3g} s vs {row['fusedlp_warm_s']:.3g} s: "
                                  f"{b['ratio_warm']:.3g}x"})
        targets.append({"target": f"{label}: >= {cold_t:g}x statsmodels cold",
                        "met": b["ratio_cold"] >= cold_t, "measured": b["ratio_cold"],
                        "detail": f"{b['s']:.3g} s vs {row['fusedlp_cold_s']:.3g} s "
                                  f"(compile {row['fusedlp_compile_s']:.3g} s): "
                                  f"{b['ratio_cold']:.3g}x" + _rerun_detail(row, b)})
    x = big["agreement"]["params_max_rel_vs_statsmodels"]
    targets.append({"target": "big GLM: estimates equal statsmodels' to 1e-6",
                    "met": x <= 1e-6, "measured": x, "detail": f"max rel diff {x:.2g}"})
    return targets


def _rerun_detail(row: dict, b: dict) -> str:
    rerun = row.get("fusedlp_rerun")
    if rerun is None:
        return ""
    return (f"; run again with the compilation cache {rerun['cached']['total_s']:.3g} s: "
            f"{b['ratio_rerun']:.3g}x")


def table(rows: list[dict]) -> str:
    head = ["workload", "fusedlp warm", "compile", "fusedlp cold", "run again", "baseline",
            "baseline", "ratio warm", "ratio cold", "ratio run again"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * 4 + "---|" + "---:|" * 4]
    for r in rows:
        rerun = r.get("fusedlp_rerun")
        for i, (name, b) in enumerate(r["baselines"].items()):
            first = i == 0
            lines.append("| " + " | ".join([
                r["workload"] if first else "",
                _fmt_s(r["fusedlp_warm_s"]) if first else "",
                _fmt_s(r["fusedlp_compile_s"]) if first and r["fusedlp_compile_s"] else "",
                _fmt_s(r["fusedlp_cold_s"]) if first and r["fusedlp_compile_s"] else "",
                _fmt_s(rerun["cached"]["total_s"]) if first and rerun else "",
                name, _fmt_s(b["s"]), _timing.fmt_ratio(b["ratio_warm"]),
                _timing.fmt_ratio(b["ratio_cold"]) if r["fusedlp_compile_s"] else "",
                _timing.fmt_ratio(b["ratio_rerun"]) if rerun else ""]) + " |")
    return "\n".join(lines) + "\n"


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{_timing.fmt_sig(s)} s"
    if s >= 1e-3:
        return f"{_timing.fmt_sig(s * 1e3)} ms"
    return f"{_timing.fmt_sig(s * 1e6)} µs"


def agreement_md(rows: list[dict]) -> str:
    lines = ["| workload | agreement |", "|---|---|"]
    for r in rows:
        a = ", ".join(f"{k} = {_fmt_val(v)}" for k, v in r["agreement"].items())
        lines.append(f"| {r['workload']} | {a} |")
    return "\n".join(lines) + "\n"


def _fmt_val(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt_val(x)}" for k, x in v.items()) + "}"
    return str(v)


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="small sizes and one timed repeat (a smoke run, well under a minute)")
    _timing.add_json_argument(p, "workloads.json")
    p.add_argument("--skip-nuts", action="store_true", help="leave out the NumPyro workloads")


def run(quick: bool, skip_nuts: bool = False, log=None) -> dict:
    """Every workload; returns the rows, targets and machine record (the notebook's entry)."""
    log = log or functools.partial(print, file=sys.stderr, flush=True)
    _configure_jax()
    cfg = {"quick": quick, "repeats": 1 if quick else 9, "max_total": 1.0 if quick else 30.0,
           "many_B": 100 if quick else 2000, "glum_subset": 10 if quick else 100,
           "big_n": 20_000 if quick else 200_000, "nuts_n": 2_000 if quick else 100_000,
           "nuts_warmup": 50 if quick else 300, "nuts_samples": 50 if quick else 300,
           "nuts_rounds": 1 if quick else 5}
    machine = _timing.machine_info()
    t0 = time.perf_counter()
    rows = [many_glms(cfg, log), big_glm(cfg, log), *statsmodels_models(cfg, log),
            eam_fit(cfg, log)]
    if not skip_nuts:
        rows += nuts(cfg, log)
    check_agreement(rows)
    return {"benchmark": "fusedlp workloads", "machine": machine, "config": cfg, "rows": rows,
            "targets": evaluate_targets(rows), "wall_s": time.perf_counter() - t0}


def check_agreement(rows: list[dict]) -> None:
    """Raise unless fusedlp did the same job as the baselines it is timed against: every
    fit converged, estimates within 1e-6 of statsmodels run to a tight tolerance (the
    issue's bar), the NUTS posterior means within half a posterior sd of NumPyro's own."""
    bad = []
    for row in rows:
        a, name = row["agreement"], row["workload"]
        if a.get("converged", a.get("of")) != a.get("of"):
            bad.append(f"{name}: {a['converged']} of {a['of']} converged")
        if a.get("status", "CONVERGED") != "CONVERGED":
            bad.append(f"{name}: {a['status']}")
        if a.get("params_max_rel_vs_statsmodels", 0.0) > 1e-6:
            bad.append(f"{name}: params {a['params_max_rel_vs_statsmodels']:.2g} off")
        if a.get("max_posterior_mean_diff_in_sd", 0.0) > 0.5:
            bad.append(f"{name}: posterior means {a['max_posterior_mean_diff_in_sd']:.2g} sd "
                       "apart")
    if bad:
        raise RuntimeError("fusedlp did not do the baselines' job: " + "; ".join(bad))


def main(args) -> int:
    doc = run(bool(args.quick), bool(args.skip_nuts))
    m = doc["machine"]
    print("## fusedlp workloads\n")
    print(f"{m['date']}: {m['cpu_model']}, {m['cpu_count']} cores ({m['platform']}); jax "
          f"{m['jax']} ({m['backend']}). Wall time {doc['wall_s']:.0f} s"
          + (" (quick: small sizes)" if doc["config"]["quick"] else "") + ".\n")
    print("Ratios: baseline time / fusedlp time (above 1: fusedlp is faster). cold = compile + "
          "the first call. run again: the job in a fresh Python process whose JAX persistent "
          "compilation cache an earlier process filled (tracing, reading the program, first "
          "call).\n")
    print(table(doc["rows"]))
    print(agreement_md(doc["rows"]))
    print(_timing.targets_md(doc["targets"]))
    if args.json:
        wall = doc.pop("wall_s")
        _timing.write_json(args.json, doc, wall)
    return 0
