"""EAM-style embedding energy E = sum_s F(sum_j rho(r_sj)) with a hand-derived VJP."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from fusedlp import _checks, constraints
from fusedlp._vjp import scaled, sum_to_shape

# The defaults reproduce the seed study exactly: rho(r) = exp(-3 (r + 1)) = e^-3 exp(-3 r),
# F(p) = p^2 + p^3 + p^4 / 4.
SEED_DENSITY = (math.exp(-3.0), 3.0)
SEED_EMBEDDING = (0.0, 1.0, 1.0, 0.25)

# Derivation. For site s with neighbours j (mask m_sj in {0, 1}):
#
#   e_sj = m_sj exp(-beta r_sj)         the only transcendental; computed once
#   S_s  = sum_j e_sj,   p_s = A S_s    (p_s = sum_j rho(r_sj))
#   F(p) = sum_{k>=1} c_k p^k,   F'(p) = sum_{k>=1} k c_k p^(k-1)   (Horner, one pass each)
#   E    = sum_s F(p_s)
#
#   dE/dr_sj  = F'(p_s) * A * (-beta) e_sj       (rho' = -beta rho: the exp is reused)
#   dE/dA     = sum_s F'(p_s) S_s
#   dE/dbeta  = -A sum_s F'(p_s) sum_j r_sj e_sj
#   dE/dc_k   = sum_s p_s^k
#
# Edges: a very negative r overflows exp to +inf, so p = +inf and F(p) takes the sign of the
# highest non-zero coefficient (+inf for the seed's F), never inf - inf = NaN. A <= 0,
# beta <= 0 or any non-finite parameter gives NaN; NaN in an unmasked r propagates. Masked
# entries may hold anything (padding), and r = +inf counts as masked: they are replaced
# before the exp (double where), so they contribute nothing and get zero derivatives of
# every order.


def _params_ok(amp, beta, coeffs):
    return (amp > 0) & (beta > 0) & jnp.isfinite(amp) & jnp.isfinite(beta) & jnp.all(
        jnp.isfinite(coeffs)
    )


def _horner(coeffs, p):
    """F(p) = sum_{k=1}^K c_k p^k and F'(p), both by Horner's rule."""
    f = jnp.zeros_like(p)
    df = jnp.zeros_like(p)
    for c in coeffs[::-1]:  # static length K: unrolled into one fused expression
        df = df * p + f
        f = f * p + c
    return f * p, f + df * p


def _embed(coeffs, p):
    """F and F' that are +-inf (never NaN) where p overflowed to +inf."""
    big = jnp.isinf(p)
    f, df = _horner(coeffs, jnp.where(big, 0.0, p))
    nonzero = coeffs != 0
    # sign of the highest non-zero coefficient (0 if F is identically zero)
    lead = jnp.sum(jnp.where(nonzero & (jnp.cumsum(nonzero[::-1])[::-1] == 1), coeffs, 0.0))
    limit = jnp.where(lead == 0, 0.0, jnp.sign(lead) * jnp.inf)
    return jnp.where(big, limit, f), jnp.where(big, limit, df)


def _densities(r, mask, beta):
    # r = +inf (a neighbour padded far away) acts as a mask: it is replaced before the exp
    # (double where), or the beta-tangent of exp(-beta r) there is inf * 0 = NaN.
    keep = r != jnp.inf if mask is None else mask & (r != jnp.inf)
    r = jnp.where(keep, r, 0.0)
    return r, jnp.where(keep, jnp.exp(-beta * r), 0.0)


def _energy(r, mask, amp, beta, coeffs):
    """E and the intermediates the partials reuse: (E, r_safe, e, S, p, F'(p), params ok)."""
    rs, e = _densities(r, mask, beta)
    s = jnp.sum(e, axis=-1)  # S_s
    p = amp * s
    f, df = _embed(coeffs, p)
    ok = _params_ok(amp, beta, coeffs)
    return jnp.where(ok, jnp.sum(f), jnp.nan), rs, e, s, p, df, ok


@jax.custom_vjp
def _eam(r, mask, amp, beta, coeffs):
    if r.size == 0:  # no neighbour, no term, no verdict: exactly 0, as the other kernels
        return jnp.zeros((), r.dtype)
    return _energy(r, mask, amp, beta, coeffs)[0]


def _eam_fwd(r, mask, amp, beta, coeffs):
    rv, av, bv, cv = r.value, amp.value, beta.value, coeffs.value
    if rv.size == 0:
        return jnp.zeros((), rv.dtype), tuple(
            jnp.zeros_like(a.value) if a.perturbed else None for a in (r, amp, beta, coeffs))
    mv = None if mask is None else mask.value
    value, rs, e, s, p, df, ok = _energy(rv, mv, av, bv, cv)
    nan_unless_ok = lambda d: jnp.where(ok, d, jnp.nan)  # noqa: E731
    dr = da = db = dc = None
    if r.perturbed:
        # A neighbour with e = 0 (masked, r = +inf, or exp underflowed) contributes nothing
        # and gets 0, also at a site whose F'(p) overflowed to inf (inf * 0 = NaN
        # otherwise). The select costs nothing measurable in this elementwise pass.
        dr = nan_unless_ok(jnp.where(e == 0, 0.0, (-bv * av) * df[..., None] * e))
    if amp.perturbed:
        da = nan_unless_ok(jnp.sum(df * s))
    if beta.perturbed:
        r_e = rs * e  # rs is 0 wherever e was masked (r = +inf included)
        db = nan_unless_ok(-av * jnp.sum(df * jnp.sum(r_e, axis=-1)))
    if coeffs.perturbed:
        powers = p[..., None] ** jnp.arange(1, cv.shape[0] + 1, dtype=p.dtype)
        dc = nan_unless_ok(sum_to_shape(powers, cv.shape))
    return value, (dr, da, db, dc)


def _eam_bwd(grads, g):
    dr, da, db, dc = grads
    return scaled(g, dr), None, scaled(g, da), scaled(g, db), scaled(g, dc)


_eam.defvjp(_eam_fwd, _eam_bwd, symbolic_zeros=True)


def eam_energy(
    r: ArrayLike,
    *,
    density: tuple[ArrayLike, ArrayLike] = SEED_DENSITY,
    embedding: ArrayLike | Sequence[float] = SEED_EMBEDDING,
    mask: ArrayLike | None = None,
    validate_args: bool | None = None,
) -> jax.Array:
    r"""Embedding energy :math:`E = \sum_s F\big(\sum_j \rho(r_{sj})\big)` of an EAM-style model.

    .. math::

        \rho(r) = A e^{-\beta r}, \qquad F(p) = \sum_{k \ge 1} c_k p^k

    The defaults reproduce the seed study: :math:`\rho(r) = e^{-3(r+1)}`,
    :math:`F(p) = p^2 + p^3 + p^4/4`. The gradient with respect to ``r``, ``A``, ``beta``
    and the coefficients is hand-derived; the forward ``exp`` feeds both :math:`\rho` and
    :math:`\rho'`.

    Args:
      r: distances, shape ``(..., n)``: the last axis runs over the neighbours of one site,
        the leading axes over sites (a 1-D ``r`` is one site).
      density: ``(A, beta)``, scalars with :math:`A > 0`, :math:`\beta > 0`.
      embedding: coefficients ``(c_1, ..., c_K)`` of :math:`p^1 \dots p^K`, shape ``(K,)``.
      mask: optional boolean array of ``r``'s shape; ``False`` marks padded neighbours of a
        ragged neighbour list, which contribute nothing whatever ``r`` holds there.
      validate_args: check concrete inputs and raise ``ValueError`` naming the argument and
        the first offending index (default: the global setting).

    Returns:
      A scalar. ``+inf`` (not NaN) if a very negative ``r`` overflows the density and the
      leading coefficient is positive; NaN for invalid parameters or NaN distances.

    Example:
      >>> import jax.numpy as jnp, fusedlp
      >>> r = jnp.array([0.1, 0.5, 1.2])
      >>> E, dE = jax.value_and_grad(fusedlp.eam_energy)(r)
      >>> dE.shape
      (3,)
    """
    fn = "eam_energy"
    r = _checks.as_real_array(fn, "r", r)
    if r.ndim == 0:
        raise ValueError(
            f"{fn}: argument `r` must have at least one axis (neighbours), got a scalar"
        )
    try:
        amp_raw, beta_raw = density
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: argument `density` must be a pair (A, beta)") from None
    amp = _checks.as_real_array(fn, "density[0] (A)", amp_raw)
    beta = _checks.as_real_array(fn, "density[1] (beta)", beta_raw)
    for name, a in (("density[0] (A)", amp), ("density[1] (beta)", beta)):
        if a.ndim != 0:
            raise ValueError(f"{fn}: argument `{name}` must be a scalar, got shape {a.shape}")
    coeffs = _checks.as_real_array(fn, "embedding", embedding)
    if coeffs.ndim != 1 or coeffs.shape[0] == 0:
        raise ValueError(
            f"{fn}: argument `embedding` must be a non-empty 1-D array of coefficients, "
            f"got shape {coeffs.shape}"
        )
    if mask is not None:
        try:
            mask = jnp.asarray(mask)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{fn}: argument `mask` is not a boolean array ({err})") from None
        if mask.dtype != jnp.bool_:
            raise TypeError(f"{fn}: argument `mask` must be boolean, got {mask.dtype}")
        if mask.shape != r.shape:
            raise ValueError(
                f"{fn}: argument `mask` must have the shape of `r` {r.shape}, got {mask.shape}"
            )
    if _checks.want_validation(validate_args):
        rr = r if mask is None or not _checks.is_concrete(mask) else jnp.where(mask, r, 0.0)
        constraints.validate(fn, "r", rr, constraints.not_nan)
        constraints.validate(fn, "density[0] (A)", amp, constraints.positive)
        constraints.validate(fn, "density[1] (beta)", beta, constraints.positive)
        constraints.validate(fn, "embedding", coeffs, constraints.real)
    # Python numbers (the defaults among them) are weak: they take r's precision.
    given = [a for a, raw in ((amp, amp_raw), (beta, beta_raw), (coeffs, embedding))
             if not _checks.is_python_number(raw)]
    dt = _checks.float_dtype(r, *given)
    return _eam(r.astype(dt), mask, amp.astype(dt), beta.astype(dt), coeffs.astype(dt))
