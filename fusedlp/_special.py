"""Special functions shared by the kernels, written to stay accurate over the whole range.

The log-densities of the Poisson, negative binomial, gamma, binomial and Student t
families are sums of large terms that cancel (``k log(lam) - lam - log k!`` at large
``k``, ``lgamma(k + phi) - lgamma(phi)`` at large ``phi``). Catherine Loader's
decomposition ("Fast and accurate computation of binomial probabilities", 2000; R's
``dpois_raw``, ``dbinom_raw``, ``stirlerr`` and ``bd0``) rewrites them as sums of small,
same-signed pieces:

* ``stirlerr(n) = log n! - log(sqrt(2 pi n) (n/e)^n)``, the error of Stirling's formula,
  a small positive number (``1/(12 n)`` for large ``n``);
* ``bd0(x, m) = x log(x/m) + m - x >= 0``, the deviance term, computed from its series in
  ``v = (x - m)/(x + m)`` where ``x`` and ``m`` are close, so it never cancels.

Every function here is ordinary ``jax.numpy`` code, so forward- and reverse-mode
derivatives of the kernels built from them are as accurate as the values (the series are
differentiated term by term), except stirlerr: between 1/2 and 7 both it and its
derivative are Chebyshev expansions, and stirlerr's jvp is its derivative's own expansion,
``dstirlerr``, not the derivative of stirlerr's truncated one. Each branch's input is
replaced by a harmless value where the branch is not selected (the double-``where``
idiom), so second derivatives see no NaN.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import custom_batching

from fusedlp import _xla

HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

# stirlerr(n) for n = 0, 1, ..., 15, to 20 digits (mpmath); stirlerr(0) = 0 by convention
# (R's sferr_halves), the kernels never use it.
_STIRLERR_TABLE = np.array([
    0.0,
    0.08106146679532725822, 0.041340695955409294094, 0.027677925684998339149,
    0.020790672103765093112, 0.016644691189821192163, 0.013876128823070747999,
    0.011896709945891770095, 0.010411265261972096497, 0.0092554621827127329177,
    0.0083305634333628712565, 0.007573675487951840795, 0.0069428401072095298657,
    0.0064089941880042070684, 0.0059513701127588477356, 0.005554733551962801371,
])
STIRLERR_TABLE_SIZE = len(_STIRLERR_TABLE)

# Stirling's series stirlerr(n) ~ sum_j S_j / n^(2j+1), S_j = B_(2j+2) / ((2j+2)(2j+1)).
# The series is asymptotic. With 17 terms (R's stirlerr takes as many just above 5.25) it
# is within float64's eps from n = 5.25 for the value, and from n = 7 for its derivative,
# whose terms carry an extra factor 2j + 1: the series is used from 7 on. float32 needs 5.
_STIRLING_S = (
    1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156,
    -3617 / 122400, 43867 / 244188, -174611 / 125400, 77683 / 5796,
    -236364091 / 1506960, 657931 / 300, -3392780147 / 93960, 1723168255201 / 2492028,
    -7709321041217 / 505920, 151628697551 / 396,
)
SERIES_FROM = 7.0


def is_wide(dtype) -> bool:
    """Whether ``dtype`` is a float of at least 64 bits: the precision the kernels' series
    lengths, tables and float32-only guards are chosen against."""
    return jnp.finfo(dtype).bits >= 64


def in_float64(fn, *args):
    """``fn(*args)`` computed in float64 and returned in the arguments' dtype, for a
    narrower caller one of whose intermediates needs more than its own precision (the
    binomial's k - n sigmoid(eta) near its mode, whose rounding the deviance squares: n eps^2
    is 0.014 at n = 1e12 in float32). The float64 part is traced under
    ``jax.enable_x64(True)``, scoped to it, so it holds whether or not the caller enables
    64-bit types. Float64 arguments: ``fn(*args)`` itself."""
    dtype = jnp.result_type(*args)
    if is_wide(dtype):
        return fn(*args)
    with jax.enable_x64(True):
        out = fn(*(jnp.asarray(a, jnp.float64) for a in args))
    return jax.tree.map(lambda o: o.astype(dtype), out)


def _horner(coefficients, w):
    out = jnp.full_like(w, coefficients[-1])
    for c in coefficients[-2::-1]:
        out = out * w + c
    return out


def _series_terms(n, above):
    """The terms of `stirling_series` for n > ``above``, as many as the dtype needs there."""
    wide = is_wide(n.dtype)
    if above >= STIRLERR_TABLE_SIZE:
        return _STIRLING_S[:8] if wide else _STIRLING_S[:3]
    return _STIRLING_S if wide else _STIRLING_S[:5]


def stirling_series(n, above=SERIES_FROM):
    """sum_j S_j / n^(2j+1) for n > ``above``, as many terms as the dtype needs there (at
    n > 16: 8 terms reach float64's eps for the value and its derivative, float32 3)."""
    r = 1.0 / n
    return r * _horner(_series_terms(n, above), r * r)


def stirlerr_table(k):
    """stirlerr(k) from the table, for integer-valued 1 <= k < 16 (larger k read the last
    entry)."""
    table = jnp.asarray(_STIRLERR_TABLE, dtype=k.dtype)
    return lookup(table, jnp.clip(k, 0, STIRLERR_TABLE_SIZE - 1).astype(jnp.int32))


def stirlerr_int(k):
    """stirlerr(k) for integer-valued k >= 1 (any float dtype): a table below 16, else the
    series. No lgamma: the cheap form for counts."""
    small = k < STIRLERR_TABLE_SIZE
    return jnp.where(small, stirlerr_table(k),
                     stirling_series(jnp.where(small, STIRLERR_TABLE_SIZE, k)))


def log_factorial_rest(k, stirlerr):
    """log k! - (k log k - k) = stirlerr(k) + log(2 pi k) / 2 for k >= 1, given the form of
    stirlerr to use: the part of log k! that Loader's forms keep apart from bd0 (it depends
    on the count alone)."""
    return stirlerr(k) + HALF_LOG_2PI + 0.5 * jnp.log(k)


def stirlerr_int_fast(k):
    """`stirlerr_int` for integer-valued k >= 1 without a select or a gather (XLA:CPU
    writes either out as an array ahead of a reduction; fusedlp._xla): the table's entries
    below 7, each times the exact indicator max(0, 1 - |k - j|), plus the series from 7."""
    small = sum(float(_STIRLERR_TABLE[j]) * jnp.maximum(0.0, 1.0 - jnp.abs(k - j))
                for j in range(1, int(SERIES_FROM)))
    above = _xla.step(k - (SERIES_FROM - 0.5))
    return small + above * stirling_series(jnp.maximum(k, SERIES_FROM))


@jax.custom_jvp
def stirlerr_fast(n):
    """`stirlerr` for real n > 0 without a select (fusedlp._xla): its pieces blended by
    exact masks."""
    return _in_pieces_fast(n, stirling_series, _stirlerr_cheb, _stirlerr_shift)


# stirlerr'(n) = psi(n) - log n + 1/(2n) is O(1/n^2) from O(1) terms: formed so, it loses
# up to 2e-13 (150 ulps of a negative binomial's d/dconcentration at concentration 5.8),
# jax's digamma included. Between 1/2 and 7, where the series does not yet converge, it is
# a Chebyshev expansion of n^2 stirlerr'(n) in y = 1/n over [1/7, 2]: coefficients
# c_j = (2/N) sum_i g(y_i) cos(j theta_i) at N = 96 Chebyshev nodes, computed with mpmath
# at 60 digits (c_0 halved). 38 terms keep stirlerr' within 2 ulps in float64 and its
# derivative too (fusedlp.hessian differentiates it; 30 terms reach eps for the value, but
# the derivative of the truncated expansion was 110 ulps off at n = 1/2); 16 in float32.
# Below 1/2, psi's recurrence: stirlerr'(n) = stirlerr'(n + 1) + log1p(1/n) - 1/(2n)
# - 1/(2(n + 1)), whose terms cancel by at most a factor 5.
_DSTIRLERR_CHEB = (
    -0.07601176098245908, 0.008086864908217022, 0.0005783296505469142,
    -0.00029554581288552265, 5.696481414774615e-05, -4.97209881725e-06,
    -1.117386231356033e-06, 6.988110093582441e-07, -2.1141544733162377e-07,
    4.2597116340692703e-08, -3.560468392608065e-09, -1.6941127769175036e-09,
    1.1337412179459115e-09, -4.286886420904456e-10, 1.2079112292068195e-10,
    -2.4085250756320517e-11, 1.2942527729249084e-12, 1.7567464325610648e-12,
    -1.1580699134432552e-12, 4.925137402352472e-13, -1.6614886763409883e-13,
    4.483879104658026e-14, -8.231794892806616e-15, -2.2969867722530686e-16,
    1.1647809552556919e-15, -7.266806698211928e-16, 3.2762111762451936e-16,
    -1.2266828526940334e-16, 3.884907433417889e-17, -9.803842834253772e-18,
    1.3958619333042174e-18, 3.9642167995697796e-19, -4.728481558973066e-19,
    2.7594900351068614e-19, -1.2732920181778775e-19, 5.063202474921878e-20,
    -1.7615953219394744e-20, 5.200654305213056e-21,
)
# stirlerr itself between 1/2 and 7 the same way: n stirlerr(n) in y = 1/n over [1/7, 2], 96
# nodes, mpmath at 60 digits; 32 terms reach float64's eps. R's lgamma forms, used before,
# are sums of O(1) terms with an answer of O(1/n): a few ulps of the terms were up to 11
# ulps of a negative binomial's value between the accuracy grid's decades.
_STIRLERR_CHEB = (
    0.08040089288096006, -0.0033825362154578354, -0.000394081341552337,
    0.0001007493354119565, -1.220540358266995e-05, 6.040906511922561e-08,
    4.4955797195899065e-07, -1.5269890110270176e-07, 3.2248505226555423e-08,
    -3.747462970389292e-09, -5.055160965356513e-10, 4.849156660182364e-10,
    -1.8677372758194545e-10, 5.155263963722584e-11, -1.0113140428977985e-11,
    6.856189754905385e-13, 5.644847833801192e-13, -3.7315134360109926e-13,
    1.5237942618447127e-13, -4.872863562902942e-14, 1.2277642253042114e-14,
    -1.9881324143472604e-15, -1.6978376705100434e-16, 3.313733928234508e-16,
    -1.863772865388654e-16, 7.802045462602543e-17, -2.7156309949517064e-17,
    7.879198509467402e-18, -1.7217167041667569e-18, 1.248668288760596e-19,
    1.420724008947607e-19, -1.1271739841591827e-19,
)
# where both expansions start; below it, each function by its recurrence from n + 1
_CHEB_FROM = 0.5


def _dstirlerr_series(n, above=SERIES_FROM):
    """stirlerr'(n) for n > ``above`` (at least 7): the series' derivative,
    -sum_j (2j+1) S_j / n^(2j+2), as many terms as `stirling_series` takes there."""
    terms = _series_terms(n, above)
    r = 1.0 / n
    r2 = r * r
    return -r2 * _horner(tuple((2 * j + 1) * c for j, c in enumerate(terms)), r2)


def _chebyshev(coeffs, n, power):
    """sum_j c_j T_j(t) / n^power for 1/2 <= n <= 7, t = (14/n - 15)/13 in [-1, 1]: an
    expansion in y = 1/n over [1/7, 2] (Clenshaw's recurrence; c_0 stored halved), of
    n^power f(n), with as many terms as the dtype needs (16 in float32)."""
    y = 1.0 / n
    t = (14.0 * y - 15.0) / 13.0
    coeffs = coeffs if is_wide(n.dtype) else coeffs[:16]
    b1, b2 = jnp.zeros_like(t), jnp.zeros_like(t)
    for c in coeffs[:0:-1]:
        b1, b2 = 2.0 * t * b1 - b2 + c, b1
    return (t * b1 - b2 + coeffs[0]) * y**power


def _stirlerr_cheb(n):
    """stirlerr(n) for 1/2 <= n <= 7 (see _STIRLERR_CHEB)."""
    return _chebyshev(_STIRLERR_CHEB, n, 1)


def _stirlerr_shift(n):
    """stirlerr(n) - stirlerr(n + 1) for 0 < n < 1/2 (lgamma's recurrence)."""
    return (n + 0.5) * jnp.log1p(1.0 / n) - 1.0


def _dstirlerr_cheb(n):
    """stirlerr'(n) for 1/2 <= n <= 7 (see _DSTIRLERR_CHEB)."""
    return _chebyshev(_DSTIRLERR_CHEB, n, 2)


def _dstirlerr_shift(n):
    """stirlerr'(n) - stirlerr'(n + 1) for 0 < n < 1/2 (psi's recurrence)."""
    return jnp.log1p(1.0 / n) - 0.5 / n - 0.5 / (n + 1.0)


def _in_pieces(n, series, cheb, shift):
    """f(n) for real n > 0 from its pieces: ``series`` above 7, ``cheb`` on [1/2, 7], and
    below 1/2 ``cheb`` at n + 1 plus ``shift``."""
    big, small = n > SERIES_FROM, n < _CHEB_FROM
    m = jnp.where(big, 2.0, jnp.where(small, n + 1.0, n))
    return jnp.where(big, series(jnp.where(big, n, 2 * SERIES_FROM)),
                     cheb(m) + jnp.where(small, shift(jnp.where(small, n, 0.25)), 0.0))


def _in_pieces_fast(n, series, cheb, shift):
    """`_in_pieces` without a select (fusedlp._xla): the pieces blended by exact masks, each
    piece's input moved where it is harmless when not taken."""
    big = _xla.step(n - SERIES_FROM)
    small = _xla.step(_CHEB_FROM - n)
    m = (n + small) * (1.0 - big) + 2.0 * big  # in [1/2, 7] where the expansion is taken
    return (big * series(n + (1.0 - big) * SERIES_FROM)
            + (1.0 - big) * cheb(m)
            + small * shift(n * small + (1.0 - small) * 0.25))


def dstirlerr(n):
    """d/dn stirlerr(n) = psi(n) - log n + 1/(2n) for real n > 0, accurate relative to
    itself (see _DSTIRLERR_CHEB)."""
    return _in_pieces(n, _dstirlerr_series, _dstirlerr_cheb, _dstirlerr_shift)


def dstirlerr_fast(n):
    """`dstirlerr` without a select."""
    return _in_pieces_fast(n, _dstirlerr_series, _dstirlerr_cheb, _dstirlerr_shift)


@jax.custom_jvp
def stirlerr(n):
    """stirlerr(n) = lgamma(n + 1) - (n + 1/2) log n + n - log(2 pi)/2 for real n > 0,
    accurate relative to itself: the series above 7, the expansion _STIRLERR_CHEB on
    [1/2, 7], and below 1/2 the recurrence from n + 1."""
    return _in_pieces(n, stirling_series, _stirlerr_cheb, _stirlerr_shift)


# Both forms' derivative is stirlerr' from its own expansion (_DSTIRLERR_CHEB): forward mode
# through stirlerr's truncated expansion was up to 3.6 ulps off on [0.3, 8], dstirlerr 1.6.
@stirlerr.defjvp
def _stirlerr_jvp(primals, tangents):
    (n,), (t,) = primals, tangents
    return stirlerr(n), dstirlerr(n) * t


@stirlerr_fast.defjvp
def _stirlerr_fast_jvp(primals, tangents):
    (n,), (t,) = primals, tangents
    return stirlerr_fast(n), dstirlerr_fast(n) * t


@jax.custom_jvp
def _series_from_table(n):
    """stirlerr(n) for n > 16 (`stirling_series`), with the series' own derivative as its
    jvp."""
    return stirling_series(n, above=STIRLERR_TABLE_SIZE)


@_series_from_table.defjvp
def _series_from_table_jvp(primals, tangents):
    (n,), (t,) = primals, tangents
    return _series_from_table(n), _dstirlerr_series(n, above=STIRLERR_TABLE_SIZE) * t


def _by_count(fn, series, phi, k):
    """fn(phi + k) for integer-valued counts k >= 0 and a ``phi`` shared by every element,
    without a select (fusedlp._xla): each count below 16 picks one of the values
    fn(phi + j), j = 0..15, computed once (a scalar ``phi`` stays unbatched under fuse's
    vmap), by exact indicators max(0, 1 - |k - j|); from 16 on, phi + k > 16 and ``series``
    alone is fn there. Per element, fn itself would form every piece of its select-free
    blend (the series, a Chebyshev expansion, the recurrence), and counts are mostly
    small."""
    table = fn(phi + jnp.arange(STIRLERR_TABLE_SIZE, dtype=k.dtype))
    small = sum(table[j] * jnp.maximum(0.0, 1.0 - jnp.abs(k - j))
                for j in range(STIRLERR_TABLE_SIZE))
    above = _xla.step(k - (STIRLERR_TABLE_SIZE - 0.5))
    return small + above * series(phi + jnp.maximum(k, float(STIRLERR_TABLE_SIZE)))


def stirlerr_by_count(phi, k):
    """stirlerr(phi + k) for counts k and a shared phi (see `_by_count`)."""
    return _by_count(stirlerr, _series_from_table, phi, k)


def dstirlerr_by_count(phi, k):
    """stirlerr'(phi + k) for counts k and a shared phi (see `_by_count`)."""
    return _by_count(dstirlerr, lambda n: _dstirlerr_series(n, above=STIRLERR_TABLE_SIZE),
                     phi, k)


# bd0's series in v = (x - m)/(x + m): bd0 = (x - m) v + 2 x sum_{j>=1} v^(2j+1)/(2j+1).
# Used for |v| < 0.1, where v^2 < 0.01: 8 terms reach float64's eps, 4 float32's.
_BD0_SERIES_BELOW = 0.1


def bd0(x, m, diff=None, log_m=None):
    """The deviance term x log(x/m) + m - x >= 0 (x >= 0, m > 0), without cancellation.

    ``diff``, if given, is ``x - m`` computed from the caller's own inputs (for example
    ``k - mu`` where x = k + phi, m = mu + phi): the series then sees the exact difference,
    and its derivatives with it. ``log_m``, if given, is log(m) for where m itself has
    under- or overflowed (m = n sigmoid(eta) at eta = -1e4). bd0(0, m) = m; bd0(x, 0) = inf
    for x > 0.
    """
    d = x - m if diff is None else diff
    s = x + m
    v = ratio(d, jnp.where(s == 0, 1.0, s))
    near = jnp.abs(v) < _BD0_SERIES_BELOW
    vn = jnp.where(near, v, 0.0)
    w = vn * vn
    terms = 8 if is_wide(x.dtype) else 4
    coeffs = tuple(1.0 / (2 * j + 1) for j in range(1, terms + 1))
    series = d * vn + 2.0 * x * vn * w * _horner(coeffs, w)
    # far from m: x log(x/m) - (x - m); x/m may overflow (x = 1e12, m = 1e-300), then
    # log x - log m, which is then at least 709 and carries no cancellation.
    xf = jnp.where(near | (x == 0), 1.0, x)
    mf = jnp.where(near, 1.0, m)
    r = ratio(xf, mf)
    log_mf = jnp.log(mf) if log_m is None else jnp.where(near, 0.0, log_m)
    exact = (r > 0) & (r < jnp.inf)
    log_ratio = jnp.where(exact, jnp.log(jnp.where(exact, r, 1.0)), jnp.log(xf) - log_mf)
    far = jnp.where(x == 0, m, xf * log_ratio - d)
    return jnp.where(near, series, far)


def bd0_fast(x, m, diff=None, log_ratio=None):
    """`bd0` for x > 0 without a select (see fusedlp._xla): the series and the direct form,
    both computed, blended by an exact 0/1 mask. The series is finite for every
    |v| <= 1, and the direct form for every x, m > 0 whose ratio neither over- nor
    underflows; where it does, the result is not finite (inf or NaN), and the caller's
    exact pass takes over.

    ``log_ratio``, if given, is log(x/m) as ``log(x) - log_m`` for a caller that holds
    log_m = log(m) (the log-rate form): one log, where log(x / m) costs a division and, as
    XLA rewrites x / exp(eta), a second exp. It serves the direct form only, where
    |x - m| >= (x + m) / 10: there its rounding, eps |log x|, is within the conditioning
    of the answer in log_m (x |log_m| eps, with log_m close to log x or the term large).
    """
    d = x - m if diff is None else diff
    v = ratio(d, x + m)
    w = v * v
    terms = 8 if is_wide(x.dtype) else 4
    coeffs = tuple(1.0 / (2 * j + 1) for j in range(1, terms + 1))
    series = d * v + 2.0 * x * v * w * _horner(coeffs, w)
    far = _xla.step(jnp.abs(v) - _BD0_SERIES_BELOW)
    direct = x * (jnp.log(ratio(x, m)) if log_ratio is None else log_ratio) - d
    return far * direct + (1.0 - far) * series


def log1pmx_series(x):
    """log(1 + x) - x by its series, accurate for |x| < 1/4 and finite for every x >= 0.

    With v = x / (2 + x) (so log1p(x) = 2 atanh(v)):
    log1p(x) - x = -2 v^2 / (1 - v) + 2 v^3 sum_{j>=0} v^(2j) / (2j + 3); no term cancels.
    The first term is computed as -v^2 (2 + x): 1 - v rounds to 0 from x ~ 1e16 (a blend
    that masks this form off there would meet 0 * inf).
    """
    v = x / (2.0 + x)
    w = v * v
    terms = 10 if is_wide(x.dtype) else 5
    coeffs = tuple(1.0 / (2 * j + 3) for j in range(terms))
    return -w * (2.0 + x) + 2.0 * v * w * _horner(coeffs, w)


def log1pmx(x):
    """log(1 + x) - x for x > -1, without cancellation near 0 (the series for |x| < 1/4)."""
    near = jnp.abs(x) < 0.25
    series = log1pmx_series(jnp.where(near, x, 0.0))
    xf = jnp.where(near, 0.5, x)
    return jnp.where(near, series, jnp.log1p(xf) - xf)


def lookup(table: jax.Array, idx: jax.Array) -> jax.Array:
    """``table[idx]`` for in-range ``idx``, shaped and sharded like ``idx``.

    Under a mesh with Explicit axes (``jax.make_mesh``'s default) a gather from a replicated
    table with sharded indices has no unambiguous output sharding and jax refuses to trace
    it; there the indices' sharding is named. Elsewhere (one device, Auto axes, one device's
    block in fuse's shard_map) the spec carries no mesh axis and this is the plain
    ``jnp.take``. Under ``vmap`` only the whole batch's indices show the mesh axes, so the
    choice is made again in the batching rule of a ``jax.custom_batching.custom_vmap``.
    """
    sharding = _xla.split_sharding(idx)
    if sharding is not None:
        return jnp.asarray(table).at[idx].get(mode="promise_in_bounds", out_sharding=sharding)
    return _take(table, idx)


@custom_batching.custom_vmap
def _take(table, idx):
    return jnp.take(table, idx)


@_take.def_vmap
def _take_batched(axis_size, in_batched, table, idx):
    del axis_size
    if not any(in_batched):  # batched tangents of the table only (forward mode)
        out = jnp.take(table, idx)
        return out, _xla.none_batched(out)
    if in_batched[0]:  # a batch of tables
        out = _xla.over_members(jnp.take, in_batched)(table, idx)
    else:
        out = lookup(table, idx)  # the batch axis leads (custom_vmap moves it there)
    return out, _xla.all_batched(out)


@jax.custom_jvp
def xlog1p_ratio(phi, mu):
    """phi log1p(mu/phi) (phi > 0, mu >= 0), with partials that neither overflow nor cancel.

    The chain rule through u = mu/phi forms mu/phi^2, which overflows at mu = 1e300,
    phi = 1e-8, and d/dphi = log1p(u) - u/(1 + u) cancels to u^2/2 at small u. The rule
    below gives d/dphi = log1pmx(u) + u^2/(1 + u) for u < 1, log1p(u) - mu/(phi + mu)
    above, and d/dmu = phi/(phi + mu).
    """
    u = mu / phi
    finite = u < jnp.inf
    # where u underflows (XLA:CPU flushes a subnormal one to 0), phi log1p(u) is mu itself
    return jnp.where(u < jnp.finfo(u.dtype).tiny, mu,
                     phi * jnp.where(finite, jnp.log1p(jnp.where(finite, u, 0.0)),
                                     jnp.log(mu) - jnp.log(phi)))


@xlog1p_ratio.defjvp
def _xlog1p_ratio_jvp(primals, tangents):
    phi, mu = primals
    dphi, dmu = tangents
    u = mu / phi
    small = u < 1.0
    us = jnp.where(small, u, 0.0)
    # p = phi / (phi + mu) and log1p(u) = log((phi + mu) / phi) through `ratio` and
    # `log_ratio`, whose own derivatives hold where 1/(1 + u)^2 and mu/phi^2 overflow
    # (fusedlp.hessian's d2/dphi2 was NaN at mu = 1e300, phi = 1e-8, for 1/phi)
    s = phi + mu
    p = ratio(phi, s)
    large = log_ratio(jnp.where(small, 2.0 * phi, s), phi) - (1.0 - p)
    d_phi = jnp.where(small, log1pmx(us) + us * us * p, large)
    d_phi = jnp.where(u < jnp.inf, d_phi, jnp.log(mu) - jnp.log(phi) - 1.0)
    return xlog1p_ratio(phi, mu), d_phi * dphi + p * dmu


@jax.custom_jvp
def ratio(a, b):
    """a / b, whose derivative in b is -(a/b)/b rather than jax's -a b^-2: at a = 0,
    b = 1e-300 that is 0, not 0 * inf = NaN."""
    return a / b


@jax.custom_jvp
def log_ratio(a, b):
    """log(a / b) (a, b > 0), whose derivative is da/a - db/b: jax's, d(a/b) / (a/b), XLA
    rewrites as a product of a, b and their tangents over another, which overflows at
    a = 1e10, b = 1e300 (d/da came out 0 for 1e-10). -inf where a / b is subnormal: the
    division has lost digits there (a GPU keeps them, log(1e-8/1e36) came out -101.333 for
    -101.313 in float32; XLA:CPU flushes them to 0), so a hand partial built on it is not
    finite and the exact pass takes the point."""
    r = a / b
    return jnp.log(jnp.where(r < jnp.finfo(r.dtype).tiny, 0.0, r))


@log_ratio.defjvp
def _log_ratio_jvp(primals, tangents):
    a, b = primals
    da, db = tangents
    return log_ratio(a, b), da / a - db / b


@jax.custom_jvp
def xlog1p_ratio_fast(phi, mu):
    """`xlog1p_ratio` without a select in its partials (fusedlp._xla): the two forms of
    d/dphi blended at u = mu/phi = 1/4. Not finite where mu/phi overflows."""
    return phi * jnp.log1p(mu / phi)


@xlog1p_ratio_fast.defjvp
def _xlog1p_ratio_fast_jvp(primals, tangents):
    phi, mu = primals
    dphi, dmu = tangents
    u = mu / phi
    p = 1.0 / (1.0 + u)  # phi / (phi + mu)
    log1p_u = jnp.log1p(u)
    far = _xla.step(u - 0.25)
    d_phi = far * (log1p_u - (1.0 - p)) + (1.0 - far) * (log1pmx_series(u) + u * u * p)
    return phi * log1p_u, d_phi * dphi + p * dmu


@ratio.defjvp
def _ratio_jvp(primals, tangents):
    a, b = primals
    da, db = tangents
    out = a / b
    return out, (da - out * db) / b


@jax.custom_jvp
def logistic(x):
    """sigmoid(x) = 1/(1 + exp(-x)), whose derivative sigmoid(x) sigmoid(-x) is accurate
    relative to itself at every x: JAX's own, sigmoid(x) (1 - sigmoid(x)), is 0 for x above
    about 37, where 1 - sigmoid(x) rounds to 0 (a binomial's second partial in its logit)."""
    return jax.nn.sigmoid(x)


@logistic.defjvp
def _logistic_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    s = logistic(x)
    return s, t * (s * logistic(-x))


@jax.custom_jvp
def logistic_pair(x):
    """(sigmoid(x), sigmoid(-x)), each accurate relative to itself, from one exp:
    with e = exp(-|x|) and r = 1/(1 + e), they are (r, e r) for x >= 0 and (e r, r) below.
    Derivatives (s, -s) for s = sigmoid(x) sigmoid(-x), as `logistic`'s."""
    e = jnp.exp(-jnp.abs(x))
    r = 1.0 / (1.0 + e)
    small = e * r
    up = x >= 0
    return jnp.where(up, r, small), jnp.where(up, small, r)


@logistic_pair.defjvp
def _logistic_pair_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    p, q = logistic_pair(x)
    s = t * (p * q)
    return (p, q), (s, -s)
