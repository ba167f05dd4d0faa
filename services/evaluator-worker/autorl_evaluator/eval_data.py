"""`autorl test-data`: put each task's test split into the evaluators' own storage before a worker
starts (on a cluster, the evaluator pod's init container).

The split is loaded exactly as an evaluation loads it (``Task.load_test_problems``, which caches it
as ``AUTORL_EVAL_DIR/data/<task>/test.jsonl``), from one of three sources:

- the Hugging Face hub (GSM8K: ``datasets.load_dataset("openai/gsm8k", "main")``; ``HF_TOKEN`` if set);
- a folder (``AUTORL_DATA_SOURCE_DIR``, holding ``<task>/test.jsonl`` or ``test.jsonl``): a folder in
  a custom image or on a claim that only this step mounts, for clusters without the hub;
- a URL (``--source-url``): ``<url>/<task>/test.jsonl`` is fetched over HTTP(S), e.g. from an
  object store, into a private temporary folder that is then the source.

A split already cached is kept. Nothing of the split is printed: only counts and paths.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from autorl.errors import AutoRLError, ConfigurationError
from autorl.settings import HomeSettings
from autorl.tasks import get_task, task_names

log = logging.getLogger("autorl.evaluator.test_data")
#: Seconds one HTTP(S) fetch of a test split may take.
FETCH_TIMEOUT_S = 120
#: A test split larger than this is refused (GSM8K's is about 0.7 MB).
MAX_SPLIT_BYTES = 256 * 1024 * 1024


def split_url(base_url: str, task: str) -> str:
    """``<base_url>/<task>/test.jsonl``; only http and https URLs naming a host are accepted."""
    try:
        parts = urllib.parse.urlsplit(base_url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # a port that is not a number is refused here, not when fetching
    except ValueError:  # an unclosed [IPv6 address, a port out of range
        valid = False
    if not valid:
        raise ConfigurationError(
            f"test data URL {base_url!r} must be http:// or https:// and name a host (for an object store, "
            "a bucket's HTTPS endpoint or a pre-signed URL of the folder)"
        )
    return f"{base_url.rstrip('/')}/{task}/test.jsonl"


def fetch_split(base_url: str, task: str, target_dir: Path) -> Path:
    """Download ``task``'s test split from ``base_url`` into ``target_dir/<task>/test.jsonl``."""
    url = split_url(base_url, task)
    target = target_dir / task / "test.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as answer:
            body = answer.read(MAX_SPLIT_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:  # ValueError: a URL http refuses
        # A failure to fetch, not a setting known to be wrong (the network may be down): exit 1.
        raise AutoRLError(
            f"could not fetch the {task} test split from {url}: {exc}; check evaluator.testData.url and "
            "that the evaluator pods may reach it"
        ) from exc
    if len(body) > MAX_SPLIT_BYTES:
        raise ConfigurationError(f"{url} is larger than {MAX_SPLIT_BYTES} bytes; is it a test split?")
    target.write_bytes(body)
    return target


def provide(
    tasks: Sequence[str], settings: HomeSettings, *, source_url: str | None = None
) -> dict[str, Path]:
    """Cache each task's test split in evaluator storage; returns the cached file of each."""
    data_dir = settings.eval_dir / "data"
    cached: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="autorl-test-data-") as scratch:
        for name in tasks:
            task = get_task(name)
            source_dir = settings.data_source_dir
            if source_url is not None and not (data_dir / task.name / "test.jsonl").is_file():
                fetch_split(source_url, task.name, Path(scratch))
                source_dir = Path(scratch)
            problems = task.load_test_problems(data_dir, source_dir=source_dir)
            cached[task.name] = data_dir / task.name / "test.jsonl"
            log.info(
                "event=test_data_ready task=%s problems=%d path=%s",
                task.name,
                len(problems),
                cached[task.name],
            )
    return cached


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "test-data",
        help="cache tasks' test splits in the evaluators' storage (AUTORL_EVAL_DIR) from the hub, "
        "AUTORL_DATA_SOURCE_DIR or a URL",
    )
    parser.add_argument(
        "--task", action="append", required=True, choices=task_names(), help="a task (repeat for several)"
    )
    parser.add_argument(
        "--source-url", help="fetch <URL>/<task>/test.jsonl over HTTP(S) instead of the hub or a folder"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autorl.cli import UsageError

    if args.source_url is not None:
        try:
            split_url(args.source_url, args.task[0])
        except ConfigurationError as exc:
            raise UsageError(f"--source-url: {exc}") from exc
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    provide(args.task, HomeSettings(), source_url=args.source_url)
    return 0
