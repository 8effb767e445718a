"""Negative binomial log-mass in the mean/concentration form, built with :func:`fusedlp.fuse`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
from jax.typing import ArrayLike

from fusedlp import _special, _xla, constraints
from fusedlp._fuse import kernel

# The over-dispersed count model (Stan's neg_binomial_2): mean mu, concentration phi,
# variance mu + mu^2 / phi; scipy's nbinom(n = phi, p = phi / (mu + phi)). One element:
#
#   log NB(k | mu, phi) = lgamma(k + phi) - lgamma(phi) - log k!
#                         + k log(mu) - k log(mu + phi) - phi log1p(mu / phi)
#   d/dmu  = k / mu - (k + phi) / (mu + phi)
#   d/dphi = digamma(k + phi) - digamma(phi) - log1p(mu / phi) + (mu - k) / (mu + phi)
#
# The value is summed in Loader's form (R's dnbinom_mu, which evaluates NB(k | mu, phi) as
# phi / (phi + k) times a binomial probability at size phi + k; fusedlp._special):
#
#   k = 0:  -phi log1p(mu / phi)  (partials by fusedlp._special.xlog1p_ratio)
#   k > 0:  -log1p(k / phi) / 2 + stirlerr(phi + k) - stirlerr(phi) - stirlerr(k)
#           - log(2 pi k) / 2 - bd0(phi, (phi + k) p) - bd0(k, (phi + k) q),
#           p = phi / (phi + mu), q = mu / (phi + mu)
#
# Every piece is small and of one sign, so nothing cancels: lgamma(k + phi) - lgamma(phi)
# in the plain form loses all digits by phi = 1e16. The differences bd0 needs,
# phi - (phi + k) p = (mu - k) p and k - (phi + k) q = (k - mu) p,
# are passed in that form, so the forward-mode partials of the series are accurate too
# (d/dphi is O(1/phi^2) at large phi, a difference of O(1/phi) terms in the plain form).
# As phi -> inf the pieces tend to Poisson's, -stirlerr(k) - log(2 pi k)/2 - bd0(k, mu),
# continuously. log k! does not depend on the parameters: `normalized=False` adds it back
# (the same partials), as lgamma(k + 1). k is data: zero cotangent (none for integer k).
# The partials are hand-derived (below), from the same pieces, so that fusedlp.hessian
# differentiates them (fast_second_order) instead of Loader's form twice.
#
# Edges: k < 0, non-integer or infinite k is outside the support (-inf, zero partials).
# mu < 0, mu = inf, phi <= 0, phi = inf (the Poisson limit: use poisson_lpmf), NaN anywhere:
# NaN. mu = 0 is the boundary: k = 0 gives exactly 0 with d/dmu = -1; k > 0 gives -inf, and
# by fuse's edge rule a zero gradient (poisson_lpmf's hand rule reports +inf there).


def _log_nb_positive(kp, mu, phi, stirlerr_n, bd0, p_may_underflow=False):
    """log NB(k | mu, phi) + stirlerr(k) + log(2 pi k) / 2 for a count kp >= 1 and valid
    mu >= 0, phi > 0 (Loader's form without its part in k alone), given stirlerr(phi + kp)
    and bd0: the exact ones (`_log_nb`) or select-free forms (`_negative_binomial_fast`).
    stirlerr(phi) is always the exact form: a scalar phi makes its selects scalar work.

    With ``p_may_underflow`` (the exact pass), where p = phi / (phi + mu) underflows
    (mu/phi > 1/tiny, 4.5e307 in float64), n p and (mu - k) p are lost (XLA:CPU flushes
    a subnormal p to 0, and the first bd0 came out 0 for 6.9e-6 at k = 1, mu = 1e300,
    phi = 1e-8). bd0 is homogeneous, bd0(c x, c m) = c bd0(x, m), so there the first is
    phi bd0(1, n/s, (mu - k)/s), and the second has m = n (mu/s), x - m = -phi (mu - k)/s:
    no product with p. Only the arguments are selected, so each bd0 is formed once."""
    # p = phi / (phi + mu) and bd0's arguments, each written so that its derivatives are sums
    # of like-signed terms: (phi + k) q, say, has d/dphi of size 1/phi^2 but its product
    # rule subtracts two terms of size 1/phi; and so that nothing underflows on the way
    # (mu q with q = mu/(phi + mu) at mu = 1e-300).
    u = mu / phi
    p = 1.0 / (1.0 + u)
    s = phi + mu
    n = phi + kp
    x1, m1, d1, c1 = phi, n * p, (mu - kp) * p, 1.0
    m2, d2 = mu * (p + kp / s), (kp - mu) * p
    if p_may_underflow:
        p_under = u > 1.0 / jnp.finfo(u.dtype).tiny
        q = _special.ratio(mu - kp, s)
        x1, c1 = jnp.where(p_under, 1.0, x1), jnp.where(p_under, phi, 1.0)
        m1, d1 = jnp.where(p_under, _special.ratio(n, s), m1), jnp.where(p_under, q, d1)
        m2 = jnp.where(p_under, n * _special.ratio(mu, s), m2)
        d2 = jnp.where(p_under, -phi * q, d2)
    return (-0.5 * jnp.log1p(kp / phi) + stirlerr_n - _special.stirlerr(phi)
            - c1 * bd0(x1, m1, diff=d1) - bd0(kp, m2, diff=d2))


def _log_nb(k, mu, phi):
    """log NB(k | mu, phi) for a count k >= 0 and valid mu >= 0, phi > 0 (Loader's form)."""
    kp = jnp.where(k > 0, k, 1.0)
    lp = (_log_nb_positive(kp, mu, phi, _special.stirlerr(phi + kp), _special.bd0,
                           p_may_underflow=True)
          - _special.log_factorial_rest(kp, _special.stirlerr_int))
    return jnp.where(k > 0, lp, -_special.xlog1p_ratio(phi, mu))


def _negative_binomial_element(k, mean, concentration, *, normalized=True):
    kok = (k >= 0) & (k == jnp.floor(k)) & (k < jnp.inf)
    kk = jnp.where(kok, k, 0.0)  # keeps the series finite off the support
    # the parameters' verdict alone picks their stand-ins: for scalar parameters the work in
    # them alone (stirlerr(phi)) stays scalar, also in the second-order rule's pass over f
    param_ok = (mean >= 0) & (mean < jnp.inf) & (concentration > 0) & (concentration < jnp.inf)
    mu = jnp.where(param_ok, mean, 1.0)
    phi = jnp.where(param_ok, concentration, 1.0)
    lp = _log_nb(kk, mu, phi)
    if not normalized:
        lp = lp + jsp.gammaln(kk + 1.0)
    return jnp.where(param_ok & ~jnp.isnan(k), jnp.where(kok, lp, -jnp.inf), jnp.nan)


def _fast_form(stirlerr_at, k, mean, concentration):
    """`_negative_binomial_element` without a select (fusedlp._xla), for fuse's common path,
    less `_negative_binomial_data`: the same pieces in their select-free forms, k = 0 and
    k > 0 blended by an exact mask (k is data: min and max on it carry no tangent), with
    stirlerr(phi + k) from ``stirlerr_at(phi, k)``. With that part, not finite for k off
    the support, an invalid parameter, or a ratio that over- or underflows (the exact
    pass's cases)."""
    mu, phi = mean, concentration
    # NaN unless mu >= tiny phi, i.e. mu/phi is normal (mu = 0, the boundary, and a u that
    # underflows, which loses the value at k = 0, -mu, go to the exact pass), and unless
    # phi > 0 is finite; for a scalar phi the bound tiny phi is scalar work
    tiny = jnp.finfo(jnp.result_type(mu, phi)).tiny
    verdict = (_xla.nan_unless_nonneg(mu - tiny * phi)
               + jax.lax.stop_gradient(jnp.log(phi) - jnp.log(phi)))
    at_zero = -_special.xlog1p_ratio_fast(phi, mu)
    positive = jnp.minimum(k, 1.0)  # 1 for a count k >= 1, 0 at k = 0
    kp = jnp.maximum(k, 1.0)
    lp = _log_nb_positive(kp, mu, phi, stirlerr_at(phi, kp), _special.bd0_fast)
    return positive * lp + (1.0 - positive) * at_zero + verdict


def _negative_binomial_fast(k, mean, concentration, *, normalized=True):
    """The fast form for any concentration: stirlerr(phi + k) per element."""
    del normalized  # it changes the part in k alone
    return _fast_form(lambda phi, k: _special.stirlerr_fast(phi + k), k, mean, concentration)


def _negative_binomial_fast_shared(k, mean, concentration, *, normalized=True):
    """The fast form for one concentration shared by every element (a scalar: the usual
    NB2 regression): stirlerr(phi + k) picked from values for the small counts
    (`fusedlp._special.stirlerr_by_count`)."""
    del normalized
    return _fast_form(_special.stirlerr_by_count, k, mean, concentration)


def _negative_binomial_data(k, *, normalized=True):
    """The fast form's part in k alone: for k >= 1, -stirlerr(k) - log(2 pi k) / 2
    (plus log k! if not ``normalized``), and NaN unless k is a count."""
    kp = jnp.maximum(k, 1.0)
    t = -jnp.minimum(k, 1.0) * _special.log_factorial_rest(kp, _special.stirlerr_int_fast)
    if not normalized:
        t = t + jsp.gammaln(k + 1.0)
    return t + _xla.nan_unless_all_nonneg(k, jnp.floor(k) - k)


def _negative_binomial_dmean(k, mean, concentration, *, normalized=True):
    """The fast form's d/dmu by hand: k/mu - (k + phi)/(mu + phi), written as
    k / (mu (1 + u)) - 1 / (1 + u) with u = mu/phi: two terms whose own derivatives,
    -k (1 + 2u) / (mu (1 + u))^2 and 1 / (phi (1 + u)^2), are each one sign and sum to
    the true -k/mu^2 + (k + phi)/(mu + phi)^2 (fusedlp.hessian differentiates this:
    fast_second_order). The quotients go through `_special.ratio`, whose derivative holds
    where a square under- or overflows; (k - mu) / (mu (1 + u)) differentiates to a
    cancellation of O(mu) terms over mu^2 (-7e133 for 1e-20 at k = 0, mu = 1e-150).
    The first term is (k/mu) p, p = 1/(1 + u): mu (1 + u) overflows at mu = 1e300,
    phi = 1e10, where its quotient's derivative was NaN. NaN at mu = 0 (the exact pass's
    boundary)."""
    del normalized  # log k! holds no mu
    p = _special.ratio(jnp.ones_like(mean), 1.0 + mean / concentration)
    return _special.ratio(k, mean) * p - p


def _dconc_form(dstirlerr_at, k, mean, concentration):
    """The fast form's d/dphi by hand, from Loader's pieces: with n = phi + k, s = phi + mu,
    t = (k - mu)/s and psi(x) = log x - 1/(2x) + stirlerr'(x),

        d/dphi = log1p(t) - t + k/(2 phi n) + stirlerr'(n) - stirlerr'(phi)

    (log1p(t) = log(n/s) = log1p(k/phi) - log1p(mu/phi), -t = (mu - k)/s). Near the Poisson
    limit each of the plain form's four terms is O(1/phi) and the answer O(1/phi^2); here
    log1p(t) - t is its series (fusedlp._special.log1pmx_series) near t = 0, and the
    stirlerr' difference (stirlerr'(phi + k) from ``dstirlerr_at(phi, k)``) is O(k/phi^3).
    Not finite where n/s over- or underflows (the exact pass's cases)."""
    mu, phi = mean, concentration
    n, s = phi + k, phi + mu
    t = _special.ratio(k - mu, s)
    # the series in v = t/(2 + t) while |v| < 1/6 (its 10 terms reach eps there): the
    # direct form's log carries an absolute error of eps, against an answer as small as
    # 0.06 at the switch, and the sum can cancel further (at k = 1, phi = 3, mu -> 0)
    far = _xla.step(jnp.abs(t / (2.0 + t)) - 1.0 / 6.0)
    direct = _special.log_ratio(n, s) - t
    log1pmx = far * direct + (1.0 - far) * _special.log1pmx_series(t)
    # the stirlerr' difference first: each is -1/(2 phi) at small phi, where it is exact
    dstirlerr = dstirlerr_at(phi, k) - _special.dstirlerr_fast(phi)
    # (k/n) (0.5/phi), not (k/n) / phi: XLA rewrites (a/b)/c as a/(b c), and n phi overflows
    # float32 at phi = 1e20 (d/dphi came out 0 for 5e-29 at k = mu = 1e12); 0.5/phi is also
    # scalar work for a scalar phi
    return log1pmx + (_special.ratio(k, n) * _special.ratio(0.5, phi) + dstirlerr)


def _negative_binomial_dconc(k, mean, concentration, *, normalized=True):
    """The fast form's d/dphi for any concentration: stirlerr'(phi + k) per element."""
    del normalized  # log k! holds no phi
    return _dconc_form(lambda phi, k: _special.dstirlerr_fast(phi + k), k, mean, concentration)


def _negative_binomial_dconc_shared(k, mean, concentration, *, normalized=True):
    """d/dphi of `_negative_binomial_fast_shared`: stirlerr'(phi + k) picked from values
    for the small counts (`fusedlp._special.dstirlerr_by_count`)."""
    del normalized
    return _dconc_form(_special.dstirlerr_by_count, k, mean, concentration)


def _negative_binomial_hand_verdict(k, mean, concentration, *, normalized=True):
    """0 where k is a count and the parameters are valid (mu >= 0 and phi > 0, finite), NaN
    elsewhere: there f is finite, and the hand partials hold wherever they are finite
    (``exact_hand_partials="own"``), so derivatives judge them by this, without forming the
    value (kernel's ``hand_verdict``)."""
    del normalized
    tiny = jnp.finfo(jnp.result_type(concentration)).tiny  # phi > 0
    return _xla.nan_unless_all_nonneg(k, jnp.floor(k) - k, mean, concentration - tiny)


def _nb_options(fast, dconc):
    """The kernel's options but its verdict (tests/test_programs.py builds it without one)."""
    return dict(fast=fast, fast_layout="columns", data=("k",), name="negative_binomial_lpmf",
                fast_partials={"mean": _negative_binomial_dmean, "concentration": dconc},
                data_term=_negative_binomial_data, fast_second_order=True,
                exact_hand_partials="own")


def _nb_kernel(fast, dconc):
    return kernel(_negative_binomial_element, **_nb_options(fast, dconc),
                  hand_verdict=_negative_binomial_hand_verdict)


# one kernel for any concentration, one for a concentration shared by every element
_negative_binomial = _nb_kernel(_negative_binomial_fast, _negative_binomial_dconc)
_negative_binomial_shared = _nb_kernel(_negative_binomial_fast_shared,
                                       _negative_binomial_dconc_shared)


@constraints.declare(support={"k": constraints.count},
                     params={"mean": constraints.nonnegative,
                             "concentration": constraints.positive})
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
    del validate_args  # checked by constraints.declare
    shared = jnp.size(concentration) == 1
    nb = _negative_binomial_shared if shared else _negative_binomial
    return nb(k, mean, concentration, normalized=bool(normalized))
