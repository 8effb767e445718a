"""The sets of values a kernel accepts, declared as data (NumPyro's ``support`` and
``arg_constraints``).

Each kernel names the constraint of every array argument once, with :func:`declare`: its
``support`` (data; an element outside it contributes ``-inf`` with a zero gradient) and its
``arg_constraints`` (parameters; a value outside them gives ``NaN``). The declaration is
readable on the kernel itself, and it drives the ``validate_args`` checks and the contract
tests::

    >>> import fusedlp
    >>> fusedlp.poisson_lpmf.support, fusedlp.poisson_lpmf.arg_constraints
    ({'k': constraints.count}, {'rate': constraints.nonnegative})
    >>> try:
    ...     fusedlp.poisson_lpmf(3, -2.0, validate_args=True)
    ... except ValueError as err:
    ...     print(err)
    poisson_lpmf: argument `rate` must be finite and >= 0; first offending entry rate = -2.0

Inside ``jit`` nothing is checked (the values are not known): there the kernel's value
carries the verdict, elementwise.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping

import jax.numpy as jnp
import numpy as np

from fusedlp import _checks

__all__ = ("Constraint", "binary", "below_inf", "count", "declare", "nonnegative",
           "not_nan", "positive", "real", "validate")


@dataclasses.dataclass(frozen=True, eq=False)
class Constraint:
    """A set of valid values: its name, how an error message states it, an elementwise numpy
    test, some values outside it (the contract tests feed them to every kernel), and
    whether a boolean array stands for its values (0 and 1)."""

    name: str
    what: str
    holds: Callable[[np.ndarray], np.ndarray]
    outside: tuple[float, ...]
    takes_bool: bool = False

    def __repr__(self) -> str:
        return f"constraints.{self.name}"


_INF, _NAN = float("inf"), float("nan")

real = Constraint("real", "must be finite", np.isfinite, (_INF, -_INF, _NAN))
positive = Constraint("positive", "must be finite and > 0",
                      lambda a: np.isfinite(a) & (a > 0), (0.0, -1.0, _INF, _NAN))
nonnegative = Constraint("nonnegative", "must be finite and >= 0",
                         lambda a: np.isfinite(a) & (a >= 0), (-1.0, _INF, _NAN))
count = Constraint("count", "must hold non-negative integer counts",
                   lambda a: (a >= 0) & (np.floor(a) == a) & np.isfinite(a), (-1.0, 2.5, _INF))
# Outcomes often come as a boolean array (y = x > 0): NumPyro's Bernoulli takes one too.
binary = Constraint("binary", "must be 0 or 1", lambda a: (a == 0) | (a == 1), (-1.0, 0.5, 2.0),
                    takes_bool=True)
below_inf = Constraint("below_inf", "must be < +inf and not NaN", lambda a: a < np.inf,
                       (_INF, _NAN))  # a log-scale parameter: -inf is its boundary, allowed
not_nan = Constraint("not_nan", "must not be NaN", lambda a: ~np.isnan(a), (_NAN,))


def validate(fn: str, name: str, value, constraint: Constraint) -> None:
    """Raise ``ValueError`` naming ``name`` and its first entry outside ``constraint``
    (concrete values only; a traced value is not looked at)."""
    _checks.validate(fn, name, value, lambda a: ~constraint.holds(a), constraint.what)


def _is_bool(value) -> bool:
    """Whether ``value`` holds booleans, from its dtype (no copy of an array); a list or a
    Python scalar is looked at on the host."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        try:
            dtype = np.asarray(value).dtype
        except (TypeError, ValueError):  # tracers in a list, or not numeric: the kernel's
            return False  # own conversion names the argument
    return dtype == np.bool_


def declare(*, support: Mapping[str, Constraint], params: Mapping[str, Constraint],
            check: Callable[..., None] | None = None):
    """Decorator for a kernel ``f(arrays..., *, validate_args=None, ...)``: sets its
    ``support`` and ``arg_constraints`` attributes, and with validation on (the
    ``validate_args`` argument, else the global switch) checks concrete arguments against
    them, in the order of the signature, before the call. ``check(fn, **arrays)``, if
    given, runs last: a constraint that ties arguments together (binomial: k <= n). A
    boolean array for an argument whose constraint takes one is passed on as integers;
    elsewhere a boolean is a ``TypeError`` naming the argument (``_checks.as_real_array``)."""
    def wrap(kernel: Callable) -> Callable:
        sig = inspect.signature(kernel)
        names = [n for n in sig.parameters if n in support or n in params]
        undeclared = {**support, **params}.keys() - set(names)
        if undeclared:
            raise TypeError(f"{kernel.__name__}: no argument named {sorted(undeclared)}")
        fn = kernel.__name__

        takes_bool = [n for n in names if (support.get(n) or params[n]).takes_bool]

        @functools.wraps(kernel)
        def checked(*args, **kwargs):
            validating = _checks.want_validation(kwargs.get("validate_args"))
            if not (validating or takes_bool):
                return kernel(*args, **kwargs)
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:  # the call's own error, which names the kernel
                return kernel(*args, **kwargs)
            for n in takes_bool:
                if n in bound.arguments and _is_bool(bound.arguments[n]):
                    bound.arguments[n] = jnp.asarray(bound.arguments[n], jnp.int32)
            args, kwargs = bound.args, bound.kwargs
            if validating:
                bound.apply_defaults()
                arrays = {n: _checks.as_real_array(fn, n, bound.arguments[n]) for n in names}
                _checks.broadcast_shape(fn, **arrays)
                for n in names:
                    validate(fn, n, arrays[n], support.get(n) or params[n])
                if check is not None:
                    check(fn, **arrays)
            return kernel(*args, **kwargs)

        checked.support = dict(support)
        checked.arg_constraints = dict(params)
        return checked

    return wrap
