"""Known bugs of jax and XLA that change fusedlp's numbers, pinned down as tests.

Each is an ``xfail`` on the versions that have it and a plain test elsewhere, so that a jax
that brings the bug back fails the plain test. Not a strict xfail: whether XLA:CPU takes the
faulty path may depend on the processor (YNNPACK picks its kernels by instruction set), and
an unexpected pass on another machine must not fail CI; ``-rX`` (in the default ``-ra``)
lists it. docs/jax-and-numpyro.md ("Known issues") says what a user can do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest
from scipy import stats

import fusedlp

# jax#39103: jaxlib 0.10.2 on the CPU hands a reduction fed by a small matrix-vector product
# to YNNPACK and gets wrong sums for batches of more than 16,384 (0.10.1 is right)
_YNN_REDUCE_MISCOMPILE = jaxlib.__version__ == "0.10.2" and jax.default_backend() == "cpu"


@pytest.mark.xfail(_YNN_REDUCE_MISCOMPILE, strict=False, raises=AssertionError,
                   reason="jax#39103: jaxlib 0.10.2 CPU miscompiles this vmapped reduction")
def test_vmapped_normal_of_a_three_column_design_sums_right(rng):
    """normal_lpdf(y, X @ b) vmapped over 40,000 coefficient vectors b of a design X with 3
    rows and 3 columns: on jaxlib 0.10.2 (CPU) 23,616 of the 40,000 sums came out wrong,
    some by more than 100%. Other kernels, other column counts and autodiff of the plain formula
    gave the right numbers on the same data (docs/jax-and-numpyro.md)."""
    X = rng.normal(size=(3, 3))
    B = rng.normal(size=(40_000, 3)) * 0.3
    y = rng.normal(size=3)
    got = jax.jit(jax.vmap(lambda b: fusedlp.normal_lpdf(y, X @ b)))(jnp.asarray(B))
    want = stats.norm.logpdf(y, B @ X.T).sum(axis=1)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
