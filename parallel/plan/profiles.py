"""Device profiles: data in profiles.json, or a calibrated JSON file the user wrote."""
import json
import math
import os
from pathlib import Path

PACKAGED = Path(__file__).with_name("profiles.json")


def cache_dir():
    """Where `--calibrate` writes by default: $XDG_CACHE_HOME or ~/.cache, never the package."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minitensor-parallel" / "profiles"


def packaged_profiles():
    profiles = json.loads(PACKAGED.read_text())
    return {name: value for name, value in profiles.items() if not name.startswith("_")}


def load_profile(name_or_path):
    """A packaged profile by name, a calibrated one in the cache dir by name, or a JSON path."""
    packaged = packaged_profiles()
    if name_or_path in packaged:
        return {"name": name_or_path, **packaged[name_or_path]}
    for path in (cache_dir() / f"{name_or_path}.json", Path(name_or_path)):
        if path.is_file():
            profile = read_json(path)
            check_profile(profile, path)
            return {"name": profile.get("name", path.stem), **profile}
    raise ValueError(f"unknown device {name_or_path!r}: not one of {', '.join(packaged)}, "
                     f"not in {cache_dir()} and not a JSON file")


def read_json(path):
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"the profile {path} is not JSON ({error})") from None


def check_profile(profile, source):
    """Every figure of a device profile, named with its value when it is not what the cost model
    divides by or multiplies with: rates, sizes and counts positive and finite, efficiencies in
    (0, 1], latencies finite and ≥ 0 (a negative peak ranked negative step times; a zero
    efficiency or bandwidth divided by zero)."""
    if not isinstance(profile, dict):
        raise ValueError(f"the profile {source} is not a JSON object of a device's figures")
    missing = {"peak_flops", "memory_gib", "devices_per_node", "intra", "inter",
               "efficiency"} - set(profile)
    if missing:
        raise ValueError(f"profile {source} lacks {sorted(missing)}")
    for kind in ("peak_flops", "intra", "inter"):
        if not isinstance(profile[kind], dict) or not profile[kind]:
            raise ValueError(f"profile {source}: {kind} must be a JSON object of figures, got {profile[kind]!r}")
    figures = {"memory_gib": profile["memory_gib"], "devices_per_node": profile["devices_per_node"],
               "efficiency": profile["efficiency"], **{f"peak_flops.{k}": v for k, v in profile["peak_flops"].items()},
               **{f"{kind}.{k}": profile[kind].get(k) for kind in ("intra", "inter")
                  for k in ("alpha_us", "bandwidth_gbps")},
               **{f"cluster.{k}": v for k, v in profile.get("cluster", {}).items() if k != "gemm_tiles"}}
    for name, value in figures.items():
        problem = figure_problem(name, value)
        if problem:
            raise ValueError(f"profile {source}: {name} = {value!r} must be {problem}")


def figure_problem(name, value):
    """What `value` must be for the figure `name`, or None if it is that."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "a finite number"
    if name.endswith("efficiency"):
        return None if 0 < value <= 1 else "in (0, 1]: the fraction of the peak reached"
    if name.endswith("alpha_us"):
        return None if value >= 0 else "≥ 0 (a latency in µs)"
    if name.endswith(("devices_per_node", "gpus_per_node", "sms")):
        return None if value >= 1 and value == int(value) else "a whole number ≥ 1"
    return None if value > 0 else "> 0"


def peak_flops(profile, precision):
    """The profile's peak for a precision, e.g. bfloat16 for mixed precision."""
    for key in precision.flops_keys:
        if key in profile["peak_flops"]:
            return key, profile["peak_flops"][key]
    raise ValueError(f"device {profile['name']!r} has no peak flops for dtype {precision.name!r} "
                     f"(looked for {precision.flops_keys}, has {sorted(profile['peak_flops'])})")
