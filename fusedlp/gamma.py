"""Gamma log-density (shape and rate), built with :func:`fusedlp.fuse`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
from jax.typing import ArrayLike

from fusedlp import _special, _xla, constraints
from fusedlp._fuse import kernel

# One element, shape alpha, rate beta:
#
#   log Gamma(x | alpha, beta) = alpha log(beta) - lgamma(alpha) + (alpha - 1) log(x) - beta x
#   d/dx     = (alpha - 1) / x - beta
#   d/dalpha = log(beta) - digamma(alpha) + log(x)
#   d/dbeta  = alpha / beta - x
#
# fuse forms these by forward mode in one pass with the value; with a scalar alpha the
# lgamma/digamma are scalar work, done once, and log(x) is shared by the value and d/dalpha.
#
# Edges: x < 0 and x = +inf are outside the support (-inf, zero partials). x = 0 is the
# boundary, as in scipy: (alpha - 1) log 0 is -inf for alpha > 1 (value -inf, zero partials),
# 0 for alpha = 1 (the exponential: value log(beta); d/dbeta = 1/beta, and by the convention
# below d/dx = -beta and d/dalpha = log(beta) - digamma(1)), +inf for alpha < 1 (value +inf;
# the partials of the finite part, log x read as 0: d/dbeta = alpha/beta). alpha <= 0,
# beta <= 0, either non-finite, or NaN anywhere: NaN.
#
# Written for XLA:CPU (see fusedlp.fuse), where a select in a summed expression keeps the
# sum from being one vectorised pass: a select *after* the log costs the most, a select on
# the log's input less, a min about nothing (docs/performance.md). So x is clamped into
# (0, inf) before the log (the boundary term adds the x = 0 values), x < 0 becomes -inf
# through a minimum with (+-inf), and an invalid parameter adds log(p) - log(p) = NaN (a
# constant of the parameters: no tangent). The parameter verdict was sqrt(ok - 1) of a
# boolean ok: with the vector rate that is a per-element compare, convert and sqrt, which
# XLA:CPU wrote out as one more temporary array for its vectorised sum;
# log(rate) - log(rate) reuses the value's own log(rate) and adds none.


def _gamma_element(x, shape, rate):
    a1 = shape - 1.0
    inside = (x > 0) & (x < jnp.inf)
    log_x = jnp.log(jnp.where(inside, x, 1.0))  # x = inf: -rate * x gives -inf alone
    at_zero = jnp.where((x == 0) & (a1 != 0), -jnp.sign(a1) * jnp.inf, 0.0)
    log_rate, log_shape = jnp.log(rate), jnp.log(shape)
    # log(rate x) as one log where the product is a normal number: log(rate) + log(x)
    # carries an ulp of each (690 at rate = 1e-300) into d/dshape = log(rate x) - digamma.
    rx = rate * jnp.where(inside, x, 1.0)
    prod = (rx > jnp.finfo(rx.dtype).tiny) & (rx < jnp.inf)
    log_rx = jnp.where(prod, jnp.log(jnp.where(prod, rx, 1.0)), log_rate + log_x)
    lp = log_rate + a1 * log_rx - jsp.gammaln(shape) - rate * x
    # x < 0: -inf (NaN stays NaN). The +-inf at x = 0 is added after the minimum: a tie
    # min(+inf, +inf) would send each side half the tangent.
    lp = jnp.minimum(lp, (2.0 * (x >= 0) - 1.0) * jnp.inf) + at_zero
    # Above shape 2, R's dgamma: log(rate) + log Poisson(shape - 1 | rate x) in Loader's
    # form (fusedlp._special), free of the cancellation of shape log(rate) - lgamma(shape)
    # + (shape - 1) log x - rate x, which keeps 4 digits at shape = 1e14.
    # a in the shape alone: for a scalar shape, stirlerr(a) is scalar work, also in the
    # second-order rule's forward-over-forward pass over this function
    big = (shape > 2.0) & inside
    a = jnp.where(shape > 2.0, a1, 1.0)
    xb = jnp.where(big, x, 1.0)
    lp_big = (log_rate - _special.stirlerr(a) - _special.HALF_LOG_2PI - 0.5 * jnp.log(a)
              - _special.bd0(a, rate * xb, log_m=log_rx))
    lp = jnp.where(big, lp_big, lp)
    # The parameter verdict: log(p) - log(p) is 0 for a finite p > 0 and NaN for p <= 0,
    # p = inf or NaN (log gives NaN, -inf or +inf there), and log(rate) is the value's own.
    verdict = (log_rate - log_rate) + (log_shape - log_shape)
    return lp + jax.lax.stop_gradient(verdict)


def _gamma_fast(x, shape, rate):
    """`_gamma_element` without a select (fusedlp._xla), for fuse's common path: the plain
    form and Loader's, blended at shape 2 by an exact mask. Not finite for x <= 0, x = inf,
    an invalid parameter, or rate x outside the normal numbers (the exact pass's cases)."""
    log_rate = jnp.log(rate)
    rx = rate * x

    def plain(shape):
        return log_rate + (shape - 1.0) * jnp.log(rx) - jsp.gammaln(shape) - rx

    def loader(shape):
        a = shape - 1.0
        return (log_rate - _special.stirlerr(a) - _special.HALF_LOG_2PI - 0.5 * jnp.log(a)
                - _special.bd0_fast(a, rx))

    # A scalar shape stays unbatched under fuse's vmap, and the cond picks one form for all
    # elements; a per-element shape turns it into a select of both (each finite there).
    lp = jax.lax.cond(shape > 2.0, loader, plain, shape)
    verdict = (log_rate - log_rate) + _xla.nan_unless_nonneg(shape) + _xla.nan_unless_nonneg(
        rx - jnp.finfo(rx.dtype).tiny)
    return lp + jax.lax.stop_gradient(verdict)


# The fast form's partials, by hand (the derivation above). In x and rate: in the plain
# form and Loader's alike, and exact to a few ulps of the terms, which the condition numbers
# bound. In shape: log(rate x) - digamma(shape), whose two terms cancel at large shape; with
# digamma(a) = log a - 1/(2a) + stirlerr'(a) (fusedlp._special, accurate for every a > 0),
# d/dshape = -log(shape / (rate x)) + 1/(2 shape) - stirlerr'(shape): nothing left to cancel
# but the log's argument near 1, which the condition in x bounds, and at a small shape
# 1/(2 shape) and -stirlerr'(shape) (about 1/(2 shape) too) add. One form for every shape,
# select-free: a per-element shape forms no digamma.
# The fast partials' divisions go through _special.ratio, whose derivative -(a/b)/b holds
# where b^2 under- or overflows: fusedlp.hessian differentiates them (fast_second_order).
def _gamma_dx(x, shape, rate):
    return _special.ratio(shape - 1.0, x) - rate


def _gamma_drate(x, shape, rate):
    return _special.ratio(shape, rate) - x


def _gamma_dshape(x, shape, rate):
    return (0.5 / shape - _special.dstirlerr_fast(shape)) - jnp.log(
        _special.ratio(shape, rate * x))


def _gamma_hand_verdict(x, shape, rate):
    """0 where shape and rate are positive and finite and rate x is a finite normal number
    (the fast form's checks, with shape = 0 refused too), NaN elsewhere: there f is finite,
    and the hand partials hold wherever they are finite (``exact_hand_partials="own"``), so
    derivatives judge them by this, without forming the value (kernel's ``hand_verdict``)."""
    tiny = jnp.finfo(jnp.result_type(x, shape, rate)).tiny  # rate = 0 makes rate x = 0
    return _xla.nan_unless_all_nonneg(rate, shape - tiny, rate * x - tiny)


# the kernel's options but its verdict (tests/test_programs.py builds it without one too)
_GAMMA_OPTIONS = dict(fast=_gamma_fast, name="gamma_lpdf",
                      fast_partials={"x": _gamma_dx, "shape": _gamma_dshape,
                                     "rate": _gamma_drate},
                      fast_second_order=True, exact_hand_partials="own")
_gamma = kernel(_gamma_element, **_GAMMA_OPTIONS, hand_verdict=_gamma_hand_verdict)


@constraints.declare(support={"x": constraints.nonnegative},
                     params={"shape": constraints.positive, "rate": constraints.positive})
def gamma_lpdf(
    x: ArrayLike,
    shape: ArrayLike,
    rate: ArrayLike,
    *,
    validate_args: bool | None = None,
) -> jax.Array:
    r"""Summed gamma log-density :math:`\sum_i \log \mathrm{Gamma}(x_i \mid \alpha_i, \beta_i)`.

    .. math::

        \log \mathrm{Gamma}(x \mid \alpha, \beta) = \alpha\log\beta - \log\Gamma(\alpha)
          + (\alpha - 1)\log x - \beta x, \qquad x \ge 0

    Shape and **rate**, as Stan's ``gamma_lpdf`` (scipy: ``gamma.logpdf(x, a=alpha,
    scale=1/beta)``). Built with :func:`fusedlp.fuse`.

    Args:
      x: observations, :math:`x \ge 0`.
      shape: :math:`\alpha > 0`, finite.
      rate: :math:`\beta > 0`, finite.
      validate_args: check concrete inputs and raise ``ValueError`` naming the argument and
        the first offending index (default: the global setting).

    Returns:
      A scalar. ``-inf`` with a zero gradient for that element if some ``x < 0`` or
      ``x = inf``; at ``x = 0`` the scipy values (``-inf`` for ``alpha > 1``, ``log(beta)``
      for ``alpha = 1``, ``+inf`` for ``alpha < 1``). ``NaN`` for an invalid ``shape`` or
      ``rate`` or NaN anywhere. Empty inputs give ``0.0``.

    Example:
      >>> import fusedlp
      >>> round(float(fusedlp.gamma_lpdf(0.0, 1.0, 2.0)), 6)  # exponential at 0: log 2
      0.693147
    """
    del validate_args  # checked by constraints.declare
    return _gamma(x, shape, rate)
