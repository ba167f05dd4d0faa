"""Print the CPU side of docker/evaluator-worker.lock: what OpenCompass and the worker need, pinned
and hashed as the lock pins them, without the CUDA packages that OpenCompass's requirements pull in
(torch, triton, nvidia-*, cuda-*) and without what only those need. Both evaluator images install it
into OpenCompass's environment with `pip install --no-deps --require-hashes`, then the CPU build of
torch (whose own dependencies pip resolves for the image's Python; generation on a GPU happens in the
gpu image's second environment, docker/evaluator-vllm.lock); `make setup` installs
.venv-opencompass under the same pins (`--constraints`: `name==version` lines only), so they all
hold one set of versions.

    python3 docker/lock_cpu_side.py docker/evaluator-worker.lock > cpu.lock
    python3 docker/lock_cpu_side.py --constraints docker/evaluator-worker.lock > constraints.txt

Reads the `# via` annotations that `uv pip compile` writes: a package belongs to the CPU side when
the `.in` file asks for it or a package of the CPU side needs it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = "-r "
CUDA_NAMES = {"torch", "triton"}
CUDA_PREFIXES = ("nvidia-", "cuda-")
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)(\[[^\]]*\])?==(\S+)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(lock_text: str) -> dict[str, tuple[str, set[str], str]]:
    """name -> (version, the names it is needed by (ROOT for the .in file), the entry's text)."""
    entries: dict[str, tuple[str, set[str], str]] = {}
    name = ""
    for line in lock_text.splitlines():
        match = _REQUIREMENT.match(line)
        if match:
            name = _normal(match.group(1))
            entries[name] = (match.group(3), set(), line + "\n")
            continue
        if not name:
            continue
        version, parents, text = entries[name]
        stripped = line.strip()
        if stripped.startswith("--hash="):
            entries[name] = (version, parents, text + line + "\n")
        elif stripped.startswith("#"):
            parent = stripped.lstrip("#").strip()
            parent = parent[len("via") :].strip() if parent.startswith("via") else parent
            if parent:
                parents.add(ROOT if parent.startswith(ROOT) else _normal(parent))
    for _name, (_version, _parents, text) in entries.items():
        if not text.rstrip().endswith("\\") and "--hash=" not in text:
            raise ValueError(f"{_name}: the lock must carry hashes (uv pip compile --generate-hashes)")
    return entries


def is_cuda(name: str) -> bool:
    return name in CUDA_NAMES or name.startswith(CUDA_PREFIXES)


def cpu_side(lock_text: str) -> dict[str, str]:
    """The CPU side's entries, name -> pinned and hashed requirement text, in the lock's order."""
    entries = parse(lock_text)
    excluded = {n for n in entries if is_cuda(n)}
    side = {n for n, (_v, parents, _t) in entries.items() if ROOT in parents} - excluded
    grown = True
    while grown:
        more = {n for n, (_v, parents, _t) in entries.items() if parents & side} - side - excluded
        side |= more
        grown = bool(more)
    return {n: text for n, (_v, _p, text) in entries.items() if n in side}


def main(argv: list[str]) -> int:
    constraints = "--constraints" in argv[1:]
    paths = [arg for arg in argv[1:] if arg != "--constraints"]
    if len(paths) != 1:
        print("usage: lock_cpu_side.py [--constraints] LOCK_FILE", file=sys.stderr)
        return 2
    side = cpu_side(Path(paths[0]).read_text())
    if "opencompass" not in side:
        print(f"{paths[0]}: no opencompass pin in the lock", file=sys.stderr)
        return 1
    if constraints:
        sys.stdout.write("".join(text.split(" ", 1)[0].rstrip("\\\n") + "\n" for text in side.values()))
    else:
        sys.stdout.write("".join(side.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
