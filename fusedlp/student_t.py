"""Student's t log-density, built with :func:`fusedlp.fuse`."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
from jax.typing import ArrayLike

from fusedlp import _special, _xla, constraints
from fusedlp._fuse import kernel

_HALF_LOG_PI = 0.5 * math.log(math.pi)

# One element, z = (x - mu) / sigma, h = (nu + 1) / 2:
#
#   log t(x | nu, mu, sigma) = lgamma(h) - lgamma(nu/2) - log(nu pi)/2 - log(sigma)
#                              - h log1p(z^2 / nu)
#   d/dx     = -(nu + 1) z / (sigma (nu + z^2))              = -d/dmu
#   d/dsigma = ((nu + 1) z^2 / (nu + z^2) - 1) / sigma
#   d/dnu    = (digamma(h) - digamma(nu/2) - 1/nu) / 2 - log1p(z^2/nu) / 2
#              + h z^2 / (nu (nu + z^2))
#
# The exact pass forms these by forward mode through the expression below (the jvp of log1p
# and lgamma are the 1/(1 + z^2/nu) and digamma above); the common path takes each from its
# hand-derived form further down (`_t_dloc`, `_t_dscale`, `_t_ddf`), judged by a verdict,
# with the value in a pass of its own. A scalar nu, sigma or mu makes lgamma, digamma and
# log(sigma) scalar work, done once.
#
# (x - mu) is formed before scaling (float32 keeps its digits at large mu). Writing
# u = (x - mu) * w with a scalar w = 1 / (sigma sqrt(nu)) instead of the two divisions sped
# up value-only calls but slowed value-and-gradient at large N (XLA:CPU lays the tangent
# loops out differently), so the divisions stay (docs/performance.md).
#
# The verdicts are arithmetic, not jnp.where: a select in the summed expression makes
# XLA:CPU evaluate the log1p in a slow elementwise loop and materialise it before the
# reduction (much costlier than the select-free sum; docs/performance.md). Here they come
# out of the formula: x = +-inf gives z^2 = inf, log1p(inf) = inf, a value of -inf (outside
# the support; fuse's edge rule zeroes its partials); 0 * mu is 0 for a finite mu and NaN
# otherwise (one multiply per element, cheaper than mu - mu and an add), sigma - sigma the same
# for sigma; sigma < 0 and nu < 0 make a log NaN; sigma = 0 and nu = 0 meet
# inf - inf = NaN; nu = inf gives lgamma(inf) - lgamma(inf) = NaN. NaN propagates. So nu <= 0,
# nu = inf, sigma <= 0, non-finite sigma or mu, and NaN anywhere give NaN. (nu = inf, the
# normal limit, is not taken: use normal_lpdf.)


def _log1p_sq(z, df):
    """log1p(z^2 / nu), without overflow where the dtype is narrower than float64.

    In float32, z^2 overflows from |z| ~ 1.8e19 and a finite x would get -inf, the verdict
    for data outside the support. There, with a = |z| / sqrt(nu), a > 1 takes
    2 log a + log1p(1/a^2) (double where: the other branch never sees a large a). (Not
    max/min: jax's jvp of those splits the tangent at a tie, a = 1, and is wrong there.) In
    float64 z^2 overflows only from |z| ~ 1e154, as scipy's does, and the plain form keeps
    the select-free sum that fuse runs fastest.
    """
    if _special.is_wide(z.dtype):
        return jnp.log1p(z * z / df)
    a = jnp.abs(z) / jnp.sqrt(df)
    big = a > 1.0
    a_big = jnp.where(big, a, 1.0)
    a_small = jnp.where(big, 1.0, a)
    r = 1.0 / a_big  # then squared: a^2 (and its tangent) would overflow first
    return jnp.where(big, 2.0 * jnp.log(a_big) + jnp.log1p(r * r),
                     jnp.log1p(a_small * a_small))


def _log_t_norm_large(df):
    """`_log_t_norm` for nu > 14, from Stirling's series (see there); a log1pmx(1/(2a)) as
    xlog1p_ratio_fast(a, 1/2) - 1/2, whose derivative log1pmx(u) + u^2/(1 + u) is formed
    from u = 1/(2a) alone (through the chain rule, log1pmx'(u) u'(a) ~ (-u)(-2u^2) is
    subnormal, and flushed, at nu = 1e15 in float32, which left d/ddf of the wrong sign
    there). The select-free form: u <= 1/14 here, so none of `xlog1p_ratio`'s selects for
    a large or overflowing u is needed, and a per-element df runs faster without them
    (docs/performance.md)."""
    a = 0.5 * df
    return (_special.stirling_series(a + 0.5) - _special.stirling_series(a)
            + (_special.xlog1p_ratio_fast(a, 0.5) - 0.5) - 0.5 * math.log(2.0))


@jax.custom_jvp
def _log_t_norm_small(df):
    """`_log_t_norm` for 0 < nu <= 14: the lgammas are O(1), the plain form exact enough.

    Its derivative is not: (digamma((nu + 1)/2) - digamma(nu/2) - 1/nu) / 2 subtracts terms
    of size 2 to a result of size 1/(4 nu^2) (500 ulps at nu = 12). With a = nu/2 and
    E(a) = digamma(a + 1/2) - digamma(a) - 1/(2a), the derivative is E(a)/2, and
    digamma(x + 1) = digamma(x) + 1/x gives, term by term positive,

        E(a) = E(a + 1) + 1 / (4 a (a + 1/2) (a + 1)),

    applied 7 times: E(a + 7) is twice the derivative of the large form at nu + 14.
    """
    return jsp.gammaln(0.5 * (df + 1.0)) - jsp.gammaln(0.5 * df) - 0.5 * jnp.log(df)


@_log_t_norm_small.defjvp
def _log_t_norm_small_jvp(primals, tangents):
    (df,), (t,) = primals, tangents
    shifted = jax.jvp(_log_t_norm_large, (df + 14.0,), (jnp.ones_like(df),))[1]
    # the 7 positive fractions over one denominator: a division is the costly operation
    dens = [4.0 * (0.5 * df + i) * (0.5 * df + i + 0.5) * (0.5 * df + i + 1.0)
            for i in range(7)]
    num, den = jnp.ones_like(df), dens[0]
    for d in dens[1:]:
        num, den = num * d + den, den * d
    steps = _special.ratio(num, den)  # its derivative has no den^2, which overflows float32
    return _log_t_norm_small(df), (shifted + 0.5 * steps) * t


def _log_t_norm(df):
    """lgamma((nu + 1)/2) - lgamma(nu/2) - log(nu)/2, accurate for every nu > 0.

    Above nu = 14 (a = nu/2 > 7, where Stirling's series and its derivative are within
    float64's eps: fusedlp._special),
    with lgamma(x) = stirlerr(x) + (x - 1/2) log x - x + log(2 pi)/2:

        stirlerr(a + 1/2) - stirlerr(a) + a log1pmx(1/(2a)) - log(2)/2

    whose pieces are O(1/nu) (the plain difference of lgammas loses every digit by
    nu = 1e16). Below, `_log_t_norm_small`.
    """
    big = df > 2.0 * _special.SERIES_FROM
    large = _log_t_norm_large(jnp.where(big, df, 4.0 * _special.SERIES_FROM))
    small = _log_t_norm_small(jnp.where(big, 1.0, df))
    return jnp.where(big, large, small)


def _half_nu1_log1p(z, df):
    """(nu + 1)/2 log1p(z^2 / nu), with forward-mode partials accurate at large nu.

    Where w = z^2/nu < 1/4 it is summed as z^2/2 + w/2 + (nu + 1)/2 log1pmx(w), which is
    (nu + 1)/2 (w + log1pmx(w)): d/dnu of the plain form subtracts two terms of size w/2 to
    a result of size w^2.

    Infinite z (x = +-inf) gives +inf through a select, so that no branch sees it: second
    derivatives (fusedlp.hessian) then stay finite for the in-support elements.
    """
    near = z * z < 0.25 * df
    zn = jnp.where(near, z, 0.0)
    wn = zn * zn / df
    zf = jnp.where(near | jnp.isinf(z), 0.0, z)
    h = 0.5 * (df + 1.0)
    out = jnp.where(near, 0.5 * (zn * zn + wn) + h * _special.log1pmx(wn),
                    h * _log1p_sq(zf, df))
    return jnp.where(jnp.isinf(z), jnp.inf, out)


def _student_t_element(x, df, loc, scale):
    # x = +-inf (outside the support) is replaced before any arithmetic and gets its -inf by
    # a select: no partial of the other elements' formula then meets inf * 0 in a second
    # derivative. d/dscale of z is -z/scale (_special.ratio): finite at scale = 1e-300.
    off = jnp.isinf(x)
    z = _special.ratio(jnp.where(off, 0.0, x - loc), scale)
    tail = jnp.where(off, jnp.inf, _half_nu1_log1p(z, df))
    lp = _log_t_norm(df) - _HALF_LOG_PI - jnp.log(scale) + (scale - scale) - tail
    return lp + 0.0 * loc


def _student_t_fast(x, df, loc, scale):
    """`_student_t_element` without a select (fusedlp._xla), for fuse's common path. Its
    value alone: every partial of the common path is hand-derived (below), so the tail is
    the plain (nu + 1)/2 log1p(z^2 / nu), accurate as a value for every nu (its forward-mode
    d/dnu is not: `_half_nu1_log1p`). Not finite for x = +-inf, an invalid parameter, or z^2
    overflowing (the exact pass's cases)."""
    z = _special.ratio(x - loc, scale)
    tail = 0.5 * (df + 1.0) * jnp.log1p(z * z / df)
    lp = _log_t_norm(df) - _HALF_LOG_PI - jnp.log(scale) + (scale - scale) - tail
    return lp + 0.0 * loc


# The fast form's partials in x, loc and scale, by hand: with h = (nu + 1)/2 and
# d/dz [h log1p(z^2/nu)] = (nu + 1) z / (nu + z^2),
#   d/dloc = -d/dx = z (nu + 1) / ((nu + z^2) scale)
#   d/dscale = (z^2 (nu + 1) / (nu + z^2) - 1) / scale = (z - 1)(z + 1) nu / ((nu + z^2) scale)
# the last without the cancellation of its first form at |z| = 1. (d/ddf below.)
#
# fusedlp.hessian differentiates these (fast_second_order) through their own jvp rules:
# forward mode through the formulas adds terms that cancel (d/dloc of d/dscale at
# z = -1e15, df = 1e-3 is 2e-48 from two terms of 2e-18). With r = 1/(nu + z^2) and the
# totals along each argument (z moves with x, loc and scale) in closed form:
#   d2/dloc2        = (nu + 1)(z^2 - nu) r^2 / scale^2              (= d2/dx2, -d2/dx dloc)
#   d2/dloc dscale  = -2 (nu + 1) nu z r^2 / scale^2                (= -d2/dx dscale)
#   d2/dscale2      = -(nu z^4 + (3 nu + 1) nu z^2 - nu^2) r^2 / scale^2
#   d2/dloc ddf     = z (z - 1)(z + 1) r^2 / scale
#   d2/dscale ddf   = (z - 1)(z + 1) z^2 r^2 / scale
# each a product of bounded factors (z^2 r, nu r, (z - 1)(z + 1) r), so that nothing
# overflows before the result does; the first and third change sign, and are as accurate
# as the sum of their terms' magnitudes allows (tests/test_accuracy.py).
def _t_pieces(x, df, loc, scale):
    """z, r = 1/(df + z^2), the bounded factors (z - 1)(z + 1) r, z^2 r and df r, and
    d2/dloc dscale, which the rules below hold."""
    z = _special.ratio(x - loc, scale)
    r = 1.0 / (df + z * z)
    s = df * r
    mixed = -2.0 * ((df + 1.0) * r) * s * (z / scale) / scale
    return z, r, (z - 1.0) * (z + 1.0) * r, z * z * r, s, mixed


@jax.custom_jvp
def _t_dloc(x, df, loc, scale):
    z = _special.ratio(x - loc, scale)
    return z * ((df + 1.0) / (df + z * z)) / scale


@_t_dloc.defjvp
def _t_dloc_jvp(primals, tangents):
    x, df, loc, scale = primals
    tx, tdf, tloc, tscale = tangents
    z, r, m, _, _, mixed = _t_pieces(*primals)
    dz = (df + 1.0) * r * ((df - z * z) * r) / scale / scale  # along x; -1 times along loc
    ddf = (z * r) * m / scale
    return (_t_dloc(*primals),
            dz * (tx - tloc) + mixed * tscale + ddf * tdf)


def _t_dx(x, df, loc, scale):
    return -_t_dloc(x, df, loc, scale)


@jax.custom_jvp
def _t_dscale(x, df, loc, scale):
    z = _special.ratio(x - loc, scale)
    # (z^2 - 1)/(df + z^2), near 1 for large z, before df: df/(df + z^2) is subnormal, and
    # flushed to 0, at df = 1e-8, z = 1e15 in float32
    return (z - 1.0) * (z + 1.0) / (df + z * z) * df / scale


@_t_dscale.defjvp
def _t_dscale_jvp(primals, tangents):
    x, df, loc, scale = primals
    tx, tdf, tloc, tscale = tangents
    _, _, m, q, s, mixed = _t_pieces(*primals)
    dscale = -(df * q * q + (3.0 * df + 1.0) * s * q - s * s) / scale / scale
    ddf = m * q / scale
    return (_t_dscale(*primals),
            mixed * (tloc - tx) + dscale * tscale + ddf * tdf)


# d/ddf by hand, the log-normaliser's part N'(nu) apart (scalar work for a scalar df, by
# forward mode through `_log_t_norm`'s accurate pieces). With w = z^2/nu, q = z^2 r =
# w/(1 + w) and s = nu r = 1 - q, the element's part is
#   d/dnu [-(nu + 1)/2 log1p(w)] = -log1p(w)/2 + (nu + 1) w / (2 nu (1 + w))
#                                = (log1pmx(-q) + q/nu) / 2
# since -log1p(w) = log(s) = log1p(-q). log1pmx(-q) = log(s) + q subtracts terms of size
# q to a result of size q^2/2 (the plain form loses every digit as nu -> inf): below
# q = 1/3 it is summed by its series, above as log(s) + q (s small is formed as nu r, not
# 1 - q). Its own derivatives, for fusedlp.hessian:
#   d2/ddf2       = N''(nu) + (q r (z^2 - 2)/nu - (q/nu)^2) / 2
#   d2/ddf dloc   = z (z - 1)(z + 1) r^2 / scale          (= -d2/ddf dx)
#   d2/ddf dscale = (z - 1)(z + 1) z^2 r^2 / scale
# (the last two as in `_t_dloc` and `_t_dscale`; checked against mpmath in
# tests/test_accuracy.py).
_LOG1PMX_SERIES_BELOW = 1.0 / 3.0  # |v| = q/(2 - q) <= 1/5: the series' terms suffice


def _dlog_t_norm(df):
    return jax.jvp(_log_t_norm, (df,), (jnp.ones_like(df),))[1]


def _log1pmx_neg(q, s):
    """log1pmx(-q) = log(s) + q, s = df r = 1 - q: by its series below q = 1/3 (both forms,
    blended by an exact mask)."""
    far = _xla.step(q - _LOG1PMX_SERIES_BELOW)
    return far * (jnp.log(s) + q) + (1.0 - far) * _special.log1pmx_series(-q)


@jax.custom_jvp
def _t_ddf(x, df, loc, scale):
    _, _, _, q, s, _ = _t_pieces(x, df, loc, scale)
    return _dlog_t_norm(df) + 0.5 * (_log1pmx_neg(q, s) + q / df)


@_t_ddf.defjvp
def _t_ddf_jvp(primals, tangents):
    x, df, loc, scale = primals
    tx, tdf, tloc, tscale = tangents
    z, r, m, q, _, _ = _t_pieces(*primals)
    qn = q / df
    ddf = (jax.jvp(_dlog_t_norm, (df,), (jnp.ones_like(df),))[1]
           + 0.5 * (q * ((z * z - 2.0) * r) / df - qn * qn))
    dloc = (z * r) * m / scale
    return (_t_ddf(*primals),
            dloc * (tloc - tx) + m * q / scale * tscale + ddf * tdf)


def _t_hand_domain(x, df, loc, scale):
    """Finite exactly where the hand partials hold: where z^2 does not overflow (beyond,
    d/dloc's (nu + 1) / (nu + z^2) is a finite 0, and the fast form is not finite)."""
    del df
    z = _special.ratio(x - loc, scale)
    return z * z


def _t_hand_verdict(x, df, loc, scale):
    """0 where df and scale are positive normal numbers and z^2 is finite (so x and loc are
    finite), NaN elsewhere: there f is finite and the hand partials hold (kernel's
    ``hand_verdict``), so first and second partials are judged without forming the value."""
    tiny = jnp.finfo(jnp.result_type(x, df, loc, scale)).tiny
    z2 = jnp.square(_special.ratio(x - loc, scale))
    # the parameters' part once for scalar ones; per element a subtraction, NaN for inf
    return _xla.nan_unless_all_nonneg(df - tiny, scale - tiny) + (z2 - z2)


# the kernel's options but its verdict (tests/test_programs.py builds it without one too)
_T_OPTIONS = dict(fast=_student_t_fast, name="student_t_lpdf",
                  fast_partials={"x": _t_dx, "df": _t_ddf, "loc": _t_dloc,
                                 "scale": _t_dscale},
                  fast_second_order=True, exact_hand_partials=_t_hand_domain)
_student_t = kernel(_student_t_element, **_T_OPTIONS, hand_verdict=_t_hand_verdict)


@constraints.declare(support={"x": constraints.real},
                     params={"df": constraints.positive, "loc": constraints.real,
                             "scale": constraints.positive})
def student_t_lpdf(
    x: ArrayLike,
    df: ArrayLike,
    loc: ArrayLike = 0.0,
    scale: ArrayLike = 1.0,
    *,
    validate_args: bool | None = None,
) -> jax.Array:
    r"""Summed Student's t log-density :math:`\sum_i \log t_{\nu_i}(x_i \mid \mu_i, \sigma_i)`.

    .. math::

        \log t_\nu(x \mid \mu, \sigma) = \log\Gamma\!\left(\tfrac{\nu+1}{2}\right)
          - \log\Gamma\!\left(\tfrac{\nu}{2}\right) - \tfrac12\log(\nu\pi) - \log\sigma
          - \tfrac{\nu+1}{2}\log\!\left(1 + \tfrac{z^2}{\nu}\right),
        \qquad z = \frac{x - \mu}{\sigma}

    Like ``scipy.stats.t.logpdf(x, df, loc, scale)`` and Stan's ``student_t_lpdf``, summed
    over the broadcast of the arguments. Built with :func:`fusedlp.fuse`: value and the
    partials of every differentiated argument in one pass.

    Args:
      x: observations.
      df: degrees of freedom :math:`\nu > 0`, finite.
      loc: location :math:`\mu`, finite (default 0).
      scale: scale :math:`\sigma > 0`, finite (default 1).
      validate_args: check concrete inputs and raise ``ValueError`` naming the argument and
        the first offending index (default: the global setting,
        :func:`fusedlp.enable_validation`).

    Returns:
      A scalar in the common floating dtype. ``NaN`` if any ``df`` or ``scale`` is not
      finite and positive, any ``loc`` is not finite, or anything is NaN; ``-inf`` with a zero
      gradient for that element if some ``x`` is infinite. Empty inputs give ``0.0``.

    Example:
      >>> import jax, fusedlp
      >>> round(float(fusedlp.student_t_lpdf(0.0, 1.0)), 5)  # Cauchy at 0: -log(pi)
      -1.14473
    """
    del validate_args  # checked by constraints.declare
    return _student_t(x, df, loc, scale)
