"""The accuracy sweep's reference table, and a kernel run over it and judged against it.

Shared by ``tests/test_accuracy.py`` and ``python -m bench accuracy``. The table
(``tests/data/accuracy_reference.json.gz``) is written by ``tests/accuracy_reference.py``
(mpmath); this module needs only numpy and jax.

The measure of an answer ``got`` for a true quantity ``q`` (value or one partial) is

    ratio = |got - q| / max(eps * max(|q|, sens), tiny)

where ``sens = sum_i |theta_i dq/dtheta_i|`` is the table's sensitivity (``sens / |q|`` is
q's condition number), eps and tiny (the smallest normal number) are the dtype's. So
``ratio = relative error / (eps * max(1, cond))`` wherever that scale is a normal number;
below it, an absolute error of tiny counts 1 (XLA:CPU flushes subnormal results to zero,
an error below tiny). A q beyond the dtype's range (the float64
table stores it as +-inf) must come back as that same infinity: anything else is ratio inf,
as is a NaN or an infinity where q is finite.
"""

from __future__ import annotations

import functools
import gzip
import json
import pathlib

import numpy as np

PATH = pathlib.Path(__file__).resolve().parent / "data" / "accuracy_reference.json.gz"
DTYPES = ("float64", "float32")
DISCRETE = ("poisson_lpmf", "poisson_log_lpmf", "negative_binomial_lpmf",
            "bernoulli_logit_lpmf", "binomial_logit_lpmf")


@functools.lru_cache(maxsize=1)
def load() -> dict:
    """{"kernel/dtype": table}; a table has ``args``, ``diff`` (names), ``inputs`` (n, args),
    ``value`` (n,), ``partials`` (n, diff) and ``sens`` (n, 1 + diff), as float64 arrays."""
    with gzip.open(PATH, "rt") as f:
        doc = json.load(f)
    return {key: as_arrays(t) for key, t in doc["tables"].items()}


def as_arrays(t: dict) -> dict:
    """A table as written (lists, see accuracy_reference.reference) -> float64 arrays."""
    n, n_diff = len(t["value"]), len(t["diff"])
    return {
        "args": tuple(t["args"]), "diff": tuple(t["diff"]),
        "inputs": np.array(t["inputs"], dtype=np.float64).reshape(n, len(t["args"])),
        "value": np.array(t["value"], dtype=np.float64),
        "partials": np.array(t["partials"], dtype=np.float64).reshape(n, n_diff),
        "sens": np.array(t["sens"], dtype=np.float64).reshape(n, 1 + n_diff)}


def kernels() -> list[str]:
    """Kernel names in the table, in its order."""
    return list(dict.fromkeys(key.split("/")[0] for key in load()))


def _eam(r1, r2, r3, amp, beta, c1, c2, c3, c4):
    import jax.numpy as jnp

    import fusedlp

    return fusedlp.eam_energy(jnp.stack([r1, r2, r3]), density=(amp, beta),
                              embedding=jnp.stack([c1, c2, c3, c4]))


def fusedlp_kernel(kernel: str):
    """The public fusedlp function, taking the table's arguments positionally (eam_energy:
    one site of three neighbours, its density and embedding spread into scalars)."""
    import fusedlp

    return _eam if kernel == "eam_energy" else getattr(fusedlp, kernel)


def evaluate(fn, table: dict, dtype: str, *, grad: bool = True, each: bool = False):
    """``fn`` at every point (inputs cast to ``dtype``), one jitted, vmapped call; if
    ``each``, one jitted loop over the points instead (``jax.lax.map``), so that no choice
    inside ``fn`` is made once for the whole batch (a fast form's verdict under vmap is).

    Returns (value, partials) as float64 arrays, partials of shape (n, len(diff)) by
    ``jax.value_and_grad`` of ``fn`` on one element; partials is None if not ``grad``.
    """
    import jax
    import jax.numpy as jnp

    cols = [jnp.asarray(table["inputs"][:, i], dtype=dtype) for i in range(len(table["args"]))]

    def over_points(f):
        return jax.jit(lambda *c: jax.lax.map(lambda a: f(*a), c) if each else jax.vmap(f)(*c))

    if not grad:
        return np.asarray(over_points(fn)(*cols), dtype=np.float64), None
    argnums = tuple(table["args"].index(d) for d in table["diff"])
    value, partials = over_points(jax.value_and_grad(fn, argnums=argnums))(*cols)
    partials = np.stack([np.asarray(p, dtype=np.float64) for p in partials], axis=1)
    return np.asarray(value, dtype=np.float64), partials


def ratios(got, ref, sens, dtype: str) -> np.ndarray:
    """Elementwise error / max(eps * max(|ref|, sens), tiny); see the module docstring."""
    fi = np.finfo(np.dtype(dtype))
    got, ref, sens = (np.asarray(a, dtype=np.float64) for a in (got, ref, sens))
    with np.errstate(invalid="ignore", over="ignore"):
        scale = np.maximum(fi.eps * np.maximum(np.abs(ref), sens), float(fi.tiny))
        r = np.abs(got - ref) / scale
    same = got == ref  # equal infinities included
    return np.where(same, 0.0, np.where(np.isfinite(ref) & np.isfinite(got), r, np.inf))


def judged_partials(table: dict) -> np.ndarray:
    """Points whose partials are judged: those whose true value is finite in float64 (where
    it overflows only the value's -inf is required)."""
    return np.isfinite(table["value"])
