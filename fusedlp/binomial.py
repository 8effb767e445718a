"""Bernoulli and binomial log-mass with a logit parameter, built with :func:`fusedlp.fuse`."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from fusedlp import _checks, _special, _xla, constraints
from fusedlp._fuse import kernel

# With p = sigmoid(eta):  log p = -softplus(-eta),  log(1 - p) = -softplus(eta), and
#
#   softplus(+-eta) = max(+-eta, 0) + l,   l = log1p(exp(-|eta|)),
#   max(+-eta, 0) = (|eta| +- eta) / 2
#
# exact for every finite eta: no exp overflows, nothing cancels, and one exp and one log1p
# serve both softplus terms. So, one element,
#
#   Bernoulli:  log p(y | eta)    = -((t + |eta|)/2 + l),                t = eta if y = 0,
#                                                                        t = -eta if y = 1
#               d/deta            = y - sigmoid(eta)
#   binomial:   log p(k | n, eta) = log C(n, k) - k (|eta| - eta)/2 - (n - k)(|eta| + eta)/2
#                                   - n l
#               d/deta            = k - n sigmoid(eta)
#
# fuse forms d/deta by forward mode in the same pass. (|eta| +- eta)/2 is formed as
# max(+-eta, 0), which does not overflow (|eta| + eta does above half the largest float, and
# XLA turns eta/2 + |eta|/2 back into the sum), and differentiated as the sum (`_half_sum`):
# at eta = 0 the jvp of |eta| is sign(0) = 1, against which max's tie (1/2) would leave
# d/deta 1/2 short of y - sigmoid(0). The normalized binomial at 0 < k < n is summed in
# Loader's form instead (see _log_binomial_interior): log C(n, k) cancels against the rest at
# large n. log C(n, k) does not depend on eta: `normalized=False` drops it. y, k and n are
# data: zero cotangent (none when integer).
#
# Edges: y not in {0, 1}, k not an integer in [0, n]: outside the support, -inf with a zero
# partial. n < 0, non-integer or infinite n (scipy: an invalid parameter), a non-finite
# logit (eta = +-inf is p = 1 or 0 exactly: not taken), NaN anywhere: NaN.


@jax.custom_jvp
def _half_sum(t, a):
    """(t + a) / 2 for a = |t|: max(t, 0), which does not overflow, differentiated as the
    sum (so that at t = 0, with abs's derivative sign(0) = 1, the softplus pieces' derivatives
    add up to exactly sigmoid(0), and their second derivatives to sigmoid'(0))."""
    return jnp.maximum(t, 0.0)


@_half_sum.defjvp
def _half_sum_jvp(primals, tangents):
    return _half_sum(*primals), 0.5 * tangents[0] + 0.5 * tangents[1]


def _bernoulli_logit_element(y, logit):
    t = jnp.where(y == 1, -logit, logit)
    a = jnp.abs(logit)  # = |t|, written in the parameter alone: with a scalar logit the
    lp = -(_half_sum(t, a) + jnp.log1p(jnp.exp(-a)))  # exp and log1p are scalar work
    ok = jnp.isfinite(logit) & ~jnp.isnan(y)
    return jnp.where(ok, jnp.where((y == 0) | (y == 1), lp, -jnp.inf), jnp.nan)


def _binomial_logit_element(k, n, logit, *, normalized=True):
    return _binomial_logit_lp(k, n, logit, normalized, wide=False)


def _binomial_logit_element_wide(k, n, logit, *, normalized=True):
    """`_binomial_logit_element` with k - n p in float64 (see `_log_binomial_interior`)."""
    return _binomial_logit_lp(k, n, logit, normalized, wide=True)


def _binomial_logit_lp(k, n, logit, normalized, *, wide):
    nok = (n >= 0) & (n == jnp.floor(n)) & (n < jnp.inf)
    kok = (k >= 0) & (k <= n) & (k == jnp.floor(k))
    nn = jnp.where(nok, n, 0.0)
    kk = jnp.where(kok, k, 0.0)  # keeps the series finite off the support
    ok = nok & jnp.isfinite(logit) & ~jnp.isnan(k)
    eta = jnp.where(ok, logit, 0.0)
    a = jnp.abs(eta)
    e = jnp.exp(-a)
    el = jnp.log1p(e)
    # n l where exp(-|eta|) underflows is exp(log n - |eta|): n l came out 0 for -3.7e-29 at
    # n = 1e15, eta = -100 in float32 (exp(-100) subnormal, flushed by XLA:CPU)
    n_el = jnp.where(e < jnp.finfo(e.dtype).tiny, jnp.exp(jnp.log(nn) - a), nn * el)
    lp = -(kk * _half_sum(-eta, a) + (nn - kk) * _half_sum(eta, a) + n_el)
    if normalized:
        lp = jnp.where((kk == 0) | (kk == nn), lp,
                       _log_binomial_interior(kk, nn, eta, a, el, wide=wide))
    return jnp.where(ok, jnp.where(kok, lp, -jnp.inf), jnp.nan)


def _log_binomial_interior(k, n, eta, abs_eta, el, *, wide):
    """log Binomial(k | n, sigmoid(eta)) for 0 < k < n, by Loader's form (R's dbinom_raw):

        stirlerr(n) - stirlerr(k) - stirlerr(n - k) - bd0(k, n p) - bd0(n - k, n q)
        - log(2 pi k (n - k) / n) / 2

    without the cancellation of log C(n, k) against k log p + (n - k) log q at large n.
    log p = -softplus(-eta) and log q = -softplus(eta) go to bd0 too: n p underflows at
    eta = -1e4 where its logarithm does not.

    The deviance squares the rounding of k - n p near the mode: n eps^2, 0.014 at n = 1e12
    in float32. With ``wide``, k - n p, n p and n q are formed in float64
    (`_special.in_float64`): for n beyond 2/eps in a narrower dtype (`_binomial_logit_for`).
    Below, and in float64 (n eps^2 is 0.2 ulp at n = 1e15), the dtype's own rounding stays
    well within the bound.
    """
    inner = (k > 0) & (k < n)
    k = jnp.where(inner, k, 1.0)
    n = jnp.where(inner, n, 2.0)
    log_p = -(_half_sum(-eta, abs_eta) + el)
    log_q = -(_half_sum(eta, abs_eta) + el)
    log_n = jnp.log(n)
    m = n - k
    if wide:
        d, n_p, n_q = _special.in_float64(_count_less_mean, k, n, eta)
    else:
        d, n_p, n_q = None, n * jnp.exp(log_p), n * jnp.exp(log_q)
    return (_special.stirlerr_int(n) - _special.stirlerr_int(k) - _special.stirlerr_int(m)
            - _special.bd0(k, n_p, diff=d, log_m=log_n + log_p)
            - _special.bd0(m, n_q, diff=None if d is None else -d, log_m=log_n + log_q)
            - _special.HALF_LOG_2PI - 0.5 * (jnp.log(k) + jnp.log1p(-k / n)))


def _count_less_mean(k, n, eta):
    """k - n p (bd0's ``diff``, and -(n - k - n q)), n p and n q, for p = sigmoid(eta)."""
    p, q = _special.logistic_pair(eta)
    return k - n * p, n * p, n * q


def _binomial_logit_fast(k, n, logit, *, normalized=True):
    """`_binomial_logit_element` without a select (fusedlp._xla), for fuse's common path,
    less `_binomial_logit_data`: Loader's interior form and the k = 0 or k = n form blended
    by an exact mask (k and n are data: min and max on them carry no tangent). With that
    part, not finite for k or n off the support, a non-finite logit, or n p, n q under- or
    overflowing, or exp(-|logit|) underflowing (the exact pass's cases)."""
    verdict = _logit_verdict(logit)
    a = jnp.abs(logit)
    el = jnp.log1p(jnp.exp(-a))
    log_p = -(_half_sum(-logit, a) + el)
    log_q = -(_half_sum(logit, a) + el)
    edge = k * log_p + (n - k) * log_q
    if not normalized:
        return edge + verdict
    inner, ks, ms, ns = _interior(k, n)
    interior = (-_special.bd0_fast(ks, ns * jnp.exp(log_p))
                - _special.bd0_fast(ms, ns * jnp.exp(log_q)))
    return inner * interior + (1.0 - inner) * edge + verdict


def _interior(k, n):
    """1 for 0 < k < n, else 0 (an exact mask), and k, n - k, n moved to >= 1."""
    inner = jnp.minimum(k, 1.0) * jnp.minimum(n - k, 1.0)
    ks = jnp.maximum(k, 1.0)
    ms = jnp.maximum(n - k, 1.0)
    return inner, ks, ms, ks + ms


def _binomial_logit_data(k, n, *, normalized=True):
    """The fast form's part in k and n alone: for 0 < k < n, Loader's
    stirlerr(n) - stirlerr(k) - stirlerr(n - k) - log(2 pi k (n - k) / n) / 2 (if
    ``normalized``), and NaN unless k and n are counts with k <= n (and n <= 2/eps if
    ``normalized``)."""
    if not normalized:
        return _counts_verdict(k, n)
    # beyond `_trials_max`, the exact pass (wide: `_binomial_logit_for`)
    verdict = _counts_verdict(k, n, _trials_max(jnp.result_type(n)) - n)
    inner, ks, ms, ns = _interior(k, n)
    part = (_special.stirlerr_int_fast(ns) - _special.stirlerr_int_fast(ks)
            - _special.stirlerr_int_fast(ms)
            - _special.HALF_LOG_2PI - 0.5 * (jnp.log(ks) + jnp.log1p(-ks / ns)))
    return inner * part + verdict


def _trials_max(dtype) -> float:
    """2/eps (2**24 in float32, 2**53 in float64): every count up to it is representable,
    and up to it the dtype's own rounding of k - n p, which the deviance squares, stays
    within the accuracy bound (`_log_binomial_interior`)."""
    return 2.0 / float(jnp.finfo(dtype).eps)


def _counts_verdict(k, n, *more):
    """0 where k and n are whole numbers with 0 <= k <= n, NaN elsewhere: floor(a) - a is 0
    for a whole a, negative otherwise; and where each of ``more`` is >= 0 (one square root
    for all: `fusedlp._xla.nan_unless_all_nonneg`)."""
    return _xla.nan_unless_all_nonneg(k, n - k, jnp.floor(k) - k, jnp.floor(n) - n, *more)


def _binomial_dlogit(k, n, logit, *, normalized=True):
    """The fast form's d/deta by hand: k - n sigmoid(eta) (sigmoid accurate relative to
    itself at every eta, and so is its derivative: the second partial -n sigmoid(eta)
    sigmoid(-eta), which fusedlp.hessian takes from it)."""
    del normalized  # log C(n, k) holds no eta
    return k - n * _special.logistic(logit)


def _binomial_hand_verdict(k, n, logit, *, normalized=True):
    """0 where k and n are counts with k <= n and `_logit_margin` is >= 0, NaN elsewhere:
    there `_binomial_dlogit` and its derivative hold, so a Hessian pass judges them by
    this, without forming the value (Loader's pieces, the kernel's dearest part)."""
    del normalized
    return _counts_verdict(k, n, _logit_margin(logit))


def _logit_margin(logit):
    """-log(tiny) - 1 - |logit| (86.3 in float32, 707.4 in float64, less |logit|): negative
    or NaN where the logit is not finite or exp(-|logit|) may underflow, and n log1p of it
    with it, which the exact pass forms as exp(log n - |logit|) instead."""
    return -math.log(jnp.finfo(jnp.result_type(logit)).tiny) - 1.0 - jnp.abs(logit)


def _logit_verdict(logit):
    """0 where `_logit_margin` is >= 0, NaN elsewhere."""
    return _xla.nan_unless_nonneg(_logit_margin(logit))


def _bernoulli_logit_edge(y, logit):
    """The element's edges without its value (kernel's ``edge``): -inf for y off {0, 1}, NaN
    for a non-finite logit or a NaN y, 0 elsewhere. jax.grad alone then forms no log1p."""
    ok = jnp.isfinite(logit) & ~jnp.isnan(y)
    return jnp.where(ok, jnp.where((y == 0) | (y == 1), 0.0, -jnp.inf), jnp.nan)


_bernoulli_logit = kernel(_bernoulli_logit_element, data=("y",), name="bernoulli_logit_lpmf",
                          edge=_bernoulli_logit_edge)
# the kernel's options but its verdict (tests/test_programs.py builds it without one too)
_BINOMIAL_LOGIT_OPTIONS = dict(fast=_binomial_logit_fast, fast_layout="columns",
                               data=("k", "n"), name="binomial_logit_lpmf",
                               fast_partials={"logit": _binomial_dlogit},
                               data_term=_binomial_logit_data, fast_second_order=True)
_binomial_logit = kernel(_binomial_logit_element, **_BINOMIAL_LOGIT_OPTIONS,
                         hand_verdict=_binomial_hand_verdict)
_binomial_logit_wide = kernel(_binomial_logit_element_wide, **_BINOMIAL_LOGIT_OPTIONS,
                              hand_verdict=_binomial_hand_verdict)


def _binomial_logit_for(n, dtype):
    """The binomial kernel for trials ``n`` in ``dtype``: `_binomial_logit_wide` (k - n p in
    float64 in the exact pass) in a dtype narrower than float64 unless every n is known now
    to be at most `_trials_max`. Its float64 part is a cost of the exact pass alone (up to
    fusedlp._xla.SMALL elements, the whole call; timings in docs/kernels.md): the fast pass
    takes n up to `_trials_max` either way."""
    if _special.is_wide(dtype) or (
            _checks.is_concrete(n) and np.all(np.asarray(n) <= _trials_max(dtype))):
        return _binomial_logit
    return _binomial_logit_wide


@constraints.declare(support={"y": constraints.binary},
                     params={"logit": constraints.real})
def bernoulli_logit_lpmf(
    y: ArrayLike,
    logit: ArrayLike,
    *,
    validate_args: bool | None = None,
) -> jax.Array:
    r"""Summed Bernoulli log-mass with a logit, :math:`p = \sigma(\eta)`, stable for any finite η.

    .. math::

        \log p(y \mid \eta) = y\eta - \log(1 + e^\eta) = -\mathrm{softplus}(\mp\eta),
        \qquad \partial_\eta = y - \sigma(\eta)

    Logistic regression: ``bernoulli_logit_lpmf(y, X @ beta)`` (Stan's
    ``bernoulli_logit_lpmf``; scipy: ``bernoulli.logpmf(y, expit(eta))``). Exact for large
    :math:`|\eta|` (e.g. ``y = 1, eta = 40`` gives ``-4.2e-18``, not 0 or ``-inf``). Built
    with :func:`fusedlp.fuse`.

    Args:
      y: outcomes in {0, 1} (boolean, integer, or a float holding 0 or 1); data, zero
        gradient.
      logit: :math:`\eta`, finite.
      validate_args: check concrete inputs and raise ``ValueError`` naming the argument and
        the first offending index (default: the global setting).

    Returns:
      A scalar. ``-inf`` with a zero gradient for ``y`` not in {0, 1}; ``NaN`` for a
      non-finite logit or NaN anywhere. Empty inputs give ``0.0``.

    Example:
      >>> import jax, fusedlp
      >>> float(jax.grad(fusedlp.bernoulli_logit_lpmf, argnums=1)(1, 0.0))  # 1 - sigmoid(0)
      0.5
    """
    del validate_args  # checked by constraints.declare
    return _bernoulli_logit(y, logit)


def _validate_k(fn, k, n, **_):
    """k in {0, ..., n} where k and n broadcast; the message names k's and n's own entries."""
    if not _checks.is_concrete(k, n):
        return
    k, n = np.asarray(k), np.asarray(n)
    shape = np.broadcast_shapes(k.shape, n.shape)
    kb, nb = np.broadcast_to(k, shape), np.broadcast_to(n, shape)
    bad = ~(constraints.count.holds(kb) & (kb <= nb))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{fn}: argument `k` must hold integers in [0, n]; first offending entry "
            f"{_checks.entry('k', idx, k.shape)} = {kb[idx].item()!r} "
            f"(against {_checks.entry('n', idx, n.shape)} = {nb[idx].item()!r})")


@constraints.declare(support={"k": constraints.count},
                     params={"n": constraints.count, "logit": constraints.real},
                     check=_validate_k)
def binomial_logit_lpmf(
    k: ArrayLike,
    n: ArrayLike,
    logit: ArrayLike,
    *,
    normalized: bool = True,
    validate_args: bool | None = None,
) -> jax.Array:
    r"""Summed binomial log-mass with a logit, :math:`p = \sigma(\eta)`, stable for any finite η.

    .. math::

        \log p(k \mid n, \eta) = \log\binom{n}{k} + k\eta - n\log(1 + e^\eta),
        \qquad \partial_\eta = k - n\,\sigma(\eta)

    Stan's ``binomial_logit_lpmf``; scipy: ``binom.logpmf(k, n, expit(eta))``. Built with
    :func:`fusedlp.fuse`.

    Args:
      k: successes, integers in ``[0, n]``; data, zero gradient.
      n: trials, non-negative integers; data, zero gradient.
      logit: :math:`\eta`, finite.
      normalized: if False, drop :math:`\log\binom{n}{k}` (Stan's ``propto``); the gradient
        is unchanged.
      validate_args: check concrete inputs and raise ``ValueError`` naming the argument and
        the first offending index (default: the global setting).

    Returns:
      A scalar. ``-inf`` with a zero gradient for ``k`` outside ``{0, ..., n}``; ``NaN`` for
      an invalid ``n`` (negative, non-integer, infinite), a non-finite logit or NaN
      anywhere. Empty inputs give ``0.0``.

    Example:
      >>> import jax, fusedlp
      >>> float(jax.grad(fusedlp.binomial_logit_lpmf, argnums=2)(3, 10, 0.0))  # 3 - 10/2
      -2.0
    """
    del validate_args  # checked by constraints.declare
    arrays = [_checks.as_real_array("binomial_logit_lpmf", name, a)  # errors name the argument
              for name, a in (("k", k), ("n", n), ("logit", logit))]
    kernel_ = _binomial_logit_for(n, _checks.float_dtype(*arrays))
    return kernel_(k, n, logit, normalized=bool(normalized))
