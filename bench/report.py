"""The measured figures of docs/PERFORMANCE.md and docs/RELIABILITY.md, rendered from the committed
``bench/results/*.json``.

Every figure in the document sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``
and is written by :func:`render` from one results file, so the document cannot drift from the
files (tests/unit/test_performance_doc.py fails when it does). After a benchmark writes new
results, ``python3 bench/report.py`` rewrites those blocks in place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results"
DOCUMENT = REPO_ROOT / "docs" / "PERFORMANCE.md"
#: docs/RELIABILITY.md: its generated blocks are rendered by RELIABILITY_RENDERERS.
RELIABILITY = REPO_ROOT / "docs" / "RELIABILITY.md"
BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.DOTALL)

#: What each variant of ``hf_generation_gpu.json`` measured, in the document's words.
GENERATION_VARIANTS = {
    "engine_full": "engine, every row writes all its new tokens",
    "engine_stop": "engine, rows stop at GSM8K train answer lengths",
    "engine_stop_keep_rows": "ablation: finished rows kept in the batch",
    "engine_stop_no_graphs": "ablation: no CUDA graphs",
    "engine_full_no_prefix": "ablation: no shared prefix (each prompt's first id differs)",
    "generate_ref": "transformers `generate`, one batch (the former GPU default size)",
    "generate_ref_split": "transformers `generate`, the same prompts in two batches",
    "engine_ref": "engine, the same prompts",
}


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
    return data


def _number(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if digits else f"{round(value):,}"


def generation_machine() -> str:
    data = _load("hf_generation_gpu")
    env = data["environment"]
    prompts = data["prompts"]
    stops = data["stop_distribution"]
    return (
        f"Measured {data['date'][:10]} on one {env['gpu']} ({env['gpu_memory_gib']} GiB), "
        f"torch {env['torch']}, "
        f"transformers {env['transformers']}; device copy bandwidth {data['copy_bandwidth_tb_s']} TB/s "
        f"(read plus write). Model: {data['model']}, {_number(data['parameters'] / 1e9, 3)} B parameters. "
        f"{prompts['rows']:,} prompts of {prompts['prompt_ids']['min']:,}–"
        f"{prompts['prompt_ids']['max']:,} ids (mean {_number(prompts['prompt_ids']['mean'], 0)}), "
        f"of which {prompts['shared_prefix_ids']:,} shared; "
        f"up to {data['max_new_tokens']} new tokens per row; stopping distribution: mean "
        f"{stops['mean_new_tokens']} new tokens per row, longest {stops['max_new_tokens']}.\n"
    )


def generation_table() -> str:
    variants = _load("hf_generation_gpu")["variants"]
    lines = [
        "| variant | what | rows | new tokens | s | new tok/s | floor s | × floor | peak GiB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, what in GENERATION_VARIANTS.items():
        record = variants.get(name)
        if record is None or record.get("status") != "ok":
            lines.append(f"| `{name}` | {what} | — | — | — | — | — | — | {record and record.get('status')} |")
            continue
        lines.append(
            f"| `{name}` | {what} | {record['rows']:,} | {record['new_tokens']:,} | {record['seconds']} | "
            f"{record['new_tokens_per_s']:,} | {record['floor_s']} | {record['over_floor']} | "
            f"{record['peak_allocated_gib']} |"
        )
    return "\n".join(lines) + "\n"


def generation_targets() -> str:
    data = _load("hf_generation_gpu")
    variants = data["variants"]
    full, stop = variants["engine_full"], variants["engine_stop"]
    ref, ours = variants["generate_ref"], variants["engine_ref"]
    attention = data["attention_step"]
    agreement = data["agreement_with_generate"]
    engine, control = agreement["engine_ref"], agreement["generate_ref_split"]
    return (
        f"- Whole split, {data['max_new_tokens']} new tokens per row: **{full['seconds']} s** "
        "(target ≤ 20 s), "
        f"{full['over_floor']}× the floor.\n"
        f"- Whole split, rows stopping at GSM8K answer lengths: **{stop['seconds']} s** (target ≤ 10 s).\n"
        f"- Side by side in the same run, {ref['rows']} prompts × "
        f"{ref['new_tokens'] // ref['rows']} new tokens: "
        f"`generate` {ref['seconds']} s, engine {ours['seconds']} s: **{engine['speedup']}×**.\n"
        f"- One layer's decode attention, {attention['rows']:,} rows, {attention['prefix_keys']:,} shared + "
        f"{attention['own_keys']} own keys: transformers' SDPA over a per-row cache "
        f"{attention['sdpa_repeat_kv_ms']} ms, grouped attention over one prefix copy "
        f"{attention['grouped_shared_prefix_ms']} ms "
        f"(**{_number(attention['sdpa_repeat_kv_ms'] / attention['grouped_shared_prefix_ms'])}×**; "
        f"reading the per-row cache once would take {attention['kv_read_floor_ms']} ms); "
        "relative difference of "
        f"the outputs {attention['relative_difference']} (bf16).\n"
        f"- Greedy ids against `generate` in bf16 (random weights): {engine['identical_rows']} of "
        f"{engine['rows']} rows identical, the first {engine['mean_identical_leading_ids']} ids "
        "equal on average; `generate` against itself with the same prompts split in two batches: "
        f"{control['identical_rows']} of "
        f"{control['rows']} identical, {control['mean_identical_leading_ids']} ids on average.\n"
    )


def generate_batches() -> str:
    data = _load("hf_eval_gpu")
    env = data["environment"]
    lines = [
        f"Measured 2026-11-30 on one {env['gpu']} ({env['gpu_memory_gib']} GiB), torch {env['torch']}, "
        f"transformers {env['transformers']}, {data['max_new_tokens']} new tokens per row, the backend's "
        "`generate` path before the engine (SDPA, dynamic cache, problem order).",
        "",
        "| prompt ids | batch | gen s | new tok/s | ms/step | peak GiB alloc / reserved | split s (1,319) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for record in data["variants"].values():
        cap = record["prompt_cap"] or data["prompt_ids"]["mean"]
        if record["status"] != "ok":
            lines.append(
                f"| {cap:,} | {record['batch_size']:,} | — | — | — | out of memory "
                f"({record['peak_allocated_gib']} / {record['peak_reserved_gib']} at failure) | — |"
            )
            continue
        lines.append(
            f"| {cap:,} | {record['batch_size']:,} | {record['generation_s']} | "
            f"{_number(record['new_tokens_per_s'], 0)} | {record['ms_per_decode_step']} | "
            f"{record['peak_allocated_gib']} / {record['peak_reserved_gib']} | {record['split_estimate_s']} |"
        )
    return "\n".join(lines) + "\n"


def opencompass_cpu() -> str:
    data = _load("opencompass_cpu")
    phases = data["phases_s"]
    slowest = sorted(phases.items(), key=lambda item: -item[1])[:3]
    return (
        f"Measured {data['timestamp'][:10]} on {data['machine']['cpus']} CPU cores (load average "
        f"{_number(data['machine']['load_avg'][0])}): {data['model']}, {data['problems']} problems, "
        f"{data['max_new_tokens']} new tokens: {data['wall_s']} s wall, {data['process_tree_cpu_s']} CPU-s. "
        f"Largest phases: "
        + ", ".join(f"{name.removesuffix('_s').replace('_', ' ')} {value} s" for name, value in slowest)
        + f"; OpenCompass's own imports cost {data['imports_per_process']['opencompass_cli']['cpu_s']} CPU-s "
        "in each of its processes.\n"
    )


RENDERERS: dict[str, Callable[[], str]] = {
    "generation-machine": generation_machine,
    "generation-table": generation_table,
    "generation-targets": generation_targets,
    "generate-batches": generate_batches,
    "opencompass-cpu": opencompass_cpu,
}


def _code(text: str) -> str:
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def mutation() -> str:
    data = _load("mutation")
    outcomes = ", ".join(f"{status} {count}" for status, count in data["outcomes"].items())
    lines = [
        f"Run {data['date'][:10]} with {data['tool']} (`make mutation`): {data['mutants']} mutants of "
        f"{', '.join(map(_code, data['modules']))}, each against {', '.join(map(_code, data['tests']))}. "
        f"Outcomes: {outcomes}.",
        "",
    ]
    if not data["survivors"]:
        return "\n".join([*lines, "No mutant survived."]) + "\n"
    lines += ["| surviving mutant | the changed line |", "| --- | --- |"]
    lines += [f"| {_code(s['mutant'])} | {_code(s['change'])} |" for s in data["survivors"]]
    return "\n".join(lines) + "\n"


RELIABILITY_RENDERERS: dict[str, Callable[[], str]] = {"mutation": mutation}
#: Every generated document and the renderers of its blocks.
DOCUMENTS = {DOCUMENT: RENDERERS, RELIABILITY: RELIABILITY_RENDERERS}


def render(name: str, renderers: dict[str, Callable[[], str]] = RENDERERS) -> str:
    return renderers[name]()


def blocks(text: str) -> dict[str, str]:
    """The generated blocks of a document, by name."""
    return {match["name"]: match["body"] for match in BLOCK.finditer(text)}


def update(path: Path = DOCUMENT, renderers: dict[str, Callable[[], str]] = RENDERERS) -> None:
    text = path.read_text(encoding="utf-8")
    path.write_text(
        BLOCK.sub(lambda m: m.group(1) + render(m["name"], renderers) + m.group(4), text), encoding="utf-8"
    )


if __name__ == "__main__":
    for document, document_renderers in DOCUMENTS.items():
        update(document, document_renderers)
        print(f"updated {document.relative_to(REPO_ROOT)}")
