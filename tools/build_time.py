"""Side by side on this machine, in a fresh clone of HEAD: ``make setup``'s three Python environments
installed one after another and side by side, and ``make images GPU=0`` one image after another
(``PARALLEL=0``) and side by side, each from a cold pip cache (the images also from cold podman
layers). Writes ``bench/results/build_time.json``; docs/RELIABILITY.md, "Suite time", shows it
(``tools/reliability_doc.py``).

    .venv/bin/python -m tools.build_time [--only setup|images ...]

The images part needs podman and the base image that ``make images`` made or pulled (run it once
first), and it removes every podman image but that base before each build, so that no layer is
reused: run ``make images`` again afterwards. Commit first: the clone holds what HEAD holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "build_time.json"
ENVIRONMENTS = [".venv/.installed", ".venv-agent/.installed", ".venv-opencompass/.installed"]
#: The base images ``docker/build-images.sh`` uses, in its order of preference.
BASES = ["docker.io/library/python:3.11-slim", "localhost/autorl/python:3.11-bookworm"]
MODES = {"sequential": "0", "parallel": "1"}


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": str(REPO_ROOT / "docker" / "containers.conf")}
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check, env=env)


def timed(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        code = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return {"seconds": round(time.monotonic() - started, 1), "exit_code": code, "log": str(log)}


def measure_setup(clone: Path, scratch: Path) -> dict[str, Any]:
    """The three environments (what ``make setup`` installs beside the system packages)."""
    results = {}
    for mode in ("parallel", "sequential"):
        for environment in ENVIRONMENTS:
            shutil.rmtree(clone / Path(environment).parent, ignore_errors=True)
        cache = scratch / f"pip-cache-setup-{mode}"
        jobs = ["-j3", "--output-sync=target"] if mode == "parallel" else []
        env = {**os.environ, "PIP_CACHE_DIR": str(cache)}
        results[mode] = timed(["make", *jobs, *ENVIRONMENTS], clone, env, scratch / f"setup-{mode}.log")
        print(f"setup {mode}: {results[mode]}", file=sys.stderr, flush=True)
    return results


def remove_images_but(base: str) -> None:
    keep = podman("image", "inspect", "--format", "{{.Id}}", base).stdout.strip()
    listed = podman("images", "-a", "--format", "{{.ID}}").stdout.split()
    ids = {image for image in listed if not keep.startswith(image)}
    if ids:
        podman("rmi", "-f", *sorted(ids))


def measure_images(clone: Path, scratch: Path) -> dict[str, Any]:
    if shutil.which("podman") is None:
        sys.exit("tools.build_time: podman is not installed; run `make images GPU=0` once first")
    base = next(
        (image for image in BASES if podman("image", "exists", image, check=False).returncode == 0),
        None,
    )
    if base is None:
        sys.exit("tools.build_time: no base image; run `make images GPU=0` once first (it makes one)")
    results = {}
    for mode in ("parallel", "sequential"):
        remove_images_but(base)
        env = {
            **os.environ,
            "GPU": "0",
            "PARALLEL": MODES[mode],
            "BASE_IMAGE": base,
            "PIP_CACHE_DIR": str(scratch / f"pip-cache-images-{mode}"),
        }
        results[mode] = timed(["docker/build-images.sh"], clone, env, scratch / f"images-{mode}.log")
        print(f"images {mode}: {results[mode]}", file=sys.stderr, flush=True)
    remove_images_but(base)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=["setup", "images"], default=["setup", "images"])
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    scratch = Path(tempfile.mkdtemp(prefix="autorl-build-time-"))
    clone = scratch / "autorl"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(clone)], check=True)
    record: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    record.update(
        {
            "date": datetime.now(UTC).date().isoformat(),
            "commit": commit,
            "machine": {"cpus": os.cpu_count()},
            "command": "python -m tools.build_time",
        }
    )
    if "setup" in args.only:
        record["setup"] = measure_setup(clone, scratch)
    if "images" in args.only:
        record["images"] = measure_images(clone, scratch)
    RESULTS.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    failed = [
        part for part in ("setup", "images") for run in record.get(part, {}).values() if run["exit_code"]
    ]
    print(f"wrote {RESULTS}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
