"""Second derivatives of functions built from custom-VJP kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax


def hessian(f: Callable, argnums: int | Sequence[int] = 0, *, has_aux: bool = False) -> Callable:
    """Hessian of a scalar function, reverse-over-reverse.

    ``jax.hessian`` is ``jacfwd(jacrev(f))``: forward mode over the reverse pass, which
    works on fusedlp kernels (their backward rules are ordinary JAX code), while
    ``jax.jacfwd`` and ``jax.jvp`` of a kernel itself fail (a ``jax.custom_vjp`` function
    has no forward-mode rule). This is ``jacrev(jacrev(f))``: the outer reverse pass
    differentiates the hand-written backward rules too, and keeps the whole Hessian in
    reverse mode (the fitting module's choice, docs/performance.md). ``argnums`` and
    ``has_aux`` and the output structure are ``jax.hessian``'s; there is no
    ``holomorphic`` (the kernels are real).

    Example:
      >>> import jax.numpy as jnp, fusedlp
      >>> H = fusedlp.hessian(lambda mu: fusedlp.normal_lpdf(jnp.ones(4), mu, 2.0))(0.0)
      >>> float(H)  # -n / sigma^2
      -1.0
    """
    return jax.jacrev(jax.jacrev(f, argnums, has_aux=has_aux), argnums, has_aux=has_aux)
