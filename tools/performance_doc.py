"""The measured figures of docs/PERFORMANCE.md, rendered from the committed ``bench/results/*.json``.

Every figure in the document sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``
and is written by one of :data:`RENDERERS` from one results file (:mod:`docgen`), so the document
cannot drift from the files (tests/unit/test_generated_docs.py fails when it does). After a
benchmark writes new results, ``python3 -m tools.performance_doc`` rewrites those blocks in place.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import Any

from tools.docgen import REPO_ROOT, Document, load_results, number

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


def generation_machine() -> str:
    data = load_results("hf_generation_gpu")
    env = data["environment"]
    prompts = data["prompts"]
    stops = data["stop_distribution"]
    return (
        f"Measured {data['date'][:10]} on one {env['gpu']} ({env['gpu_memory_gib']} GiB), "
        f"torch {env['torch']}, "
        f"transformers {env['transformers']}; device copy bandwidth {data['copy_bandwidth_tb_s']} TB/s "
        f"(read plus write). Model: {data['model']}, {number(data['parameters'] / 1e9, 3)} B parameters. "
        f"{prompts['rows']:,} prompts of {prompts['prompt_ids']['min']:,}–"
        f"{prompts['prompt_ids']['max']:,} ids (mean {number(prompts['prompt_ids']['mean'], 0)}), "
        f"of which {prompts['shared_prefix_ids']:,} shared; "
        f"up to {data['max_new_tokens']} new tokens per row; stopping distribution: mean "
        f"{stops['mean_new_tokens']} new tokens per row, longest {stops['max_new_tokens']}.\n"
    )


def generation_table() -> str:
    variants = load_results("hf_generation_gpu")["variants"]
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
    data = load_results("hf_generation_gpu")
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
        f"(**{number(attention['sdpa_repeat_kv_ms'] / attention['grouped_shared_prefix_ms'])}×**; "
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
    data = load_results("hf_eval_gpu")
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
            f"{number(record['new_tokens_per_s'], 0)} | {record['ms_per_decode_step']} | "
            f"{record['peak_allocated_gib']} / {record['peak_reserved_gib']} | {record['split_estimate_s']} |"
        )
    return "\n".join(lines) + "\n"


def opencompass_cpu() -> str:
    data = load_results("opencompass_cpu")
    phases = data["phases_s"]
    slowest = sorted(phases.items(), key=lambda item: -item[1])[:3]
    return (
        f"Measured {data['timestamp'][:10]} on {data['machine']['cpus']} CPU cores (load average "
        f"{number(data['machine']['load_avg'][0])}): {data['model']}, {data['problems']} problems, "
        f"{data['max_new_tokens']} new tokens: {data['wall_s']} s wall, {data['process_tree_cpu_s']} CPU-s. "
        f"Largest phases: "
        + ", ".join(f"{name.removesuffix('_s').replace('_', ' ')} {value} s" for name, value in slowest)
        + f"; OpenCompass's own imports cost {data['imports_per_process']['opencompass_cli']['cpu_s']} CPU-s "
        "in each of its processes.\n"
    )


def _failed(record: dict[str, Any]) -> str:
    return f"not measured ({record.get('status')}: {str(record.get('error', ''))[:120]})"


def evaluate_engine() -> str:
    """A whole ``HFBackend.evaluate`` call through the engine (the ``engine`` run of hf_eval_gpu)."""
    run = load_results("hf_eval_gpu").get("engine")
    if run is None:
        return "Not run on a GPU yet.\n"
    env, record = run["environment"], run["variants"]["1319"]
    return (
        f"Measured {run['date'].replace('T', ' ')[:16]} UTC on one {env['gpu']}, torch {env['torch']}, "
        f"transformers {env['transformers']}: `HFBackend().evaluate` on {record['n_problems']:,} prompts of "
        f"{run['prompt_ids']['min']:,}–{run['prompt_ids']['max']:,} ids, {run['max_new_tokens']} new tokens "
        f"per row ({run['model']}), in {record['split_batches']} batch of {record['batch_size']:,}: "
        f"**{record['wall_s']} s** from the call to the scores (target ≤ 20 s), of which generation "
        f"{record['generation_s']} s ({number(record['new_tokens_per_s'], 0)} new tok/s, "
        f"{record['ms_per_decode_step']} ms a decode step) and loading, prompts and scoring "
        f"{record['overhead_s']} s; peak {record['peak_allocated_gib']} GiB allocated.\n"
    )


def grpo_throughput() -> str:
    data = load_results("grpo_gpu")
    part = data["throughput"]
    if part.get("status") == "error":
        return _failed(part) + "\n"
    env = data["environment"]
    lines = [
        f"Measured {data['runs']['throughput']['date'].replace('T', ' ')[:16]} UTC on one {env['gpu']}, "
        f"torch {env['torch']}, transformers {env['transformers']}, TRL {env['trl']}, all variants in one "
        f"process with one model. Model: {part['model']}, "
        f"{number(part['parameters'] / 1e9, 3)} B parameters; prompts of about "
        f"{number(part['prompt_ids_mean'], 0)} ids; {part['completion_tokens']}-token completions.",
        "",
        "| variant | completions / step | steps timed | s / step | rollout s | loss + update s "
        "| completion tok/s | × TRL reference |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, record in part["variants"].items():
        if record.get("status") == "error":
            lines.append(f"| `{name}` | — | — | — | — | — | — | {_failed(record)} |")
            continue
        lines.append(
            f"| `{name}` | {record['completions_per_step']} | {record['steps_timed']} | {record['step_s']} | "
            f"{record.get('rollout_s', '—')} | {record.get('train_s', '—')} | "
            f"{number(record['completion_tokens_per_s'], 0)} | {record.get('vs_trl_2x4', '—')} |"
        )
    design = part.get("design_reference")
    best = max(
        (r for r in part["variants"].values() if "completion_tokens_per_s" in r),
        key=lambda r: r["completion_tokens_per_s"],
    )
    if design:
        reference = design["trl_2x4_completion_tokens_per_s"]
        lines += [
            "",
            f"Against the design's reference measurement of TRL at the same settings ({reference} tok/s): "
            f"**{number(best['completion_tokens_per_s'] / reference)}×** (target ≥ 10×, "
            f"{number(best['completion_tokens_per_s'], 0)} against ≥ {number(10 * reference, 0)} tok/s).",
        ]
    return "\n".join(lines) + "\n"


def grpo_learning() -> str:
    part = load_results("grpo_gpu")["learning"]
    if part.get("status") == "error":
        return _failed(part) + "\n"
    data = load_results("grpo_gpu")
    date, gpu = data["runs"]["learning"]["date"], data["environment"]["gpu"]
    sft, grpo, curve = part["sft"], part["grpo"], part["grpo"]["curve"]
    tenth = max(1, len(curve) // 10)
    points = ", ".join(f"{c['step']}: {c['reward']}" for c in curve[::tenth])
    first, last = curve[:tenth], curve[-tenth:]
    return (
        f"Measured {date.replace('T', ' ')[:16]} UTC on one {gpu} (the run above). "
        f"Model: {part['model']}, {number(part['parameters'] / 1e6, 1)} M parameters. Held out: "
        f"{part['held_out']}. Greedy accuracy: {part['accuracy_initial']} % at random init, "
        f"{part['accuracy_after_sft']} % after SFT ({sft['steps']} steps of {sft['rows_per_step']} rows in "
        f"{sft['seconds']} s, learning rate {sft['learning_rate']}), "
        f"**{part['accuracy_after_grpo']} %** after "
        f"{len(curve)} fast GRPO steps in {curve[-1]['t_s']} s ({grpo['prompts_per_step']} prompts × "
        f"{grpo['num_generations']} generations, learning rate {grpo['learning_rate']}, up to "
        f"{grpo['max_completion_length']} new tokens). Mean reward (+1 right, -1 wrong) by step: {points}; "
        f"first {tenth} steps {number(sum(c['reward'] for c in first) / len(first), 3)}, last {tenth} "
        f"{number(sum(c['reward'] for c in last) / len(last), 3)}.\n"
    )


def bf16_agreement() -> str:
    part = load_results("grpo_gpu")["learning"]
    if part.get("status") == "error" or "agreement" not in part:
        return _failed(part) + "\n"
    a = part["agreement"]
    return (
        f"The GRPO-trained arith model above, bf16 on the GPU, {a['rows']:,} prompts (the held-out 200 and "
        f"train prompts), up to 64 new tokens: final answers equal between the engine and `generate` in "
        f"**{a['equal_final_answers']:,} of {a['rows']:,} ({a['equal_final_answers_pct']} %)** "
        f"(target ≥ 99 %); ids identical in {a['identical_ids']:,} rows; `generate` wrote a final answer "
        f"in {a['rows_with_an_answer']:,}.{_agreement_controls(a)}\n"
    )


def _agreement_controls(a: dict[str, Any]) -> str:
    """The controls of bench/grpo_gpu.py's agreement part, where the results hold them."""
    if "generate_vs_generate_other_batches" not in a:
        return ""
    floor, wide = a["generate_vs_generate_other_batches"], a["float32_engine_vs_generate"]
    first, second = a["generate_batch_sizes"]
    return (
        f" Controls: `generate` against itself in batches of {first} and {second}: final answers equal in "
        f"{floor['equal_final_answers']:,} ({floor['equal_final_answers_pct']} %), ids in "
        f"{floor['identical_ids']:,}; the engine against `generate` on a float32 copy of the model: "
        f"{wide['equal_final_answers']:,} ({wide['equal_final_answers_pct']} %), "
        f"ids in {wide['identical_ids']:,}."
    )


def weight_swap() -> str:
    part = load_results("grpo_gpu")["weight_swap"]
    if part.get("status") == "error":
        return _failed(part) + "\n"
    cold, warm = part["cold_load_to_first_token_s"], part["weight_swap_to_first_token_s"]
    return (
        f"{part['model']}; one prompt of {part['prompt_ids']:,} ids. Cold `from_pretrained` to the GPU and "
        f"the first id: {', '.join(f'{v} s' for v in cold)}; weights read straight to the GPU into the "
        f"resident model and the first id: **{', '.join(f'{v} s' for v in warm)}** (target ≤ 2 s).\n"
    )


def demo_cpu() -> str:
    data = load_results("demo_cpu")
    lines = _demo_table(data)
    for earlier in data.get("earlier_runs", []):
        lines += ["", f"An earlier run of the same script ({earlier['note']}):", "", *_demo_table(earlier)]
    return "\n".join(lines) + "\n"


def _demo_table(data: dict[str, Any]) -> list[str]:
    machine = data["machine"]
    lines = [
        f"Measured {data['date'].replace('T', ' ')[:16]} UTC: {len(data['variants'])} runs of "
        "`autorl run -t arith "
        f"-m builtin:tiny-qwen2 -a example_grpo --timeout {data['timeout_s']:g}` at once on a machine of "
        f"{machine['cores']} idle cores ({machine['processor']}), each pinned to {data['cores_per_run']} "
        "cores of its own with its grader and evaluator. Scores on the arith test split (0–100).",
        "",
        "| variant | agent arguments | baseline | best SFT checkpoint | best GRPO checkpoint | improvement "
        "| run s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, record in data["variants"].items():
        cells = [record.get(key) for key in ("baseline", "best_sft", "best_grpo", "improvement")]
        shown = " | ".join("—" if value is None else number(value) for value in cells)
        lines.append(
            f"| `{name}` | `{record['agent_args'] or '(defaults)'}` | {shown} | {record['wall_s']} |"
        )
    return lines


#: ``autorl run``'s phases in bench/autorl_run_gpu.py's results, in order, by column heading.
RUN_PHASES = {
    "services_started": "services",
    "baseline_scored": "baseline scored",
    "agent_started": "agent start",
    "first_submission": "1st submission",
    "first_score": "1st score",
    "agent_exited": "agent exit",
    "results_row": "results row",
}


def autorl_run() -> str:
    if not (REPO_ROOT / "bench" / "results" / "autorl_run_gpu.json").is_file():
        return "Not run on a GPU yet: `bench/results/autorl_run_gpu.json` does not exist.\n"
    runs = load_results("autorl_run_gpu")["runs"]
    lines = []
    for name, run in runs.items():
        env, settings = run["environment"], run["settings"]
        added = ", ".join(
            f"{package} {version}" for package, version in sorted((env["wheelhouse"] or {}).items())
        )
        lines.append(
            f"- `{name}`: {run['date'][:16].replace('T', ' ')} UTC on {len(env['gpus'])}× {env['gpus'][0]}, "
            f"torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}; model "
            f"{run['model']['name']}; agent `example_grpo` (`{settings['agent_args']}`), budget "
            f"{number(settings['timeout_s'], 0)} s; evaluations of {settings['eval_limit'] or 'all'} "
            f"problems × up to {settings['eval_max_new_tokens']} new tokens; "
            f"added to the image: {added or 'nothing'}."
        )
    lines += [
        "",
        "Seconds from the start of each `autorl run`:",
        "",
        "| run | GPUs | "
        + " | ".join(RUN_PHASES.values())
        + " | exit | scored | evaluation s | peak MiB by GPU |",
        "| --- | --- | " + "---: | " * (len(RUN_PHASES) + 3) + "--- |",
    ]
    for name, run in runs.items():
        phases = [run["phases_s"].get(key) for key in RUN_PHASES]
        evaluations = [row["eval_seconds"] for row in run.get("submissions", []) if row.get("eval_seconds")]
        spread = f"{number(min(evaluations))}–{number(max(evaluations))}" if evaluations else "—"
        memory = ", ".join(f"{gpu}: {mib:,}" for gpu, mib in sorted(run["gpu_peak_used_mib"].items())) or "—"
        row = run.get("results_row", {})
        flags = " ".join([*(f"{k}={v}" for k, v in run["env"].items()), *run["flags"]]) or "no GPU flags"
        lines.append(
            f"| `{name}` | `{flags}` | "
            + " | ".join("—" if value is None else number(value) for value in phases)
            + f" | {run['exit_code']} | {row.get('submissions', '—')} | {spread} | {memory} |"
        )
    lines.append("")
    for name, run in runs.items():
        row = run.get("results_row", {})
        start = next(
            (line.split(" event=start ")[1] for line in run.get("agent_log", []) if " event=start " in line),
            "",
        )
        lines.append(
            f"- `{name}`: status {row.get('status', '—')}, baseline {row.get('baseline')}, best "
            f"{row.get('best_score')}, improvement {row.get('improvement')}; the agent: `{start}`."
        )
    return "\n".join(lines) + "\n"


#: What each variant of ``opencompass_vllm_gpu.json`` ran, in the document's words.
OPENCOMPASS_VLLM_VARIANTS = {
    "bare_llm_graphs": "bare vLLM: offline `LLM.generate`, all prompts in one call; CUDA graphs, "
    "prefix caching, `max_num_seqs` 512 (the reference of this run)",
    "serve_graphs": "`vllm serve` with the same engine settings; one request per prompt, all at once",
    "serve_graphs_run2": "the same server again (next call, compile cache warm)",
    "serve_worker_config": "`vllm serve` with the engine arguments the worker's config gives vLLM today "
    "(`enforce_eager`; `max_num_seqs` and prefix caching left at vLLM's defaults)",
    "bare_llm_worker_config": "offline `LLM.generate` with the worker's engine arguments, all prompts in "
    "one call: what `VLLMwithChatTemplate` runs with the config the worker writes",
}
OPENCOMPASS_VLLM_RUNS = ("opencompass_prompts", "ids_stop", "ids_full")


def opencompass_vllm_machine() -> str:
    data = load_results("opencompass_vllm_gpu")
    env = data["environment"]
    recorded = data["recorded"]
    sampling = recorded["sampling_kwargs"]
    dates = sorted({call["date"][:16].replace("T", " ") for call in data["calls"]})
    return (
        f"Measured {', '.join(dates)} UTC on one {env['gpu']} ({env['gpu_memory_gib']} GiB), "
        f"torch {env['torch']}, vLLM {env['vllm']}, Python {env['python']}; {data['model']}, "
        f"{number(data['model_build']['parameters'] / 1e9, 3)} B parameters. The {recorded['prompts']:,} "
        f"prompts: {recorded['problems']}, rendered by OpenCompass through the worker's own config "
        f"(`{recorded['worker_details']['model_type']}`, tensor-parallel size "
        f"{recorded['worker_details']['tensor_parallel_size']}); sampling as OpenCompass sends it: "
        f"temperature {sampling['temperature']}, top-k {sampling['top_k']}, up to {sampling['max_tokens']} "
        f"new tokens, stop at {', '.join(f'`{s}`' for s in sampling['stop'])}. The id workloads: "
        f"{data['workloads']['ids_stop']}; {data['workloads']['ids_full']}. Commands: "
        f"`{recorded['command']}` here, then on the GPU machine, one warm machine, consecutive calls: "
        + "; ".join(f"`{call['command']}`" for call in data["calls"])
        + f"; then `{data['replay_command']}` here.\n"
    )


def opencompass_vllm_table() -> str:
    variants = load_results("opencompass_vllm_gpu")["variants"]
    bare = variants["bare_llm_graphs"]["runs"]
    lines = [
        "| variant | engine start s | OpenCompass's prompts s (× bare) | GSM8K answer lengths s (× bare) "
        "| 512 tokens per row s (× bare) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, what in OPENCOMPASS_VLLM_VARIANTS.items():
        record = variants.get(name)
        if record is None or record.get("status") != "ok":
            lines.append(f"| {what} | — | — | — | — |")
            continue
        seconds = [record["runs"][run]["seconds"] for run in OPENCOMPASS_VLLM_RUNS]
        cells = [
            f"{value} ({number(value / bare[run]['seconds'], 2)}×)"
            for value, run in zip(seconds, OPENCOMPASS_VLLM_RUNS, strict=True)
        ]
        lines.append(f"| {what} | {record['startup_s']} | {' | '.join(cells)} |")
    lines.append("")
    for name, record in variants.items():
        phases = record.get("startup_phases_s")
        if phases:
            lines.append(
                f"- `{name}`'s engine start, from its log's whole-second stamps: "
                + ", ".join(f"{phase.replace('_', ' ')} {value} s" for phase, value in phases.items())
                + "."
            )
    return "\n".join(lines) + "\n"


def opencompass_vllm_parity() -> str:
    data = load_results("opencompass_vllm_gpu")
    lines = []
    for name, replay in data["replay"].items():
        lines.append(
            f"- `{name}`: the worker read back "
            f"{'the same' if replay['completions_equal_gpu'] else 'DIFFERENT'} "
            f"{data['recorded']['prompts']:,} completions the GPU gave; OpenCompass's summary "
            f"{replay['summary_accuracy']}, the task's own OpenCompass-protocol score "
            f"{number(replay['recomputed_here'], 4)} "
            f"({'equal' if replay['summary_equals_recomputed'] else 'NOT equal'} at the summary's two "
            "decimals); worker "
            f"{replay['worker_seconds']} s on this machine's CPUs (OpenCompass's processes and scoring).\n"
        )
    for name, a in data["agreement_with_bare"].items():
        lines.append(
            f"- `{name}` against bare vLLM, same prompts: {a['identical_completions']:,} of {a['rows']:,} "
            f"completions identical, {a['equal_final_answers']:,} equal final answers "
            f"({a['equal_final_answers_both_empty']:,} of them because neither holds a number), the first "
            f"{a['mean_identical_leading_chars']} characters equal on average.\n"
        )
    control = data.get("agreement_serve_graphs_runs")
    if control:
        lines.append(
            f"- Control: the same server configuration in two calls: {control['identical_completions']:,} of "
            f"{control['rows']:,} identical, {control['equal_final_answers']:,} equal final answers "
            f"({control['equal_final_answers_both_empty']:,} both without a number), "
            f"{control['mean_identical_leading_chars']} characters on average.\n"
        )
    return "".join(lines)


def grpo_trl_vllm() -> str:
    """TRL's ``GRPOTrainer`` with colocated vLLM against the fast path (bench/grpo_trl_vllm_gpu.py)."""
    data = load_results("grpo_trl_vllm_gpu")
    env, model, settings = data["environment"], data["model"], data["settings"]
    calls = data["calls"]
    sizes = (
        f"{number(model['parameters'] / 1e9, 3)} B parameters; prompts of about "
        f"{number(model['prompt_ids_mean'], 0)} ids; at most {settings['completion_tokens']} completion "
        f"tokens; learning rate {settings['learning_rate']}, seed {settings['seed']}, "
        f"{settings['warmup_steps']} warm-up step left out of each variant."
    )
    lines = [
        f"Measured on one {env['gpu']} ({env['gpu_memory_gib']} GiB), torch {env['torch']}, transformers "
        f"{env['transformers']}, TRL {env['trl']}, vLLM {env['vllm']}, datasets {env['datasets']}, Python "
        f"{env['python']}; {len(calls)} calls, each variant in a process of its own, the pairs of one "
        f"size in the same call. Model: {model['description']}, {sizes}",
        "",
        "| variant | call | completions / step | steps timed | s / step | completion tok/s "
        "| engine start s | reward per step |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, record in data["variants"].items():
        if record.get("status") != "ok":
            lines.append(
                f"| `{name}` | {record.get('call', 0) + 1} | — | — | — | — | — | {_failed(record)} |"
            )
            continue
        rewards = ", ".join(str(r) for r in record["reward_per_step"])
        rate = number(record["completion_tokens_per_s"], 0)
        lines.append(
            f"| `{name}` | {record['call'] + 1} | {record['completions_per_step']} | "
            f"{record['steps_timed']} | {record['step_s']} | {rate} | "
            f"{record.get('trainer_start_s', '—')} | {rewards} |"
        )
    lines.append("")
    for name, ratio in data["ratios"].items():
        fast, _, trl = name.partition("_over_")
        lines.append(f"- `{fast}` against `{trl}`, same call: **{ratio}×** completion tokens per second.")
    lines.append("")
    for index, call in enumerate(calls, start=1):
        lines.append(f"- Call {index}, {call['date'].replace('T', ' ')[:16]} UTC: `{call['command']}`")
    return "\n".join(lines) + "\n"


def grpo_trl_vllm_learning() -> str:
    """The learning comparison on a trained checkpoint (bench/grpo_trl_vllm_gpu.py --checkpoint)."""
    run = load_results("grpo_trl_vllm_gpu").get("learning_run")
    if run is None:
        return (
            "Not measured yet: no learning run on a trained checkpoint (`--checkpoint`) is in the "
            "results file, so nothing here compares what the two paths learn per step.\n"
        )
    return learning_run_text(run)


def learning_run_text(run: dict[str, Any]) -> str:
    """A learning run's reward curves side by side, the first and last steps' mean reward and the
    held-out accuracy before and after, per variant."""
    env, model, settings = run["environment"], run["model"], run["settings"]
    learning, variants = run["learning"], run["variants"]
    compared = learning["variants"]
    training = model.get("training") or {}
    trained = (
        f", fine-tuned {training['steps']} steps at learning rate {training['learning_rate']} (loss "
        f"{training['loss_first_last'][0]} → {training['loss_first_last'][1]})"
        if {"steps", "learning_rate", "loss_first_last"} <= set(training)
        else ""
    )
    check = run.get("prompt_check", {})
    prompt = (
        f"equal to OpenCompass's recorded prompt for {check['equal']:,} of the {check['recorded_prompts']:,} "
        "evaluated problems"
        if check.get("checked")
        else f"not checked against OpenCompass's recorded prompt ({check.get('why', 'no record')})"
    )
    problems = run.get("problems", {})
    same = learning.get("same_problems_every_step")
    lines = [
        f"Measured {run['date'].replace('T', ' ')[:16]} UTC on one {env.get('gpu', 'CPU')}, torch "
        f"{env['torch']}, transformers {env['transformers']}, TRL {env['trl']}, vLLM {env['vllm']}: "
        f"`{run['command']}`. Model: {model['description']}, {number(model['parameters'] / 1e9, 3)} B "
        f"parameters{trained}. Prompts: the evaluated 4-shot prompt ({prompt}) around generated problems "
        f"that are not among {problems.get('kept_out', 'the training or evaluated problems')}; learning "
        f"rate {settings['learning_rate']}, temperature {settings['temperature']}, at most "
        f"{settings['completion_tokens']} completion tokens, seed {settings['seed']}; reward "
        f"{settings.get('reward', '+1 right, -1 wrong')}. The same problems at every step in every "
        f"variant: {'yes' if same else 'no'}.",
        "",
        "| step | " + " | ".join(f"`{name}` mean reward (right %)" for name in compared) + " |",
        "| ---: | " + " | ".join("---:" for _ in compared) + " |",
    ]
    longest = max((len(c["reward_per_step"]) for c in compared.values()), default=0)
    for index in range(longest):
        cells = [
            f"{c['reward_per_step'][index]:.3f} ({number(100 * c['accuracy_per_step'][index])})"
            if index < len(c["reward_per_step"])
            else "—"
            for c in compared.values()
        ]
        lines.append(f"| {index + 1} | " + " | ".join(cells) + " |")
    window = learning.get("window", 0)
    held = run.get("held_out", {})
    count = settings.get("held_out", 0)
    lines += [
        "",
        f"| variant | steps run | mean reward, first {window} → last {window} of "
        f"{learning.get('steps_compared', 0)} steps | held-out greedy accuracy % before → after "
        f"({count} problems) | s / step | completion tok/s | engine start s | policy weights |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for name, record in variants.items():
        c = compared.get(name)
        if record.get("status") != "ok" or c is None:
            lines.append(f"| `{name}` | — | — | — | — | — | — | {_failed(record)} |")
            continue
        accuracy = (
            f"{c['held_out_accuracy_before']} → **{c['held_out_accuracy_after']}**"
            if "held_out_accuracy_after" in c
            else "not answered"
        )
        rate = record.get("completion_tokens_per_s")
        lines.append(
            f"| `{name}` | {c['steps_run']} | {c['mean_reward_first']} → **{c['mean_reward_last']}** | "
            f"{accuracy} | {record.get('step_s', '—')} | {'—' if rate is None else number(rate, 0)} | "
            f"{record.get('trainer_start_s', '—')} | {record.get('policy_dtype', '—')} |"
        )
    lines.append("")
    if held.get("status") == "ok":
        answers = held["answers"]
        lines.append(
            f"- Held out: {count} problems answered greedily by one engine (`{held['engine']}`) in one "
            "process, the checkpoint as it was and then each variant's final weights loaded into it; "
            "OpenCompass's protocol: "
            + ", ".join(f"{name} {a['opencompass_accuracy']} %" for name, a in answers.items())
            + "; answers that end with the end-of-turn id: "
            + ", ".join(f"{name} {a['stopped']}" for name, a in answers.items())
            + "; mean absolute change of a weight: "
            + ", ".join(
                f"{name} {a['weights_mean_abs_change']}"
                for name, a in answers.items()
                if name != "checkpoint"
            )
            + "."
        )
    else:
        lines.append(f"- Held out: {_failed(held)}.")
    lines.append(
        f"- s / step and completion tok/s leave out each variant's first step, as above; the whole call: "
        f"{run['total_s']} s."
    )
    return "\n".join(lines) + "\n"


def vllm_warm_reload() -> str:
    """A resident vLLM engine loading checkpoints in place against a fresh engine per checkpoint."""
    data = load_results("vllm_warm_reload_gpu")
    env, warm, fresh = data["environment"], data["warm"], data["fresh"]
    controls = data["controls"]
    lines = [
        f"Measured {data['date'].replace('T', ' ')[:16]} UTC on one {env['gpu']}, torch {env['torch']}, vLLM "
        f"{env['vllm']}, Python {env['python']}: `{data['command']}`. Model: {data['model']['description']}, "
        f"{number(data['model']['parameters'] / 1e9, 3)} B parameters, a "
        f"{number(data['model']['checkpoint_bytes'] / 1e9)} GB safetensors file. Engine: "
        + ", ".join(f"`{k}={v}`" for k, v in data["engine_kwargs"].items())
        + f". Workload: {data['workload']}.",
        "",
        "| checkpoint on disk → every prompt answered | s | of which |",
        "| --- | ---: | --- |",
    ]
    for reload in warm["reloads"]:
        lines.append(
            f"| resident engine, checkpoint {reload['checkpoint']} loaded in place | "
            f"{reload['checkpoint_to_answers_s']} | loading the weights {reload['load_weights_s']} s |"
        )
    for label, record in fresh.items():
        lines.append(
            f"| fresh process and engine, checkpoint {label} | {record['process_s']} | importing vLLM "
            f"{record['import_s']} s, engine start {record['engine_start_s']} s, generation "
            f"{record['generate_s']} s |"
        )
    reload_b = next(r for r in warm["reloads"] if r["checkpoint"] == "B")
    ratio = number(fresh["B"]["process_s"] / reload_b["checkpoint_to_answers_s"])
    lines += [
        "",
        f"Same call, checkpoint B: the fresh process takes **{ratio}×** as long as the resident engine.",
        "",
        f"The resident engine's own start, once: {warm['engine_start_s']} s (its first generation "
        f"{warm['first_generate_s']} s).",
        "",
        "Greedy answers as token ids, identical rows of 1,319:",
        "",
    ]
    words = {
        "warm_B_vs_fresh_B": "resident engine after loading B, against a fresh engine on B",
        "warm_A_after_B_vs_fresh_A": "resident engine after loading B then A, against a fresh engine on A",
        "warm_A_after_B_vs_warm_A_at_start": "the same, against the resident engine's first answers on A",
        "control_two_fresh_engines_on_A": "control: two freshly started engines on A "
        "(each one's first answers)",
        "control_A_vs_B_differ": "control: checkpoints A and B differ",
        "control_same_engine_same_weights_again": "control: the resident engine answering on "
        "A a second time, no reload",
        "warm_A_loaded_onto_A_vs_warm_A_at_start": "A's file loaded onto A, against the first answers",
        "warm_A_after_B_vs_warm_A_repeat": "after B then A, against the second answers without a reload",
    }
    for source, agreement in (("", data["agreement"]), (" (second call)", controls["agreement"])):
        for name, a in agreement.items():
            lines.append(
                f"- {words.get(name, name)}{source}: {a['identical']:,} of {a['rows']:,} identical, "
                f"the first {a['mean_identical_leading_ids']} ids equal on average."
            )
    equal = (
        controls["warm"]["parameters_bitwise_equal_after_reloading_A"]
        and controls["warm"]["parameters_bitwise_equal_after_loading_A_onto_A"]
    )
    lines += [
        f"- Every parameter's bytes after loading A again equal the engine's at its start (a digest of "
        f"each): {'yes' if equal else 'no'} (second call, {controls['date'].replace('T', ' ')[:16]} UTC: "
        f"`{controls['command']}`; its reloads took "
        + ", ".join(f"{r['checkpoint_to_answers_s']} s" for r in controls["warm"]["reloads"])
        + ")."
    ]
    return "\n".join(lines) + "\n"


def _when(date: str) -> str:
    return f"{date.replace('T', ' ')[:16]} UTC"


#: The resident engine benchmark's completion sets, in the document's words.
RESIDENT_SETS = {
    "resident_T1": "resident engine, T1 (its start)",
    "resident_T2": "resident engine, T2 loaded in place",
    "resident_A": "resident engine, A loaded in place",
    "resident_T1_again": "resident engine, T1 loaded in place again",
    "fresh_eager_T2": "fresh engine, the recorded arguments (eager), T2",
    "fresh_eager_T2_again": "the same engine, T2 a second time",
    "fresh_graphs_T2": "fresh engine, CUDA graphs and prefix caching, T2",
    "fresh_graphs_T2_again": "the same engine, T2 a second time",
    "in_process_T2": "in-process engine (`greedy_engine`), T2",
}


def resident_engine() -> str:
    """The worker's resident engine on the GPU: warm, fresh and in-process, on trained checkpoints."""
    data = load_results("resident_engine_gpu")
    env, trained, work = data["environment"], data["training"], data["workload"]
    resident = {e["checkpoint"]: e for e in data["resident"]["evaluations"]}
    eager, graphs = data["fresh"]["eager"], data["fresh"]["graphs"]
    inproc, tokens, scores = data["in_process"], data["completion_tokens"], data["replay"]["scores"]
    lines = [
        f"Measured {_when(data['date'])} on one {env['gpu']} ({env['gpu_memory_gib']} GiB), torch "
        f"{env['torch']}, "
        f"vLLM {env['vllm']}, transformers {env['transformers']}, Python {env['python']}. Checkpoints: the "
        f"Qwen2.5-1.5B architecture ({number(data['model_build']['A']['parameters'] / 1e9, 3)} B parameters) "
        "with the view's locally built Qwen2-format tokenizer; A: random bf16 weights (seed 0); T1 and T2: "
        f"A fine-tuned on the GPU for {trained['saves']['T1']} and {trained['saves']['T2']} steps of "
        f"{trained['batch']} (learning rate {trained['learning_rate']}, loss {trained['loss_first_last'][0]} "
        "→ "
        f"{trained['loss_first_last'][1]}, {trained['seconds']} s) on "
        f"{number(trained['examples']['problems'], 0)} "
        "generated problems, none of them among those evaluated, each in the evaluated 4-shot prompt. "
        f"Workload: OpenCompass's {number(work['prompts'], 0)} rendered prompts (16 GSM8K test problems and "
        f"generated ones), sampling as OpenCompass sends it ({work['sampling_kwargs']}). The recorded engine "
        "arguments (those of the config the worker writes for an engine of one evaluation): "
        + ", ".join(f"`{k}={v}`" for k, v in work["engine_kwargs"].items())
        + ".",
        "",
        "| evaluation | checkpoint on disk → every answer s | of which the load s | generation s "
        "| mean new tokens | OpenCompass's score % |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = [
        ("resident_T1", resident["T1"]),
        ("resident_T2", resident["T2"]),
        ("resident_A", resident["A"]),
        ("resident_T1_again", resident["T1_again"]),
        ("fresh_eager_T2", eager["first"]),
        ("fresh_eager_T2_again", eager["again"]),
        ("fresh_graphs_T2", graphs["first"]),
        ("fresh_graphs_T2_again", graphs["again"]),
    ]
    for name, run in rows:
        lines.append(
            f"| {RESIDENT_SETS[name]} | {run['checkpoint_to_answers_s']} | {run['load_s']} | "
            f"{run['generate_s']} "
            f"| {tokens[name]['mean']} | {scores[name]['summary_accuracy']} |"
        )
    whole = round(inproc["load_s"] + inproc["tokenize_s"] + inproc["generate_s"], 2)
    lines.append(
        f"| {RESIDENT_SETS['in_process_T2']} | {whole} | {inproc['load_s']} (tokenizing "
        f"{inproc['tokenize_s']}) "
        f"| {inproc['generate_s']} | {tokens['in_process_T2']['mean']} | "
        f"{scores['in_process_T2']['summary_accuracy']} |"
    )
    warm = resident["T2"]["checkpoint_to_answers_s"]
    lines += [
        "",
        f"- Warm against fresh, same call, T2 from disk to every answer: the resident engine **{warm} s** "
        "(target ≤ 10 s), a fresh engine with the same arguments "
        f"{eager['first']['checkpoint_to_answers_s']} s "
        f"(**{number(eager['first']['checkpoint_to_answers_s'] / warm)}×**); the resident engine's own start "
        f"once: {resident['T1']['load_s']} s.",
        f"- In-process engine against vLLM, same call, T2's generation: {inproc['generate_s']} s against the "
        f"resident engine's {resident['T2']['generate_s']} s (vLLM "
        f"**{number(resident['T2']['generate_s'] / inproc['generate_s'], 2)}×** "
        f"as long) and the graphs engine's {graphs['first']['generate_s']} s.",
        "- New tokens are counted by tokenizing each completion's text again (A's random text does not "
        "round-trip to the ids it was written with, so its mean passes 512).",
        "",
        "Each set of completions against the resident engine's on T2, 1,319 rows:",
        "",
    ]
    for name, a in data["agreement_with_resident_T2"].items():
        lines.append(
            f"- {RESIDENT_SETS.get(name, name)}: {number(a['identical'], 0)} identical completions, "
            f"{number(a['equal_final_answers'], 0)} equal final answers (`gsm8k_postprocess`)."
        )
    again = data["agreement_resident_T1_first_vs_after_T2_and_A"]
    lines.append(
        f"- The resident engine's first answers on T1 against its answers on T1 after T2 and A were loaded: "
        f"{number(again['identical'], 0)} identical, {number(again['equal_final_answers'], 0)} equal final "
        "answers."
    )
    equal_scores = len({scores[n]["summary_accuracy"] for n in scores if n.endswith(("T2", "T2_again"))}) == 1
    lines += [
        f"- OpenCompass's score of every T2 set: {'the same' if equal_scores else 'not the same'}; each "
        "scored "
        "through the worker's real path here, the completions reaching OpenCompass unchanged: "
        + ("yes" if all(s["completions_equal_gpu"] for s in scores.values()) else "no")
        + ".",
        "",
    ]
    for call in data["follow_up_calls"]:
        if "through_the_worker" in call:
            worker, direct, a = call["through_the_worker"], call["direct"], call["agreement_direct_vs_worker"]
            detail = (
                f"generation through the worker {worker[0]['generate_s']} s / {worker[1]['generate_s']} s, "
                f"the engine called directly {direct[0]['generate_s']} s / {direct[1]['generate_s']} s (the "
                "worker's path over the direct call, second calls: "
                f"**{call['worker_over_direct']}×**); engine starts {worker[0]['load_s']} s and "
                f"{direct[0]['start_s']} s; "
                f"{number(a['identical'], 0)} of {number(a['rows'], 0)} completions identical, "
                f"{number(a['equal_final_answers'], 0)} equal final answers"
            )
        elif "evaluations" in call:
            runs = ", ".join(
                f"{e['checkpoint']} {e['checkpoint_to_answers_s']} s" for e in call["evaluations"]
            )
            detail = f"{runs}; the prompts tokenized in one call {call['batch_tokenize_s']} s"
        else:
            runs = ", ".join(
                f"{r['checkpoint']}: generation {r['generate_s']} s (tokenizing {r['tokenize_s']} s)"
                for r in call["runs"]
            )
            detail = runs
        where = "Another machine" if "through_the_worker" in call else "Same machine"
        lines.append(f"- {where}, {_when(call['date'])}: {call['what']}: {detail}.")
    lines += [
        "",
        f"Commands: `{data['prepare_command']}` ({_when(data['prepare_date'])}), then `{data['command']}` on "
        "the "
        f"GPU machine; `{data['replay']['command']}` here ({_when(data['replay']['date'])}).",
    ]
    return "\n".join(lines) + "\n"


#: The engine race's vLLM configurations, in the document's words.
RACE_VARIANTS = {
    "vllm_worker_eager": "vLLM, the worker's arguments (eager)",
    "vllm_graphs": "vLLM, CUDA graphs and prefix caching",
    "vllm_graphs_seqs512": "the same, `max_num_seqs=512`",
    "vllm_graphs_seqs256": "the same, `max_num_seqs=256`",
}


def engine_race() -> str:
    """The in-process greedy engine against vLLM, one run, one model, one workload."""
    data = load_results("engine_race_gpu")
    env, inproc = data["environment"], data["in_process"]
    lines = [
        f"Measured {_when(data['date'])} on one {env['gpu']} ({env['gpu_memory_gib']} GiB), torch "
        f"{env['torch']}, "
        f"vLLM {env['vllm']}, transformers {env['transformers']}, Python {env['python']}: "
        f"`{data['command']}`. "
        f"Model: {data['model']['description']}, {number(data['model']['parameters'] / 1e9, 3)} B "
        "parameters. "
        "Workloads: " + "; ".join(f"`{k}`: {v}" for k, v in data["workloads"].items()) + ".",
        "",
        "| engine | start s | `ids_stop` s | `ids_full` s | `opencompass_prompts` s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for attempt in ("first", "second"):
        cells = " | ".join(
            str(inproc["runs"][w][attempt]["seconds"])
            for w in ("ids_stop", "ids_full", "opencompass_prompts")
        )
        start = inproc["load_s"] if attempt == "first" else "–"
        lines.append(f"| in-process engine, {attempt} call | {start} | {cells} |")
    for name, variant in data["vllm"].items():
        if variant.get("status") != "ok":
            lines.append(f"| {RACE_VARIANTS.get(name, name)} | {variant.get('status')} | | | |")
            continue
        cells = " | ".join(
            str(variant["runs"][w]["seconds"]) for w in ("ids_stop", "ids_full", "opencompass_prompts")
        )
        lines.append(f"| {RACE_VARIANTS.get(name, name)} | {variant['startup_s']} | {cells} |")
    lines.append("")
    for workload, r in data["ratios"].items():
        lines.append(
            f"- `{workload}`: the fastest vLLM ({RACE_VARIANTS[r['fastest_vllm']]}) {r['fastest_vllm_s']} s, "
            "the "
            f"in-process engine {r['in_process_first_s']} s / {r['in_process_second_s']} s (first / second "
            "call): "
            f"vLLM's time over the engine's **{r['vllm_over_in_process_first']}× / "
            f"{r['vllm_over_in_process_second']}×**."
        )
    return "\n".join(lines) + "\n"


WARM_VARIANTS = {
    "command": "the `opencompass` command (three processes), OpenCompass's transformers model",
    "warm": "warm worker: forked from the warm OpenCompass, OpenCompass's transformers model",
    "command_resident": "the `opencompass` command, the resident engine started for the evaluation",
    "warm_resident": "warm worker: forked from the warm OpenCompass, the resident engine kept",
}


def warm_opencompass_cpu() -> str:
    """The warm worker's OpenCompass against the ``opencompass`` command (bench/warm_opencompass_cpu.py)."""
    data = load_results("warm_opencompass_cpu")
    machine = data["machine"]
    lines = [
        f"Measured {_when(data['date'])} on {machine['cpus']} CPU cores (load average "
        f"{number(machine['load_average'][0])} at the end): {data['model']}, {data['problems']} problems, "
        f"up to {data['max_new_tokens']} new tokens, {data['rounds']} evaluations of each variant in one "
        f"process, one variant after another; {data['total_s']} s in all.",
        "",
        "| variant | evaluations (s) | median s | first evaluation (server start) s |",
        "| --- | --- | ---: | ---: |",
    ]
    for name, label in WARM_VARIANTS.items():
        first = data["first_evaluation_s"].get(name)
        lines.append(
            f"| {label} | {', '.join(str(v) for v in data['seconds'][name])} | {data['median_s'][name]} | "
            f"{first if first is not None else '—'} |"
        )
    same = data["same_completions"]
    lines += [
        "",
        f"The command's median over the warm worker's: **{data['ratios']['command_over_warm']}×** with "
        "OpenCompass's own model, **"
        f"{data['ratios']['command_resident_over_warm_resident']}×** with the resident engine. Completions "
        f"word for word the same: warm against command {'yes' if same['warm_vs_command'] else 'NO'}, "
        f"with the resident engine {'yes' if same['warm_resident_vs_command_resident'] else 'NO'}.",
    ]
    split = data.get("split")
    if split is not None:
        lines += [
            "",
            f"The whole split, {split['prompts']:,} prompts answered with the completions "
            f"{split['completions']}: the command "
            f"{', '.join(str(v) for v in split['seconds']['command'])} s "
            f"(median {split['median_s']['command']}), the warm worker "
            f"{', '.join(str(v) for v in split['seconds']['warm'])} s (median {split['median_s']['warm']}; "
            f"its first, with the server's start, {split['first_evaluation_s']['warm']}): "
            f"**{split['command_over_warm']}×**. OpenCompass's summary: "
            + ", ".join(f"{name} {value}" for name, value in split["summary_accuracy"].items())
            + f"; the completions OpenCompass scored were the GPU's: "
            f"{'yes' if split['completions_are_the_gpus'] else 'NO'}.",
        ]
        if "warm_formatted" in split["seconds"]:
            lines += [
                "",
                "The warm worker as it was before its runs dumped their config unformatted (mmengine "
                "laying out each dump with yapf), in the same run: "
                f"{', '.join(str(v) for v in split['seconds']['warm_formatted'])} s "
                f"(median {split['median_s']['warm_formatted']}): "
                f"**{split['warm_formatted_over_warm']}×** the warm worker's.",
            ]
    return "\n".join(lines) + "\n"


WORKER_RUNS = {
    "warm_T2_first": "warm worker, T2 first (the warm OpenCompass and the engine start)",
    "warm_T1": "warm worker, T1 (weights loaded in place)",
    "warm_T2": "warm worker, T2 (weights loaded in place)",
    "command_T2": "outside the warm worker: the `opencompass` command, an engine for the evaluation",
    "in_process_T2": "the `hf` backend's in-process engine, T2 (generation only)",
}


#: The warm GPU worker's submit-to-score target for the whole split at GSM8K answer lengths.
WARM_TARGET_S = 10.0


def opencompass_worker_gpu() -> str:
    """The ``opencompass`` backend end to end on the GPU (bench/opencompass_worker_gpu.py)."""
    path = REPO_ROOT / "bench" / "results" / "opencompass_worker_gpu.json"
    if not path.exists():
        return (
            "Not measured yet: the script is written and runs on the CPU (`--smoke`), but no GPU "
            "machine has been lent since it was written, so no figure of OpenCompass on the GPU "
            "machine, and no submit-to-score time, is published here.\n"
        )
    data = load_results("opencompass_worker_gpu")
    env = data["environment"]
    lines = [
        f"Measured {_when(data['date'])} on one {env['machine']}: OpenCompass's environment "
        + ", ".join(f"{k} {v}" for k, v in env["opencompass_environment"].items())
        + "; the engine's "
        + ", ".join(f"{k} {v}" for k, v in env["engine_environment"].items())
        + f"; {data['problems']} problems.",
        "",
        "| run | snapshot s | evaluate s | submit to score s | OpenCompass s | score |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, label in WORKER_RUNS.items():
        run = data["runs"].get(name)
        if run is None or "evaluate_s" not in run:
            continue
        lines.append(
            f"| {label} | {run['snapshot_s']} | {run['evaluate_s']} | {run['submit_to_score_s']} | "
            f"{run['opencompass_s']} | {run['summary_accuracy']} |"
        )
    lines.append("")
    for name, agreement in data.get("agreement", {}).items():
        lines.append(
            f"- {WORKER_RUNS.get(name, name)} against the warm worker's T2: final answers equal in "
            f"{agreement['equal_final_answers']:,} of {agreement['rows']:,} "
            f"({100 * agreement['equal_final_answers_share']:.2f} %), identical text in "
            f"{agreement['identical']:,}."
        )
    texts_file = path.with_name("opencompass_worker_gpu.texts.json.gz")
    if texts_file.exists():
        with gzip.open(texts_file, "rt", encoding="utf-8") as handle:
            texts = json.load(handle)
        first, again = texts.get("warm_T2_first"), texts.get("warm_T2")
        if first and again and len(first) == len(again):
            same = sum(a == b for a, b in zip(first, again, strict=True))
            lines.append(
                f"- The same engine twice: the warm worker's T2 as its engine started against T2 loaded in "
                f"place after T1: identical text in {same:,} of {len(first):,}; both scored "
                f"{data['runs']['warm_T2_first']['summary_accuracy']} and "
                f"{data['runs']['warm_T2']['summary_accuracy']}."
            )
    runs = data["runs"]
    warm, cold, inside = runs.get("warm_T2"), runs.get("command_T2"), runs.get("in_process_T2")
    if warm and cold:
        lines.append(
            "- Submit to score, the same checkpoint in the same run: warm worker "
            f"{warm['submit_to_score_s']} s, "
            f"outside it {cold['submit_to_score_s']} s "
            f"({cold['submit_to_score_s'] / warm['submit_to_score_s']:.1f}× the warm worker's). Against the "
            f"target of at most {WARM_TARGET_S:g} s the warm worker is "
            f"{'within it' if warm['submit_to_score_s'] <= WARM_TARGET_S else 'over it'}; "
            f"of its time, {warm['snapshot_s']} s is the grader's snapshot (the weights copied) and "
            f"{warm['opencompass_s']} s OpenCompass with the engine."
        )
    if warm and inside:
        engine_s = inside["load_s"] + inside["tokenize_s"] + inside["generate_s"]
        lines.append(
            f"- The in-process engine on the same prompts and weights in the same call: "
            f"{engine_s:.2f} s (load {inside['load_s']}, tokenize {inside['tokenize_s']}, generate "
            f"{inside['generate_s']}), against the warm worker's {warm['opencompass_s']} s of OpenCompass "
            f"and vLLM ({warm['opencompass_s'] / engine_s:.1f}×); it does not score, so this is its "
            "generation alone."
        )
    lines += worker_engine_share(runs)
    lines.append(f"- Command: `{data['command']}`, then `in-process` and `bare` as below.")
    return "\n".join(lines) + "\n"


def worker_engine_share(runs: dict[str, Any]) -> list[str]:
    """What OpenCompass and the worker add to the engine: the engine's own generation time in the
    warm worker's T2 (its log), and vLLM called directly on the same prompts in the same call."""
    warm, bare = runs.get("warm_T2") or {}, runs.get("bare_vllm_T2")
    lines = []
    if warm.get("engine_generate_s"):
        lines.append(
            f"- Of the warm worker's {warm['opencompass_s']} s of OpenCompass on T2, the resident engine "
            f"generated for {warm['engine_generate_s']} s (its log); the rest is OpenCompass's own work "
            "(prompts, scoring, summary) and the worker's."
        )
    if bare:
        lines.append(
            f"- vLLM called directly with the resident engine's arguments on the same prompts and T2, in "
            f"the same call: start {bare['start_s']} s, the split in "
            f"{', '.join(str(v) for v in bare['generate_s'])} s; the warm worker's OpenCompass with "
            f"the engine took **{bare['opencompass_over_bare']}×** that (target: at most 2×)."
        )
    return lines


SNAPSHOT_RUNS = {
    "snapshot_copy_gpu": "the GPU machine (its CPU cores and disk)",
    "snapshot_copy": "the development machine",
}


def snapshot_copy() -> str:
    """The grader's snapshot copy: blocks in parallel against the former one-stream loops."""
    lines = [
        "| where | weights | blocks in parallel (s, median) | one stream, hash beside (s) | "
        "one stream, hash after each write (s) | hash beside / blocks | checks | date | command |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    checks = (
        "same_fingerprint_each_round",
        "one_stream_fingerprints_agree",
        "blocks_snapshot_holds_one_stream_fingerprint",
    )
    for name, where in SNAPSHOT_RUNS.items():
        if not (REPO_ROOT / "bench" / "results" / f"{name}.json").exists():
            continue
        data = load_results(name)
        medians, rates, ratios = data["median_s"], data["gib_per_s"], data["ratio_over_blocks"]
        cells = [f"{medians[v]} ({rates[v]} GiB/s)" for v in ("blocks_in_parallel", *ratios)]
        lines.append(
            f"| {where}, {data['machine']['cpus']} cores | {data['weights_bytes'] / 2**30:.2f} GiB | "
            + " | ".join(cells)
            + f" | **{ratios['one_stream_hash_beside']}×** | "
            f"{'pass' if all(data[c] for c in checks) else 'FAIL'} | "
            f"{_when(data['date'])} | `{data['command']}` |"
        )
    return "\n".join(lines) + "\n"


def grader_tenants() -> str:
    """Another tenant's and the admin API's latencies, idle and under one tenant's flood."""
    run = load_results("grader_load")["runs"]["tenants"]
    data = run["tenants"]
    machine = data["machine"]
    lines = [
        f"Measured {run['date']} on {machine['cpus']} cores shared with other work (load average "
        f"{machine['load_average_before'][0]} before, {machine['load_average_after'][0]} after): "
        f"`{run['command']}`.",
        "",
        "| database | flood: 200 / 429 | its /scores answer | other tenant's GET /scores p50 / p99, "
        "idle → flood (ms) | admin GET p50 / p99, idle → flood (ms) | p99 flood / idle (tenant, admin) | "
        "target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for database in ("sqlite", "postgres"):
        r = data[database]
        statuses = r["flood_statuses"]

        def cell(name: str, r: dict[str, Any] = r) -> str:
            idle, flood = r["idle"][name], r["under_flood"][name]
            return (
                f"{idle['latency_ms_p50']} / {idle['latency_ms_p99']} → "
                f"{flood['latency_ms_p50']} / {flood['latency_ms_p99']}"
            )

        ratio = r["p99_ratio"]
        lines.append(
            f"| {database} | {number(statuses.get('200', 0), 0)} / {number(statuses.get('429', 0), 0)} | "
            f"{number(r['flood_scores_answer_bytes'] / 1000, 0)} KB | {cell('other_tenant_scores')} | "
            f"{cell('admin_get')} | {ratio['other_tenant_scores']}×, {ratio['admin_get']}× | "
            f"≤ {r['target_p99_ratio']:g}×: {'met' if r['within_target'] else 'not met'} |"
        )
    return "\n".join(lines) + "\n"


RENDERERS: dict[str, Callable[[], str]] = {
    "generation-machine": generation_machine,
    "generation-table": generation_table,
    "generation-targets": generation_targets,
    "generate-batches": generate_batches,
    "evaluate-engine": evaluate_engine,
    "opencompass-cpu": opencompass_cpu,
    "grpo-throughput": grpo_throughput,
    "grpo-learning": grpo_learning,
    "bf16-agreement": bf16_agreement,
    "weight-swap": weight_swap,
    "autorl-run-gpu": autorl_run,
    "demo-cpu": demo_cpu,
    "opencompass-vllm-machine": opencompass_vllm_machine,
    "opencompass-vllm-table": opencompass_vllm_table,
    "opencompass-vllm-parity": opencompass_vllm_parity,
    "grpo-trl-vllm": grpo_trl_vllm,
    "grpo-trl-vllm-learning": grpo_trl_vllm_learning,
    "vllm-warm-reload": vllm_warm_reload,
    "resident-engine": resident_engine,
    "engine-race": engine_race,
    "warm-opencompass-cpu": warm_opencompass_cpu,
    "snapshot-copy": snapshot_copy,
    "opencompass-worker-gpu": opencompass_worker_gpu,
    "grader-tenants": grader_tenants,
}


PERFORMANCE = Document(REPO_ROOT / "docs" / "PERFORMANCE.md", RENDERERS)


if __name__ == "__main__":
    PERFORMANCE.update()
    print(f"updated {PERFORMANCE.path.relative_to(REPO_ROOT)}")
