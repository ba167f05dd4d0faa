"""Model sources: what ``--model`` / an Experiment's ``model`` may name, resolved to a local folder.

:func:`resolve_model` turns a model source into a local folder: a folder holding ``config.json``,
``builtin:tiny-qwen2`` (built here once, offline, by :mod:`autorl.models.tiny`), or a Hugging Face
hub id ``org/name`` (downloaded once into the models cache, :mod:`autorl.layout`). What a submitted
checkpoint may hold, and how it is checked and copied for evaluation, is :mod:`autorl.checkpoints.snapshot`.

huggingface_hub (and, for the builtin model, torch, tokenizers and safetensors) are imported inside
the functions that need them: the grader takes snapshots of checkpoints without any of them installed.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from autorl.errors import ModelSourceError, ModelSourceUnreachableError
from autorl.layout import BUILTIN_PREFIX, builtin_model_subpath, hub_model_subpath
from autorl.models.tiny import build_tiny_qwen2

#: Only what evaluation and training read: pickle weights and duplicate formats are never fetched.
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
WEIGHT_SUFFIX = ".safetensors"
#: builtin:NAME → a builder writing the model into the folder it is given.
BUILTIN_MODELS: dict[str, Callable[[Path], Path]] = {"tiny-qwen2": build_tiny_qwen2}

#: A Hugging Face hub id, ``org/name`` (a regular expression that Python and Go's RE2 read alike).
HUB_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"
_HUB_ID = re.compile(HUB_ID_PATTERN)
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def resolve_model(source: str, models_dir: Path) -> Path:
    """A local folder holding the model named by ``source``; builds or downloads it once.

    ``source`` is an existing folder with ``config.json``, ``builtin:NAME`` or a hub id
    ``org/name``. Raises :class:`ModelSourceError` with the fix when it cannot be resolved.
    """
    if source.startswith(BUILTIN_PREFIX):
        return _resolve_builtin(source[len(BUILTIN_PREFIX) :], models_dir)
    local = Path(source).expanduser()
    if local.exists() or not _HUB_ID.fullmatch(source) or ".." in source:
        return _resolve_local(local)
    return _download_from_hub(source, models_dir)


def model_dir_name(source: str) -> str:
    """The folder name of a model source inside a workspace's ``models/``.

    ``builtin:tiny-qwen2`` → ``tiny-qwen2``, ``Qwen/Qwen2.5-1.5B`` → ``Qwen2.5-1.5B``, a local
    folder → its own name; characters unsafe in a path become ``-``.
    """
    if source.startswith(BUILTIN_PREFIX):
        raw = source[len(BUILTIN_PREFIX) :]
    elif Path(source).expanduser().exists() or not _HUB_ID.fullmatch(source):
        raw = Path(source).expanduser().resolve().name
    else:
        raw = source.split("/", 1)[1]
    name = _UNSAFE_NAME_CHARS.sub("-", raw).strip("-")
    return name if name not in ("", ".", "..") else "model"


def reference_model_subpath(source: str) -> str | None:
    """Where the reference puts a hub model inside ``models/``: ``Qwen/Qwen2.5-1.5B`` →
    ``Qwen/Qwen2.5-1.5B`` (the workspace links it to ``models/<model_dir_name>``); None for a
    built-in model or a local folder, and where the organisation's name is the model folder's own."""
    if (
        source.startswith(BUILTIN_PREFIX)
        or Path(source).expanduser().exists()
        or not _HUB_ID.fullmatch(source)
    ):
        return None
    org = _UNSAFE_NAME_CHARS.sub("-", source.split("/", 1)[0]).strip("-")
    name = model_dir_name(source)
    return None if org in ("", ".", "..", name) else f"{org}/{name}"


def _resolve_local(folder: Path) -> Path:
    if not folder.exists():
        raise ModelSourceError(
            f"model folder {folder} does not exist; pass an existing folder that holds config.json, "
            f"a Hugging Face hub id (org/name) or one of {_builtin_names()}"
        )
    if not folder.is_dir():
        raise ModelSourceError(f"model source {folder} is a file; pass the folder that holds config.json")
    if not (folder / "config.json").is_file():
        raise ModelSourceError(
            f"model folder {folder} has no config.json; pass a folder written by save_pretrained "
            "(config.json, tokenizer files and weights)"
        )
    return folder.resolve()


def _builtin_names() -> str:
    return ", ".join(f"{BUILTIN_PREFIX}{name}" for name in sorted(BUILTIN_MODELS))


def _resolve_builtin(name: str, models_dir: Path) -> Path:
    builder = BUILTIN_MODELS.get(name)
    if builder is None:
        raise ModelSourceError(
            f"unknown builtin model {BUILTIN_PREFIX}{name}; use one of: {_builtin_names()}"
        )
    target = models_dir / builtin_model_subpath(name)
    return _build_once(target, builder)


def _build_once(target: Path, builder: Callable[[Path], Path]) -> Path:
    """Build into a temporary sibling and rename: a reader sees no folder or a complete one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if (target / "config.json").is_file():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            builder(staging)
            # mkdtemp makes the folder 0700; the model is meant to be read by other users (an agent).
            staging.chmod(0o755)
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target


def _download_from_hub(repo_id: str, models_dir: Path) -> Path:
    import httpx
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        RepositoryNotFoundError,
    )

    target = models_dir / hub_model_subpath(repo_id)
    # A marker beside the folder, written after a full download: snapshot_download asks the hub
    # even when the files are all there, and a cached model must keep working offline.
    complete = target.parent / f".{target.name}.complete"
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if complete.is_file() and (target / "config.json").is_file():
            return target
        try:
            snapshot_download(repo_id, local_dir=target, allow_patterns=HUB_ALLOW_PATTERNS)
        except RepositoryNotFoundError as exc:
            raise ModelSourceError(
                f"{repo_id} is not a model on the Hugging Face hub (or is private); check the id, "
                "set HF_TOKEN for a private model, or pass a local folder that holds config.json"
            ) from exc
        except GatedRepoError as exc:
            raise ModelSourceError(
                f"{repo_id} is gated on the Hugging Face hub; accept its license on the hub and set "
                "HF_TOKEN, or pass a local folder that holds config.json"
            ) from exc
        except HFValidationError as exc:
            raise ModelSourceError(
                f"{repo_id} is not a valid Hugging Face hub id ({_first_line(exc)}); write it as org/name, "
                "e.g. Qwen/Qwen2.5-1.5B"
            ) from exc
        except (HfHubHTTPError, httpx.HTTPError, OSError) as exc:
            raise ModelSourceUnreachableError(
                f"cannot download {repo_id} from the Hugging Face hub ({type(exc).__name__}: "
                f"{_first_line(exc)}); pre-download it where the hub is reachable "
                f"(`hf download {repo_id} --local-dir DIR`) and pass DIR as the model"
            ) from exc
        if not (target / "config.json").is_file():
            raise ModelSourceError(
                f"{repo_id} on the Hugging Face hub has no config.json; it is not a transformers model"
            )
        if not any(target.glob(f"*{WEIGHT_SUFFIX}")):
            raise ModelSourceError(
                f"{repo_id} publishes no safetensors weights; convert it (load it and save_pretrained "
                "into a folder) and pass that folder as the model"
            )
        complete.touch()
    return target


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no detail"
