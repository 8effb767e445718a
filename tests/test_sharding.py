"""Sharded kernels and fits on four CPU devices equal the unsharded ones, reducing in XLA.

This pytest process has one device (and x64, conftest.py), and the device count is fixed
when jax starts, so the checks run in a fresh interpreter, ``_sharding_worker.py``, started
with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``. It runs once per session and
reports every check as JSON; one test asserts every group of them:

* kernels: value and gradient of every kernel, sharded against unsharded, float64 and
  float32, N divisible by 4 and N padded by ``fusedlp.shard(..., pad=True)`` (the kernels
  built with ``fusedlp.fuse``: float64, N divisible by 4), with the cotangents' shardings
  and the compiled HLO (an all-reduce of scalars, no all-gather);
* explicit: the same, float64, on a mesh with Explicit axes (``jax.make_mesh``'s default),
  and ``fusedlp.hessian`` of a fuse-built kernel there;
* fit: a sharded Poisson regression equals the unsharded one, step for step;
* hlo: the HLO check itself fails on a program that gathers the data (a mutation check);
* helper, cotangents: ``fusedlp.shard``'s padding, mask and errors; eager gradients.

A last test runs the README's multi-process recipe: two processes joined by
``jax.distributed.initialize`` on this machine (two CPU devices each, gloo collectives) fit
a padded Poisson regression, from full data and from process-local rows, and must agree
with the one-process, unsharded fit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import fusedlp

WORKER = Path(__file__).with_name("_sharding_worker.py")
GROUPS = ("helper", "kernels", "explicit", "cotangents", "hlo", "fit")


def worker_env(devices: int) -> dict:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
    env["JAX_ENABLE_X64"] = "1"
    env["JAX_PLATFORMS"] = "cpu"
    return env


def last_json_line(proc, what: str):
    out, err = proc.stdout, proc.stderr
    lines = out.strip().splitlines()
    assert proc.returncode == 0 and lines, (
        f"{what} exited with {proc.returncode}\n--- stdout\n{out[-4000:]}"
        f"\n--- stderr\n{err[-4000:]}")
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def worker_results():
    proc = subprocess.run([sys.executable, str(WORKER)], env=worker_env(4),
                          capture_output=True, text=True, timeout=600, check=False)
    return last_json_line(proc, "sharding worker")


def test_sharding_groups(worker_results):
    # One test for every group: under pytest-xdist each worker that runs a test of this
    # module sets up the module's fixture, and the worker takes minutes. (xdist's
    # loadgroup, which would keep parametrized tests on one worker, does not group them
    # under pytest 9: it renames items through an attribute pytest no longer reads.)
    missing = [g for g in GROUPS if not any(c["group"] == g for c in worker_results)]
    assert not missing, f"the worker ran no check of the groups {missing}"
    failed = [c for c in worker_results if not c["ok"]]
    assert not failed, "\n\n".join(f"FAILED {c['group']}: {c['name']}:\n{c['detail']}"
                                     for c in failed)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _load_worker():
    spec = importlib.util.spec_from_file_location("_sharding_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_processes_fit_like_one():
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), "--process", str(i), "2", str(port)],
                              env=worker_env(2), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:  # a failed process leaves its peer waiting: end it
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    results = [last_json_line(subprocess.CompletedProcess(p.args, p.returncode, *out),
                              f"process {i}") for i, (p, out) in enumerate(zip(procs, outs))]

    # the reference: this process, one device, no padding
    w = _load_worker()
    X, k = w._regression_data(4003)
    want = fusedlp.fit(w.poisson_regression, {"beta": jnp.zeros(3)}, X, k)
    for i, r in enumerate(results):
        assert r["devices"] == 4 and r["local_devices"] == 2, r
        for way in ("A", "B"):  # A: full data on every process; B: process-local rows
            got = r[way]
            assert got["status"] == int(fusedlp.FitStatus.CONVERGED), (i, way, got)
            assert got["num_steps"] == int(want.num_steps), (i, way, got)
            np.testing.assert_allclose(got["beta"], want.params["beta"], rtol=1e-9)
            np.testing.assert_allclose(got["value"], want.value, rtol=1e-12)
