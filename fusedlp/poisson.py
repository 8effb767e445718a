"""Poisson log-mass, in rate and in log-rate form, with hand-derived VJPs."""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from fusedlp import _checks
from fusedlp._vjp import scaled, sum_to_shape

# Derivation (one element; the kernels sum over elements):
#
#   rate form:      log P(k | lam) = k log(lam) - lam - log k!
#                   d/dlam = k / lam - 1                 (= -1 at k = 0, also at lam = 0)
#   log-rate form:  log P(k | eta) = k eta - exp(eta) - log k!,   lam = exp(eta)
#                   d/deta = k - exp(eta)                (exp(eta) shared with the value)
#
# log k! does not depend on the parameters, so it appears in no partial: `normalized=False`
# drops it (it is most of the cost) and the gradient is unchanged. k is data: it receives a
# zero cotangent (integer k receives none at all).
#
# Edges, elementwise: k < 0, non-integer or infinite k is outside the support: -inf with a
# zero partial. lam < 0, lam = inf, eta = +inf or NaN anywhere: NaN. lam = 0 (eta = -inf)
# is the boundary: k = 0 gives exactly 0 with d/dlam = -1; k > 0 gives -inf, d/dlam = +inf.

_TABLE_SIZE = 32
# log k! for k < 32, correctly rounded from float64: float32 lgamma(k + 1) is off by a few
# ulp even at k = 0 (lgamma(1) = 2**-21 there, not 0).
_LOG_FACTORIAL = np.array([math.lgamma(k + 1.0) for k in range(_TABLE_SIZE)])
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
# Up to this many counts log k! takes the full formula directly: the lax.cond costs 1-3 us,
# more than Stirling's series for so few elements (measured at N = 10 and 100: 0.6-2.8 us
# saved; at 10^3 the cond saved 17 us).
_SMALL = 128


def _lookup(table: jax.Array, idx: jax.Array) -> jax.Array:
    """``table[idx]`` for in-range ``idx``, shaped and sharded like ``idx``.

    Under a mesh with Explicit axes (``jax.make_mesh``'s default) a gather from a replicated
    table with sharded indices has no unambiguous output sharding and jax refuses to trace
    it; there the indices' sharding is named. Elsewhere (one device, Auto axes, one device's
    block in fuse's shard_map) the spec carries no mesh axis and this is the plain
    ``jnp.take``.
    """
    sharding = getattr(jax.typeof(idx), "sharding", None) if hasattr(jax, "typeof") else None
    if sharding is not None and any(axis is not None for axis in sharding.spec):
        return table.at[idx].get(mode="promise_in_bounds", out_sharding=sharding)
    return jnp.take(table, idx)


def _log_factorial(k: jax.Array) -> jax.Array:
    """log k! for non-negative integer-valued float k.

    Below 32 an exact table; from 32 on Stirling's series for log Gamma(n), n = k + 1,

        (n - 1/2) log n - n + log(2 pi)/2 + 1/(12 n) - 1/(360 n^3) + 1/(1260 n^5) - 1/(1680 n^7)

    whose first omitted term, 1/(1188 n^9) < 2e-17, is below float64 rounding. One log and
    one division per element: about 5x cheaper than XLA's lgamma here, and more accurate
    (float32 relative error 1.5e-7 against lgamma's 4.8e-7 over k < 5000).
    """
    small = _table_log_factorial(k)
    n = jnp.maximum(k, _TABLE_SIZE) + 1.0
    r = 1.0 / n
    r2 = r * r
    series = r * (1 / 12 - r2 * (1 / 360 - r2 * (1 / 1260 - r2 * (1 / 1680))))
    large = (n - 0.5) * jnp.log(n) - n + _HALF_LOG_2PI + series
    return jnp.where(k < _TABLE_SIZE, small, large)


def _table_log_factorial(k: jax.Array) -> jax.Array:
    """log k! from the table, for k < 32 (larger k read the last entry)."""
    table = jnp.asarray(_LOG_FACTORIAL, dtype=k.dtype)
    return _lookup(table, jnp.clip(k, 0, _TABLE_SIZE - 1).astype(jnp.int32))


def _by_log_factorial(normalized: bool, k: jax.Array, pass_fn):
    """``pass_fn(log_factorial)``: a kernel's summed value, given how to form log k!.

    Count data are mostly small: when every k is below 32 (one max over k) the table alone
    is the exact log k!, and the log and the division of Stirling's series, computed for
    every element and then selected away, are most of the cost. So a normalized kernel's
    summed value is the branch of one lax.cond on that max: the table or the full formula.
    Making only log k! conditional, as before, wrote the N-array of log k! (and the clipped
    counts it was formed from) out of the cond: at N = 10^6 the log-rate value took 2.7 ms
    that way against 2.1 ms, value-and-gradient 4.1 against 3.3 ms. The partial stays out
    of the branch: XLA does not drop a cond's unused output, so with the partial inside,
    jax.grad alone paid for the value too (2-7x autodiff's time from N = 10^2 in the rate
    form; the value-and-gradient was 2.9 ms). (``pass_fn(None)`` when ``normalized`` is
    False: no log k!.) A k off the support (k < 0, non-integer, inf, NaN) can only send the
    max to the full formula, which is exact for every count. Under vmap the cond becomes a
    select of both: the same values, slower.
    """
    if not normalized:
        return pass_fn(None)
    if k.size <= _SMALL:
        return pass_fn(_log_factorial)
    few = jnp.max(k, initial=0) < _TABLE_SIZE
    return jax.lax.cond(few, lambda: pass_fn(_table_log_factorial),
                        lambda: pass_fn(_log_factorial))


def _in_support(k, integer_k):
    if integer_k:  # cast from an integer dtype: whole and finite by construction
        return k >= 0
    return (k >= 0) & (k == jnp.floor(k)) & jnp.isfinite(k)


def _usable(param_ok, k, integer_k):
    """Parameter verdict and no NaN count (a count cast from integers is never NaN).

    For integer counts the redundant checks are left out, not left to XLA: it does not prove
    floor(float(k)) == float(k), and those per-element tests made the gradient-only pass at
    N = 10^6 take 570 us instead of 345 us (measured on the 2-core CPU of README's tables).
    """
    return param_ok if integer_k else param_ok & ~jnp.isnan(k)


def _finish(terms, k, param_ok, log_factorial, integer_k):
    """Apply support/parameter verdicts elementwise and subtract log k! (formed by
    ``log_factorial``; None: dropped, `normalized=False`)."""
    kok = _in_support(k, integer_k)
    if log_factorial is not None:
        terms = terms - jnp.where(kok, log_factorial(jnp.where(kok, k, 0.0)), 0.0)
    terms = jnp.where(kok, terms, -jnp.inf)
    return jnp.where(_usable(param_ok, k, integer_k), terms, jnp.nan), kok


def _fold_partial(d, kok, param_ok, k, shape, param_shape, integer_k, invalid=None):
    """The edges of `_finish`, applied to a partial, folded back to the parameter's shape.

    Zero off the support (k is data there, not a parameter), NaN for an invalid parameter
    or a NaN count. ``invalid``, if given, is added last: an arithmetic verdict (0, or NaN
    for an invalid parameter) for what ``param_ok`` leaves to it.
    """
    d = jnp.where(kok, d, 0.0)
    d = jnp.where(_usable(param_ok, k, integer_k), d, jnp.nan)
    if invalid is not None:
        d = d + invalid
    return sum_to_shape(jnp.broadcast_to(d, shape), param_shape)


def _bwd(*args):
    """Backward rule of both forms (static options first): k is data and gets no cotangent."""
    *_, dparam, g = args
    return None, scaled(g, dparam)


# ---------------------------------------------------------------------------- rate form


def _rate_ok(rate):
    return (rate >= 0) & jnp.isfinite(rate)  # no inf constant: see _poisson_propto_int_sum


def _poisson_terms(log_factorial, k, rate, integer_k):
    # k log(lam) with 0 log 0 = 0; at lam = 0, k > 0 this is -inf, as it should be.
    klog = jnp.where(k == 0, 0.0, k * jnp.log(rate))
    return _finish(klog - rate, k, _rate_ok(rate), log_factorial, integer_k)


def _poisson_propto_int_sum(k, rate):
    """Sum of k log(lam) - lam for integer-valued k, with the verdicts in arithmetic.

    The fast path for the common fitting case (integer counts, `normalized=False`). XLA:CPU
    reduces a select-free expression in one vectorised pass but first materialises a
    select-laden one as a temporary array, so the edges are arithmetic here:
      - 0 log 0 = 0: at k = 0 the log sees lam + 1/2 (1/2 - min(k, 1/2) is 1/2 at k = 0, 0
        above), and 0 * log(lam + 1/2) = 0;
      - sqrt(lam) - sqrt(lam) is 0 for a valid rate, NaN for lam < 0, lam = inf or NaN;
      - (k + 1/2) * inf is -inf for k < 0 and +inf for k >= 0: min() with it gives -inf
        off the support and leaves valid terms (and NaN) alone.
    Equal, element for element, to the select form in `_poisson_terms` for integer k. (The
    constants 1/2 and inf appear nowhere in the partials' pass: a constant shared with it
    is broadcast once and materialised as an N-array for this reduction.)
    """
    klog = k * jnp.log(rate + (0.5 - jnp.minimum(k, 0.5)))
    t = klog - rate + (jnp.sqrt(rate) - jnp.sqrt(rate))
    return jnp.sum(jnp.minimum(t, (k + 0.5) * jnp.inf))


def _poisson_value(normalized, integer_k, k, rate):
    if integer_k and not normalized:
        return _poisson_propto_int_sum(k, rate)
    return _by_log_factorial(normalized, k, lambda log_factorial: jnp.sum(
        _poisson_terms(log_factorial, k, rate, integer_k)[0]))


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _poisson(normalized, integer_k, k, rate):
    return _poisson_value(normalized, integer_k, k, rate)


def _poisson_drate(integer_k, k, rate):
    # k / lam - 1: at k = 0 the division sees 1, not lam, so it is exactly -1, also at
    # lam = 0 (no 0/0). A float k off the support (inf, say) is replaced by 0 first: its
    # partial is selected away, and a second derivative would otherwise meet inf * 0 =
    # NaN there. An invalid rate gives NaN: lam < 0 and NaN by the select, lam = inf by
    # lam * 0 (an isfinite test instead doubled this pass: 0.47 against 0.25 ms at
    # N = 10^6, where jax.grad of jax.scipy.stats takes 0.22 ms).
    shape = jnp.broadcast_shapes(k.shape, rate.shape)
    kok = _in_support(k, integer_k)
    ks = k if integer_k else jnp.where(kok, k, 0.0)
    d = ks / jnp.where(ks == 0, 1.0, rate) - 1.0
    return _fold_partial(d, kok, rate >= 0, k, shape, rate.shape, integer_k,
                         invalid=rate * 0.0)


def _poisson_fwd(normalized, integer_k, k, rate):
    kv, rv = k.value, rate.value
    drate = _poisson_drate(integer_k, kv, rv) if rate.perturbed else None
    return _poisson_value(normalized, integer_k, kv, rv), drate


_poisson.defvjp(_poisson_fwd, _bwd, symbolic_zeros=True)

# ------------------------------------------------------------------------ log-rate form


def _log_rate_ok(log_rate):
    return log_rate < jnp.inf  # False for +inf and NaN; -inf (rate 0) is allowed


def _poisson_log_terms(log_factorial, integer_k, k, log_rate, rate):
    keta = jnp.where(k == 0, 0.0, k * log_rate)  # 0 * (-inf) = 0 at the boundary
    return _finish(keta - rate, k, _log_rate_ok(log_rate), log_factorial, integer_k)


def _poisson_log_value(normalized, integer_k, k, log_rate, rate):
    return _by_log_factorial(normalized, k, lambda log_factorial: jnp.sum(
        _poisson_log_terms(log_factorial, integer_k, k, log_rate, rate)[0]))


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _poisson_log(normalized, integer_k, k, log_rate):
    return _poisson_log_value(normalized, integer_k, k, log_rate, jnp.exp(log_rate))


def _poisson_log_fwd(normalized, integer_k, k, log_rate):
    kv, ev = k.value, log_rate.value
    rate = jnp.exp(ev)  # the value and the partial both use it
    value = _poisson_log_value(normalized, integer_k, kv, ev, rate)
    deta = None
    if log_rate.perturbed:
        shape = jnp.broadcast_shapes(kv.shape, ev.shape)
        deta = _fold_partial(kv - rate, _in_support(kv, integer_k), _log_rate_ok(ev), kv,
                             shape, ev.shape, integer_k)
    return value, deta


_poisson_log.defvjp(_poisson_log_fwd, _bwd, symbolic_zeros=True)

# -------------------------------------------------------------------------- public API


def _prepare(fn, k, param_name, param, validate_args, param_bad, param_what):
    k = _checks.as_real_array(fn, "k", k)
    param = _checks.as_real_array(fn, param_name, param)
    _checks.broadcast_shape(fn, k=k, **{param_name: param})
    if _checks.want_validation(validate_args):
        _checks.validate(
            fn, "k", k, lambda a: ~((a >= 0) & (np.floor(a) == a) & np.isfinite(a)),
            "must hold non-negative integer counts",
        )
        _checks.validate(fn, param_name, param, param_bad, param_what)
    integer_k = bool(jnp.issubdtype(k.dtype, jnp.integer))
    dt = _checks.float_dtype(param) if integer_k else _checks.float_dtype(k, param)
    return k.astype(dt), param.astype(dt), integer_k


def poisson_lpmf(
    k: ArrayLike,
    rate: ArrayLike,
    *,
    normalized: bool = True,
    validate_args: bool | None = None,
) -> jax.Array:
    r"""Summed Poisson log-mass :math:`\sum_i \log \mathrm{Poisson}(k_i \mid \lambda_i)`.

    .. math::

        \log \mathrm{Poisson}(k \mid \lambda) = k \log\lambda - \lambda - \log k!,
        \qquad \partial_\lambda = k/\lambda - 1

    Args:
      k: counts (integer or integer-valued float). Integer ``k`` takes the floating dtype
        of ``rate``; in float32 counts above 2**24 are rounded. ``k`` is data and gets a
        zero gradient.
      rate: :math:`\lambda \ge 0`, finite.
      normalized: if False, drop :math:`-\log k!` (Stan's ``propto``), which does not
        depend on ``rate`` and costs most of the time. The gradient is unchanged.
      validate_args: check concrete inputs and raise ``ValueError`` naming the argument and
        the first offending index (default: the global setting).

    Returns:
      A scalar. ``-inf`` with a zero gradient for counts outside the support (negative,
      non-integer); ``NaN`` for ``rate < 0``, ``rate = inf`` or NaN anywhere. At
      ``rate = 0``: ``k = 0`` contributes exactly 0 with derivative -1, ``k > 0`` gives
      ``-inf``. Empty inputs give ``0.0``.

    Example:
      >>> import jax, fusedlp
      >>> jax.grad(fusedlp.poisson_lpmf, argnums=1)(3, 2.0)  # 3/2 - 1
      Array(0.5, dtype=float32, weak_type=True)
    """
    k, rate, integer_k = _prepare(
        "poisson_lpmf", k, "rate", rate, validate_args,
        lambda a: ~((a >= 0) & np.isfinite(a)), "must be finite and >= 0",
    )
    return _poisson(bool(normalized), integer_k, k, rate)


def poisson_log_lpmf(
    k: ArrayLike,
    log_rate: ArrayLike,
    *,
    normalized: bool = True,
    validate_args: bool | None = None,
) -> jax.Array:
    r"""Summed Poisson log-mass with a log-rate, :math:`\lambda = e^\eta`, without a round trip.

    .. math::

        \log \mathrm{Poisson}(k \mid e^\eta) = k\eta - e^\eta - \log k!,
        \qquad \partial_\eta = k - e^\eta

    The natural parametrisation of Poisson regression (``poisson_log_lpmf(k, X @ beta)``):
    one ``exp`` per element serves the value and the gradient, and no ``log`` is taken.

    Args:
      k: counts, as in :func:`poisson_lpmf`.
      log_rate: :math:`\eta < +\infty`; ``-inf`` is the rate-0 boundary.
      normalized: if False, drop :math:`-\log k!`.
      validate_args: as in :func:`poisson_lpmf`.

    Returns:
      A scalar, with the edge conventions of :func:`poisson_lpmf` (``eta = +inf`` is an
      infinite rate: NaN).

    Example:
      >>> import jax, fusedlp
      >>> jax.grad(fusedlp.poisson_log_lpmf, argnums=1)(3, 0.0)  # 3 - e^0
      Array(2., dtype=float32, weak_type=True)
    """
    k, log_rate, integer_k = _prepare(
        "poisson_log_lpmf", k, "log_rate", log_rate, validate_args,
        lambda a: ~(a < np.inf), "must be < +inf and not NaN",
    )
    return _poisson_log(bool(normalized), integer_k, k, log_rate)
