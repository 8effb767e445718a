"""Small helpers shared by the hand-written VJP rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sum_to_shape(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Sum ``x`` over the axes that broadcasting added to an array of ``shape``.

    This is what keeps a scalar ``loc`` from receiving a vector cotangent: the
    per-element partials live in the broadcast shape and must be folded back.
    """
    if x.shape == tuple(shape):
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1
    )
    out = jnp.sum(x, axis=axes, keepdims=False) if axes else x
    return out.reshape(shape)


def scaled(g: jax.Array, partial: jax.Array | None) -> jax.Array | None:
    """Cotangent ``g * partial``; ``None`` (a symbolic zero) passes through."""
    return None if partial is None else g * partial


def is_zero(t) -> bool:
    """Whether a tangent or cotangent is a symbolic zero (None, or jax's ``SymbolicZero``
    as a rule defined with ``symbolic_zeros=True`` receives it)."""
    return t is None or isinstance(t, jax.custom_derivatives.SymbolicZero)
