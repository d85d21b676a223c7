"""Device profiles: data in profiles.json, or a calibrated JSON file the user wrote."""
import json
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
    if not isinstance(profile, dict):
        raise ValueError(f"the profile {source} is not a JSON object of a device's figures")
    missing = {"peak_flops", "memory_gib", "devices_per_node", "intra", "inter",
               "efficiency"} - set(profile)
    if missing:
        raise ValueError(f"profile {source} lacks {sorted(missing)}")


def peak_flops(profile, precision):
    """The profile's peak for a precision, e.g. bfloat16 for mixed precision."""
    for key in precision.flops_keys:
        if key in profile["peak_flops"]:
            return key, profile["peak_flops"][key]
    raise ValueError(f"device {profile['name']!r} has no peak flops for dtype {precision.name!r} "
                     f"(looked for {precision.flops_keys}, has {sorted(profile['peak_flops'])})")
