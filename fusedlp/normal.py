"""Normal log-density with a hand-derived, forward-sharing VJP."""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from fusedlp import _checks, _xla, constraints
from fusedlp._vjp import is_zero, scaled, sum_to_shape

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

# Derivation (z = (x - mu) / sigma, one element; the kernel sums over elements):
#
#   log N(x | mu, sigma) = -z^2 / 2 - log(sigma) - log(2 pi) / 2
#   d/dx     = -z / sigma
#   d/dmu    = +z / sigma                       = -d/dx
#   d/dsigma = -1/sigma + z^2 / sigma           = (z^2 - 1) / sigma
#
# So z and 1/sigma, formed once, give the value and all three partials. The output is a
# scalar, so the VJP of a cotangent g is g times the gradient: the forward rule computes the
# gradient, already folded to each argument's shape, and the backward rule only scales it
# (under value_and_grad the cotangent is the constant 1 and XLA drops the multiply).
#
# Memory traffic, not arithmetic, bounds this kernel. XLA:CPU does not fuse a reduction and
# an elementwise output into one loop, so the forward rule is two passes: one reduction for
# the value, one elementwise pass writing z / sigma. The reduction is kept free of selects:
# XLA:CPU hands a plain arithmetic reduction to its vectorised reduce kernel (YNNPACK), but
# materialises a select-laden input as a full temporary array first. So the edge verdicts
# are arithmetic there: x = +-inf makes z^2 = inf by itself; (mu - mu) is 0 for a finite mu
# and NaN otherwise; log(sigma) is NaN for sigma < 0 and, at sigma = 0, meets z^2 = inf as
# inf - inf = NaN. Scalar parameters are judged once, after the sum. The value squares
# x + (-mu) while the partials use x - mu: the two must not be merged into one shared,
# materialised difference array (XLA's CSE would do that for identical expressions).
#
# Edges: x = +-inf is outside the support (value -inf, zero partials for that element);
# sigma <= 0, non-finite sigma or mu give NaN; NaN anywhere propagates as NaN.


def _finite_or_0(x):
    """x, with +-inf replaced by 0 (the safe input of a double where)."""
    return jnp.where(jnp.isinf(x), 0.0, x)


def _params_ok(loc, scale):
    return jnp.isfinite(loc) & jnp.isfinite(scale) & (scale > 0)


def _dloc_elements(x, loc, scale):
    """d/dmu = z / sigma = (x - mu) / sigma^2 per element; 0 off the support, NaN for bad
    parameters.

    Two multiplies by m = -1/sigma (m^2 = 1/sigma^2), never one by 1/sigma^2: that
    overflows for sigma < 1e-154 (and XLA rewrites (a / s) / s into a / (s * s)). Not by the
    value's 1/sigma: a broadcast shared with it would be materialised.
    """
    m = -1.0 / scale
    return jnp.where(_params_ok(loc, scale),
                     jnp.where(jnp.isinf(x), 0.0, ((x - loc) * m) * m), jnp.nan)


def _dscale_elements(x, loc, scale):
    """d/dsigma = (z^2 - 1) / sigma per element, with the edges of _dloc_elements."""
    inv = 1.0 / scale
    off = jnp.isinf(x)
    z = jnp.where(off, 0.0, (x - loc) * inv)
    return jnp.where(_params_ok(loc, scale), jnp.where(off, 0.0, (z * z - 1.0) * inv), jnp.nan)


def _safe_second_order(partials, x, loc, scale):
    """``partials(x, loc, scale)``, differentiated (by fusedlp.hessian only) as if x = +-inf
    were 0 (double where): the partial of such an element is selected away, but the
    derivative of the raw branch there is inf * 0 = NaN. First-order calls run the plain
    ``partials``: no extra select in their pass."""
    return _with_tangent_of(lambda a, b, c: jnp.where(jnp.isinf(a), 0.0,
                                                      partials(_finite_or_0(a), b, c)),
                            partials(x, loc, scale), x, loc, scale)


def _z_sum_squares(x, loc, s, shape):
    """Sum of z^2, z = (x - mu)/sigma for a scalar sigma, in one select-free reduction.

    A non-finite array mu must give NaN, but in the sum it gives +inf like an infinite x.
    Both make the sum non-finite, so only then (lax.cond) a second pass adds mu - mu (NaN
    for a non-finite mu, else 0) to tell them apart: the common path pays nothing for it.
    """
    # x + (-mu), not x - mu: the partials use x - mu, and an array shared with them would
    # be materialised (see the note above). 1 / s is fine: they scale by -1 / s instead.
    def sum_sq(verdict):
        z = (x + (-loc)) * (1.0 / s)  # formed inside each branch: a shared z is materialised
        return jnp.sum(jnp.broadcast_to(z * z + (loc - loc) if verdict else z * z, shape))

    if loc.size == 1:
        return sum_sq(False)
    if _xla.below(math.prod(shape), _xla.SMALL_NORMAL):
        return sum_sq(True)
    z2 = sum_sq(False)
    return jax.lax.cond(_xla.batch_all(jnp.isfinite(z2)), lambda _: z2, lambda _: sum_sq(True),
                        None)


def _scalar_scale_value(normalized, x, loc, s, shape):
    """Value for a scalar sigma, with the sum of z^2 and the scalar parameter verdict."""
    n = math.prod(shape)
    z2 = _z_sum_squares(x, loc, s, shape)
    ok = jnp.all(_params_ok(loc, s)) if loc.size == 1 else _params_ok(0.0, s)
    value = jnp.where(ok, -0.5 * z2 - n * jnp.log(s), jnp.nan)
    if normalized:
        value = value - _HALF_LOG_2PI * n
    return value, z2, ok


def _normal_value(normalized, x, loc, scale):
    shape = jnp.broadcast_shapes(x.shape, loc.shape, scale.shape)
    if math.prod(shape) == 0:  # no element, no verdict: exactly 0, as the other kernels
        return jnp.zeros((), x.dtype)
    if scale.size == 1:
        return _scalar_scale_value(normalized, x, loc, scale.reshape(()), shape)[0]
    z = (x + (-loc)) / scale
    t = z * z + 2.0 * jnp.log(scale) + ((loc - loc) + (scale - scale))
    total = -0.5 * jnp.sum(jnp.broadcast_to(t, shape))
    if normalized:
        total = total - _HALF_LOG_2PI * math.prod(shape)
    return total


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _with_tangent_of(fn, value, *args):
    """``value`` (= ``fn(*args)`` wherever it is used), differentiated as ``fn(*args)``.

    Only second derivatives (``fusedlp.hessian``) differentiate the forward rule. There, a
    sum formed from the raw x meets x = +-inf as inf * 0 = NaN even where the rule selects
    it away (a lax.cond's untaken branch still receives a zero cotangent); ``fn`` forms
    the same sum from the safe x. First-order calls never trace this rule: no extra pass.
    """
    del fn, args
    return value


@_with_tangent_of.defjvp
def _with_tangent_of_jvp(fn, primals, tangents):
    value, *args = primals
    _, *targs = tangents
    return value, jax.jvp(fn, tuple(args), tuple(targs))[1]


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _in_support_sums(shape, z2, x, loc, s):
    """(Z2, Z1, n) over the elements with a finite x, for a scalar sigma ``s``:
    Z2 = sum z^2 (``z2``, the value's select-free sum, where finite), Z1 = sum z, n their
    count. Off-support x (+-inf) make ``z2`` infinite: only then does a second, exact pass
    (lax.cond) mask those elements; a non-finite array mu gives NaN there.
    """
    n = math.prod(shape)
    s_inv = 1.0 / s
    z1 = jnp.sum(jnp.broadcast_to(x - loc, shape)) * s_inv

    def sums(x, loc):
        o = jnp.isinf(x)
        zm = jnp.where(o, 0.0, (_finite_or_0(x) - loc) * s_inv)
        zm = jnp.where(jnp.isfinite(loc), zm, jnp.nan)
        return jnp.sum(zm * zm), jnp.sum(zm), jnp.sum(~o, dtype=z2.dtype)

    def exact(_):  # over blocks: its selects' temporaries stay block-sized
        flat = [jnp.broadcast_to(a, shape).reshape(-1) if a.size != 1 else a.reshape(())
                for a in (x, loc)]
        return _xla.blockwise(sums, flat, [a.ndim == 1 for a in flat], fallback=True)

    fast = lambda _: (z2, z1, jnp.asarray(n, z2.dtype))  # noqa: E731
    if _xla.below(n, _xla.SMALL_NORMAL):
        return sums(jnp.broadcast_to(x, shape), loc)
    return jax.lax.cond(_xla.batch_all(jnp.isfinite(z2)), fast, exact, None)


# Second order (fusedlp.hessian differentiates the forward rule). Over the in-support
# elements, with dz = (dx - dmu - z dsigma) / sigma per element:
#   dZ2 = 2 sum z dz = (2 sum z (dx - dmu) - 2 Z2 dsigma) / sigma
#   dZ1 =   sum dz   = (sum (dx - dmu) - Z1 dsigma) / sigma,        dn = 0.
# With x fixed and a scalar mu the sums are n dmu and Z1 dmu: the tangents are scalar
# arithmetic on the sums already formed, not a pass over the data (differentiating the
# passes themselves would store and reread N-sized linearisation residuals).
def _in_support_sums_jvp(shape, primals, tangents):
    _, x, loc, s = primals
    _, dx, dloc, ds = tangents
    z2, z1, n_in = out = _in_support_sums(shape, *primals)
    s_inv = 1.0 / s
    zero = jnp.zeros_like(z2)
    dz2 = zero if is_zero(ds) else -2.0 * z2 * ds
    dz1 = zero if is_zero(ds) else -z1 * ds
    if not is_zero(dloc) and loc.size == 1:
        dz2, dz1 = dz2 - 2.0 * z1 * dloc.reshape(()), dz1 - n_in * dloc.reshape(())
        dloc = None
    shift = [d for d in (dx, None if is_zero(dloc) else -dloc) if not is_zero(d)]
    if shift:  # per-element tangents (an array mu, or x itself): a pass over the data
        o = jnp.broadcast_to(jnp.isinf(x), shape)
        t = jnp.where(o, 0.0, jnp.broadcast_to(sum(shift), shape))
        z = jnp.where(o, 0.0, jnp.broadcast_to((_finite_or_0(x) - loc) * s_inv, shape))
        dz2, dz1 = dz2 + 2.0 * jnp.sum(z * t), dz1 + jnp.sum(t)
    # a non-finite array mu makes the sums NaN: their tangents too, not +-inf
    nan_if = lambda a, d: jnp.where(jnp.isnan(a), jnp.nan, d * s_inv)  # noqa: E731
    return out, (nan_if(z2, dz2), nan_if(z1, dz1), zero)


_in_support_sums.defjvp(_in_support_sums_jvp, symbolic_zeros=True)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _normal(normalized, x, loc, scale):
    return _normal_value(normalized, x, loc, scale)


def _normal_fwd(normalized, x, loc, scale):
    xv, lv, sv = x.value, loc.value, scale.value
    shape = jnp.broadcast_shapes(xv.shape, lv.shape, sv.shape)
    if math.prod(shape) == 0:
        return _normal_value(normalized, xv, lv, sv), tuple(
            jnp.zeros_like(a.value) if a.perturbed else None for a in (x, loc, scale))
    dx = dloc = dscale = None
    # Arrays of partials (an output anyway, so selects cost nothing extra there). A scalar
    # mu gets the sum of them when x is differentiated too, or when sigma is an array (the
    # sums Z1, Z2 below are for a scalar sigma only).
    if x.perturbed or (loc.perturbed and (lv.size != 1 or sv.size != 1)):
        g = _safe_second_order(_dloc_elements, xv, lv, sv)
        g = jnp.broadcast_to(g, shape)
        dx = sum_to_shape(-g, xv.shape) if x.perturbed else None
        dloc = sum_to_shape(g, lv.shape) if loc.perturbed else None
    if sv.size != 1:
        value = _normal_value(normalized, xv, lv, sv)
        if scale.perturbed:
            ds = _safe_second_order(_dscale_elements, xv, lv, sv)
            dscale = sum_to_shape(jnp.broadcast_to(ds, shape), sv.shape)
        return value, (dx, dloc, dscale)

    # Scalar sigma (the fitting case): the value and the scalar partials come from the sums
    #   Z1 = sum z,  Z2 = sum z^2:   value = -Z2/2 - n log sigma,
    #   d/dmu = Z1 / sigma (scalar mu),   d/dsigma = (Z2 - n) / sigma,
    # reduced without selects in the pass that forms the value. Off-support x (+-inf) makes
    # Z2 infinite: only then does a second, exact pass (lax.cond) mask those elements.
    s = sv.reshape(())
    s_inv = 1.0 / s
    value, z2, s_ok = _scalar_scale_value(normalized, xv, lv, s, shape)
    want_z1 = loc.perturbed and lv.size == 1 and not x.perturbed  # else dloc = sum of g
    if not (want_z1 or scale.perturbed):
        return value, (dx, dloc, dscale)
    # Z1 is its own reduction over x - mu (a different expression from the value's
    # x + (-mu), so XLA does not materialise a shared z array to feed both). When nothing
    # reads it (d/dmu not wanted, first order), XLA drops it.
    z2_in, z1_in, n_in = _in_support_sums(shape, z2, xv, lv, s)
    if want_z1:
        dloc = jnp.where(s_ok, z1_in * s_inv, jnp.nan).reshape(lv.shape)
    if scale.perturbed:
        dscale = jnp.where(s_ok, (z2_in - n_in) * s_inv, jnp.nan).reshape(sv.shape)
    return value, (dx, dloc, dscale)


def _normal_bwd(normalized, grads, g):
    return tuple(scaled(g, d) for d in grads)


_normal.defvjp(_normal_fwd, _normal_bwd, symbolic_zeros=True)


@constraints.declare(support={"x": constraints.real},
                     params={"loc": constraints.real, "scale": constraints.positive})
def normal_lpdf(
    x: ArrayLike,
    loc: ArrayLike = 0.0,
    scale: ArrayLike = 1.0,
    *,
    normalized: bool = True,
    validate_args: bool | None = None,
) -> jax.Array:
    r"""Summed normal log-density :math:`\sum_i \log N(x_i \mid \mu_i, \sigma_i)`.

    .. math::

        \log N(x \mid \mu, \sigma) = -\tfrac12 z^2 - \log\sigma - \tfrac12\log 2\pi,
        \qquad z = (x - \mu)/\sigma

    The arguments broadcast against each other (NumPy rules) and the elementwise
    log-densities are summed, like Stan's ``normal_lpdf``. The gradient with respect to
    every floating argument is hand-derived and reuses ``z`` and ``1/sigma`` from the
    forward pass; arguments that are not differentiated cost nothing.

    Args:
      x: observations, any real dtype.
      loc: mean :math:`\mu`, finite.
      scale: standard deviation :math:`\sigma > 0`, finite.
      normalized: if False, drop the constant :math:`-\tfrac12\log 2\pi` per element
        (Stan's ``propto``): the gradient is unchanged.
      validate_args: if True (default: the global setting, see
        :func:`fusedlp.enable_validation`), concrete inputs are checked and a ``ValueError``
        names the argument and the first offending index.

    Returns:
      A scalar in the common floating dtype of the inputs. ``NaN`` if any ``scale <= 0``,
      any ``loc`` or ``scale`` is not finite, or anything is NaN; ``-inf`` (with a zero
      gradient for that element) if some ``x`` is infinite. Empty inputs give ``0.0``.

    Raises:
      ValueError: at trace time if the shapes do not broadcast.
      TypeError: at trace time if an argument has a non-real dtype.

    Example:
      >>> import jax, fusedlp
      >>> value, grad = jax.value_and_grad(fusedlp.normal_lpdf, argnums=1)(2.0, 0.5, 1.0)
      >>> round(float(value), 4), round(float(grad), 4)  # grad = (x - loc) / scale**2
      (-2.0439, 1.5)
    """
    del validate_args  # checked by constraints.declare
    fn = "normal_lpdf"
    x = _checks.as_real_array(fn, "x", x)
    loc = _checks.as_real_array(fn, "loc", loc)
    scale = _checks.as_real_array(fn, "scale", scale)
    _checks.broadcast_shape(fn, x=x, loc=loc, scale=scale)
    dt = _checks.float_dtype(x, loc, scale)
    return _normal(bool(normalized), x.astype(dt), loc.astype(dt), scale.astype(dt))
