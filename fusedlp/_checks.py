"""Trace-time argument checks, dtype promotion and the opt-in value validation.

Everything here runs in Python while a kernel is traced: it sees shapes and dtypes, never
values, except in :func:`validate`, which looks at values only when they are concrete.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

_state = threading.local()


def validation_enabled() -> bool:
    """Whether kernels validate concrete inputs by default (see :func:`validation`)."""
    return getattr(_state, "enabled", False)


def enable_validation(enabled: bool = True) -> None:
    """Turn value validation on or off for every kernel call in this thread.

    With validation on, a kernel called with concrete (non-traced) inputs raises
    ``ValueError`` naming the argument and the first offending index instead of returning
    NaN or -inf. Traced inputs (inside ``jit``, ``vmap``, ``grad``) cannot be inspected and
    are never validated: there the returned value carries the verdict.
    """
    _state.enabled = bool(enabled)


@contextlib.contextmanager
def validation(enabled: bool = True) -> Iterator[None]:
    """Context manager form of :func:`enable_validation`."""
    before = validation_enabled()
    enable_validation(enabled)
    try:
        yield
    finally:
        enable_validation(before)


def as_real_array(fn: str, name: str, value: ArrayLike, *, allow_int: bool = True) -> jax.Array:
    """``jnp.asarray(value)`` that rejects non-numeric, boolean and complex dtypes by name."""
    try:
        arr = jnp.asarray(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{fn}: argument `{name}` is not a numeric array ({err})") from None
    dt = arr.dtype
    ok = jnp.issubdtype(dt, jnp.floating) or (allow_int and jnp.issubdtype(dt, jnp.integer))
    if not ok:
        kind = "floating" if not allow_int else "integer or floating"
        raise TypeError(f"{fn}: argument `{name}` must have a real {kind} dtype, got {dt}")
    return arr


def float_dtype(*arrays: jax.Array):
    """The common floating dtype of the arguments; integer-only inputs give the default float."""
    dt = jnp.result_type(*arrays)
    if not jnp.issubdtype(dt, jnp.floating):
        dt = jnp.result_type(float)
    return dt


def is_python_number(value) -> bool:
    """A Python int/float, or a tuple/list of them: weakly typed, like a JAX Python scalar."""
    if isinstance(value, (tuple, list)):
        return all(is_python_number(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def broadcast_shape(fn: str, **arrays: jax.Array) -> tuple[int, ...]:
    """Broadcast shape of the named arrays; the error names the first argument that clashes."""
    shape: tuple[int, ...] = ()
    seen: list[str] = []
    for name, arr in arrays.items():
        try:
            shape = jnp.broadcast_shapes(shape, arr.shape)
        except ValueError:
            others = ", ".join(f"`{n}` {arrays[n].shape}" for n in seen)
            raise ValueError(
                f"{fn}: argument `{name}` with shape {arr.shape} does not broadcast "
                f"against {others}"
            ) from None
        seen.append(name)
    return shape


def is_concrete(*arrays: ArrayLike) -> bool:
    """Whether the values are known now: no tracer, also inside a list or tuple of them."""
    return not any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(arrays))


def validate(fn: str, name: str, value: ArrayLike, bad, what: str) -> None:
    """Raise ``ValueError`` if ``bad(np.asarray(value))`` holds anywhere (concrete values only)."""
    if not is_concrete(value):
        return
    arr = np.asarray(value)
    mask = np.asarray(bad(arr))
    if mask.any():
        idx = tuple(int(i) for i in np.argwhere(mask)[0]) if mask.ndim else ()
        where = entry(name, idx, arr.shape)
        raise ValueError(
            f"{fn}: argument `{name}` {what}; first offending entry {where} = {arr[idx].item()!r}"
        )


def entry(name: str, idx: tuple[int, ...], shape: tuple[int, ...]) -> str:
    """``name[i, j]``: the entry of an array of ``shape`` that broadcasting sends to ``idx``
    (an index into the broadcast shape); the bare name for a scalar."""
    own = [0 if size == 1 else i for i, size in zip(idx[len(idx) - len(shape):], shape)]
    return f"{name}[{', '.join(map(str, own))}]" if shape else name


def want_validation(flag: bool | None) -> bool:
    return validation_enabled() if flag is None else bool(flag)
