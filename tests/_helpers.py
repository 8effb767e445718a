"""Helpers shared by several test modules (``pythonpath = ["tests"]`` in pyproject.toml).

Not a conftest: these are plain functions the tests call, not fixtures.
"""

from collections import Counter

import jax
import jax.extend.core
import numpy as np


def assert_close(got, ref, rtol, mag=None, what="", *, require_finite=True):
    """|got - ref| <= rtol * (|ref| + max(mag)), elementwise, and the shapes equal.

    ``mag`` is the magnitude of the summed terms behind ``ref`` (the conditioning of a float
    sum of terms of mixed sign); by default ``|ref|`` itself. ``require_finite``: fail if the
    test data produced a non-finite reference (off where a test compares edges on purpose;
    equal infinities then compare equal).
    """
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    if require_finite:
        assert np.all(np.isfinite(ref)), f"test data produced a non-finite reference {what}"
    mag = np.abs(ref[np.isfinite(ref)]) if mag is None else mag
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * np.max(mag, initial=0.0),
                               err_msg=what)


def count_primitives(jaxpr, counts=None) -> Counter:
    """Primitive names in a jaxpr, recursing into every sub-jaxpr held in eqn params."""
    counts = Counter() if counts is None else counts
    for eqn in jaxpr.eqns:
        counts[eqn.primitive.name] += 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    count_primitives(sub.jaxpr, counts)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    count_primitives(sub, counts)
    return counts


def grad_primitive_counts(f, argnums, args) -> Counter:
    """:func:`count_primitives` of the jaxpr of ``jax.grad(f, argnums)(*args)``."""
    return count_primitives(jax.make_jaxpr(jax.grad(f, argnums=argnums))(*args).jaxpr)
