"""Every kernel against its own declared constraints (fusedlp.constraints).

Each kernel declares its ``support`` (data) and ``arg_constraints`` (parameters). For every
argument and every value its constraint lists as outside the set, the kernel must give what
the edge contract promises: NaN for NaN input or a parameter outside its constraint, -inf
with a zero gradient for data outside the support; and with ``validate_args=True`` a
ValueError naming that argument. A kernel added without a declaration, or without a row
here, fails the first test.
"""

from __future__ import annotations

import inspect
import math

import jax
import numpy as np
import pytest

import fusedlp
from fusedlp import _xla

# A valid point per summed kernel, every array argument by name.
VALID = {
    "normal_lpdf": dict(x=0.3, loc=0.1, scale=1.2),
    "poisson_lpmf": dict(k=3.0, rate=2.5),
    "poisson_log_lpmf": dict(k=3.0, log_rate=0.4),
    "negative_binomial_lpmf": dict(k=3.0, mean=2.5, concentration=4.0),
    "student_t_lpdf": dict(x=0.3, df=5.0, loc=0.1, scale=1.2),
    "gamma_lpdf": dict(x=0.7, shape=2.5, rate=1.5),
    "bernoulli_logit_lpmf": dict(y=1.0, logit=0.3),
    "binomial_logit_lpmf": dict(k=3.0, n=10.0, logit=0.3),
}


def _kernel(name):
    return getattr(fusedlp, name)


def _declared(kernel):
    return {**kernel.support, **kernel.arg_constraints}


def _outside_cases():
    return [pytest.param(name, arg, value, id=f"{name}-{arg}-{value}")
            for name in VALID for arg, constraint in _declared(_kernel(name)).items()
            for value in constraint.outside]


def test_every_summed_kernel_declares_every_array_argument():
    public = {n for n in fusedlp.__all__ if n.endswith(("_lpdf", "_lpmf"))}
    assert public == VALID.keys()
    for name in public:
        kernel = _kernel(name)
        arrays = [p.name for p in inspect.signature(kernel).parameters.values()
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert set(_declared(kernel)) == set(arrays), name
        assert not kernel.support.keys() & kernel.arg_constraints.keys(), name
        assert set(VALID[name]) == set(arrays), name


@pytest.mark.parametrize("name", VALID)
def test_the_valid_point_is_inside_every_constraint(name):
    kernel, point = _kernel(name), VALID[name]
    for arg, constraint in _declared(kernel).items():
        assert constraint.holds(np.asarray(point[arg])), (name, arg)
    value = kernel(**point, validate_args=True)
    assert np.isfinite(value)


@pytest.mark.parametrize("n", [None, 2 * _xla.SMALL + 3], ids=["scalars", "among-many"])
@pytest.mark.parametrize(("name", "arg", "bad"), _outside_cases())
def test_a_value_outside_its_constraint(name, arg, bad, n):
    """Every argument a scalar (n None: the exact pass), or the value one element among
    more than _xla.SMALL valid ones, every argument an array: where the select-free fast
    forms (and trace-time data terms) run."""
    kernel = _kernel(name)
    assert not _declared(kernel)[arg].holds(np.asarray(bad))
    if n is None:
        point, i = dict(VALID[name]), ()
        point[arg] = bad
    else:
        point, i = {a: np.full(n, v) for a, v in VALID[name].items()}, _xla.SMALL
        point[arg][i] = bad
    params = list(kernel.arg_constraints)
    value, grads = jax.value_and_grad(
        lambda p: kernel(**{**point, **p}), argnums=0)({a: point[a] for a in params})
    if math.isnan(bad) or arg in kernel.arg_constraints:
        assert np.isnan(value)
    else:  # data outside the support: that element's partials are zero, the rest finite
        assert value == -np.inf
        for a, g in grads.items():
            g = np.asarray(g)
            assert g[i] == 0.0 and np.all(np.isfinite(g)), (a, g)
    with pytest.raises(ValueError, match=f"`{arg}`"):
        kernel(**point, validate_args=True)
