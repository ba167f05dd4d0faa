"""The grader's snapshot of a submission: hashing beside the copy against hashing after each write.

``autorl.checkpoints.snapshot`` copies a submission's weights into storage the agent cannot write
and hashes every byte it writes. Each chunk is now hashed on a thread of its own while the next
one is read and written, in 8 MiB pieces. This times ``snapshot_submission`` as it is against the
same function with the hashing done inline after each write in 1 MiB pieces (the former loop: the
executor replaced by one that runs each task at once), alternating, on the same checkpoint in the
same run, and checks both give the same fingerprint.

    .venv/bin/python bench/snapshot_copy.py [--hidden 1024 --layers 16] [--rounds 3]
    # on the GPU machine, a real 1.5B checkpoint (bench/resident_engine_gpu.py's):
    PYTHONPATH=. python3 bench/snapshot_copy.py --base /root/resident/A --checkpoint /root/resident/T2 \\
        --output $OUT/snapshot_copy.json

Writes ``bench/results/snapshot_copy.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
RESULTS = REPO_ROOT / "bench" / "results" / "snapshot_copy.json"
FORMER_CHUNK_BYTES = 1024 * 1024


class InlineExecutor:
    """Runs each task when it is submitted: the copy loop hashes each chunk right after writing it."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def __enter__(self) -> InlineExecutor:
        return self

    def __exit__(self, *_: Any) -> None:
        pass

    def submit(self, function: Any, *args: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(function(*args))
        return done


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


def take(base: Path, checkpoint: Path, snapshots: Path, former: bool) -> tuple[float, str]:
    from autorl.checkpoints import snapshot

    workspace = snapshots.parent / "workspace"
    output = workspace / "output"
    target = output / "checkpoint"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(checkpoint, target, copy_function=os.link)
    saved = (snapshot.ThreadPoolExecutor, snapshot.COPY_CHUNK_BYTES)
    if former:
        snapshot.ThreadPoolExecutor, snapshot.COPY_CHUNK_BYTES = InlineExecutor, FORMER_CHUNK_BYTES  # type: ignore[assignment,misc]
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
        snapshot.ThreadPoolExecutor, snapshot.COPY_CHUNK_BYTES = saved  # type: ignore[misc]
    snapshot.remove_snapshot(taken.path)
    return seconds, taken.fingerprint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="a base model folder (built here when not given)")
    parser.add_argument("--checkpoint", type=Path, help="a submission of the base's architecture")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="snapshot-copy-") as scratch:
        work = Path(scratch)
        if args.base is None or args.checkpoint is None:
            base, checkpoint = build_checkpoints(work, args.hidden, args.layers)
        else:
            base, checkpoint = args.base.resolve(), args.checkpoint.resolve()
        weights = sum(path.stat().st_size for path in checkpoint.glob("*.safetensors"))
        seconds: dict[str, list[float]] = {"hash_beside_copy": [], "hash_after_each_write": []}
        fingerprints: dict[str, set[str]] = {name: set() for name in seconds}
        take(base, checkpoint, work / "snapshots", former=False)  # warm the page cache
        for _ in range(args.rounds):
            for name in seconds:
                spent, fingerprint = take(
                    base, checkpoint, work / "snapshots", former=name != "hash_beside_copy"
                )
                seconds[name].append(round(spent, 3))
                fingerprints[name].add(fingerprint)
                print(f"{name}: {spent:.2f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
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
        "ratio_after_over_beside": round(medians["hash_after_each_write"] / medians["hash_beside_copy"], 2),
        "same_fingerprint": len(fingerprints["hash_beside_copy"] | fingerprints["hash_after_each_write"])
        == 1,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(
        json.dumps(
            {
                key: result[key]
                for key in ("median_s", "gib_per_s", "ratio_after_over_beside", "same_fingerprint")
            }
        )
    )
    return 0 if result["same_fingerprint"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
