"""Time the accurate kernels of whichever fusedlp is importable, to compare two checkouts.

Run once per checkout, each in its own process, alternating (the numbers in
docs/kernels.md, "What the stable forms cost", are the minimum over such rounds)::

    git worktree add /tmp/before 27825a6          # a commit to compare with
    PYTHONPATH=/tmp/before python bench/tree_speed.py 1e5
    PYTHONPATH=. python bench/tree_speed.py 1e5
    PYTHONPATH=. python bench/tree_speed.py 1e5 --contexts

Prints one JSON line per kernel, float64, microseconds: the minimum over 7 rounds of the
mean of 10 calls. Without ``--contexts``: ``value`` and ``vg`` (value and gradient), data
closed over. With it, value-and-gradient with a vector parameter in four calling contexts:
data closed over (``closed``), passed as jit arguments with int32 or int64 counts
(``args_i32``, ``args_i64``), and a vmapped batch of 10 (``vmap10``).
"""

from __future__ import annotations

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import fusedlp  # noqa: E402  (after x64 is on)


def _time(f, *args) -> int:
    jax.block_until_ready(f(*args))
    best = np.inf
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(10):
            out = f(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / 10)
    return round(best * 1e6)


def _cases(n: int):
    rng = np.random.default_rng(0)
    x = rng.normal(size=n)
    k = rng.poisson(4.0, size=n)
    trials = k + rng.integers(0, 10, size=n)
    pos = rng.gamma(2.0, 1.0, size=n) + 0.01
    eta = rng.normal(size=n) * 0.3 + 1.0
    return {  # name: (kernel(data, vector parameter), data, parameter)
        "poisson": (lambda d, r: fusedlp.poisson_lpmf(d[0], r), (k,), np.exp(eta)),
        "poisson_log": (lambda d, e: fusedlp.poisson_log_lpmf(d[0], e), (k,), eta),
        "negative_binomial": (lambda d, m: fusedlp.negative_binomial_lpmf(d[0], m, 3.0), (k,),
                              np.exp(eta)),
        "student_t": (lambda d, loc: fusedlp.student_t_lpdf(d[0], 5.0, loc, 1.3), (x,),
                      np.zeros(n)),
        "gamma": (lambda d, b: fusedlp.gamma_lpdf(d[0], 2.5, b), (pos,), np.full(n, 1.5)),
        "binomial_logit": (lambda d, e: fusedlp.binomial_logit_lpmf(d[0], d[1], e),
                           (k, trials), eta - 1.0),
        "normal": (lambda d, loc: fusedlp.normal_lpdf(d[0], loc, 1.3), (x,), np.zeros(n)),
        "bernoulli_logit": (lambda d, e: fusedlp.bernoulli_logit_lpmf(d[0] > 3, e), (k,), eta),
    }


def main(argv) -> None:
    n = int(float(argv[0]))
    contexts = "--contexts" in argv
    for name, (fn, data, p) in _cases(n).items():
        p = jnp.asarray(p)
        d32 = tuple(a.astype(np.int32) if a.dtype.kind == "i" else a for a in data)
        row = {"kernel": name}
        if not contexts:
            row["value"] = _time(jax.jit(lambda q, fn=fn, d=d32: fn(d, q)), p)
            row["vg"] = _time(jax.jit(jax.value_and_grad(lambda q, fn=fn, d=d32: fn(d, q))), p)
        else:
            d64 = tuple(a.astype(np.int64) if a.dtype.kind == "i" else a for a in data)

            def vg(d, q, fn=fn):
                return jax.value_and_grad(lambda q: fn(d, q))(q)

            row["closed"] = _time(jax.jit(lambda q, d=d32, vg=vg: vg(d, q)), p)
            row["args_i32"] = _time(jax.jit(vg), tuple(map(jnp.asarray, d32)), p)
            row["args_i64"] = _time(jax.jit(vg), tuple(map(jnp.asarray, d64)), p)
            batched = tuple(jnp.asarray(a.reshape(10, -1)) for a in d32)
            row["vmap10"] = _time(jax.jit(jax.vmap(vg)), batched, p.reshape(10, -1))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
