"""Second derivatives of functions built from custom-VJP kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax


def hessian(f: Callable, argnums: int | Sequence[int] = 0, *, has_aux: bool = False) -> Callable:
    """Hessian of a scalar function, reverse-over-reverse.

    ``jax.hessian`` is ``jacfwd(jacrev(f))``: forward mode over reverse mode. A
    ``jax.custom_vjp`` function has no forward-mode rule, so ``jax.hessian`` and
    ``jax.jacfwd`` fail on every fusedlp kernel. This is ``jacrev(jacrev(f))`` instead: the
    outer reverse pass differentiates the hand-written backward rules, which are ordinary
    JAX code. Same signature and output structure as ``jax.hessian``.

    Example:
      >>> import jax.numpy as jnp, fusedlp
      >>> H = fusedlp.hessian(lambda mu: fusedlp.normal_lpdf(jnp.ones(4), mu, 2.0))(0.0)
      >>> float(H)  # -n / sigma^2
      -1.0
    """
    return jax.jacrev(jax.jacrev(f, argnums, has_aux=has_aux), argnums, has_aux=has_aux)
