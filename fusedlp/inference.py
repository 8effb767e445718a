"""The table reported after a maximum-likelihood fit: estimates, standard errors, z, p-values,
confidence intervals, log-likelihood, AIC and BIC (:func:`summary`)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.scipy.special import erfc, ndtri

from fusedlp import _checks
from fusedlp.fitting import (
    FitResult,
    FitStatus,
    _as_float_params,
    _covariance,
    _inverse_information,
    _warn_if_unusable,
)

__all__ = ("FitSummary", "summary")

PyTree = Any

_COLUMNS = ("coef", "std_err", "z", "p_value", "ci_lower", "ci_upper")


def _key_text(key) -> str:
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    if isinstance(key, jax.tree_util.SequenceKey):
        return f"[{key.idx}]"
    return f"[{getattr(key, 'key', key)}]"


def parameter_names(params: PyTree) -> list[str]:
    """One name per scalar parameter, in ``ravel_pytree`` order: ``beta[3]``, ``log_phi``,
    ``layer.w[1, 2]`` (a bare array is ``params[i]``, a top-level tuple ``params[0][i]``)."""
    names = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        parts = [_key_text(k) for k in path]
        base = "".join(p if p.startswith("[") or i == 0 else "." + p
                       for i, p in enumerate(parts))
        if not base or base.startswith("["):  # a bare array, or a top-level tuple or list
            base = "params" + base
        shape = np.shape(leaf)
        if not shape:
            names.append(base)
        else:
            names.extend(f"{base}[{', '.join(map(str, idx))}]" for idx in np.ndindex(*shape))
    return names


def pandas(what: str):
    """The pandas module, for ``what`` (a ``to_frame``); an ImportError that says how to get
    it where it is missing (it is an optional dependency: the ``frames`` extra)."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(f"{what} needs pandas (pip install pandas; from a fusedlp "
                          "clone, pip install '.[frames]')") from None
    return pd


class FitSummary(NamedTuple):
    """What :func:`summary` returns: a pytree (it passes through ``jit`` and ``vmap``); its
    ``str`` is a statsmodels-like table.

    Attributes:
      params, se, z, p_value, ci_lower, ci_upper: pytrees shaped like the parameters: the
        estimates, their standard errors, ``params / se``, two-sided normal p-values, and
        the ``1 - alpha`` normal-theory interval ``params -/+ z_{1-alpha/2} se``.
      loglik: the log-likelihood at ``params``.
      aic: ``2 k - 2 loglik`` with ``k`` the number of scalar parameters.
      bic: ``k log(nobs) - 2 loglik``; NaN without ``nobs``.
      nobs: the number of observations given (NaN if none).
      alpha: the intervals' level.
    """

    params: PyTree
    se: PyTree
    z: PyTree
    p_value: PyTree
    ci_lower: PyTree
    ci_upper: PyTree
    loglik: jax.Array
    aic: jax.Array
    bic: jax.Array
    nobs: jax.Array
    alpha: jax.Array

    def to_dict(self) -> dict:
        """NumPy columns, one entry per scalar parameter (``name``, ``coef``, ``std_err``,
        ``z``, ``p_value``, ``ci_lower``, ``ci_upper``), and the scalars ``loglik``, ``aic``,
        ``bic``, ``nobs``, ``alpha``. Concrete, unbatched summaries only."""
        self._check_printable("to_dict")
        cols = [self.params, self.se, self.z, self.p_value, self.ci_lower, self.ci_upper]
        out: dict = {"name": parameter_names(self.params)}
        for key, tree in zip(_COLUMNS, cols):
            out[key] = np.asarray(ravel_pytree(tree)[0])
        for key in ("loglik", "aic", "bic", "nobs", "alpha"):
            out[key] = np.asarray(getattr(self, key)).item()
        return out

    def to_frame(self):
        """The per-parameter columns as a pandas DataFrame indexed by parameter name (needs
        pandas: the ``frames`` extra)."""
        pd = pandas("FitSummary.to_frame")
        d = self.to_dict()
        return pd.DataFrame({k: d[k] for k in _COLUMNS}, index=pd.Index(d["name"], name="name"))

    def _check_printable(self, who: str) -> None:
        if not _checks.is_concrete(self):
            raise TypeError(f"FitSummary.{who}: the summary is traced (inside jit or vmap)")
        if np.ndim(self.loglik) != 0:
            raise ValueError(f"FitSummary.{who}: a batch of {np.shape(self.loglik)} summaries "
                             "(from vmap); select one first, jax.tree.map(lambda a: a[i], s)")

    def __str__(self) -> str:
        self._check_printable("__str__")
        d = self.to_dict()
        level = 1.0 - d["alpha"]
        lo, hi = f"[{d['alpha'] / 2:.3g}", f"{1 - d['alpha'] / 2:.3g}]"
        width = max([len(n) for n in d["name"]] + [10])
        head = (f"{'':<{width}} {'coef':>11} {'std err':>11} {'z':>9} {'P>|z|':>8} "
                f"{lo:>11} {hi:>11}")
        rule = "=" * len(head)
        nobs = "—" if math.isnan(d["nobs"]) else f"{d['nobs']:.0f}"
        left = [f"Log-likelihood: {d['loglik']:.6g}", f"AIC: {d['aic']:.6g}",
                f"BIC: {d['bic']:.6g}" if math.isfinite(d["bic"]) else "BIC: —"]
        right = [f"No. parameters: {len(d['name'])}", f"No. observations: {nobs}",
                 f"Intervals: {level:.3g} normal"]
        half = len(head) // 2
        lines = ["fusedlp summary (observed information)".center(len(head)), rule]
        lines += [f"{a:<{half}}{b:>{len(head) - half}}" for a, b in zip(left, right)]
        lines += [rule, head, "-" * len(head)]
        for i, name in enumerate(d["name"]):
            lines.append(f"{name:<{width}} {d['coef'][i]:>11.4g} {d['std_err'][i]:>11.4g} "
                         f"{_z_text(d['z'][i])} {d['p_value'][i]:>8.3f} "
                         f"{d['ci_lower'][i]:>11.4g} {d['ci_upper'][i]:>11.4g}")
        lines.append(rule)
        return "\n".join(lines)


def _z_text(z: float) -> str:
    """z in the table's 9 columns: fixed point, or exponent form where that would not fit."""
    return f"{z:>9.3f}" if not abs(z) >= 1e5 else f"{z:>9.2e}"


def _warn_if_not_converged(result) -> None:
    """A RuntimeWarning where a concrete fit did not end ``CONVERGED`` (as statsmodels warns
    with its ``ConvergenceWarning``): its params are not the maximum normal-theory inference
    is taken at."""
    if not (isinstance(result, FitResult) and _checks.is_concrete(result.status)):
        return
    status = FitStatus(int(result.status))
    if status == FitStatus.SINGULAR:
        warnings.warn("summary: the fit ended SINGULAR: the parameters run off to infinity "
                      "(perfect separation, say) or the optimum's Hessian is singular "
                      "(collinear covariates); the standard errors, z, p-values and "
                      "intervals do not apply there", RuntimeWarning, stacklevel=3)
    elif status != FitStatus.CONVERGED:
        warnings.warn(f"summary: the fit ended {status.name}, not CONVERGED: its params are "
                      "not a maximum found to tol, and the table is taken there (see "
                      "fusedlp.FitStatus; raise max_steps or check the model)",
                      RuntimeWarning, stacklevel=3)


def summary(
    objective: Callable[..., jax.Array],
    result: FitResult | PyTree,
    *data: Any,
    nobs: int | None = None,
    alpha: float = 0.05,
    maximize: bool = True,
) -> FitSummary:
    r"""Inference at the maximum of a log-likelihood: the table statsmodels prints.

    Standard errors are :func:`fusedlp.standard_errors`' (the inverse observed information,
    :math:`(-H)^{-1}`, over all parameter leaves together); ``z = params / se``; the p-value
    is two-sided, :math:`2\,\Phi(-|z|)`; the interval is ``params -/+ q se`` with
    :math:`q = \Phi^{-1}(1 - \alpha/2)`: normal theory, as statsmodels' GLM and discrete
    models report them (with the observed information). ``AIC = 2k - 2 loglik`` and
    ``BIC = k log(nobs) - 2 loglik`` count every scalar parameter in ``k``. Works under
    ``jit`` and ``vmap`` (all but printing); ``print(s)`` shows the table,
    ``s.to_frame()`` gives it to pandas.

    Args:
      objective: the log-likelihood that was maximised, ``objective(params, *data)`` (with
        ``maximize=False``: the negative log-likelihood that was minimised).
      result: a :class:`FitResult` or a parameter pytree. A Newton fit's result carries
        the Hessian the fit formed at its ``params`` (``result.hessian``), and its
        ``value``: both are used as they are, so ``objective`` and ``data`` must be the
        fit's. Pass ``result.params`` to evaluate them again (other data, or to check).
      *data: the remaining arguments of ``objective``.
      nobs: the number of observations, for BIC (NaN without it).
      alpha: the intervals cover ``1 - alpha``.
      maximize: False if ``objective`` is a negative log-likelihood.

    Returns:
      A :class:`FitSummary`. Where the log-likelihood is not finite at ``params``, or its
      negated Hessian is not positive definite, the standard errors and everything built
      on them are NaN, with a ``RuntimeWarning`` when concrete. A concrete fit that did
      not end ``CONVERGED`` (``SINGULAR``, ``MAX_STEPS``, ``STALLED``, ``DIVERGED``) gets a
      ``RuntimeWarning`` too, and its numbers are still returned (as statsmodels returns
      its own with a ``ConvergenceWarning``).

    Example:
      >>> import jax.numpy as jnp, numpy as np, fusedlp
      >>> y = jnp.array([1.0, 2.0, 4.0, 5.0])
      >>> loglik = lambda p, y: fusedlp.normal_lpdf(y, p["loc"], jnp.exp(p["log_scale"]))
      >>> res = fusedlp.fit(loglik, {"loc": 0.0, "log_scale": 0.0}, y)
      >>> s = fusedlp.summary(loglik, res, y, nobs=4)
      >>> round(float(s.se["loc"]), 4), round(float(s.aic), 3)
      (0.7906, 19.017)
    """
    if isinstance(result, FitResult) and np.ndim(result.status):
        raise ValueError(
            f"summary: result holds a batch of {np.shape(result.status)} fits (from vmap); "
            "call summary under the same vmap, jax.vmap(lambda r, *d: fusedlp.summary("
            "objective, r, *d))(result, *data), or select one fit first, "
            "jax.tree.map(lambda a: a[i], result)")
    params = result.params if isinstance(result, FitResult) else result
    params = _as_float_params(params)
    if _checks.is_concrete(alpha) and not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"summary: alpha must be in (0, 1), got {alpha!r}")
    if nobs is not None and _checks.is_concrete(nobs) and not (
            float(nobs) >= 1.0 and float(nobs) == int(nobs)):
        raise ValueError(f"summary: nobs must be a positive whole number, got {nobs!r}")
    if isinstance(result, FitResult) and result.hessian is not None:
        sign = 1.0 if maximize else -1.0  # the fit's own value and curvature at its params
        loglik, cov, finite, pos_def = _inverse_information(sign * result.value,
                                                            sign * result.hessian)
    else:
        loglik, cov, finite, pos_def = _covariance(objective, bool(maximize), params,
                                                   tuple(data))
    _warn_if_unusable("summary", finite, pos_def)
    _warn_if_not_converged(result)
    flat, unravel = ravel_pytree(params)
    se = jnp.sqrt(jnp.diagonal(cov)).astype(flat.dtype)
    z = flat / se
    p_value = erfc(jnp.abs(z) / math.sqrt(2.0))
    alpha = jnp.asarray(alpha, flat.dtype)
    q = ndtri(1.0 - alpha / 2)
    k = flat.shape[0]
    nobs = jnp.asarray(jnp.nan if nobs is None else nobs, loglik.dtype)
    return FitSummary(
        params=unravel(flat), se=unravel(se), z=unravel(z), p_value=unravel(p_value),
        ci_lower=unravel(flat - q * se), ci_upper=unravel(flat + q * se),
        loglik=loglik, aic=2.0 * k - 2.0 * loglik, bic=k * jnp.log(nobs) - 2.0 * loglik,
        nobs=nobs, alpha=alpha,
    )
