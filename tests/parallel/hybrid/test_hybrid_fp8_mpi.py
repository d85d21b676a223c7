"""FP8 recipes under real mpiexec: `python -m parallel.train --check` on 4 ranks equals one
device under the same recipe (float64 around the FP8 products) to 1e-9."""
import re

from mpi_launch import requires_mpiexec, run_mpi

TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "16", "--digits", "2", "--steps", "3"]


@requires_mpiexec
def test_fp8_delayed_and_blockwise_on_four_ranks_equal_one_device_under_the_same_recipe():
    for layout in (["--dp", "2", "--tp", "2", "--zero", "2", "--precision", "fp8-delayed"],
                   ["--tp", "2", "--pp", "2", "--microbatches", "2", "--precision", "fp8-blockwise", "--fp8-tile", "4"]):
        result = run_mpi(4, ["-m", "parallel.train", *TINY, *layout, "--check", "3"], timeout=240)
        worst = float(re.search(r"largest relative difference to one device over 3 step\(s\): (\S+)",
                                result.stdout).group(1))
        assert worst <= 1e-9, result.stdout


@requires_mpiexec
def test_fp8_experts_on_four_ranks_equal_one_device_under_the_same_recipe():
    """Expert parallelism over real ranks: each routed expert's amaxes MAX-reduced over its replicas (edp)."""
    for layout in (["--dp", "4", "--ep", "2", "--zero", "2", "--precision", "fp8-delayed"],
                   ["--dp", "2", "--ep", "2", "--tp", "2", "--shared-experts", "1", "--precision", "fp8-blockwise",
                    "--fp8-tile", "4"]):
        result = run_mpi(4, ["-m", "parallel.train", *TINY, "--experts", "4", *layout, "--check", "3"], timeout=240)
        worst = float(re.search(r"largest relative difference to one device over 3 step\(s\): (\S+)",
                                result.stdout).group(1))
        assert worst <= 1e-9 and "ep all_to_all" in result.stdout, result.stdout


@requires_mpiexec
def test_fp8_current_on_four_ranks_reduces_each_casts_amax_and_equals_one_device():
    """Current scaling over real ranks: every cast's amax MAX-reduced over tp and dp (a routed expert's over
    edp) inside forward and backward, one small all-reduce per cast."""
    for layout in (["--dp", "2", "--tp", "2", "--zero", "2"], ["--dp", "4", "--ep", "2", "--experts", "4"]):
        result = run_mpi(4, ["-m", "parallel.train", *TINY, *layout, "--precision", "fp8-current", "--check", "3"],
                         timeout=240)
        worst = float(re.search(r"largest relative difference to one device over 3 step\(s\): (\S+)",
                                result.stdout).group(1))
        assert worst <= 1e-9, result.stdout
