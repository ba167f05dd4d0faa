"""A Hugging Face datasets cache holding ``openai/gsm8k`` as a download from the hub leaves it, made
here from GSM8K-format fixture files by the ``datasets`` library itself.

With the hub offline, ``datasets.load_dataset("openai/gsm8k", "main", split=...)`` (the platform's
real loading code) reads this cache, so the download path is tested without the hub. Like the hub's
copy, the cache holds two configurations, ``main`` and ``socratic`` (whose answers interleave
sub-questions), so that a load that named no configuration, or the wrong one, is noticed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: The cache's version folder: a hub download names it after the repository's revision.
REVISION = "0" * 40
#: What ``openai/gsm8k``'s socratic configuration puts before each step: a sub-question.
SOCRATIC_PREFIX = "How many are there? ** "


def socratic_rows(source: Path) -> list[dict[str, str]]:
    """The rows of a GSM8K-format ``source`` file with socratic-style answers."""
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line]
    return [{"question": r["question"], "answer": SOCRATIC_PREFIX + r["answer"]} for r in rows]


def build_gsm8k_cache(datasets_cache: Path, fixture_dir: Path, work_dir: Path) -> None:
    """Fill ``datasets_cache`` (what ``HF_DATASETS_CACHE`` names) with ``openai/gsm8k``'s ``main``
    configuration (``fixture_dir``'s train.jsonl and test.jsonl) and its ``socratic`` one."""
    from datasets.packaged_modules.json.json import Json

    socratic_dir = work_dir / "socratic"
    socratic_dir.mkdir(parents=True)
    for split in ("train", "test"):
        lines = (json.dumps(row) + "\n" for row in socratic_rows(fixture_dir / f"{split}.jsonl"))
        (socratic_dir / f"{split}.jsonl").write_text("".join(lines), encoding="utf-8")
    target = datasets_cache / "openai___gsm8k"
    target.mkdir(parents=True)
    for config, folder in (("main", fixture_dir), ("socratic", socratic_dir)):
        build_root = work_dir / f"build-{config}"
        files = {split: str(folder / f"{split}.jsonl") for split in ("train", "test")}
        builder = Json(
            cache_dir=str(build_root),
            dataset_name="gsm8k",
            config_name=config,
            data_files=files,
            hash=REVISION,
        )
        builder.download_and_prepare()
        # A local build's configuration folder carries a hash of its data files; the hub's is the
        # configuration's bare name (the repository's own files define it).
        [built] = (build_root / "gsm8k").iterdir()
        shutil.move(built, target / config)
