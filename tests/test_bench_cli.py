"""The main job's command line: ``python -m bench`` runs the seed studies.

One small study in quick mode through the real entry point, checking what the README and
the issue promise of it: a markdown table per study and the headline table on stdout, the
JSON (machine record, rows, correctness checks) and one PNG per study.
"""

import importlib
import json
import pathlib
import subprocess
import sys

import jax
import pytest

from fusedlp import _xla

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytest.importorskip("numba")
pytest.importorskip("matplotlib")


def _bench(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, check=False)


def test_quick_study_writes_tables_json_and_plot(tmp_path):
    out_json, plots = tmp_path / "s.json", tmp_path / "plots"
    p = _bench("--quick", "--study", "broadcast", "--json", str(out_json), "--plots", str(plots))
    assert p.returncode == 0, p.stderr
    assert "## Gradient of Σ exp(x)" in p.stdout
    assert "## Headline:" in p.stdout
    assert "| broadcast | 1,000 |" in p.stdout
    doc = json.loads(out_json.read_text())
    assert doc["quick"] is True
    assert doc["machine"]["jax"] and doc["machine"]["backend"] == jax.default_backend()
    (res,) = doc["results"]
    assert res["study"] == "broadcast" and res["checks"]
    timed = [r for r in res["rows"] if r["median_s"] is not None]
    assert timed and all(r["median_s"] > 0 and r["repeats"] >= 5 for r in timed)
    assert all(r["compile_s"] is not None for r in timed)
    assert (plots / "broadcast.png").stat().st_size > 10_000


def test_unknown_study_is_an_error(tmp_path):
    p = _bench("--quick", "--study", "nope", "--json", str(tmp_path / "x.json"))
    assert p.returncode != 0
    assert "unknown study" in p.stderr


def test_quick_fuse_benchmark_reports_both_autodiff_references(tmp_path):
    """`python -m bench fuse --quick`: every variant checked against autodiff before timing,
    ratios against autodiff of jax.scipy.stats and of the kernel's own element function,
    and a target line for each reading of "autodiff of the same formula"."""
    out_json = tmp_path / "fuse.json"
    p = _bench("fuse", "--quick", "--kernels", "gamma", "--json", str(out_json))
    assert p.returncode == 0, p.stderr
    assert "| no fuse-built kernel slower than autodiff of its own element function" in p.stdout
    assert "| no fuse-built kernel slower than autodiff of the jax.scipy.stats" in p.stdout
    doc = json.loads(out_json.read_text())
    assert [r["n"] for r in doc["results"]] == [10**3, 10**4]
    for r in doc["results"]:
        med = {k: v["median"] for k, v in r["variants"].items()}
        q = r["ratios"]
        assert q["autodiff_f_vg_over_fused_vg"] == pytest.approx(
            med["autodiff[f].vg"] / med["fused.vg"])
        assert q["autodiff_f_value_over_fused_value"] == pytest.approx(
            med["autodiff[f].value"] / med["fused.value"])
        assert all(c["value_rel_err"] <= 1e-9 for c in r["check"].values())
        # Up to fusedlp._xla.SMALL gamma's value path is the plain sum of its element
        # function, one program with autodiff[f]'s (an A/A pair); above, its select-free
        # form is summed instead, another program (at every size off XLA:CPU's layouts).
        assert r["value_programs_identical"] is _xla.below(r["n"], _xla.SMALL)
    assert "| A/A noise: the same compiled program timed as two variants" in p.stdout


def test_quick_kernel_benchmark_times_an_aa_pair(tmp_path):
    """`python -m bench kernels`: the first autodiff baseline is compiled twice and timed as
    two variants; their ratio (the run's noise) is in the JSON and in the targets table,
    and "slower than autodiff" is judged beyond that noise."""
    out_json = tmp_path / "kernels.json"
    p = _bench("kernels", "--quick", "--kernels", "eam", "--dtypes", "float64",
               "--min-n", "100", "--max-n", "1000", "--json", str(out_json))
    assert p.returncode == 0, p.stderr
    assert "| A/A noise: autodiff timed against a second compilation of itself |" in p.stdout
    assert "| fused grad never slower than autodiff grad beyond noise (10%) |" in p.stdout
    doc = json.loads(out_json.read_text())
    assert [r["n"] for r in doc["results"]] == [100, 1000]
    for r in doc["results"]:
        med = {k: v["median"] for k, v in r["variants"].items()}
        for kind in ("value", "grad", "vg"):
            assert r["ratios"][f"aa_{kind}"] == pytest.approx(
                med[f"plain.{kind}"] / med[f"aa.{kind}"])
            assert r["check"]["errors"][f"aa.{kind}"]  # checked before timing, like the rest
    (aa,) = [t for t in doc["targets_float64"] if t["target"].startswith("A/A")]
    assert aa["met"] is None and len(aa["measured"]) == 2 * 3


# ------------------------------------------------------------------ sharding and throughput


def test_quick_sharding_check_finds_no_gather(tmp_path):
    """`python -m bench sharding --quick`: four forced CPU devices in a subprocess; the
    sharded programs reduce scalars across devices and never gather the data."""
    out_json = tmp_path / "sh.json"
    p = _bench("sharding", "--quick", "--json", str(out_json))
    assert p.returncode == 0, p.stderr
    assert "| kernel | dtype | N | 1 device ms (IQR) | 4 devices ms (IQR) |" in p.stdout
    doc = json.loads(out_json.read_text())
    assert "--xla_force_host_platform_device_count=4" in doc["machine"]["xla_flags"]
    rows = doc["results"]
    assert {r["kernel"] for r in rows} == {"normal", "poisson_log"}
    for r in rows:
        assert r["collectives"]["all-reduce"] >= 1, r
        assert r["collectives"]["all-gather"] == r["collectives"]["all-to-all"] == 0, r
        assert r["grad_sharding_kept"] is True, r
        assert r["one_device"]["median"] > 0 and r["sharded"]["median"] > 0
        assert r["ratio_sharded_over_one"] == pytest.approx(
            r["sharded"]["median"] / r["one_device"]["median"])


def _bench_module(monkeypatch, name):
    """A module of the benchmark package, which is not installed: import it from the checkout."""
    monkeypatch.syspath_prepend(str(ROOT))
    return importlib.import_module(name)


def test_throughput_mode_reports_fraction_of_peak(tmp_path, monkeypatch):
    """The GPU bandwidth report (`--throughput`) end to end, on the CPU with a given peak:
    bytes moved per element, GB/s = bytes / time per pipelined call, fraction = GB/s /
    peak, and the float32 target line at the largest N."""
    bytes_per_element = _bench_module(monkeypatch, "bench.sharding").bytes_per_element

    out_json = tmp_path / "tp.json"
    p = _bench("sharding", "--throughput", "--quick", "--max-n", "1e4", "--peak-gbps", "40",
               "--json", str(out_json))
    assert p.returncode == 0, p.stderr
    assert "Target >= 70 % of peak, `normal` float32 N = 10^4:" in p.stdout
    assert "Target >= 70 % of peak, `poisson_log` float32 N = 10^4:" in p.stdout
    doc = json.loads(out_json.read_text())
    rows = doc["results"]
    assert {(r["kernel"], r["dtype"]) for r in rows} == {
        (k, d) for k in ("normal", "poisson_log") for d in ("float32", "float64")}
    for r in rows:
        assert r["n"] == 10**4 and r["peak_gbps"] == 40.0
        itemsize = 4 if r["dtype"] == "float32" else 8
        assert r["bytes_moved"] == bytes_per_element(r["kernel"], itemsize) * r["n"]
        for name in ("fused", "autodiff"):
            v = r[name]
            assert v["gbps"] == pytest.approx(r["bytes_moved"] / v["pipelined_s"] / 1e9)
            assert v["fraction_of_peak"] == pytest.approx(v["gbps"] / 40.0)


@pytest.mark.parametrize("kind, gbps", [
    ("NVIDIA H100 80GB HBM3", 3350.0),
    ("NVIDIA H100 PCIe", 2000.0),
    ("NVIDIA H100 NVL", 3900.0),
    ("NVIDIA H200", 4800.0),
    ("NVIDIA GH200 480GB", 4000.0),
    ("NVIDIA A100-SXM4-80GB", 2039.0),
    ("NVIDIA A100-SXM4-40GB", 1555.0),
    ("NVIDIA L40S", 864.0),
    ("NVIDIA L4", 300.0),
    ("Tesla T4", 320.0),
    ("cpu", None),
])
def test_peak_bandwidth_by_device_kind(kind, gbps, monkeypatch):
    assert _bench_module(monkeypatch, "bench.sharding").peak_bandwidth_gbps(kind) == gbps


# ------------------------------------------------------------------------ contexts


def test_quick_contexts_benchmark_reports_every_context(tmp_path):
    """`python -m bench contexts`: per kernel, the seven calling contexts' time ratios against
    autodiff of jax.scipy.stats, the XLA temporaries of both programs, two NumPyro rows and
    the issue's targets, in markdown and in the JSON."""
    out_json = tmp_path / "contexts.json"
    p = _bench("contexts", "--quick", "--kernels", "poisson,gamma", "--json", str(out_json))
    assert p.returncode == 0, p.stderr
    assert "| kernel | baseline | N | args i32 | args i64 | closed | vmap x10 | while x5 |" \
        in p.stdout
    assert "NumPyro: Poisson regression" in p.stdout and "### Targets (this run)" in p.stdout
    doc = json.loads(out_json.read_text())
    assert [r["kernel"] for r in doc["rows"]] == ["poisson", "gamma"]
    for r in doc["rows"]:
        from bench.contexts import CONTEXTS

        assert list(r["contexts"]) == list(CONTEXTS)
        for c in r["contexts"].values():
            assert c["ratio"] == pytest.approx(c["baseline_s"] / c["fusedlp_s"])
            assert c["temp_arrays_fusedlp"] >= 0 and c["temp_arrays_baseline"] >= 0
    # the NumPyro potential with the kernel normalized, then with normalized=False
    assert [r["normalized"] for r in doc["numpyro"]] == [True, False]
    assert all(r["ratio"] > 0 for r in doc["numpyro"]) and len(doc["targets"]) == 5


def test_contexts_benchmark_refuses_to_time_a_kernel_that_disagrees():
    import dataclasses

    from bench import contexts

    case = next(c for c in contexts._cases() if c.name == "poisson")
    wrong = dataclasses.replace(case, fused=lambda d, rate: case.fused(d, rate) + 1.0)
    with pytest.raises(RuntimeError, match="value"):
        contexts.bench_case(wrong, 1000, {"min_repeats": 1, "min_total": 0.0,
                                          "max_total": 0.01})


def test_quick_hessian_benchmark_reports_both_workloads(tmp_path):
    """`python -m bench hessian`: per kernel, fusedlp.hessian against jax.hessian of
    autodiff, with respect to scalar parameters and to regression coefficients, both
    checked to agree before timing, with compile times, in markdown and in the JSON."""
    out_json = tmp_path / "hessian.json"
    p = _bench("hessian", "--quick", "--kernels", "poisson_log,gamma", "--json", str(out_json))
    assert p.returncode == 0, p.stderr
    assert "| kernel | N | workload | size | fused µs | autodiff µs |" in p.stdout
    doc = json.loads(out_json.read_text())
    assert [r["kernel"] for r in doc["rows"]] == ["poisson_log", "gamma"]
    for r in doc["rows"]:
        from bench.hessian import WORKLOADS

        assert list(r["workloads"]) == list(WORKLOADS)
        sizes = {wl: w["size"] for wl, w in r["workloads"].items()}
        assert sizes == {"scalar": 1 if r["kernel"] == "poisson_log" else 2, "glm": 5}
        for w in r["workloads"].values():
            assert w["ratio"] == pytest.approx(w["autodiff_s"] / w["fused_s"])
            assert w["max_rel_diff"] <= 1e-7 and w["compile_fused_s"] > 0
    from bench import summary

    assert "### Hessians (`python -m bench hessian`)" in summary.render(
        str(tmp_path), ("hessian",))


def test_hessian_benchmark_refuses_to_time_a_kernel_that_disagrees():
    import dataclasses

    from bench import contexts, hessian

    case = next(c for c in contexts._cases() if c.name == "gamma")
    wrong = dataclasses.replace(
        case, fused=lambda d, shape, rate: case.fused(d, shape, rate) + 0.01 * shape**3)
    with pytest.raises(RuntimeError, match="Hessians differ"):
        hessian.bench_case(wrong, 1000, {"min_repeats": 1, "min_total": 0.0,
                                         "max_total": 0.01})
