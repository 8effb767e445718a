"""Negative binomial log-mass in the mean/concentration form, built with :func:`fusedlp.fuse`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
from jax.typing import ArrayLike

from fusedlp import _checks
from fusedlp._fuse import fuse
from fusedlp.poisson import _log_factorial

# The over-dispersed count model (Stan's neg_binomial_2): mean mu, concentration phi,
# variance mu + mu^2 / phi; scipy's nbinom(n = phi, p = phi / (mu + phi)). One element:
#
#   log NB(k | mu, phi) = lgamma(k + phi) - lgamma(phi) - log k!
#                         + k log(mu) - k log(mu + phi) - phi log1p(mu / phi)
#   d/dmu  = k / mu - (k + phi) / (mu + phi)
#   d/dphi = digamma(k + phi) - digamma(phi) - log1p(mu / phi) + (mu - k) / (mu + phi)
#
# (phi log(phi / (mu + phi)) is written -phi log1p(mu / phi): no cancellation in that term
# for mu << phi, where the model tends to Poisson. lgamma(k + phi) - lgamma(phi) does cancel
# at large phi, as in scipy's nbinom.logpmf: relative error about 5e-11 at phi = 1e5 and
# 1e-9 at 1e7 for small k in float64. Near the Poisson limit, use poisson_lpmf.) log k!
# does not depend on the parameters: it appears in no partial and `normalized=False` drops
# it; it is the same table-and-Stirling log k! as poisson_lpmf (exact for small k in
# float32). k is data: zero cotangent (none for integer k).
# fuse forms the partials by forward mode in one pass with the value.
#
# Edges: k < 0, non-integer or infinite k is outside the support (-inf, zero partials).
# mu < 0, mu = inf, phi <= 0, phi = inf (the Poisson limit: use poisson_lpmf), NaN anywhere:
# NaN. mu = 0 is the boundary: k = 0 gives exactly 0 with d/dmu = -1; k > 0 gives -inf, and
# by fuse's edge rule a zero gradient (poisson_lpmf's hand rule reports +inf there).


def _negative_binomial_element(k, mean, concentration, *, normalized=True):
    kok = (k >= 0) & (k == jnp.floor(k)) & (k < jnp.inf)
    kk = jnp.where(kok, k, 0.0)  # keeps lgamma and log k! finite off the support
    mu, phi = mean, concentration
    klogmu = jnp.where(kk == 0, 0.0, kk * jnp.log(mu))  # 0 log 0 = 0 at mu = 0
    lp = (jsp.gammaln(kk + phi) - jsp.gammaln(phi) + klogmu - kk * jnp.log(mu + phi)
          - phi * jnp.log1p(mu / phi))
    if normalized:
        lp = lp - _log_factorial(kk)
    ok = (mu >= 0) & (mu < jnp.inf) & (phi > 0) & (phi < jnp.inf) & ~jnp.isnan(k)
    return jnp.where(ok, jnp.where(kok, lp, -jnp.inf), jnp.nan)


_negative_binomial = fuse(_negative_binomial_element, data=("k",),
                          name="negative_binomial_lpmf")


def negative_binomial_lpmf(
    k: ArrayLike,
    mean: ArrayLike,
    concentration: ArrayLike,
    *,
    normalized: bool = True,
    validate_args: bool | None = None,
) -> jax.Array:
    r"""Summed negative binomial log-mass, mean/concentration form (Stan's ``neg_binomial_2``).

    .. math::

        \log \mathrm{NB}(k \mid \mu, \phi) = \log\Gamma(k + \phi) - \log\Gamma(\phi) - \log k!
          + k \log\frac{\mu}{\mu + \phi} + \phi\log\frac{\phi}{\mu + \phi}

    Mean :math:`\mu`, variance :math:`\mu + \mu^2/\phi`: the usual model for over-dispersed
    counts (scipy: ``nbinom.logpmf(k, n=phi, p=phi / (mu + phi))``). Built with
    :func:`fusedlp.fuse`.

    Args:
      k: counts (integer or integer-valued float); data, zero gradient.
      mean: :math:`\mu \ge 0`, finite.
      concentration: :math:`\phi > 0`, finite (the inverse dispersion; large is Poisson).
      normalized: if False, drop :math:`-\log k!` (Stan's ``propto``); the gradient is
        unchanged.
      validate_args: check concrete inputs and raise ``ValueError`` naming the argument and
        the first offending index (default: the global setting).

    Returns:
      A scalar. ``-inf`` with a zero gradient for counts outside the support; ``NaN`` for an
      invalid ``mean`` or ``concentration`` or NaN anywhere. At ``mean = 0``: ``k = 0``
      contributes exactly 0 (derivative -1), ``k > 0`` gives ``-inf``. Empty inputs give
      ``0.0``.

    Example:
      >>> import fusedlp
      >>> round(float(fusedlp.negative_binomial_lpmf(0, 2.0, 2.0)), 6)  # 2 log(1/2)
      -1.386294
    """
    fn = "negative_binomial_lpmf"
    if _checks.want_validation(validate_args):
        args = {n: _checks.as_real_array(fn, n, v)
                for n, v in (("k", k), ("mean", mean), ("concentration", concentration))}
        _checks.broadcast_shape(fn, **args)
        _checks.validate(fn, "k", args["k"],
                         lambda a: ~((a >= 0) & (np.floor(a) == a) & np.isfinite(a)),
                         "must hold non-negative integer counts")
        _checks.validate(fn, "mean", args["mean"], lambda a: ~(np.isfinite(a) & (a >= 0)),
                         "must be finite and >= 0")
        _checks.validate(fn, "concentration", args["concentration"],
                         lambda a: ~(np.isfinite(a) & (a > 0)), "must be finite and > 0")
    return _negative_binomial(k, mean, concentration, normalized=bool(normalized))
