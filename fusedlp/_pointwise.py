"""Per-observation log-densities from the summed kernels (for LOO / WAIC)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import jax
import jax.numpy as jnp

from fusedlp import _checks, _xla
from fusedlp.eam import eam_energy


def pointwise(kernel: Callable[..., jax.Array], *args, **kwargs) -> jax.Array:
    """The terms of a summed fusedlp kernel, one per element: ``sum(pointwise(k, ...)) ==
    k(...)``.

    Every fusedlp log-density returns the sum of its elementwise terms, which is what a fit
    or a sampler's potential needs; LOO and WAIC (ArviZ) need the terms themselves, the
    per-observation log-likelihood. This broadcasts the array arguments (the parameters
    the kernel takes by position or name: ``x``, ``loc``, ``k``, ``log_rate``...) to their
    common shape and maps the kernel over single elements with ``jax.vmap``, so each term is
    the kernel's own value for that element; keyword-only options (``normalized``,
    ``validate_args``) are passed through. The kernel's checks run first on the whole
    arguments, with its own messages: shapes and dtypes always, values where validation
    is on (``validate_args=True`` or :func:`fusedlp.validation`) and they are concrete.
    Works for kernels built with :func:`fusedlp.fuse` too, and under ``jit``, ``vmap`` and
    ``grad``.

    Args:
      kernel: a summed elementwise fusedlp kernel (``fusedlp.poisson_log_lpmf``...).
      *args, **kwargs: its arguments, as for ``kernel(*args, **kwargs)``.

    Returns:
      An array of the arguments' broadcast shape.

    Raises:
      TypeError: ``eam_energy``, whose terms are per site, not per element (for per-site
        energies, ``jax.vmap`` it over the sites: ``jax.vmap(eam_energy)(r)``).

    Example:
      >>> import jax.numpy as jnp, fusedlp
      >>> k, eta = jnp.array([0.0, 3.0, 1.0]), jnp.array([0.1, 1.2, -0.5])
      >>> terms = fusedlp.pointwise(fusedlp.poisson_log_lpmf, k, eta)
      >>> terms.shape, bool(jnp.isclose(terms.sum(), fusedlp.poisson_log_lpmf(k, eta)))
      ((3,), True)
    """
    if kernel is eam_energy:
        raise TypeError("pointwise: eam_energy's terms are per site, not per element; "
                        "use jax.vmap(eam_energy) over the sites")
    # The arrays are the parameters that bind by position or by their name (``*params`` of
    # a fused element function too); keyword-only options, and a ``**options`` catch-all,
    # pass through as given. Each element call binds them again by name, so that one
    # given by name after a skipped default is mapped too.
    signature = inspect.signature(kernel)
    bound = signature.bind(*args, **kwargs)
    slots, arrays = [], []
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            slots += [(name, i) for i in range(len(value))]
            arrays += [jnp.asarray(a) for a in value]
        elif kind in (inspect.Parameter.POSITIONAL_ONLY,
                      inspect.Parameter.POSITIONAL_OR_KEYWORD):
            slots.append((name, None))
            arrays.append(jnp.asarray(value))

    def call(values):
        arguments = dict(bound.arguments)
        for (name, i), a in zip(slots, values):
            if i is None:
                arguments[name] = a
            else:
                arguments[name] = arguments[name][:i] + (a,) + arguments[name][i + 1:]
        b = inspect.BoundArguments(signature, arguments)
        return kernel(*b.args, **b.kwargs)

    # the kernel's own checks first, with its own messages naming the argument: shapes and
    # dtypes at trace time, and values where validation is asked for and they are concrete
    # (inside the vmap below every input is traced)
    if _checks.want_validation(kwargs.get("validate_args")) and _checks.is_concrete(arrays):
        call(arrays)
    else:
        jax.eval_shape(call, arrays)
    shape = jnp.broadcast_shapes(*(a.shape for a in arrays))
    # on a mesh with Explicit axes, the broadcast arguments take the split one's sharding:
    # vmap maps only arrays split alike
    sharding = next((sh for a in arrays if a.shape == shape
                     for sh in [_xla.split_sharding(a)] if sh is not None), None)
    flat = [jnp.broadcast_to(a, shape, out_sharding=sharding).reshape(-1) for a in arrays]

    def one(*elements):
        return call(elements)

    return jax.vmap(one)(*flat).reshape(shape)
