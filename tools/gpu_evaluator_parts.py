"""The GPU evaluator's two environments as parts one device call each can carry to the GPU machine.

The GPU machine has torch 2.11 (CUDA 13) but neither OpenCompass nor vLLM, and a call carries at
most 64 MiB with the repository; files written outside the repository there stay while the machine
is warm. This builds, for CPython 3.12 on x86-64 Linux:

- ``oc/``: OpenCompass's environment, the OpenCompass side of ``docker/evaluator-worker.lock`` at its
  versions (OpenCompass 0.5.2, transformers 4.57.6, numpy 1.26.4, datasets 3.6.0 and the worker's
  own dependencies), without torch, triton and CUDA's libraries (the machine's torch serves, its
  jax left out) and
  without the packages that neither an OpenCompass GSM8K run nor the worker imports
  (:data:`NOT_IMPORTED`, found by recording every module each OpenCompass process had imported at
  its exit): beneath them the machine's own are never loaded;
- ``vllm/``: vLLM 0.25.0 and ``bench/data/vllm-0.25-serve-wheels.txt`` (the resident engine's);
- ``trl/``: ``bench/data/trl-1.16-wheels.txt`` (the GRPO comparison's);
- ``install.sh``: run there from the repository's root once the parts are joined: vLLM and TRL into
  ``/root/site`` (``pip --target``), OpenCompass's into the venv ``/root/oc`` (the machine's
  packages after its own, jax left out, and this repository, through ``.pth`` files), and
  ``/root/vllm-python``, the engine's Python for ``AUTORL_VLLM_PYTHON``.

All of it in one tar, split into ``OUT/pN/partN`` of ``--part-mib`` each; ``--for BENCHMARK`` builds
only the parts that benchmark imports (:data:`BENCHMARK_PARTS`: vLLM alone for the engine
benchmarks, vLLM and TRL for the GRPO comparison, OpenCompass's and vLLM for the worker end to
end), ``--parts`` names them, and ``install.sh`` installs what is there:

    .venv/bin/python -m tools.gpu_evaluator_parts [--out .vllm-parts] [--part-mib 56] \\
        [--for resident_engine_gpu | --parts oc vllm trl]
    # one device call per part, carrying .vllm-parts/pN:
    mkdir -p /root/parts && cp .vllm-parts/pN/partN /root/parts/
    # then, in the next call:
    mkdir -p /root/w && cat $(ls -v /root/parts/part*) | tar x -C /root/w && bash /root/w/install.sh
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from tools.gpu_wheelhouse import MANYLINUX, normalize

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCK = REPO_ROOT / "docker" / "evaluator-worker.lock"
VLLM_LIST = REPO_ROOT / "bench" / "data" / "vllm-0.25-serve-wheels.txt"
TRL_LIST = REPO_ROOT / "bench" / "data" / "trl-1.16-wheels.txt"
#: The machine's own torch (2.11, CUDA 13) serves OpenCompass's process, which runs no CUDA.
MACHINE_PROVIDES = ("torch", "triton")
#: Lock packages that neither an OpenCompass GSM8K run (its command, inference and evaluation
#: processes) nor the worker imports. opencv-python-headless alone is 50 MB.
NOT_IMPORTED = ("opencv-python-headless", "matplotlib", "fonttools", "lxml")
#: Platforms a cp312 wheel may be built for that the machine runs.
PLATFORMS = [
    *MANYLINUX,
    "manylinux1_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
]

#: What each GPU benchmark imports of the parts: only those are built for it (``--for``).
BENCHMARK_PARTS: dict[str, tuple[str, ...]] = {
    "resident_engine_gpu": ("vllm",),
    "engine_race_gpu": ("vllm",),
    "opencompass_vllm_gpu": ("vllm",),
    "vllm_warm_reload_gpu": ("vllm",),
    "grpo_trl_vllm_gpu": ("vllm", "trl"),
    "opencompass_worker_gpu": ("oc", "vllm"),
}
PARTS = ("oc", "vllm", "trl")

INSTALL = """#!/bin/bash
# Installs the joined parts (tools/gpu_evaluator_parts.py); run from the repository's root. Each
# part is installed where it was built: vllm/ and trl/ into /root/site, oc/ into the venv /root/oc.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PIP="-q --no-index --no-deps --no-compile"
SITE_WHEELS=$(ls "$HERE"/vllm/*.whl "$HERE"/trl/*.whl 2>/dev/null || true)
if [ -n "$SITE_WHEELS" ]; then
  python3 -m pip install $PIP --target /root/site $SITE_WHEELS
fi
if [ -d "$HERE/oc" ]; then
python3 -m venv --system-site-packages --without-pip /root/oc
/root/oc/bin/python -m pip install $PIP "$HERE"/oc/*.whl
# OpenCompass's Python sees, after its own packages: the machine's torch and what comes with it,
# but not its jax (transformers 4.57 imports jax where it finds it, and the machine's does not
# load), and this repository, as the image's worker environment has it installed (the chat
# template's renderer runs in an isolated interpreter: PYTHONPATH does not reach it).
MACHINE=$(cd /tmp && python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
mkdir -p /root/machine-site
for path in "$MACHINE"/*; do
  case $(basename "$path") in
    jax*|jaxlib*|_jax*|flax*|tensorflow*) ;;
    *) ln -sfn "$path" /root/machine-site/ ;;
  esac
done
OC_SITE=$(/root/oc/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo /root/machine-site > "$OC_SITE"/machine-site.pth
printf '%s\n%s\n' "$PWD" "$PWD/services/evaluator-worker" > "$OC_SITE"/autorl-repository.pth
CHECK="import opencompass, numpy, torch, transformers as t, transformers.image_transforms, autorl_evaluator"
PRINT="print(numpy.__version__, t.__version__, torch.__version__)"
(cd /tmp && env -i /root/oc/bin/python -c "$CHECK; $PRINT")
fi
if [ -d "$HERE/vllm" ]; then
ENGINE_ENV="PYTHONPATH=/root/site VLLM_USE_FLASHINFER_SAMPLER=0"
printf '#!/bin/sh\\nexport %s\\nexec %s "$@"\\n' "$ENGINE_ENV" "$(command -v python3)" > /root/vllm-python
chmod +x /root/vllm-python
/root/vllm-python -c "import vllm, transformers as t; print('engine:', vllm.__version__, t.__version__)"
fi
"""


def pinned(text: str) -> dict[str, str]:
    """name -> version of every ``name==version`` line (a lock's or a list's; comments and hash
    lines skipped)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip().rstrip("\\").strip()
        if "==" in line and not line.startswith("--"):
            name, version = line.split("==", 1)
            found[normalize(name.split("[")[0])] = version.split(";")[0].strip()
    return found


def opencompass_side(lock_text: str) -> dict[str, str]:
    """The lock's packages OpenCompass's environment takes to the GPU machine."""
    return {
        name: version
        for name, version in pinned(lock_text).items()
        if name not in MACHINE_PROVIDES and not name.startswith("nvidia-") and name not in NOT_IMPORTED
    }


def selected_parts(benchmark: str | None, parts: list[str] | None) -> tuple[str, ...]:
    """The parts to build: what ``benchmark`` imports, or ``parts``, or all of them."""
    if benchmark is not None:
        return BENCHMARK_PARTS[benchmark]
    return tuple(name for name in PARTS if parts is None or name in parts)


def part_packages(name: str) -> dict[str, str]:
    """The pinned packages of part ``name``."""
    if name == "oc":
        return opencompass_side(LOCK.read_text(encoding="utf-8"))
    return pinned((VLLM_LIST if name == "vllm" else TRL_LIST).read_text(encoding="utf-8"))


def download(packages: dict[str, str], target: Path) -> None:
    """Each package's wheel for the machine; one built here from its source where none is published."""
    target.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    platforms = [flag for name in PLATFORMS for flag in ("--platform", name)]
    for name, version in sorted(packages.items()):
        wanted = f"{name}=={version}"
        fetched = subprocess.run(
            [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
             "--implementation", "cp", *platforms, "-d", str(target), wanted],
            capture_output=True,
        )  # fmt: skip
        if fetched.returncode != 0:
            subprocess.run([*pip, "wheel", "--no-deps", "-w", str(target), wanted], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / ".vllm-parts")
    parser.add_argument("--part-mib", type=int, default=56, help="one part's size (a call carries 64 MiB)")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument(
        "--for", dest="benchmark", choices=sorted(BENCHMARK_PARTS), help="only what this benchmark imports"
    )
    chosen.add_argument("--parts", nargs="+", choices=PARTS, help="these environments only (default: all)")
    args = parser.parse_args()
    wanted = selected_parts(args.benchmark, args.parts)
    stage = args.out / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    for name in wanted:
        download(part_packages(name), stage / name)
    (stage / "install.sh").write_text(INSTALL, encoding="utf-8")
    archive = args.out / "all.tar"
    with tarfile.open(archive, "w") as tar:
        for path in sorted(stage.iterdir()):
            tar.add(path, arcname=path.name)
    for old in args.out.glob("p[0-9]*"):
        shutil.rmtree(old)
    size = args.part_mib * 2**20
    with archive.open("rb") as handle:
        index = 0
        while chunk := handle.read(size):
            part = args.out / f"p{index}"
            part.mkdir()
            (part / f"part{index}").write_bytes(chunk)
            index += 1
    total = archive.stat().st_size
    archive.unlink()
    shutil.rmtree(stage)
    print(
        f"{', '.join(wanted)}: {index} parts of {args.part_mib} MiB at most ({total / 2**20:.0f} MiB): "
        f"{args.out}/p0.."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
