"""Shared test configuration: float64 on, one tolerance table, a seeded generator.

x64 is enabled for the whole session so that float64 references are real float64; the
float32 tests pass explicit float32 arrays and check that float32 comes back.
"""

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import fusedlp  # noqa: E402

# The one tolerance table. Every numeric comparison in the suite takes its tolerance from
# here, by dtype:
#   value     relative error of a summed log-density against the float64 reference (scipy or
#             a numpy formula evaluated at the same, already rounded, inputs); the absolute
#             part is value * (sum of the magnitudes of the summed terms), the conditioning
#             of a float sum of terms of mixed sign.
#   grad      the same for gradients against autodiff of the plain formula in float64.
#   fd_eps    finite-difference step for jax.test_util.check_grads.
#   fd_atol / fd_rtol   check_grads tolerances (directional derivatives of random directions).
# Results that must be exact (boundaries, zeros, small log k! in float32) are compared with
# ==, not with a tolerance.
TOL = {
    np.dtype(np.float64): dict(
        value=1e-12, grad=1e-10, fd_eps=1e-5, fd_atol=1e-6, fd_rtol=1e-6
    ),
    np.dtype(np.float32): dict(
        value=1e-6, grad=1e-5, fd_eps=2e-3, fd_atol=1e-2, fd_rtol=1e-2
    ),
}

DTYPES = (np.float64, np.float32)


@pytest.fixture(params=DTYPES, ids=lambda d: np.dtype(d).name)
def dtype(request):
    """Both floating dtypes: a test that takes ``dtype`` runs once for each."""
    return request.param


@pytest.fixture
def rng():
    """A freshly seeded generator per test: every test sees the same numbers."""
    return np.random.default_rng(20240611)


@pytest.fixture
def tol():
    """``tol(dtype)`` -> the tolerance row of :data:`TOL` for that dtype."""
    return lambda dtype: TOL[np.dtype(dtype)]


@pytest.fixture(autouse=True)
def _validation_off():
    """Tests must not leak the thread-global validation switch into each other."""
    fusedlp.enable_validation(False)
    yield
    fusedlp.enable_validation(False)


@pytest.fixture
def xla_setting(monkeypatch):
    """``xla_setting(name, value)`` sets a ``fusedlp._xla`` constant (a size threshold, a
    block size, an idiom) for one test. Kernels read these when they are traced and jax keeps
    traces, so jax's caches are cleared on the way in and out: no trace made under one value
    serves a test under another, whichever tests ran before in the same process."""
    from fusedlp import _xla

    def use(name, value):
        jax.clear_caches()
        monkeypatch.setattr(_xla, name, value)

    yield use
    jax.clear_caches()  # before monkeypatch, set up first, puts the value back


@pytest.fixture(scope="module")
def empty_dispatch_cache():
    """jax's C++ dispatch cache emptied, once per module, before a test that counts entries.

    ``jitted._cache_size()`` counts a function's entries in that cache, which is process-wide:
    8192 executables shared by every jitted function, jax.numpy's eager operations included.
    Once a long session has filled it, a new function's entry is dropped at once (size 0:
    each call is dispatched from Python; nothing is retraced), and the count means nothing.
    """
    jax.clear_caches()


# Modules whose tests take minutes each on two cores (a subprocess with four devices, the
# two-process fit, notebooks, benchmark runs): collected first, so that pytest-xdist hands
# them out while the other workers still have the short tests to run, instead of leaving
# one worker alone with them at the end of the session.
_LONG_FIRST = ("test_sharding.py", "test_notebooks.py", "test_bench_cli.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return _LONG_FIRST.index(name) if name in _LONG_FIRST else len(_LONG_FIRST)

    items.sort(key=rank)  # stable: the order within each group is unchanged
