"""The wheels that ``autorl run`` needs on a GPU machine whose image has PyTorch but not our services.

Builds wheels of the packages ``autorl run`` needs (``autorl``, the grader, the evaluator, the agent
runner and ``autorl-local``, which holds ``autorl run``; not the controller), then adds
every package their runtime needs reach that ``IMAGE_PACKAGES`` does not already hold, at the
version installed in this machine's ``.venv``, for CPython 3.12 on x86-64 Linux. Nothing of the
agent's TRL path or of the Kubernetes operator is needed there: the agent's GRPO runs on the
batched CUDA engine, GSM8K comes from ``AUTORL_DATA_SOURCE_DIR``.

    .venv/bin/python -m tools.gpu_wheelhouse [--target .whl] [--python-version 3.12]

On the GPU machine (the folder carried there), into the interpreter's own environment: the chat
template's renderer starts ``python -I``, which ignores ``PYTHONPATH`` (so no ``--target``):

    python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl

Writes ``TARGET/manifest.json``: each wheel's name, version and size, and the total.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The repository's packages, by distribution name → source folder.
OWN_PACKAGES = {
    "autorl": ".",
    "autorl-grader": "services/grader",
    "autorl-evaluator": "services/evaluator-worker",
    "autorl-agent-runner": "services/agent-runner",
    "autorl-local": "services/local-run",
}
#: What ``autorl run`` imports on the GPU machine, beyond the image (the roots of the closure).
#: ``autorl[ml]``'s heavy part (torch, transformers, safetensors, accelerate) is in the image;
#: ``datasets`` and ``trl`` are left out (see the module's first paragraph).
ROOTS = [
    "pydantic",
    "pydantic-settings",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "redis",
    "rq",
    "fastapi",
    "uvicorn",
    "h11",
    "prometheus-client",
]
#: Python packages of the GPU machines' image ('cuda'), as read there on 2026-11-17.
IMAGE_PACKAGES = frozenset(
    """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
    meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime
    onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
    packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
    pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
    python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
    scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
    sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
    tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
    urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
    """.split()  # noqa: SIM905 (a list read off the machine)
)
#: The largest wheelhouse one device call can carry beside the repository (64 MiB in all).
CARRY_LIMIT_BYTES = 48 * 1024 * 1024
MANYLINUX = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_closure(roots: list[str], python_version: str) -> dict[str, str]:
    """name → installed version of every package the roots need that the image lacks."""
    environment: dict[str, str] = {
        **{key: str(value) for key, value in default_environment().items()},
        "python_version": ".".join(python_version.split(".")[:2]),
        "python_full_version": python_version if python_version.count(".") == 2 else f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "implementation_name": "cpython",
    }
    found: dict[str, str] = {}
    pending = [Requirement(root) for root in roots]
    while pending:
        requirement = pending.pop()
        name = normalize(requirement.name)
        if name in found or name in IMAGE_PACKAGES:
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError as exc:
            raise SystemExit(f"{name} is not installed in this environment: run make setup first") from exc
        found[name] = distribution.version
        for extra in requirement.extras:
            pending.extend(_needs(distribution, environment, extra))
        pending.extend(_needs(distribution, environment, ""))
    return found


def _needs(distribution: metadata.Distribution, environment: dict[str, str], extra: str) -> list[Requirement]:
    needs = []
    for text in distribution.requires or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({**environment, "extra": extra}):
            if extra and (requirement.marker is None or "extra" not in str(requirement.marker)):
                continue
            needs.append(requirement)
    return needs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=REPO_ROOT / ".whl")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python: 3.12 or 3.12.3")
    args = parser.parse_args()
    if args.target.exists() and any(args.target.iterdir()):
        raise SystemExit(f"{args.target} is not empty: remove it first (one version of each wheel)")
    args.target.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    for folder in OWN_PACKAGES.values():
        # setuptools builds in the source folder; a build/ it leaves there would hold stale copies.
        build = REPO_ROOT / folder / "build"
        built_before = build.exists()
        subprocess.run(
            [
                *pip,
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(args.target),
                str(REPO_ROOT / folder),
            ],
            check=True,
        )
        if not built_before:
            shutil.rmtree(build, ignore_errors=True)
    needed = missing_closure(ROOTS, args.python_version)
    platforms = [flag for name in MANYLINUX for flag in ("--platform", name)]
    for name, version in sorted(needed.items()):
        subprocess.run(
            [
                *pip,
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                args.python_version,
                "--implementation",
                "cp",
                *platforms,
                "-d",
                str(args.target),
                f"{name}=={version}",
            ],
            check=True,
        )
    wheels = sorted(args.target.glob("*.whl"))
    total = sum(wheel.stat().st_size for wheel in wheels)
    manifest = {
        "python_version": args.python_version,
        "own": sorted(OWN_PACKAGES),
        "added": needed,
        "wheels": {wheel.name: wheel.stat().st_size for wheel in wheels},
        "total_bytes": total,
    }
    (args.target / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {args.target}: {', '.join(sorted(needed))}")
    if total > CARRY_LIMIT_BYTES:
        print(
            f"more than {CARRY_LIMIT_BYTES / 2**20:.0f} MiB: too large to carry with the repository",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
