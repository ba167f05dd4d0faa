"""The grader's snapshot of a submission: blocks copied and hashed in parallel against one stream.

``autorl.checkpoints.snapshot`` copies a submission's weights into storage the agent cannot write
and hashes every byte it writes. It now reads and writes them in 8 MiB blocks, in order, while up
to four threads hash the blocks before (the fingerprint scheme v3: a file's digest over its
blocks' digests). This times ``snapshot_submission`` as it is against the same function with the former
copy loops put back (the v2 scheme: the file hashed as one stream, so on one core), alternating,
on the same checkpoint in the same run, each round starting with the next variant:

- ``blocks_in_parallel``: as it is (blocks hashed in parallel beside the copy);
- ``one_stream_hash_beside``: each 8 MiB chunk hashed on a helper thread while the next is read and
  written (the loop before this one);
- ``one_stream_hash_after_write``: each 1 MiB chunk hashed right after it is written (the loop
  before that).

It checks that each variant's fingerprint is the same every round, and that the snapshot taken as
it is ``holds`` the one-stream fingerprint (what a submission scored before the change carries).

    .venv/bin/python bench/snapshot_copy.py [--hidden 1024 --layers 16] [--rounds 3]
    # on the GPU machine, a real 1.5B checkpoint (bench/resident_engine_gpu.py's):
    PYTHONPATH=. python3 bench/snapshot_copy.py --base /root/resident/A --checkpoint /root/resident/T2 \\
        --output $OUT/snapshot_copy_gpu.json

Writes ``bench/results/snapshot_copy.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from autorl.checkpoints.safetensors_header import Header
    from autorl.checkpoints.snapshot import Snapshot, _Opened, _Writer

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "snapshot_copy.json"
VARIANTS = ("blocks_in_parallel", "one_stream_hash_beside", "one_stream_hash_after_write")
#: The chunk of each one-stream loop, and whether it hashed on a helper thread.
ONE_STREAM = {
    "one_stream_hash_beside": (8 * 1024 * 1024, True),
    "one_stream_hash_after_write": (1024 * 1024, False),
}


class CopyWeights(Protocol):
    """What ``autorl.checkpoints.snapshot._copy_weights`` is called as."""

    def __call__(self, opened: _Opened, header: Header, writer: _Writer) -> None: ...


def one_stream_copy(chunk_bytes: int, beside: bool) -> CopyWeights:
    """The former ``_copy_weights``: the canonical header, then the data read, written and hashed in
    order as one stream (``beside``: each chunk hashed on a helper thread while the next is read)."""
    from autorl.errors import CheckpointError

    def copy(opened: _Opened, header: Header, writer: _Writer) -> None:
        target = writer.path / Path(opened.name).name
        canonical = header.canonical()
        content = hashlib.sha256(canonical)
        os.lseek(opened.fd, len(header.raw), os.SEEK_SET)
        hashing: Future[None] | None = None
        with target.open("xb") as out, ThreadPoolExecutor(1) as hasher:
            out.write(canonical)
            remaining = header.data_bytes
            while remaining:
                chunk = os.read(opened.fd, min(remaining, chunk_bytes))
                if not chunk:
                    raise CheckpointError("changed")
                out.write(chunk)
                if beside:
                    if hashing is not None:
                        hashing.result()
                    hashing = hasher.submit(content.update, chunk)
                else:
                    content.update(chunk)
                remaining -= len(chunk)
            if hashing is not None:
                hashing.result()
        writer.digests[target.name] = content.digest()

    return copy


def build_checkpoints(work: Path, hidden: int, layers: int) -> tuple[Path, Path]:
    """A base model of the tiny model's tokenizer at ``hidden`` x ``layers``, and a submission
    with other weights of the same shapes."""
    from autorl.models.tiny import _save_random_weights, build_tiny_qwen2

    base = build_tiny_qwen2(work / "base")
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    heads = max(2, hidden // 64)
    config.update(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=hidden // heads,
        torch_dtype="float32",
    )
    (base / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    _save_random_weights(config, base / "model.safetensors", seed=0)
    submission = work / "submission"
    shutil.copytree(base, submission)
    _save_random_weights(config, submission / "model.safetensors", seed=1)
    return base, submission


def take(base: Path, checkpoint: Path, snapshots: Path, variant: str) -> tuple[float, Snapshot]:
    from autorl.checkpoints import snapshot

    workspace = snapshots.parent / "workspace"
    output = workspace / "output"
    target = output / "checkpoint"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(checkpoint, target, copy_function=os.link)
    saved = snapshot._copy_weights, snapshot._FINGERPRINT_SCHEME
    if variant in ONE_STREAM:
        snapshot._copy_weights = one_stream_copy(*ONE_STREAM[variant])
        snapshot._FINGERPRINT_SCHEME = snapshot._FINGERPRINT_SCHEME_V2
    try:
        started = time.perf_counter()
        taken = snapshot.snapshot_submission(
            "output/checkpoint",
            workspace=workspace,
            output_dir=output,
            base_model_dir=base,
            snapshot_root=snapshots,
        )
        seconds = time.perf_counter() - started
    finally:
        snapshot._copy_weights, snapshot._FINGERPRINT_SCHEME = saved
    return seconds, taken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="a base model folder (built here when not given)")
    parser.add_argument("--checkpoint", type=Path, help="a submission of the base's architecture")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="snapshot-copy-") as scratch:
        work = Path(scratch)
        if args.base is None or args.checkpoint is None:
            base, checkpoint = build_checkpoints(work, args.hidden, args.layers)
        else:
            base, checkpoint = args.base.resolve(), args.checkpoint.resolve()
        weights = sum(path.stat().st_size for path in checkpoint.glob("*.safetensors"))
        seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
        fingerprints: dict[str, set[str]] = {name: set() for name in VARIANTS}
        from autorl.checkpoints.snapshot import remove_snapshot

        _, warm = take(base, checkpoint, work / "snapshots", VARIANTS[0])  # warm the page cache
        remove_snapshot(warm.path)
        for round_index in range(args.rounds):
            # Each round starts with the next variant: whichever copy follows a removal pays some of
            # the filesystem's work on it, so each variant takes each place in turn.
            shift = round_index % len(VARIANTS)
            for name in VARIANTS[shift:] + VARIANTS[:shift]:
                spent, taken = take(base, checkpoint, work / "snapshots", name)
                seconds[name].append(round(spent, 3))
                fingerprints[name].add(taken.fingerprint)
                remove_snapshot(taken.path)
                print(f"{name}: {spent:.2f} s", flush=True)
        _, kept = take(base, checkpoint, work / "snapshots", VARIANTS[0])
        holds_one_stream = all(kept.holds(found) for found in fingerprints["one_stream_hash_beside"])
        remove_snapshot(kept.path)
    medians = {name: round(statistics.median(values), 3) for name, values in seconds.items()}
    result = {
        "benchmark": "snapshot_copy",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": " ".join(["python3", "bench/snapshot_copy.py", *sys.argv[1:]]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor(),
        },
        "weights_bytes": weights,
        "rounds": args.rounds,
        "seconds": seconds,
        "median_s": medians,
        "gib_per_s": {name: round(weights / 2**30 / value, 2) for name, value in medians.items()},
        "ratio_over_blocks": {name: round(medians[name] / medians[VARIANTS[0]], 2) for name in VARIANTS[1:]},
        "same_fingerprint_each_round": all(len(found) == 1 for found in fingerprints.values()),
        "one_stream_fingerprints_agree": fingerprints["one_stream_hash_beside"]
        == fingerprints["one_stream_hash_after_write"],
        "blocks_snapshot_holds_one_stream_fingerprint": holds_one_stream,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    checks = (
        "same_fingerprint_each_round",
        "one_stream_fingerprints_agree",
        "blocks_snapshot_holds_one_stream_fingerprint",
    )
    print(json.dumps({key: result[key] for key in ("median_s", "gib_per_s", "ratio_over_blocks", *checks)}))
    return 0 if all(result[key] for key in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
