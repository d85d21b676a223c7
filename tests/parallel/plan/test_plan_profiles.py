"""Device profiles (parallel.plan.profiles): every figure of a user's JSON profile is checked
before the planner divides by it or ranks with it, in one line naming the figure and its value."""
import json
import math

import pytest

from parallel.plan.__main__ import main
from parallel.plan.profiles import check_profile, packaged_profiles


def error_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("name", sorted(packaged_profiles()))
def test_every_packaged_profile_passes_the_checks(name):
    check_profile(packaged_profiles()[name], name)


@pytest.mark.parametrize("path, value, must", [
    (("peak_flops", "float32"), -5e10, "> 0"),
    (("peak_flops", "float32"), math.inf, "a finite number"),
    (("memory_gib",), math.nan, "a finite number"),
    (("memory_gib",), 0, "> 0"),
    (("efficiency",), 0, "in (0, 1]"),
    (("efficiency",), 1.5, "in (0, 1]"),
    (("intra", "bandwidth_gbps"), 0, "> 0"),
    (("inter", "alpha_us"), -1, "≥ 0"),
    (("devices_per_node",), 2.5, "a whole number ≥ 1"),
    (("inter", "bandwidth_gbps"), "fast", "a finite number"),
    (("cluster", "nic_efficiency"), 0, "in (0, 1]"),
    (("cluster", "peak_flops"), -1.0, "> 0"),
])
def test_a_bad_figure_is_one_line_naming_it(path, value, must, tmp_path, capsys):
    profile = {**packaged_profiles()["a100-80gb"]}
    profile = json.loads(json.dumps(profile))
    target = profile
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    file = tmp_path / "device.json"
    file.write_text(json.dumps(profile))  # json writes NaN and Infinity, and reads them back
    line = error_line(["--config", "small", "--devices", "2", "--device", str(file)], capsys)
    assert f"--device {file}: profile {file}: {'.'.join(path)} = {value!r} must be {must}" in line


@pytest.mark.parametrize("output, why", [("afile/x.json", "Not a directory"), (".", "Is a directory")])
def test_calibrate_refuses_an_output_it_cannot_write_before_measuring(output, why, tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    line = error_line(["--calibrate", "--output", str(tmp_path / output)], capsys)
    assert line.endswith(f"--output {tmp_path / output} cannot be written ({why}): give a writable file path")
