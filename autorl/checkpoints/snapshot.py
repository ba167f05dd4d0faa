"""Submission snapshots: the model files, copied once into storage the agent cannot write.

At submit the grader opens the experiment's output folder with ``O_DIRECTORY|O_NOFOLLOW`` and walks
the submitted path one component at a time with ``openat(..., O_NOFOLLOW)``: no symbolic link is
followed anywhere, so a path cannot leave ``output/`` and nothing can be swapped in between two
checks. Entries of the folder are sorted by an allow-list:

- weights: ``model.safetensors``, or ``model.safetensors.index.json`` and the shards it names;
- ``config.json`` (required): checked against the base model's architecture, never evaluated;
- refused: ``adapter_config.json`` (an adapter: merge it first) and pickle weights without
  safetensors ones;
- everything else is ignored: never opened, never copied, listed in the answer (bounded:
  :data:`MAX_IGNORED_LISTED` names of :data:`MAX_IGNORED_NAME_CHARS` characters). That includes the
  submission's tokenizer files, chat template and ``generation_config.json``: a tokenizer is a
  program (its normalizer, pre-tokenizer, post-processor and decoder rewrite every test prompt and
  every completion), a chat template is one, and decoding settings choose where a completion is
  cut. **Only the weights come from the agent**: every other evaluated file is the base model's.

Each weight file (and the config and index) is opened ``O_NOFOLLOW|O_NONBLOCK`` and checked on its
descriptor (a regular file, under its size cap, not sparse) before it is read; weight headers are
checked against the base model's (:mod:`autorl.checkpoints.safetensors_header`) before any tensor
data is read.
The weights are then copied, hashed while copied, into a new folder under the snapshot root, beside
the base model's config, generation config, tokenizer and chat template (normalized as
:mod:`autorl.checkpoints.model_files` says). Every source file's size and modification time are compared again
just before the first tensor byte is read (a change by then is refused at no cost), after each chunk
of the copy (a change stops it there) and at the end. A refusal once tensor data has been read is a
:class:`~autorl.errors.CostlyCheckpointError`: the grader counts it against the submission limit,
since the read and the copy were made. The fingerprint is over what the
snapshot holds, so identical evaluated files, and only those, share a score; a copy of the base
model's weights has the baseline's fingerprint. The evaluator loads the snapshot, never the agent's
folder.

A snapshot belongs to one submission and is removed once that submission is final (by the
evaluator after recording the result, by the grader when a score is reused or, where evaluators
mount the snapshots read-only, by the grader's reconciler), unless it is kept for a sealed
experiment's final (autorl.store.sealed_final.snapshot_holders); :func:`prune_snapshots` removes what
a crash left behind. Every experiment's snapshots share one storage: the grader holds each
experiment to its share of it (autorl_grader.submissions.check_share).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import stat
import time
import uuid
from collections import deque
from collections.abc import Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autorl.checkpoints import model_files
from autorl.checkpoints.agent_names import MAX_NAME_CHARS, quoted, quoted_names, shown_value
from autorl.checkpoints.model_files import TOKENIZER_FILES
from autorl.checkpoints.safetensors_header import (
    Header,
    Tensor,
    check_name,
    compare_names,
    compare_to_base,
    read_header,
)
from autorl.errors import (
    AutoRLError,
    CheckpointError,
    CostlyCheckpointError,
    MalformedCheckpointError,
    ModelSourceError,
    ServiceUnavailableError,
    UnreadableCheckpointError,
)
from autorl.untrusted_text import printable, shortened

log = logging.getLogger("autorl.checkpoints")

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
ADDED_TOKENS = "added_tokens.json"
CHAT_TEMPLATE_JINJA = "chat_template.jinja"
CHAT_TEMPLATE_JSON = "chat_template.json"
ADAPTER_CONFIG = "adapter_config.json"
_MIB = 1024 * 1024
#: Size caps of the files read from a submission besides its weights, each far above what a real
#: model ships (a config is a few KiB, the index of a 1,000-shard model about 100 KiB): at most
#: 5 MiB of them is read and parsed per submission. The weights' headers are held to the base
#: model's (:attr:`BaseCheckpoint.header_allowance`), and the weights' size must equal what a header
#: with the base model's tensors declares. The base model's own files are the platform's.
SIZE_CAPS = {CONFIG: _MIB, WEIGHTS_INDEX: 4 * _MIB}
#: The base model's files that every snapshot holds besides the weights (the config is written
#: from the parsed base config; the chat template files are folded into the tokenizer config).
PLATFORM_FILES = frozenset({GENERATION_CONFIG, *TOKENIZER_FILES})
#: A folder with more entries is not a model folder; listing stops there.
MAX_ENTRIES = 10_000
MAX_SHARDS = 1_000
#: The longest shard file name an index may give (the longest file name most filesystems take).
MAX_SHARD_NAME_CHARS = 255
#: Header bytes a submission's shards may hold beyond twice what the base model's need.
HEADER_SLACK_BYTES = 64 * 1024
#: How many ignored names an answer lists (the first, sorted), and the most characters each one
#: takes there: past either, the answer says so (:func:`_listed`). The names are the agent's to
#: choose, and every answer about the submission carries them, GET /scores each submission's: bounded
#: so, a submission's ``ignored_files`` is about 2 KB of JSON for plain names and at most 13 KB
#: whatever the characters (150 names of 250 undecodable bytes each added 177 KB to each submission
#: in GET /scores when every listed name was whole and 100 were listed). A checkpoint saved by
#: ``Trainer`` leaves about a dozen files beside its weights (one ``rng_state`` more per GPU).
MAX_IGNORED_LISTED = 20
#: As many as a name takes in a refusal (autorl.checkpoints.agent_names).
MAX_IGNORED_NAME_CHARS = MAX_NAME_CHARS
#: Files above this size must have at least this fraction of their bytes allocated.
SPARSE_CHECK_MIN_BYTES = _MIB
MIN_DATA_FRACTION = 0.5
#: Weights are read, written and hashed in blocks this large; a weights file's digest is over its
#: blocks' digests, so the size is part of the fingerprint scheme below.
COPY_BLOCK_BYTES = 8 * _MIB
#: Blocks hashed at once, beside the copy (one core hashes more slowly than a copy between page
#: caches runs); each holds its block until hashed.
COPY_THREADS = max(1, min(4, os.cpu_count() or 1))
#: Small files (configs, an index) are read in pieces this large: each read allocates its size.
SMALL_READ_BYTES = _MIB
#: Free space the snapshot storage keeps after a copy, for the evaluators' own files.
MIN_FREE_BYTES = 1024 * _MIB
#: A snapshot folder nothing refers to is removed once its newest file is this old.
ORPHAN_GRACE_S = 3600.0
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: v3: a weights file's digest is over its blocks' digests (v2: over its bytes, one stream).
_FINGERPRINT_SCHEME = b"autorl-snapshot-v3\0"
_FINGERPRINT_SCHEME_V2 = b"autorl-snapshot-v2\0"
_SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.safetensors")
_PICKLE_WEIGHTS = re.compile(r"(pytorch_model.*\.bin|.*\.(pt|pth|ckpt|pkl))", re.IGNORECASE)
_SAVE = "save the model with model.save_pretrained(path) and tokenizer.save_pretrained(path)"
_CHANGED = (
    "the checkpoint's files changed while they were being submitted; stop writing a checkpoint before "
    "you submit it: save each checkpoint to a new folder and submit that folder once it is complete"
)
#: The grader's own shortage, never the checkpoint's fault: a 503 to retry, counted nowhere.
_NO_DESCRIPTORS = (
    "the grader has no file descriptor free to read this checkpoint with right now; submit it again "
    "in a moment (this does not count against your submission limit)"
)
#: What a checkpoint whose files broke a check in a way no rule names is told (see _agent_files).
_MALFORMED = (
    "{shown}: the checkpoint's files could not be read as a model ({kind} while checking them); save "
    "the model with model.save_pretrained(path), which writes safetensors, and submit that folder"
)
#: A full evaluator storage, as the agent is told (503).
STORAGE_FULL = (
    "the evaluator storage has too little room to take this checkpoint now; retry once queued "
    "evaluations have finished (operators: grow AUTORL_SNAPSHOT_DIR's volume; the platform's log "
    "says by how much)"
)
_BASE_CHANGED = (
    "the base model's files changed while this checkpoint was being taken (the platform replaced them); "
    "submit the checkpoint again"
)


@dataclass(frozen=True)
class Snapshot:
    """A folder of evaluated files, its content fingerprint and what the submission held besides."""

    name: str
    path: Path
    fingerprint: str
    ignored_files: tuple[str, ...] = ()

    def holds(self, fingerprint: str) -> bool:
        """Whether these are the files ``fingerprint`` was taken of: by this scheme, or by the one
        before it (each file's digest over its bytes), which a submission scored before an upgrade
        carries. The earlier scheme reads every file again, so it is only tried when this one
        differs."""
        return fingerprint == self.fingerprint or fingerprint == _fingerprint_v2(self.path)


@dataclass(frozen=True)
class BaseCheckpoint:
    """What a submission is held to: the base model's config and tensors."""

    config: dict[str, Any]
    tensors: dict[str, Tensor]
    #: The base model's chat template: the one every evaluation prompts through (None: it has none).
    chat_template: str | None = None
    #: The length of the base model's safetensors headers, all shards together.
    header_bytes: int = 0

    @property
    def header_allowance(self) -> int:
        """How many header bytes a submission's shards may hold in all: what the base's tensors
        need, twice over (other dtypes and offsets spell longer), plus room for a shard's
        metadata. A header is read only within what is left of this."""
        return 2 * self.header_bytes + HEADER_SLACK_BYTES

    @property
    def vocab_size(self) -> int:
        size = self.config.get("vocab_size")
        return size if isinstance(size, int) else 2**31

    @property
    def tied(self) -> frozenset[str]:
        """The tensors the base's config makes another's (``tie_word_embeddings``: the output
        embedding is the input embedding), where the base stores them anyway: a submission may leave
        them out, and what it holds of them is left out of its snapshot. Every engine then takes
        the input embedding for both, as the config says; kept, each would take what it likes (one
        the embedding, one the stored head, one whichever it copied last)."""
        if self.config.get("tie_word_embeddings") is True and model_files.OUTPUT_EMBEDDING in self.tensors:
            return frozenset({model_files.OUTPUT_EMBEDDING})
        return frozenset()

    @property
    def required(self) -> dict[str, Tensor]:
        """The tensors a submission must hold: the base's, less :attr:`tied`."""
        return {name: tensor for name, tensor in self.tensors.items() if name not in self.tied}


# --- entry points ---------------------------------------------------------------------------


def snapshot_submission(
    model_path: str | Path,
    *,
    workspace: Path,
    output_dir: Path,
    base_model_dir: Path,
    snapshot_root: Path,
) -> Snapshot:
    """Check a submitted checkpoint and copy its weights, beside the base model's other files,
    into a new snapshot.

    A relative ``model_path`` resolves against ``workspace``; it must lie inside ``output_dir``.
    Each broken rule raises a :class:`CheckpointError` saying what to do instead; a file or folder
    the grader may not read (saved 0600 by its writer) raises :class:`UnreadableCheckpointError`,
    naming it and the ``chmod`` that fixes it, and leaves nothing behind (the grader tries again
    for a while: the agent's pod adds group-read within seconds, autorl_grader.snapshot_slots).
    """
    with _descriptors_are_the_platforms():
        base = read_base_model(base_model_dir)
    with _descriptors_are_the_platforms(), ExitStack() as stack:
        folder, submitted = _open_submission_folder(model_path, workspace=workspace, output_dir=output_dir)
        stack.callback(os.close, folder)
        source = _Source(folder, shown=str(model_path), follow_links=False, fix=submitted)
        platform = _open_base_folder(base_model_dir, stack)
        return _build(source, platform, base, snapshot_root)


def submission_readable(model_path: str | Path, *, workspace: Path, output_dir: Path) -> bool:
    """Whether the grader may open the submitted folder and the files a snapshot of it opens (its
    config, weights and their index) now, checking nothing else: what a submit refused as
    unreadable tries, without the database, before it tries the whole submit again. Any other
    refusal is the whole submit's to make (True)."""
    try:
        folder, _ = _open_submission_folder(model_path, workspace=workspace, output_dir=output_dir)
    except UnreadableCheckpointError:
        return False
    except (CheckpointError, OSError):
        return True
    try:
        with os.scandir(folder) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_ENTRIES:
                    break
                if entry.name in (CONFIG, WEIGHTS_INDEX) or entry.name.endswith(".safetensors"):
                    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                    try:
                        os.close(os.open(entry.name, flags, dir_fd=folder))
                    except PermissionError:
                        return False
                    except OSError:
                        continue
    except PermissionError:
        return False
    finally:
        os.close(folder)
    return True


@contextmanager
def _descriptors_are_the_platforms() -> Iterator[None]:
    """Whatever failed for want of a file descriptor (the grader's, shared by every experiment)
    fails as :class:`ServiceUnavailableError`, never as a refusal of the checkpoint."""
    try:
        yield
    except ServiceUnavailableError:
        raise
    except Exception as exc:
        if _out_of_descriptors(exc):
            raise ServiceUnavailableError(_NO_DESCRIPTORS) from exc
        raise


@contextmanager
def _agent_files(shown: str) -> Iterator[None]:
    """Around the checks of the bytes of a checkpoint's files (their JSON, their headers): what
    fails there other than a refusal or the grader's own I/O (an OSError: its storage, its
    descriptors) or memory is the files' doing, and a :class:`MalformedCheckpointError` naming
    the fix. The copy into the snapshot storage is outside: its failures stay the platform's."""
    try:
        yield
    except (AutoRLError, OSError, MemoryError):
        raise
    except Exception as exc:
        raise MalformedCheckpointError(_MALFORMED.format(shown=shown, kind=type(exc).__name__)) from exc


def _out_of_descriptors(exc: BaseException | None) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def snapshot_base_model(base_model_dir: Path, snapshot_root: Path) -> Snapshot:
    """The base model's snapshot, taken and fingerprinted like a submission's (so a copy of the
    base model submitted by an agent has the baseline's fingerprint). The base model is the
    platform's own: links in its folder (a hub cache) are followed."""
    with _descriptors_are_the_platforms(), ExitStack() as stack:
        base = read_base_model(base_model_dir)
        source = _open_base_folder(base_model_dir, stack)
        return _build(source, source, base, snapshot_root)


def _open_base_folder(base_model_dir: Path, stack: ExitStack) -> _Source:
    """The base model's folder, whose files other than weights every snapshot holds."""
    folder = os.open(base_model_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    stack.callback(os.close, folder)
    return _Source(folder, shown=str(base_model_dir), follow_links=True, fix=str(base_model_dir))


def read_base_model(base_model_dir: Path) -> BaseCheckpoint:
    """The base model's config and safetensors tensors; a broken base is the platform's problem."""
    try:
        with _agent_files(str(base_model_dir)):
            return _read_base_model(base_model_dir)
    except (OSError, CheckpointError) as exc:
        raise ModelSourceError(
            f"the base model in {base_model_dir} cannot be read ({exc}); resolve the base model again"
        ) from exc


def _read_base_model(base_model_dir: Path) -> BaseCheckpoint:
    """read_base_model's reading, any failure of which is the base model's (a ModelSourceError)."""
    config = model_files.parse_json_object((base_model_dir / CONFIG).read_bytes(), CONFIG)
    if (base_model_dir / WEIGHTS_INDEX).is_file():
        index = model_files.parse_json_object((base_model_dir / WEIGHTS_INDEX).read_bytes(), WEIGHTS_INDEX)
        shards = sorted(set(_weight_map(index, WEIGHTS_INDEX).values()))
    else:
        shards = [WEIGHTS]
        if not (base_model_dir / WEIGHTS).is_file():
            raise ModelSourceError(_no_safetensors(base_model_dir))
    tensors: dict[str, Tensor] = {}
    header_bytes = 0
    for shard in shards:
        path = base_model_dir / shard
        with path.open("rb") as handle:
            header = read_header(handle.fileno(), path.stat().st_size, shard)
        tensors.update(header.tensors)
        header_bytes += len(header.raw)
    template = _base_chat_template(base_model_dir)
    return BaseCheckpoint(config=config, tensors=tensors, chat_template=template, header_bytes=header_bytes)


def _no_safetensors(model_dir: Path) -> str:
    """Why a model folder without safetensors weights is refused, and the fix."""
    pickles = sorted(entry.name for entry in model_dir.iterdir() if _PICKLE_WEIGHTS.fullmatch(entry.name))
    if pickles:
        return (
            f"{model_dir} holds only pickle weights ({quoted_names(pickles, 5)}), which can run code when "
            "loaded and are not accepted; load the model once and save it with model.save_pretrained(path), "
            "which writes model.safetensors (safetensors is its default), then use that folder"
        )
    return (
        f"{model_dir} has no safetensors weights ({WEIGHTS} or {WEIGHTS_INDEX}); save the full model with "
        "model.save_pretrained(path) (safetensors is its default) and use that folder"
    )


def _base_chat_template(base_model_dir: Path) -> str | None:
    def json_file(name: str) -> dict[str, Any] | None:
        path = base_model_dir / name
        return model_files.parse_json_object(path.read_bytes(), name) if path.is_file() else None

    jinja = base_model_dir / CHAT_TEMPLATE_JINJA
    return model_files.resolve_chat_template(
        json_file(TOKENIZER_CONFIG) or {},
        jinja.read_text(encoding="utf-8") if jinja.is_file() else None,
        json_file(CHAT_TEMPLATE_JSON),
    )


def remove_snapshot(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def prune_snapshots(
    snapshot_root: Path, keep: Collection[str], *, grace_s: float = ORPHAN_GRACE_S
) -> list[str]:
    """Remove snapshot folders not in ``keep`` (the snapshots of unfinished submissions) whose
    newest file is older than ``grace_s`` (one being written, or just committed, is young)."""
    removed: list[str] = []
    if not snapshot_root.is_dir():
        return removed
    now = time.time()
    for folder in snapshot_root.iterdir():
        if folder.name in keep or not folder.is_dir() or folder.is_symlink():
            continue
        newest = max([folder.stat().st_mtime, *(entry.stat().st_mtime for entry in folder.iterdir())])
        if now - newest > grace_s:
            remove_snapshot(folder)
            removed.append(folder.name)
    return removed


# --- opening the submitted folder -----------------------------------------------------------


def _open_submission_folder(model_path: str | Path, *, workspace: Path, output_dir: Path) -> tuple[int, str]:
    """The submitted folder, open, and its name for the agent (``$WORKSPACE/...``)."""
    candidate = Path(model_path)
    if not candidate.is_absolute():
        candidate = workspace / candidate
    normal = Path(os.path.normpath(candidate))
    outside = CheckpointError(
        f"model_path {model_path} lies outside this experiment's output folder {output_dir}; save the "
        f"model under OUTPUT_DIR ({output_dir}) and submit that folder"
    )
    # Lexical only: nothing is resolved, so the answer says nothing about what exists elsewhere.
    # The output folder may also be named through the real path of the folder that holds it (the
    # platform's path), never through its own: the agent may replace output/ by a link, and its
    # target would pass as the output folder, letting it submit any folder the grader can read.
    lexical = Path(os.path.normpath(output_dir))
    for root in (lexical, Path(os.path.realpath(lexical.parent)) / lexical.name):
        if normal.is_relative_to(root):
            parts = normal.relative_to(root).parts
            break
    else:
        raise outside
    named = Path(os.path.normpath(workspace))
    agent_root = f"$WORKSPACE/{root.relative_to(named)}" if root.is_relative_to(named) else str(root)
    try:
        folder = os.open(root, _FOLDER_FLAGS)
    except PermissionError:
        raise _unreadable(agent_root, "folder", agent_root) from None
    except OSError as exc:
        raise CheckpointError(
            f"this experiment's output folder {output_dir} cannot be opened ({exc.strerror}); it must be a "
            "plain folder, not a link: save the model under OUTPUT_DIR and submit that folder"
        ) from exc
    walked = Path(root)
    try:
        for index, part in enumerate(parts):
            walked = walked / part
            shown = f"model_path {model_path}: {walked.relative_to(root.parent)}"
            for_agent = f"{agent_root}/{walked.relative_to(root)}"
            try:
                info = os.stat(part, dir_fd=folder, follow_symlinks=False)
            except PermissionError:
                parent = str(Path(for_agent).parent)
                raise _unreadable(parent, "folder", parent) from None
            except FileNotFoundError:
                raise CheckpointError(
                    f"model_path {model_path} does not exist; save the model there first "
                    "(model.save_pretrained(path) and tokenizer.save_pretrained(path)) and submit that folder"
                ) from None
            if stat.S_ISLNK(info.st_mode):
                raise CheckpointError(
                    f"{shown} is a symbolic link, and links are never followed; save the model into a "
                    "real folder under OUTPUT_DIR and submit that folder"
                )
            if not stat.S_ISDIR(info.st_mode):
                what = "is a file, not a folder" if index == len(parts) - 1 else "is not a folder"
                raise CheckpointError(f"{shown} {what}; submit the folder that save_pretrained wrote")
            try:
                child = os.open(part, _FOLDER_FLAGS, dir_fd=folder)
            except PermissionError:
                raise _unreadable(for_agent, "folder", for_agent) from None
            os.close(folder)
            folder = child
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, a folder swapped for a link
        os.close(folder)
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise CheckpointError(
            f"model_path {model_path} cannot be opened ({reason}); save the model into a plain folder "
            "under OUTPUT_DIR with model.save_pretrained(path) and submit that folder"
        ) from exc
    except BaseException:
        os.close(folder)
        raise
    return folder, f"{agent_root}/{Path(*parts)}" if parts else agent_root


def _unreadable(name: str, kind: str, fix: str) -> UnreadableCheckpointError:
    return UnreadableCheckpointError(
        f"{name} cannot be read by the grader (permission denied): the grader reads checkpoints through "
        f"the workspace's group, and this {kind} gives the group no read"
        f"{' and search' if kind == 'folder' else ''} permission (safetensors and tempfile create "
        "files 0600, mkdtemp folders 0700; in a pod the platform adds group-read within seconds of "
        f'a save, but not here). Run chmod -R g+rX "{fix}" and submit again; this refusal does not '
        "count against your submission limit"
    )


# --- one snapshot ---------------------------------------------------------------------------


@dataclass
class _Source:
    """An open folder to snapshot and how its files are named in messages."""

    fd: int
    shown: str
    follow_links: bool
    #: The folder as the agent names it, for the chmod that makes it readable.
    fix: str

    def name(self, entry: str) -> str:
        return f"{self.shown}/{entry}"

    def unreadable(self, entry: str | None) -> UnreadableCheckpointError:
        """The folder itself (``entry`` None) or one of its files cannot be read."""
        if entry is None:
            return _unreadable(self.fix, "folder", self.fix)
        return _unreadable(f"{self.fix}/{entry}", "file", self.fix)


@dataclass
class _Opened:
    fd: int
    name: str
    info: os.stat_result


@dataclass
class _Writer:
    """The snapshot folder being written and the digest of each file written into it."""

    path: Path
    digests: dict[str, bytes] = field(default_factory=dict)

    def write(self, name: str, data: bytes) -> None:
        (self.path / name).write_bytes(data)
        self.digests[name] = hashlib.sha256(data).digest()

    def fingerprint(self, scheme: bytes | None = None) -> str:
        digest = hashlib.sha256(scheme or _FINGERPRINT_SCHEME)
        for name in sorted(self.digests):
            encoded = name.encode("utf-8")
            # Length-prefixed names: no two file lists hash the same bytes.
            digest.update(len(encoded).to_bytes(8, "big") + encoded + self.digests[name])
        return digest.hexdigest()


def _build(source: _Source, platform: _Source, base: BaseCheckpoint, snapshot_root: Path) -> Snapshot:
    """``source``'s weights, checked against ``base``, beside ``platform``'s (the base model's)
    config, generation config, tokenizer and chat template. Of ``source`` only the weights,
    ``config.json`` and the weights' index are opened; everything else is listed as ignored."""
    names = _list(source)
    with _agent_files(source.shown):
        shards = _weight_files(source, names, base)
    indexed = shards != [WEIGHTS]
    checked = {CONFIG, WEIGHTS_INDEX} if indexed else {CONFIG}
    missing = sorted(set(shards) - names)
    if missing:
        raise CheckpointError(
            f"{source.shown}: {WEIGHTS_INDEX} names {quoted_names(missing)}, which is not in the folder; "
            + _SAVE
        )
    if CONFIG not in names:
        raise CheckpointError(
            f"{source.shown} has no config.json; save the model with model.save_pretrained(path), which "
            "writes it, and submit that folder"
        )
    ignored = _listed(source, names - set(shards) - checked)
    snapshot_root.mkdir(parents=True, exist_ok=True)
    name = uuid.uuid4().hex
    writer = _Writer(snapshot_root / name)
    writer.path.mkdir(mode=0o755)
    reading_weights = False
    try:
        with ExitStack() as stack:
            # The small files stay open to the end; each weights file is open only while its header
            # is read and again while it is copied: the descriptors a submission holds do not grow
            # with the number of files it chose to save its weights in.
            opened = {entry: _open(source, entry, stack) for entry in sorted(checked)}
            platform_names = _list(platform) & PLATFORM_FILES
            platform_files = {entry: _open(platform, entry, stack) for entry in sorted(platform_names)}
            with _agent_files(source.shown):
                headers, seen = _read_headers(source, shards, base)
            _check_free_space(
                snapshot_root,
                sum(handle.info.st_size for handle in [*opened.values(), *platform_files.values()])
                + sum(info.st_size for info in seen.values()),
            )
            with _agent_files(source.shown):
                weight_map = _checked_against_base(source, headers, opened[CONFIG], base)
            small = {entry: _read_small(handle) for entry, handle in platform_files.items()}
            platform_written = _platform_files(small, base, platform)
            # Every check that needs no tensor data is behind, and a file changed by now is refused
            # at no cost, before anything is written to the evaluator storage. From here on the
            # weights are read, copied and hashed: a refusal is a CostlyCheckpointError, which the
            # grader counts against the submission limit.
            for handle in opened.values():
                _check_unchanged(handle)
            for shard, info in seen.items():
                _check_same_file(source, shard, info)
            reading_weights = True
            for entry, data in platform_written.items():
                writer.write(entry, data)
            kept = {shard: header.without(base.tied) for shard, header in headers.items()}
            for shard, header in kept.items():
                if not header.tensors:  # a shard of tied tensors only
                    continue
                with ExitStack() as shard_stack:
                    handle = _open(source, shard, shard_stack)
                    if _identity(handle.info) != _identity(seen[shard]):
                        raise CheckpointError(_CHANGED)
                    _copy_weights(handle, header, writer)
            if indexed:
                total = sum(end - start for header in kept.values() for start, end in header.ranges())
                index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
                writer.write(WEIGHTS_INDEX, model_files.dump_json(index))
            for handle in opened.values():
                _check_unchanged(handle)
            # Every weights file is still the one copied (the same inode, size, modification and
            # change time): not another save put in its place, nor one written over it. A write
            # through a shared mapping to a page already written moves no time: what such a file
            # held as it was read is what the snapshot holds, hashes and gets scored for, as any
            # weights the agent could have saved.
            for shard, info in seen.items():
                _check_same_file(source, shard, info)
            for handle in platform_files.values():
                # The base model's files are the platform's: their change is not the agent's to pay for.
                if platform is not source and _changed(handle):
                    raise ServiceUnavailableError(_BASE_CHANGED)
                _check_unchanged(handle)
        fingerprint = writer.fingerprint()
    except CheckpointError as exc:
        remove_snapshot(writer.path)
        if reading_weights and not isinstance(exc, CostlyCheckpointError) and not _out_of_descriptors(exc):
            raise CostlyCheckpointError(str(exc)) from exc
        raise
    except BaseException:
        remove_snapshot(writer.path)
        raise
    return Snapshot(
        name=name,
        path=writer.path,
        fingerprint=fingerprint,
        ignored_files=ignored,
    )


def _checked_against_base(
    source: _Source, headers: dict[str, Header], config: _Opened, base: BaseCheckpoint
) -> dict[str, str]:
    """Refuse unless the shards' headers hold the base model's tensors, each once, and ``config``
    describes the base model's architecture. Returns which shard holds each tensor."""
    tensors: dict[str, Tensor] = {}
    weight_map: dict[str, str] = {}
    for shard, header in headers.items():
        for tensor in header.tensors:
            if tensor in tensors:
                raise CheckpointError(
                    f"{source.shown}: tensor {quoted(tensor)} is stored twice "
                    f"({quoted(weight_map[tensor])} and {quoted(shard)}); {_SAVE}"
                )
            weight_map[tensor] = shard
        tensors.update(header.tensors)
    for tied in base.tied:
        tensors.pop(tied, None)
        weight_map.pop(tied, None)
    compare_to_base(tensors, base.required, source.shown)
    parsed = model_files.parse_json_object(_read_small(config), config.name)
    model_files.check_config(parsed, base.config, config.name)
    return weight_map


def _fingerprint_v2(folder: Path) -> str:
    """The fingerprint of a snapshot folder's files by the scheme before :data:`_FINGERPRINT_SCHEME`."""
    writer = _Writer(folder)
    for path in sorted(folder.iterdir()):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(COPY_BLOCK_BYTES):
                digest.update(chunk)
        writer.digests[path.name] = digest.digest()
    return writer.fingerprint(_FINGERPRINT_SCHEME_V2)


def _check_free_space(snapshot_root: Path, needed: int) -> None:
    """Refuse (503, retry later) rather than fill the evaluators' storage. Every experiment's
    snapshots share it: its path and free bytes go to the platform's log, never to the agent."""
    usage = shutil.disk_usage(snapshot_root)
    if usage.free < needed + MIN_FREE_BYTES:
        log.warning(
            "event=snapshot_storage_full path=%s free_bytes=%d needed_bytes=%d reserve_bytes=%d",
            snapshot_root,
            usage.free,
            needed,
            MIN_FREE_BYTES,
        )
        raise ServiceUnavailableError(STORAGE_FULL)


def _list(source: _Source) -> set[str]:
    names: set[str] = set()
    with os.scandir(source.fd) as entries:
        for entry in entries:
            names.add(entry.name)
            if len(names) > MAX_ENTRIES:
                raise CheckpointError(
                    f"{source.shown} holds more than {MAX_ENTRIES} entries; save the model into a folder "
                    "of its own with model.save_pretrained(path) and submit that folder"
                )
    return names


def _read_headers(
    source: _Source, shards: list[str], base: BaseCheckpoint
) -> tuple[dict[str, Header], dict[str, os.stat_result]]:
    """Each shard's header and the file it was read from, the shards opened one after the other,
    each closed before the next, within the base model's header allowance: a submission never makes
    the grader read or hold more header bytes, or hold more descriptors, than its base model needs."""
    headers: dict[str, Header] = {}
    seen: dict[str, os.stat_result] = {}
    left = base.header_allowance
    for shard in shards:
        with ExitStack() as stack:
            handle = _open(source, shard, stack)
            headers[shard] = read_header(handle.fd, handle.info.st_size, handle.name, max_bytes=left)
            seen[shard] = handle.info
        left -= len(headers[shard].raw)
    return headers, seen


def _identity(info: os.stat_result) -> tuple[int, int, int, int, int]:
    """What says a file is the one read before, unwritten: the same inode, size, modification time
    and change time. The change time is the kernel's (a write sets it, and so does setting the
    modification time back): an agent owns its files' modification time, not their change time."""
    return (info.st_ino, info.st_dev, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _check_same_file(source: _Source, entry: str, info: os.stat_result) -> None:
    """``entry`` of ``source`` is still the file ``info`` describes (not replaced, not written)."""
    try:
        now = os.stat(entry, dir_fd=source.fd, follow_symlinks=source.follow_links)
    except OSError:
        raise CheckpointError(_CHANGED) from None
    if _identity(now) != _identity(info):
        raise CheckpointError(_CHANGED)


def _weight_files(source: _Source, names: set[str], base: BaseCheckpoint) -> list[str]:
    if ADAPTER_CONFIG in names:
        raise CheckpointError(
            f"{source.shown} holds {ADAPTER_CONFIG}: a LoRA/PEFT adapter, not a full model; merge it "
            "with model = model.merge_and_unload() and save the full model with "
            "model.save_pretrained(path) (plus the tokenizer), then submit that folder"
        )
    if WEIGHTS in names and WEIGHTS_INDEX in names:
        raise CheckpointError(
            f"{source.shown} holds both {WEIGHTS} and {WEIGHTS_INDEX}, two different sets of weights; "
            "save the model into a fresh folder with model.save_pretrained(path) and submit that folder"
        )
    if WEIGHTS in names:
        return [WEIGHTS]
    if WEIGHTS_INDEX in names:
        with ExitStack() as stack:
            index = model_files.parse_json_object(
                _read_small(_open(source, WEIGHTS_INDEX, stack)), source.name(WEIGHTS_INDEX)
            )
        weight_map = _weight_map(index, source.name(WEIGHTS_INDEX))
        # Checked before any shard is opened: the index names the base model's tensors, no others.
        compare_names(set(weight_map) - base.tied, set(base.required), source.name(WEIGHTS_INDEX))
        return sorted(set(weight_map.values()))
    pickles = sorted(name for name in names if _PICKLE_WEIGHTS.fullmatch(name))
    if pickles:
        raise CheckpointError(
            f"{source.shown} holds pickle weights ({quoted_names(pickles, 5)}), which can run code when "
            "loaded and are not accepted; save the model with model.save_pretrained(path), which writes "
            "model.safetensors (safetensors is its default), and submit that folder"
        )
    raise CheckpointError(
        f"{source.shown} has no *.safetensors weights ({WEIGHTS}); save the full model with "
        "model.save_pretrained(path) (safetensors is its default) and submit that folder"
    )


def _weight_map(index: dict[str, Any], shown: str) -> dict[str, str]:
    """The index's weight_map, checked to map tensor names to shard names (strings of bounded
    length, each shard a file of the same folder) before any of them is hashed or compared."""
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{shown} has no weight_map; {_SAVE}")
    for name, shard in weight_map.items():
        check_name(name, shown)
        if not _is_shard_name(shard):
            raise CheckpointError(
                f"{shown} maps tensor {quoted(name)} to {shown_value(shard)}, not to the name of a "
                f"*.safetensors file in the same folder; {_SAVE}"
            )
    if len(set(weight_map.values())) > MAX_SHARDS:
        raise CheckpointError(
            f"{shown} must name at most {MAX_SHARDS} *.safetensors files in the same folder; {_SAVE}"
        )
    return weight_map


def _is_shard_name(shard: object) -> bool:
    if not isinstance(shard, str) or len(shard) > MAX_SHARD_NAME_CHARS:
        return False
    return _SHARD_NAME.fullmatch(shard) is not None


def _listed(source: _Source, names: set[str]) -> tuple[str, ...]:
    """The ignored entries ``names`` of ``source`` as an answer lists them: sorted as shown
    (undecodable bytes escaped as ``\\udcff``, a folder ending in /), the first
    :data:`MAX_IGNORED_LISTED`, each shortened to :data:`MAX_IGNORED_NAME_CHARS` characters, then
    how many more there are."""
    shown = sorted(_ignored_names(source, names))
    listed = [
        text if len(text) <= MAX_IGNORED_NAME_CHARS else _shortened(entry, suffix)
        for text, entry, suffix in shown[:MAX_IGNORED_LISTED]
    ]
    if len(shown) > MAX_IGNORED_LISTED:
        listed.append(f"(and {len(shown) - MAX_IGNORED_LISTED} more)")
    return tuple(listed)


def _ignored_names(source: _Source, names: set[str]) -> Iterator[tuple[str, str, str]]:
    """Each entry as shown, the entry and the suffix of its shown name (/ for a folder)."""
    for entry in names:
        try:
            is_dir = stat.S_ISDIR(os.stat(entry, dir_fd=source.fd, follow_symlinks=False).st_mode)
        except OSError:
            is_dir = False
        suffix = "/" if is_dir else ""
        yield printable(entry) + suffix, entry, suffix  # the agent's name: every hidden character escaped


def _shortened(entry: str, suffix: str) -> str:
    """``entry`` shown in at most MAX_IGNORED_NAME_CHARS characters with its suffix, cut between
    characters (never inside an escape) and marked so."""
    return shortened(entry, MAX_IGNORED_NAME_CHARS - len(suffix), printable) + suffix


def _open(source: _Source, entry: str, stack: ExitStack) -> _Opened:
    """Open ``entry`` for reading after checking, on the descriptor, that it is a plain file."""
    shown = source.name(entry)
    try:
        info = os.stat(entry, dir_fd=source.fd, follow_symlinks=source.follow_links)
    except FileNotFoundError:
        raise CheckpointError(_CHANGED) from None
    except PermissionError:
        raise source.unreadable(None) from None
    if stat.S_ISLNK(info.st_mode):
        raise CheckpointError(
            f"{shown} is a symbolic link, and links are never followed; copy the file into the "
            "checkpoint folder instead of linking it (model.save_pretrained(path) writes real files)"
        )
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointError(f"{shown} is not a regular file; {_SAVE}")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if source.follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(entry, flags, dir_fd=source.fd)
    except PermissionError:
        raise source.unreadable(entry) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CheckpointError(_CHANGED) from exc
        raise CheckpointError(f"{shown} cannot be opened ({exc.strerror}); {_SAVE}") from exc
    stack.callback(os.close, fd)
    opened = _Opened(fd=fd, name=shown, info=os.fstat(fd))
    if not stat.S_ISREG(opened.info.st_mode) or (opened.info.st_ino, opened.info.st_dev) != (
        info.st_ino,
        info.st_dev,
    ):
        raise CheckpointError(_CHANGED)
    cap = SIZE_CAPS.get(entry)
    if cap is not None and opened.info.st_size > cap:
        raise CheckpointError(
            f"{shown} is {opened.info.st_size} bytes, more than the {cap} allowed for {entry}; {_SAVE}"
        )
    if opened.info.st_size > SPARSE_CHECK_MIN_BYTES and _allocated(fd, opened.info.st_size) < (
        MIN_DATA_FRACTION * opened.info.st_size
    ):
        raise CheckpointError(
            f"{shown} is a sparse file ({opened.info.st_size} bytes, mostly holes), not a saved model; "
            + _SAVE
        )
    return opened


def _allocated(fd: int, size: int) -> int:
    """Bytes of ``fd`` that hold data (SEEK_DATA/SEEK_HOLE); ``size`` where the filesystem cannot tell."""
    data = offset = 0
    try:
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole is left
                    break
                raise
            offset = os.lseek(fd, start, os.SEEK_HOLE)
            data += offset - start
    except OSError:
        return size
    finally:
        os.lseek(fd, 0, os.SEEK_SET)
    return data


def _read_small(opened: _Opened) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(opened.fd, SMALL_READ_BYTES):
        chunks.append(chunk)
        size += len(chunk)
        if size > opened.info.st_size:
            raise CheckpointError(_CHANGED)
    if size != opened.info.st_size:
        raise CheckpointError(_CHANGED)
    os.lseek(opened.fd, 0, os.SEEK_SET)
    return b"".join(chunks)


def _copy_weights(opened: _Opened, header: Header, writer: _Writer) -> None:
    """Copy the checked header, made canonical, then its tensors' data (:meth:`Header.ranges`: all
    of it, less a tied tensor's) in blocks of :data:`COPY_BLOCK_BYTES`, read and written in order
    on this thread while up to :data:`COPY_THREADS` threads hash the blocks before (hashlib
    releases the GIL): the copy takes about as long as the reads and writes, not as long as
    hashing the file on one core. The file's digest is the SHA-256 of the canonical header
    followed by each block's SHA-256 in order. A file that changes (size or modification time)
    stops the copy at the next block."""
    target = writer.path / Path(opened.name).name
    # The canonical header, not the submitted one: the same tensors and data are the same file,
    # whatever metadata, key order or padding the agent's header held (nothing of it is evaluated).
    canonical = header.canonical()
    source_start, size = len(header.raw), header.data_bytes
    digest = hashlib.sha256(canonical)
    hashing: deque[Future[bytes]] = deque()  # blocks being hashed, oldest first
    pool = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="snapshot-hash")
    with target.open("xb") as out, pool:
        out.write(canonical)
        out.flush()
        at = len(canonical)
        try:
            for pieces in _blocks(header.ranges()):
                data = b"".join(
                    os.pread(opened.fd, length, source_start + offset) for offset, length in pieces
                )
                if len(data) != sum(length for _, length in pieces) or _changed(opened):
                    raise CheckpointError(_CHANGED)  # stop at once: the rest would be refused anyway
                _write_all(out.fileno(), data, at)
                at += len(data)
                if len(hashing) == COPY_THREADS:  # at most COPY_THREADS blocks wait to be hashed
                    digest.update(hashing.popleft().result())
                hashing.append(pool.submit(_block_digest, data))
            if os.pread(opened.fd, 1, source_start + size):  # grown since its size was read
                raise CheckpointError(_CHANGED)
            while hashing:
                digest.update(hashing.popleft().result())
        except BaseException:
            for waiting in hashing:
                waiting.cancel()
            raise
    writer.digests[target.name] = digest.digest()


def _blocks(ranges: list[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
    """The copied data in blocks of :data:`COPY_BLOCK_BYTES` (the last one shorter), each as the
    ``(offset, length)`` pieces of ``ranges`` that make it: blocks fall at the same places in what is
    written however the source's ranges lie, so the same bytes hash the same."""
    block: list[tuple[int, int]] = []
    filled = 0
    for start, end in ranges:
        while start < end:
            length = min(COPY_BLOCK_BYTES - filled, end - start)
            block.append((start, length))
            filled, start = filled + length, start + length
            if filled == COPY_BLOCK_BYTES:
                yield block
                block, filled = [], 0
    if block:
        yield block


def _write_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, at)
        if written == 0:  # no storage should answer so, but a loop on it would never end
            raise OSError(errno.EIO, "the snapshot storage wrote nothing")
        view, at = view[written:], at + written


def _block_digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _changed(opened: _Opened) -> bool:
    return _identity(os.fstat(opened.fd)) != _identity(opened.info)


def _check_unchanged(opened: _Opened) -> None:
    if _changed(opened):
        raise CheckpointError(_CHANGED)


def _platform_files(files: dict[str, bytes], base: BaseCheckpoint, platform: _Source) -> dict[str, bytes]:
    """The base model's files besides its weights, as every evaluation of it reads them: its
    config, the token ids of its generation config (decoding is the platform's), its tokenizer
    files, and its chat template folded into the tokenizer config."""

    def parsed(entry: str) -> dict[str, Any] | None:
        return model_files.parse_json_object(files[entry], platform.name(entry)) if entry in files else None

    written = {CONFIG: model_files.dump_json(base.config)}
    generation = parsed(GENERATION_CONFIG)
    if generation is not None:
        kept = model_files.normalize_generation_config(
            generation, base.vocab_size, platform.name(GENERATION_CONFIG)
        )
        written[GENERATION_CONFIG] = model_files.dump_json(kept)
    tokenizer_config = parsed(TOKENIZER_CONFIG) or {}
    normalized = model_files.normalize_tokenizer_config(
        tokenizer_config, base.chat_template, platform.name(TOKENIZER_CONFIG)
    )
    written[TOKENIZER_CONFIG] = model_files.dump_json(normalized)
    special = parsed(SPECIAL_TOKENS_MAP)
    if special is not None:
        written[SPECIAL_TOKENS_MAP] = model_files.dump_json(model_files.normalize_special_tokens_map(special))
    added = parsed(ADDED_TOKENS)
    if added is not None:
        checked = model_files.check_added_tokens(added, platform.name(ADDED_TOKENS))
        written[ADDED_TOKENS] = model_files.dump_json(checked)
    for entry in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model"):
        if entry in files:
            written[entry] = files[entry]
    return written
