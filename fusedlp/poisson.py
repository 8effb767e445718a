"""Poisson log-mass, in rate and in log-rate form, with hand-derived VJPs."""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from fusedlp import _checks, _special, _xla, constraints
from fusedlp._vjp import scaled, sum_to_shape

# Derivation (one element; the kernels sum over elements):
#
#   rate form:      log P(k | lam) = k log(lam) - lam - log k!
#                   d/dlam = k / lam - 1                 (= -1 at k = 0, also at lam = 0)
#   log-rate form:  log P(k | eta) = k eta - exp(eta) - log k!,   lam = exp(eta)
#                   d/deta = k - exp(eta)                (exp(eta) shared with the value)
#
# The normalized value is summed in Loader's form, -stirlerr(k) - log(2 pi k)/2 - bd0(k, lam)
# (fusedlp._special): the same number without the cancellation of k log(lam) - lam - log k!
# at large counts. log k! does not depend on the parameters, so it appears in no partial:
# `normalized=False` drops it and the gradient is unchanged. k is data: it receives a
# zero cotangent (integer k receives none at all).
#
# Edges, elementwise: k < 0, non-integer or infinite k is outside the support: -inf with a
# zero partial. lam < 0, lam = inf, eta = +inf or NaN anywhere: NaN. lam = 0 (eta = -inf)
# is the boundary: k = 0 gives exactly 0 with d/dlam = -1; k > 0 gives -inf, d/dlam = +inf.


def _by_stirlerr(normalized: bool, k: jax.Array, pass_fn):
    """``pass_fn(stirlerr)``: a kernel's summed value, given how to form stirlerr(k).

    A normalized value is Loader's form (see `_normalized_terms`). Count data are mostly
    small: when every k is below the table's 16 entries (one max over k) the table alone is
    stirlerr, and the series, computed for every element and then selected away, can be
    skipped. So the summed value is the branch of one lax.cond on that max. The partial
    stays out of the branch: XLA does not drop a cond's unused output, so ``jax.grad``
    alone would pay for the value. (``pass_fn(None)`` when ``normalized`` is False: no
    log k!.) A k off the support (k < 0, non-integer, inf, NaN) can only send the max to the
    full form, which is right for every count. Under vmap the verdict is the whole batch's
    (`fusedlp._xla.batch_all`).
    """
    if not normalized:
        return pass_fn(None)
    if _xla.below(k.size, _xla.SMALL_POISSON_TABLE):
        return pass_fn(_special.stirlerr_int)
    few = _xla.batch_all(jnp.max(k, initial=0) < _special.STIRLERR_TABLE_SIZE)
    return jax.lax.cond(few, lambda: pass_fn(_special.stirlerr_table),
                        lambda: pass_fn(_special.stirlerr_int))


def _normalized_terms(stirlerr, k, rate, log_rate=None):
    """log P(k | lam) by Loader's decomposition, without cancellation at any k and lam:

        k = 0:  -lam
        k > 0:  -stirlerr(k) - log(2 pi k) / 2 - bd0(k, lam)

    (k log(lam) - lam - log k! cancels terms of size k log k to an answer of size log k:
    at k = lam = 1e9 the plain form keeps 7 digits.) ``log_rate``, if known, serves where
    lam under- or overflows (eta = -200 in float32). The caller applies the verdicts.
    """
    kp = jnp.where(k > 0, k, 1.0)
    t = -_special.log_factorial_rest(kp, stirlerr) - _special.bd0(kp, rate, log_m=log_rate)
    return jnp.where(k > 0, t, -rate)


def _in_support(k, integer_k):
    if integer_k:  # cast from an integer dtype: whole and finite by construction
        return k >= 0
    return (k >= 0) & (k == jnp.floor(k)) & jnp.isfinite(k)


def _usable(param_ok, k, integer_k):
    """Parameter verdict and no NaN count (a count cast from integers is never NaN).

    For integer counts the redundant checks are left out, not left to XLA: it does not prove
    floor(float(k)) == float(k), and those per-element tests made the gradient-only pass
    markedly slower (docs/performance.md).
    """
    return param_ok if integer_k else param_ok & ~jnp.isnan(k)


def _finish(terms, k, param_ok, integer_k):
    """Apply the support and parameter verdicts elementwise to the terms."""
    kok = _in_support(k, integer_k)
    terms = jnp.where(kok, terms, -jnp.inf)
    return jnp.where(_usable(param_ok, k, integer_k), terms, jnp.nan), kok


def _terms(stirlerr, k, rate, unnormalized, param_ok, integer_k, log_rate=None):
    """Both forms' elementwise terms: Loader's (``stirlerr`` given) or the propto ones."""
    if stirlerr is None:
        return _finish(unnormalized, k, param_ok, integer_k)
    kk = jnp.where(_in_support(k, integer_k), k, 0.0)  # keeps the series finite off support
    return _finish(_normalized_terms(stirlerr, kk, rate, log_rate), k, param_ok, integer_k)


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


# Jitted, as the exact passes are (see _poisson_exact_value): a fit traces and lowers it
# once, not at each site (under vmap both passes are in the program: fusedlp._xla).
@partial(jax.jit, static_argnums=(0, 1, 4, 5))
def _fast(normalized, integer_k, k, param, log_form, want_partial, data_sum=None):
    """(value, partial or None) in one select-free pass (fusedlp._xla).

    The value is Loader's form for k >= 1 and -lam at k = 0, blended by an exact mask, or
    k log(lam) - lam; the partial is k/lam - 1 or k - lam. Not finite wherever an element
    is an edge (k off the support, an invalid or zero rate, a rate or ratio that over- or
    underflows; in the log-rate form bd0's log(k / lam) is log k - eta, which does not):
    there `_fast_or_exact` runs the exact pass instead. ``data_sum``, if
    given, is `_data_sum` of counts known to lie on the support: their part of Loader's
    form and their checks are not computed again.
    """
    if not normalized and param.size == 1:
        return _fast_linear(integer_k, k, param, log_form, want_partial)
    shape = jnp.broadcast_shapes(k.shape, param.shape)

    def terms(k, param):
        verdict = param - param if log_form else _xla.nan_unless_nonneg(param)
        if data_sum is None:
            verdict = verdict + _xla.nan_unless_nonneg(k)
        if data_sum is None and not integer_k:
            verdict = verdict + _xla.nan_unless_whole(k)
        rate = jnp.exp(param) if log_form else param
        if normalized:
            kp = jnp.maximum(k, 1.0)
            positive = jnp.minimum(k, 1.0)  # 1 for a count k >= 1, 0 at k = 0
            t = _special.bd0_fast(kp, rate,
                                  log_ratio=jnp.log(kp) - param if log_form else None)
            if data_sum is None:
                t = _special.log_factorial_rest(kp, _special.stirlerr_int_fast) + t
            t = -positive * t - (1.0 - positive) * rate
        else:
            t = k * (param if log_form else jnp.log(rate)) - rate
        return jnp.broadcast_to(t + verdict, jnp.broadcast_shapes(k.shape, param.shape))

    def written_sum(k, param):
        written = jax.ShapeDtypeStruct(jnp.broadcast_shapes(k.shape, param.shape),
                                       jnp.result_type(k, param))
        return jnp.sum(_xla.fenced(terms, written, k, param))

    # Loader's form is summed from terms written by a loop of their own (fusedlp._xla.fenced),
    # over blocks of elements (fusedlp._xla.blockwise) from two blocks up, where each
    # argument is a scalar or holds every element: the arrays XLA:CPU writes inside that
    # loop then stay block-sized. A vmap batch of smaller problems stays whole (blocks of
    # members cost compile time in a fit and gained nothing there). The short propto
    # expression reduces well directly.
    split = _flattened(k, param) if math.prod(shape) // _xla.BLOCK >= 2 else None
    if normalized and split is not None:
        batched, flat = split
        value = _xla.blockwise(lambda k, p: (written_sum(k, p),), flat, batched)[0]
    elif normalized:
        value = written_sum(k, param)
    else:
        value = jnp.sum(terms(k, param))
    if data_sum is not None:
        value = value - data_sum
    if not want_partial:
        return value, None
    rate = jnp.exp(param) if log_form else param
    d = k - rate if log_form else k / rate - 1.0
    return value, sum_to_shape(jnp.broadcast_to(d, shape), param.shape)


def _minus_inf_where_negative(t, k):
    """``t``, but -inf where the count ``k`` is negative, without a select: (k + 1/2) * inf
    is -inf for k < 0 and +inf for k >= 0, and min() with it leaves t (and NaN) alone."""
    return jnp.minimum(t, (k + 0.5) * jnp.inf)


def _fast_linear(integer_k, k, param, log_form, want_partial):
    """`_fast` for ``normalized=False`` and a scalar parameter, where the sum is linear in
    the counts: sum_i k_i eta - n lam = eta S - n lam and its partial S - n lam (S/lam - n
    in the rate form), S = sum_i k_i, so one pass over the data serves both (the counts'
    verdicts ride in S) and the parameter is scalar work."""
    ks = _minus_inf_where_negative(k, k)  # S -inf: not finite, so the exact pass runs
    if not integer_k:
        ks = ks + _xla.nan_unless_whole(k)
    s = jnp.sum(ks)
    n = k.size
    param, shape = param.reshape(()), param.shape
    rate = jnp.exp(param) if log_form else param
    param_verdict = param - param if log_form else _xla.nan_unless_nonneg(param)
    value = s * (param if log_form else jnp.log(rate)) - n * rate + param_verdict
    if not want_partial:
        return value, None
    return value, (s - n * rate if log_form else s / rate - n).reshape(shape)


def _flattened(k, param):
    """``(batched, flat)`` for `fusedlp._xla.blockwise` where each of k and the parameter is
    a scalar or holds every element (of more than one): each as a vector of every element,
    or a scalar shared by all. None for other shapes (k (3, 1) against a (1, 4) parameter)."""
    n = math.prod(jnp.broadcast_shapes(k.shape, param.shape))
    if n <= 1 or any(a.size not in (1, n) for a in (k, param)):
        return None
    batched = [a.size != 1 for a in (k, param)]
    return batched, [a.reshape(-1) if b else a.reshape(()) for a, b in zip((k, param), batched)]


def _fast_or_exact(k, param, fast, exact):
    """`fusedlp._xla.fast_or_exact` of ``fast(k, param)`` and ``exact(k, param)``, the exact
    pass over blocks of elements (`fusedlp._xla.blockwise`) where each argument is a scalar
    or holds every element (the partial is then a sum or per element)."""
    n = math.prod(jnp.broadcast_shapes(k.shape, param.shape))

    def blocks(k, param):
        batched, flat = _flattened(k, param)
        value, d = _xla.blockwise(exact, flat, batched, fallback=True)
        return value, None if d is None else d.reshape(param.shape)

    return _xla.fast_or_exact(n, fast, exact, k, param,
                              exact_blocks=None if _flattened(k, param) is None else blocks)


def _bwd(*args):
    """Backward rule of both forms (static options first): k and its data sum are data and
    get no cotangent."""
    *_, dparam, g = args
    return None, None, scaled(g, dparam)


# ---------------------------------------------------------------------------- rate form


def _rate_ok(rate):
    return (rate >= 0) & jnp.isfinite(rate)  # no inf constant: see _poisson_propto_int_sum


def _poisson_terms(stirlerr, k, rate, integer_k):
    # k log(lam) with 0 log 0 = 0; at lam = 0, k > 0 this is -inf, as it should be.
    klog = None if stirlerr is not None else jnp.where(k == 0, 0.0, k * jnp.log(rate)) - rate
    return _terms(stirlerr, k, rate, klog, _rate_ok(rate), integer_k)


def _poisson_propto_int_sum(k, rate):
    """Sum of k log(lam) - lam for integer-valued k, with the verdicts in arithmetic.

    The fast path for the common fitting case (integer counts, `normalized=False`). XLA:CPU
    reduces a select-free expression in one vectorised pass but first materialises a
    select-laden one as a temporary array, so the edges are arithmetic here:
      - 0 log 0 = 0: at k = 0 the log sees lam + 1/2 (1/2 - min(k, 1/2) is 1/2 at k = 0, 0
        above), and 0 * log(lam + 1/2) = 0;
      - sqrt(lam) - sqrt(lam) is 0 for a valid rate, NaN for lam < 0, lam = inf or NaN;
      - `_minus_inf_where_negative` gives -inf off the support.
    Equal, element for element, to the select form in `_poisson_terms` for integer k. (The
    constants 1/2 and inf appear nowhere in the partials' pass: a constant shared with it
    is broadcast once and materialised as an N-array for this reduction.)
    """
    klog = k * jnp.log(rate + (0.5 - jnp.minimum(k, 0.5)))
    t = klog - rate + (jnp.sqrt(rate) - jnp.sqrt(rate))
    return jnp.sum(_minus_inf_where_negative(t, k))


# The exact passes are jitted so that a program calling a kernel at several sites (a fit:
# line search, gradient, Hessian, standard errors) traces and lowers each once; XLA inlines
# the call, so the compiled program is the same (docs/performance.md).
@partial(jax.jit, static_argnums=(0, 1))
def _poisson_exact_value(normalized, integer_k, k, rate):
    return _by_stirlerr(normalized, k, lambda stirlerr: jnp.sum(
        _poisson_terms(stirlerr, k, rate, integer_k)[0]))


def _poisson_value(normalized, integer_k, k, data_sum, rate):
    if integer_k and not normalized:
        return _poisson_propto_int_sum(k, rate)
    return _fast_or_exact(
        k, rate, lambda k, rate: _fast(normalized, integer_k, k, rate, False, False, data_sum),
        lambda k, rate: (_poisson_exact_value(normalized, integer_k, k, rate), None))[0]


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _poisson(normalized, integer_k, k, data_sum, rate):
    return _poisson_value(normalized, integer_k, k, data_sum, rate)


def _poisson_drate(integer_k, k, rate):
    # k / lam - 1: at k = 0 the division sees 1, not lam, so it is exactly -1, also at
    # lam = 0 (no 0/0). A float k off the support (inf, say) is replaced by 0 first: its
    # partial is selected away, and a second derivative would otherwise meet inf * 0 =
    # NaN there. An invalid rate gives NaN: lam < 0 and NaN by the select, lam = inf by
    # lam * 0 (an isfinite test adds a per-element check to this pass and costs markedly
    # more; docs/performance.md).
    shape = jnp.broadcast_shapes(k.shape, rate.shape)
    kok = _in_support(k, integer_k)
    ks = k if integer_k else jnp.where(kok, k, 0.0)
    d = ks / jnp.where(ks == 0, 1.0, rate) - 1.0
    return _fold_partial(d, kok, rate >= 0, k, shape, rate.shape, integer_k,
                         invalid=rate * 0.0)


def _partial_apart(param, perturbed: bool) -> bool:
    """Whether a perturbed parameter's partial is formed apart from the value's conditional
    pass: an elementwise partial (a vector parameter) is, since jax.grad alone then drops
    the value (an unused lax.cond goes; a partly used one runs whole), and its selects cost
    little outside a reduction. A scalar parameter's partial is a reduction: it rides in
    the select-free pass."""
    return perturbed and param.size != 1


def _poisson_fwd(normalized, integer_k, k, data_sum, rate):
    kv, rv, cv = k.value, rate.value, _value(data_sum)
    if (integer_k and not normalized) or _partial_apart(rv, rate.perturbed):
        drate = _poisson_drate(integer_k, kv, rv) if rate.perturbed else None
        return _poisson_value(normalized, integer_k, kv, cv, rv), drate

    def fast(kv, rv):
        return _fast(normalized, integer_k, kv, rv, False, rate.perturbed, cv)

    def exact(kv, rv):
        drate = _poisson_drate(integer_k, kv, rv) if rate.perturbed else None
        return _poisson_exact_value(normalized, integer_k, kv, rv), drate

    return _fast_or_exact(kv, rv, fast, exact)


_poisson.defvjp(_poisson_fwd, _bwd, symbolic_zeros=True)

# ------------------------------------------------------------------------ log-rate form


def _log_rate_ok(log_rate):
    return log_rate < jnp.inf  # False for +inf and NaN; -inf (rate 0) is allowed


def _poisson_log_terms(stirlerr, integer_k, k, log_rate, rate):
    # Normalized: Loader's form in rate = exp(eta) (its rounding moves bd0 by (lam - k) eps,
    # within the conditioning in eta); propto: k eta - exp(eta), 0 * (-inf) = 0 at eta = -inf.
    keta = None if stirlerr is not None else jnp.where(k == 0, 0.0, k * log_rate) - rate
    return _terms(stirlerr, k, rate, keta, _log_rate_ok(log_rate), integer_k, log_rate)


@partial(jax.jit, static_argnums=(0, 1))
def _poisson_log_exact_value(normalized, integer_k, k, log_rate, rate):
    return _by_stirlerr(normalized, k, lambda stirlerr: jnp.sum(
        _poisson_log_terms(stirlerr, integer_k, k, log_rate, rate)[0]))


def _poisson_log_deta(integer_k, k, log_rate, rate):
    shape = jnp.broadcast_shapes(k.shape, log_rate.shape)
    return _fold_partial(k - rate, _in_support(k, integer_k), _log_rate_ok(log_rate), k,
                         shape, log_rate.shape, integer_k)


def _poisson_log_sums(normalized, integer_k, k, data_sum, log_rate, want_partial):
    """The value and (if wanted) the partial in eta, by the fast or the exact pass."""
    if _partial_apart(log_rate, want_partial):
        value = _poisson_log_sums(normalized, integer_k, k, data_sum, log_rate, False)[0]
        return value, _poisson_log_deta(integer_k, k, log_rate, jnp.exp(log_rate))

    def fast(k, log_rate):
        return _fast(normalized, integer_k, k, log_rate, True, want_partial, data_sum)

    def exact(k, log_rate):
        rate = jnp.exp(log_rate)  # the value and the partial both use it
        deta = _poisson_log_deta(integer_k, k, log_rate, rate) if want_partial else None
        return _poisson_log_exact_value(normalized, integer_k, k, log_rate, rate), deta

    return _fast_or_exact(k, log_rate, fast, exact)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _poisson_log(normalized, integer_k, k, data_sum, log_rate):
    return _poisson_log_sums(normalized, integer_k, k, data_sum, log_rate, False)[0]


def _poisson_log_fwd(normalized, integer_k, k, data_sum, log_rate):
    return _poisson_log_sums(normalized, integer_k, k.value, _value(data_sum),
                             log_rate.value, log_rate.perturbed)


_poisson_log.defvjp(_poisson_log_fwd, _bwd, symbolic_zeros=True)

# -------------------------------------------------------------------------- public API


def _value(primal):
    """A custom_vjp primal's value (``None``, an empty pytree, stays None)."""
    return None if primal is None else primal.value


def _data_sum(normalized, k, dtype, shape):
    """For counts known when the kernel is traced (data closed over by the caller, as in
    ``jax.jit(lambda p: loglik(p, data))`` or NumPyro's MCMC), Loader's data-only part,
    sum over k > 0 of stirlerr(k) + log(2 pi k) / 2, computed once, now, instead of in
    every call; each count counted as often as broadcasting against the parameter repeats
    it. None for traced counts, for ``normalized=False``, when a count is off the support
    (the general path gives -inf there), and where only the exact pass runs (up to
    fusedlp._xla.SMALL elements, and at every size off XLA:CPU), which does not use it."""
    if not normalized or not _checks.is_concrete(k) or _xla.below(math.prod(shape), _xla.SMALL):
        return None
    with jax.ensure_compile_time_eval():
        k = jnp.asarray(k).astype(dtype)
        if not bool(jnp.all(_in_support(k, False))):
            return None
        kp = jnp.maximum(k, 1.0)
        part = _special.log_factorial_rest(kp, _special.stirlerr_int)
        repeats = math.prod(shape) // max(k.size, 1)
        return repeats * jnp.sum(jnp.where(k > 0, part, 0.0))


def _prepare(fn, k, param_name, param):
    k = _checks.as_real_array(fn, "k", k)
    param = _checks.as_real_array(fn, param_name, param)
    _checks.broadcast_shape(fn, k=k, **{param_name: param})
    integer_k = bool(jnp.issubdtype(k.dtype, jnp.integer))
    dt = _checks.float_dtype(param) if integer_k else _checks.float_dtype(k, param)
    return k.astype(dt), param.astype(dt), integer_k


def _with_data_sum(kernel, fn, k, param_name, param, normalized):
    """Checks and converts the arguments, then calls the custom-VJP ``kernel``."""
    raw_k = k
    k, param, integer_k = _prepare(fn, k, param_name, param)
    shape = jnp.broadcast_shapes(k.shape, param.shape)
    return kernel(bool(normalized), integer_k, k,
                  _data_sum(normalized, raw_k, param.dtype, shape), param)


@constraints.declare(support={"k": constraints.count},
                     params={"rate": constraints.nonnegative})
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
      >>> float(jax.grad(fusedlp.poisson_lpmf, argnums=1)(3, 2.0))  # 3/2 - 1
      0.5
    """
    del validate_args  # checked by constraints.declare
    return _with_data_sum(_poisson, "poisson_lpmf", k, "rate", rate, normalized)


@constraints.declare(support={"k": constraints.count},
                     params={"log_rate": constraints.below_inf})
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
      >>> float(jax.grad(fusedlp.poisson_log_lpmf, argnums=1)(3, 0.0))  # 3 - e^0
      2.0
    """
    del validate_args  # checked by constraints.declare
    return _with_data_sum(_poisson_log, "poisson_log_lpmf", k, "log_rate", log_rate,
                          normalized)
