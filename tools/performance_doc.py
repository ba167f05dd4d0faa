"""The measured figures of docs/PERFORMANCE.md, rendered from the committed ``bench/results/*.json``.

Every figure in the document sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``
and is written by one of :data:`RENDERERS` from one results file (:mod:`docgen`), so the document
cannot drift from the files (tests/unit/test_generated_docs.py fails when it does). A block holds
the figures and the few words that say what they are; how they were measured (commands,
environments, workloads) is in the results file and the benchmark's docstring. After a benchmark
writes new results, ``python3 -m tools.performance_doc`` rewrites the blocks in place.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import Any

from tools.docgen import REPO_ROOT, RESULTS, Document, load_results, number

#: What each variant of ``hf_generation_gpu.json`` measured, in the document's words.
GENERATION_VARIANTS = {
    "engine_full": "engine, every row writes all its new tokens",
    "engine_stop": "engine, rows stop at GSM8K answer lengths",
    "engine_stop_keep_rows": "ablation: finished rows kept",
    "engine_stop_no_graphs": "ablation: no CUDA graphs",
    "engine_full_no_prefix": "ablation: no shared prefix",
    "generate_ref": "transformers `generate`, one batch",
    "generate_ref_split": "transformers `generate`, two batches",
    "engine_ref": "engine, the same prompts",
}


def each_card(name: str, render: Callable[[str], str]) -> str:
    """``render`` of each card's results file: ``NAME.json`` (the first card measured), then
    ``NAME_h100.json`` (the same benchmark on an H100, said in fewer words: see :func:`second_card`),
    those that exist."""
    found = [card for card in (name, f"{name}_h100") if (RESULTS / f"{card}.json").exists()]
    return "\n".join(render(card) for card in found) if found else "Not measured yet.\n"


def second_card(name: str) -> bool:
    """Whether ``name`` is a second card's results (``NAME_h100``), whose text leaves out what the
    first card's already said."""
    return name.endswith("_h100")


def _when(date: str) -> str:
    return f"{date.replace('T', ' ')[:16]} UTC"


def _failed(record: dict[str, Any]) -> str:
    return f"not measured ({record.get('status')}: {str(record.get('error', ''))[:120]})"


def generation() -> str:
    """The ``hf`` backend's engine on the whole split (bench/hf_generation_gpu.py), a table for each
    card measured."""
    return each_card("hf_generation_gpu", generation_card)


def generation_card(name: str) -> str:
    data = load_results(name)
    env, prompts, variants = data["environment"], data["prompts"], data["variants"]
    lines = [
        f"The same on one {env['gpu']} ({data['date'][:10]}; copies at {data['copy_bandwidth_tb_s']} TB/s):"
        if second_card(name)
        else f"Measured {data['date'][:10]} on one {env['gpu']}: {prompts['rows']:,} prompts of the split's "
        f"lengths, up to {data['max_new_tokens']} new tokens; × floor: over the time of reading the weights "
        f"and caches once a step at {data['copy_bandwidth_tb_s']} TB/s.",
        "",
        "| variant | rows | new tokens | s | new tok/s | × floor | peak GiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, what in GENERATION_VARIANTS.items():
        record = variants.get(name)
        if record is not None and str(record.get("status")).startswith("skipped"):
            continue  # not started in that call (its deadline)
        if record is None or record.get("status") != "ok":
            lines.append(f"| {what} | — | — | — | — | — | {record and record.get('status')} |")
            continue
        lines.append(
            f"| {what} | {record['rows']:,} | {record['new_tokens']:,} | {record['seconds']} | "
            f"{record['new_tokens_per_s']:,} | {record['over_floor']} | {record['peak_allocated_gib']} |"
        )
    full, stop = variants["engine_full"], variants["engine_stop"]
    lines += [
        "",
        f"- Whole split, {data['max_new_tokens']} new tokens a row: **{full['seconds']} s** (target ≤ 20 s); "
        f"rows stopping at GSM8K answer lengths: **{stop['seconds']} s** (target ≤ 10 s).",
    ]
    engine = data["agreement_with_generate"].get("engine_ref")
    if engine:
        ref, ours = variants["generate_ref"], variants["engine_ref"]
        lines.append(
            f"- Same prompts, same run: `generate` {ref['seconds']} s, the engine {ours['seconds']} s "
            f"(**{engine['speedup']}×**)."
        )
    return "\n".join(lines) + "\n"


def evaluate_engine() -> str:
    """A whole ``HFBackend.evaluate`` call through the engine (the ``engine`` run of hf_eval_gpu)."""
    run = load_results("hf_eval_gpu").get("engine")
    if run is None:
        return "Not run on a GPU yet.\n"
    env, record = run["environment"], run["variants"]["1319"]
    return (
        f"`HFBackend().evaluate` on {record['n_problems']:,} prompts, {run['max_new_tokens']} new tokens a "
        f"row, one {env['gpu']} ({run['date'][:10]}): **{record['wall_s']} s** from the call to the scores "
        f"(target ≤ 20 s), of which generation {record['generation_s']} s; peak "
        f"{record['peak_allocated_gib']} GiB.\n"
    )


def opencompass_cpu() -> str:
    data = load_results("opencompass_cpu")
    phases = data["phases_s"]
    slowest = sorted(phases.items(), key=lambda item: -item[1])[:3]
    return (
        f"{data['model']}, {data['problems']} problems, {data['max_new_tokens']} new tokens, on "
        f"{data['machine']['cpus']} CPU cores ({data['timestamp'][:10]}): {data['wall_s']} s wall. Largest "
        "phases: "
        + ", ".join(f"{name.removesuffix('_s').replace('_', ' ')} {value} s" for name, value in slowest)
        + ".\n"
    )


def grpo_throughput() -> str:
    data = load_results("grpo_gpu")
    part = data["throughput"]
    if part.get("status") == "error":
        return _failed(part) + "\n"
    env = data["environment"]
    lines = [
        f"Measured {_when(data['runs']['throughput']['date'])} on one {env['gpu']}, TRL {env['trl']}, "
        f"{part['completion_tokens']}-token completions.",
        "",
        "| variant | completions / step | s / step | rollout s | loss + update s | completion tok/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, record in part["variants"].items():
        if record.get("status") == "error":
            lines.append(f"| `{name}` | — | — | — | — | {_failed(record)} |")
            continue
        lines.append(
            f"| `{name}` | {record['completions_per_step']} | {record['step_s']} | "
            f"{record.get('rollout_s', '—')} | {record.get('train_s', '—')} | "
            f"{number(record['completion_tokens_per_s'], 0)} |"
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
            f"Against TRL's reference figure at the example agent's settings ({reference} tok/s): "
            f"**{number(best['completion_tokens_per_s'] / reference)}×** (target ≥ 10×).",
        ]
    return "\n".join(lines) + "\n"


def grpo_learning() -> str:
    part = load_results("grpo_gpu")["learning"]
    if part.get("status") == "error":
        return _failed(part) + "\n"
    sft, curve = part["sft"], part["grpo"]["curve"]
    tenth = max(1, len(curve) // 10)
    first, last = curve[:tenth], curve[-tenth:]
    return (
        f"arith, a Qwen2 of {number(part['parameters'] / 1e6, 1)} M parameters from random init: greedy "
        f"accuracy {part['accuracy_initial']} % → {part['accuracy_after_sft']} % after SFT ({sft['steps']} "
        f"steps, {sft['seconds']} s) → **{part['accuracy_after_grpo']} %** after {len(curve)} fast GRPO "
        f"steps ({curve[-1]['t_s']} s); mean reward of the first {tenth} steps "
        f"{number(sum(c['reward'] for c in first) / len(first), 3)}, of the last {tenth} "
        f"{number(sum(c['reward'] for c in last) / len(last), 3)}.\n"
    )


#: The columns of a learning run's row after its name (:func:`learning_cells`), and their alignment.
LEARNING_COLUMNS = "steps | training s | held-out accuracy % | gained / lost | McNemar p | completion tok/s |"
LEARNING_ALIGNMENT = "---: | ---: | --- | --- | ---: | ---: |"


def learning_cells(run: dict[str, Any], start: dict[str, Any]) -> str:
    """A learning run's cells after its name, from the checkpoint ``start`` it trained."""
    return (
        f"{run['steps']} | {run['trained_s']} | {start['accuracy']} → **{run['accuracy']}** | "
        f"{run['gains']} / {run['losses']} | {run['p_value']:.2g} | "
        f"{number(run['completion_tokens_per_s'], 0)} |"
    )


def grpo_headroom() -> str:
    """The fast path's GRPO from a checkpoint with headroom, one run a learning rate."""
    data = load_results("grpo_learning_gpu")
    start, runs = data["checkpoint"], data["runs"]
    lines = [
        f"Measured {_when(data['date'])} on one {data['environment']['gpu']}. Held out: {start['held_out']}; "
        f"the checkpoint ({start['sft']['steps']} SFT steps) answers {start['accuracy']} % of them greedily. "
        f"{data['settings']['prompts']} prompts x {data['settings']['generations']} completions a step.",
        "",
        "| learning rate | " + LEARNING_COLUMNS,
        "| ---: | " + LEARNING_ALIGNMENT,
    ]
    lines += [f"| {name} | {learning_cells(run, start)}" for name, run in runs.items()]
    return "\n".join(lines) + "\n"


def grpo_paths() -> str:
    """The fast path beside TRL with colocated vLLM from one checkpoint with headroom
    (bench/grpo_learning_gpu.py --runs, its calls joined with --merge)."""
    if not (RESULTS / "grpo_learning_paths_gpu.json").exists():
        return (
            "Not measured yet: bench/README.md's two calls of `bench/grpo_learning_gpu.py --runs` "
            "measure it.\n"
        )
    data = load_results("grpo_learning_paths_gpu")
    start = data["checkpoint"]
    rate = data["settings"]["learning_rates"][0]
    lines = [
        f"Measured {_when(data['date'])} on one {', '.join(data['cards'])}, learning rate {rate:g}, "
        f"{data['settings']['completion_tokens']}-token completions, temperature 1. Held out: "
        f"{start['held_out']}; the checkpoint answers {start['accuracy']} % greedily.",
        "",
        "| run | " + LEARNING_COLUMNS,
        "| --- | " + LEARNING_ALIGNMENT,
    ]
    for name, run in {**data["runs"], **data["speed"]}.items():
        if run.get("status") != "ok":
            lines.append(f"| `{name}` | {_failed(run)} | | | | | |")
        elif "curve" in run:
            lines.append(f"| `{name}` | {learning_cells(run, start)}")
        else:
            lines.append(
                f"| `{name}` (speed) | {run['steps_timed']} | — | — | — | — | "
                f"{number(run['completion_tokens_per_s'], 0)} |"
            )
    for pair, compared in data["comparison"]["learning"].items():
        reached = "; ".join(
            f"{target} %: " + ", ".join(f"{key} {'—' if t is None else f'{t} s'}" for key, t in times.items())
            for target, times in compared["seconds_to_accuracy"].items()
        )
        same, steps = compared["same_problems_leading_steps"], min(compared["steps"].values())
        lines += [
            "",
            f"`{pair}`: the same problems in the first {same} of {steps} steps; training seconds to "
            f"reach {reached}.",
        ]
    for ratio, value in data["comparison"]["speed_ratios"].items():
        lines += ["", f"`{ratio}`: **{value}×** in completion tokens per second."]
    return "\n".join(lines) + "\n"


def bf16_agreement() -> str:
    part = load_results("grpo_gpu")["learning"]
    if part.get("status") == "error" or "agreement" not in part:
        return _failed(part) + "\n"
    a = part["agreement"]
    return (
        f"The engine against `generate` on that trained model in bf16, {a['rows']:,} prompts: final answers "
        f"equal in **{a['equal_final_answers']:,} of {a['rows']:,} ({a['equal_final_answers_pct']} %)** "
        "(target ≥ 99 %).\n"
    )


def weight_swap() -> str:
    part = load_results("grpo_gpu")["weight_swap"]
    if part.get("status") == "error":
        return _failed(part) + "\n"
    cold, warm = part["cold_load_to_first_token_s"], part["weight_swap_to_first_token_s"]
    return (
        "Load to the first id, the 1.5B checkpoint: cold `from_pretrained` "
        f"{', '.join(f'{v} s' for v in cold)}; weights copied into the resident model "
        f"**{', '.join(f'{v} s' for v in warm)}** (target ≤ 2 s).\n"
    )


def demo_cpu() -> str:
    data = load_results("demo_cpu")
    lines = [
        f"Measured {_when(data['date'])}: `autorl run -t arith -m builtin:tiny-qwen2 -a example_grpo "
        f"--timeout {data['timeout_s']:g}`, {len(data['variants'])} runs at once, each on "
        f"{data['cores_per_run']} cores of its own. Scores on the arith test split.",
        "",
        "| variant (its agent arguments: the results file) | baseline | best SFT | best GRPO | improvement "
        "| run s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, record in data["variants"].items():
        cells = [record.get(key) for key in ("baseline", "best_sft", "best_grpo", "improvement")]
        shown = " | ".join("—" if value is None else number(value) for value in cells)
        lines.append(f"| `{name}` | {shown} | {record['wall_s']} |")
    return "\n".join(lines) + "\n"


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
    lines = [
        "Seconds from the start of each `autorl run` (one GPU shared by the agent and the evaluator):",
        "",
        "| run | " + " | ".join(RUN_PHASES.values()) + " | scored | evaluation s | baseline → best |",
        "| --- | " + "---: | " * (len(RUN_PHASES) + 2) + "--- |",
    ]
    for name, run in runs.items():
        phases = [run["phases_s"].get(key) for key in RUN_PHASES]
        evaluations = [row["eval_seconds"] for row in run.get("submissions", []) if row.get("eval_seconds")]
        spread = f"{number(min(evaluations))}–{number(max(evaluations))}" if evaluations else "—"
        row = run.get("results_row", {})
        lines.append(
            f"| `{name}` ({_when(run['date'])}) | "
            + " | ".join("—" if value is None else number(value) for value in phases)
            + f" | {row.get('submissions', '—')} | {spread} | "
            f"{row.get('baseline')} → {row.get('best_score')} |"
        )
    return "\n".join(lines) + "\n"


#: What each variant of ``opencompass_vllm_gpu.json`` ran, in the document's words.
OPENCOMPASS_VLLM_VARIANTS = {
    "bare_llm_graphs": "bare `LLM.generate`, CUDA graphs, prefix caching, `max_num_seqs` 512",
    "serve_graphs": "`vllm serve`, the same engine settings",
    "serve_graphs_run2": "the same server again (compile cache warm)",
    "serve_worker_config": "`vllm serve`, the worker's engine arguments (eager)",
    "bare_llm_worker_config": "`LLM.generate`, the worker's engine arguments: what OpenCompass runs",
}
OPENCOMPASS_VLLM_RUNS = ("opencompass_prompts", "ids_stop", "ids_full")


def opencompass_vllm() -> str:
    data = load_results("opencompass_vllm_gpu")
    env, variants = data["environment"], data["variants"]
    bare = variants["bare_llm_graphs"]["runs"]
    lines = [
        f"Measured {data['date'][:10]} on one {env['gpu']}, vLLM {env['vllm']}, "
        f"{data['recorded']['prompts']:,} prompts.",
        "",
        "| variant | engine start s | OpenCompass's prompts s (× bare) | GSM8K answer lengths s (× bare) "
        "| 512 tokens a row s (× bare) |",
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
    replays = data["replay"].values()
    same = sum(r["completions_equal_gpu"] and r["summary_equals_recomputed"] for r in replays)
    lines += [
        "",
        f"Replayed through the worker's OpenCompass path: {same} of {len(replays)} runs read back exactly "
        "the GPU's completions, with OpenCompass's summary equal to the task's own score.",
    ]
    return "\n".join(lines) + "\n"


def grpo_trl_vllm() -> str:
    """TRL's ``GRPOTrainer`` with colocated vLLM against the fast path (bench/grpo_trl_vllm_gpu.py),
    a table for each card measured."""
    return each_card("grpo_trl_vllm_gpu", grpo_trl_vllm_card)


def grpo_trl_vllm_card(name: str) -> str:
    data = load_results(name)
    env, settings = data["environment"], data["settings"]
    micro = f"the loss {settings['loss_micro_batch']} rows at a time on both paths"
    lines = [
        f"The same on one {env['gpu']} ({_when(data['date'])}), {micro}:"
        if second_card(name)
        else f"Measured {_when(data['date'])} on one {env['gpu']}, TRL {env['trl']}, vLLM {env['vllm']}; at "
        f"most {settings['completion_tokens']} completion tokens, {micro}.",
        "",
        "| variant | completions / step | s / step | completion tok/s | engine start s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, record in data["variants"].items():
        if record.get("status") != "ok":
            lines.append(f"| `{name}` | — | — | — | {_failed(record)} |")
            continue
        lines.append(
            f"| `{name}` | {record['completions_per_step']} | {record['step_s']} | "
            f"{number(record['completion_tokens_per_s'], 0)} | {record.get('trainer_start_s', '—')} |"
        )

    def sizes(ratios: dict[str, float]) -> str:  # fast_16x8_over_trl_vllm_16x8 → 16x8
        return ", ".join(
            f"{name.partition('_over_')[0].removeprefix('fast_')} **{ratio}×**"
            for name, ratio in ratios.items()
        )

    lines.append("")
    same = sizes(data["ratios"])
    lines.append(f"The fast path's completion tokens per second over TRL's, same call: {same}.")
    if data.get("ratios_across_calls"):
        lines.append(f"In consecutive calls on the same machine: {sizes(data['ratios_across_calls'])}.")
    return "\n".join(lines) + "\n"


def vllm_warm_reload() -> str:
    """A resident vLLM engine loading checkpoints in place against a fresh engine per checkpoint."""
    data = load_results("vllm_warm_reload_gpu")
    env, warm, fresh, controls = data["environment"], data["warm"], data["fresh"], data["controls"]
    lines = [
        f"Measured {_when(data['date'])} on one {env['gpu']}, vLLM {env['vllm']}, a "
        f"{number(data['model']['checkpoint_bytes'] / 1e9)} GB checkpoint.",
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
    equal = (
        controls["warm"]["parameters_bitwise_equal_after_reloading_A"]
        and controls["warm"]["parameters_bitwise_equal_after_loading_A_onto_A"]
    )
    lines += [
        "",
        f"A fresh process takes **{ratio}×** as long as the resident engine; every parameter after a reload "
        f"equals the checkpoint's byte for byte: {'yes' if equal else 'no'}.",
    ]
    return "\n".join(lines) + "\n"


#: The resident engine benchmark's completion sets, in the document's words.
RESIDENT_SETS = {
    "resident_T1": "resident engine, T1 (its start)",
    "resident_T2": "resident engine, T2 loaded in place",
    "resident_A": "resident engine, A loaded in place",
    "resident_T1_again": "resident engine, T1 loaded in place again",
    "fresh_eager_T2": "fresh engine (eager), T2",
    "fresh_eager_T2_again": "the same engine, T2 again",
    "fresh_graphs_T2": "fresh engine (CUDA graphs, prefix caching), T2",
    "fresh_graphs_T2_again": "the same engine, T2 again",
    "in_process_T2": "in-process engine (`greedy_engine`), T2",
}


def resident_engine() -> str:
    """The worker's resident engine on the GPU: warm, fresh and in-process, on trained checkpoints."""
    data = load_results("resident_engine_gpu")
    env, trained = data["environment"], data["training"]
    resident = {e["checkpoint"]: e for e in data["resident"]["evaluations"]}
    eager, graphs = data["fresh"]["eager"], data["fresh"]["graphs"]
    inproc, tokens, scores = data["in_process"], data["completion_tokens"], data["replay"]["scores"]
    lines = [
        f"Measured {_when(data['date'])} on one {env['gpu']}, vLLM {env['vllm']}; A random weights, T1 and "
        f"T2 A fine-tuned {trained['saves']['T1']} and {trained['saves']['T2']} steps.",
        "",
        "| evaluation | checkpoint on disk → every answer s | load s | generation s | mean new tokens "
        "| OpenCompass's score % |",
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
            f"{run['generate_s']} | {tokens[name]['mean']} | {scores[name]['summary_accuracy']} |"
        )
    whole = round(inproc["load_s"] + inproc["tokenize_s"] + inproc["generate_s"], 2)
    lines.append(
        f"| {RESIDENT_SETS['in_process_T2']} | {whole} | {inproc['load_s']} | {inproc['generate_s']} | "
        f"{tokens['in_process_T2']['mean']} | {scores['in_process_T2']['summary_accuracy']} |"
    )
    warm = resident["T2"]["checkpoint_to_answers_s"]
    agreements = data["agreement_with_resident_T2"].values()
    fewest = min(a["equal_final_answers"] for a in agreements)
    rows_of = max(a.get("rows", 0) for a in agreements) or data["workload"]["prompts"]
    t2_scores = {scores[n]["summary_accuracy"] for n in scores if n.endswith(("T2", "T2_again"))}
    lines += [
        "",
        f"- Warm against fresh, T2 from disk to every answer: **{warm} s** (target ≤ 10 s) against "
        f"{eager['first']['checkpoint_to_answers_s']} s "
        f"(**{number(eager['first']['checkpoint_to_answers_s'] / warm)}×**).",
        f"- Every other set of T2 completions gives the resident engine's final answer on at least "
        f"{number(fewest, 0)} of {number(rows_of, 0)} problems, and "
        f"{'the same score' if len(t2_scores) == 1 else 'not the same score'}.",
    ]
    small = (REPO_ROOT / "bench" / "results" / "resident_engine_prepare_h100.json").exists()
    if small:
        card = load_results("resident_engine_prepare_h100")
        steps = card["training"]
        lines.append(
            f"- The prepare phase on one {card['environment']['gpu']} ({_when(card['date'])}): the same "
            f"{steps['steps']} steps of {steps['batch']} examples, {steps['micro_batch']} at a time, in "
            f"{steps['seconds']} s (on the {env['gpu']} {trained['seconds']} s, all {trained['batch']} at "
            f"once), peak {steps['peak_gib']} GiB; loss {steps['loss_first_last'][0]} → "
            f"{steps['loss_first_last'][1]} (there {trained['loss_first_last'][0]} → "
            f"{trained['loss_first_last'][1]})."
        )
    return "\n".join(lines) + "\n"


#: The engine race's vLLM configurations, in the document's words.
RACE_VARIANTS = {
    "vllm_worker_eager": "vLLM, the worker's arguments (eager)",
    "vllm_graphs": "vLLM, CUDA graphs and prefix caching",
    "vllm_graphs_seqs512": "the same, `max_num_seqs=512`",
    "vllm_graphs_seqs256": "the same, `max_num_seqs=256`",
}


def engine_race() -> str:
    """The in-process greedy engine against vLLM, one run, one model, one workload, a table for
    each card measured."""
    return each_card("engine_race_gpu", engine_race_card)


def engine_race_card(name: str) -> str:
    data = load_results(name)
    env, inproc = data["environment"], data["in_process"]
    workloads = ("ids_stop", "ids_full", "opencompass_prompts")
    lines = [
        f"The same on one {env['gpu']} ({_when(data['date'])}):"
        if second_card(name)
        else f"Measured {_when(data['date'])} on one {env['gpu']}, vLLM {env['vllm']}; `ids_stop`: GSM8K "
        "answer lengths, `ids_full`: 512 new tokens a row.",
        "",
        "| engine | start s | `ids_stop` s | `ids_full` s | `opencompass_prompts` s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for attempt in ("first", "second"):
        cells = " | ".join(str(inproc["runs"][w][attempt]["seconds"]) for w in workloads)
        start = inproc["load_s"] if attempt == "first" else "–"
        lines.append(f"| in-process engine, {attempt} call | {start} | {cells} |")
    for name, variant in data["vllm"].items():
        if variant.get("status") != "ok":
            lines.append(f"| {RACE_VARIANTS.get(name, name)} | {variant.get('status')} | | | |")
            continue
        cells = " | ".join(str(variant["runs"][w]["seconds"]) for w in workloads)
        lines.append(f"| {RACE_VARIANTS.get(name, name)} | {variant['startup_s']} | {cells} |")
    ratios = ", ".join(
        f"`{workload}` **{r['vllm_over_in_process_second']}×**" for workload, r in data["ratios"].items()
    )
    lines.append("")
    if ratios:
        lines.append(f"The fastest vLLM's time over the in-process engine's (second call): {ratios}.")
    # The settings and the profile may come from a call of their own (``settings_call``).
    apart = inproc.get("settings_call")
    unprofiled_s = apart["ids_stop_second_s"] if apart else inproc["runs"]["ids_stop"]["second"]["seconds"]
    tried = inproc.get("ids_stop_settings")
    if tried:
        cells = ", ".join(f"`{setting}` {run['seconds']} s" for setting, run in tried.items())
        when = f"; a call of {_when(apart['date'])}" if apart else ""
        lines.append(
            "- The engine's settings on `ids_stop` (`checkN`: finished rows checked every N steps, `keepS`: "
            f"dropped once at most that share runs, `spanK`: attention span; first: its default{when}): "
            + f"{cells}."
        )
    profiled = inproc.get("ids_stop_profile")
    if profiled:
        lines.append(race_profile(profiled, unprofiled_s))
    return "\n".join(lines) + "\n"


#: Kernel names by what they compute, for the engine's profile (the first kind that matches; any
#: other kernel is "other").
KERNEL_KINDS = {
    "attention": ("flash",),
    "matrix products": ("nvjet", "gemm"),
    "elementwise and copies": ("elementwise_kernel", "copy_kernel"),
}


def race_profile(profiled: dict[str, Any], unprofiled_s: float) -> str:
    """Where one profiled ``ids_stop`` call's GPU time went, by kind of kernel."""
    kinds: dict[str, list[float]] = {}
    for kernel in profiled["top_kernels"]:
        kind = next(
            (k for k, marks in KERNEL_KINDS.items() if any(m in kernel["name"] for m in marks)),
            "other",
        )
        kinds.setdefault(kind, [0.0, 0])
        kinds[kind][0] += kernel["s"]
        kinds[kind][1] += kernel["calls"]
    shown = "; ".join(f"{kind} {s:.2f} s in {calls:,} launches" for kind, (s, calls) in kinds.items())
    return (
        f"- One `ids_stop` call profiled: the GPU ran kernels for {profiled['kernel_s']} s, against "
        f"{unprofiled_s} s for the whole call unprofiled; of the {len(profiled['top_kernels'])} kernels "
        f"that took most ({sum(k['s'] for k in profiled['top_kernels']):.2f} s): {shown}."
    )


WARM_VARIANTS = {
    "command": "the `opencompass` command, OpenCompass's transformers model",
    "warm": "warm worker, OpenCompass's transformers model",
    "command_resident": "the `opencompass` command, the resident engine",
    "warm_resident": "warm worker, the resident engine",
}


def warm_opencompass_cpu() -> str:
    """The warm worker's OpenCompass against the ``opencompass`` command (bench/warm_opencompass_cpu.py)."""
    data = load_results("warm_opencompass_cpu")
    lines = [
        f"Measured {_when(data['date'])} on {data['machine']['cpus']} CPU cores (load average "
        f"{number(data['machine']['load_average'][0], 1)}): {data['model']}, {data['problems']} problems, "
        f"{data['rounds']} evaluations of each.",
        "",
        "| variant | median s | first evaluation (server start) s |",
        "| --- | ---: | ---: |",
    ]
    for name, label in WARM_VARIANTS.items():
        first = data["first_evaluation_s"].get(name)
        lines.append(f"| {label} | {data['median_s'][name]} | {first if first is not None else '—'} |")
    same = data["same_completions"]
    ratios = data["ratios"]
    lines += [
        "",
        f"The command over the warm worker: **{ratios['command_over_warm']}×**, with the resident engine "
        f"**{ratios['command_resident_over_warm_resident']}×**; completions word for word the same: "
        f"{'yes' if same['warm_vs_command'] and same['warm_resident_vs_command_resident'] else 'NO'}.",
    ]
    split = data.get("split")
    if split is not None:
        lines.append(
            f"The whole split ({split['prompts']:,} prompts, the GPU's completions): the command "
            f"{split['median_s']['command']} s, the warm worker {split['median_s']['warm']} s "
            f"(**{split['command_over_warm']}×**)."
        )
        if "warm_counted" in split["median_s"]:
            same = split["completions_are_the_gpus"] and split.get("same_scores", False)
            lines.append(
                f"With every prompt tokenized for the length check and role tables deep-copied: "
                f"{split['median_s']['warm_counted']} s (**{split['warm_counted_over_warm']}×**); with "
                f"config dumps laid out with yapf too: {split['median_s']['warm_formatted']} s "
                f"(**{split['warm_formatted_over_warm']}×**); completions and scores the same in every "
                f"variant: {'yes' if same else 'NO'}."
            )
    return "\n".join(lines) + "\n"


WORKER_RUNS = {
    "warm_T2_first": "warm worker, T2 first (OpenCompass and the engine start)",
    "warm_T1": "warm worker, T1 (weights loaded in place)",
    "warm_T2": "warm worker, T2 (weights loaded in place)",
    "command_T2": "the `opencompass` command, an engine for the evaluation",
    "in_process_T2": "the `hf` backend's in-process engine, T2 (generation only)",
}


#: The warm GPU worker's submit-to-score target for the whole split at GSM8K answer lengths.
WARM_TARGET_S = 8.0
#: OpenCompass's run over its engine's own generation of the same prompts.
ENGINE_SHARE_TARGET = 1.5


def opencompass_worker_gpu() -> str:
    """The ``opencompass`` backend end to end on the GPU (bench/opencompass_worker_gpu.py), a table
    for each card measured."""
    return each_card("opencompass_worker_gpu", worker_card)


def worker_card(name: str) -> str:
    data = load_results(name)
    env = data["environment"]
    lines = [
        f"The same on one {env['machine']} ({_when(data['date'])}):"
        if second_card(name)
        else f"Measured {_when(data['date'])} on one {env['machine']}: OpenCompass "
        f"{env['opencompass_environment'].get('opencompass')}, vLLM {env['engine_environment'].get('vllm')}; "
        f"{data['problems']:,} problems.",
        "",
        "| run | snapshot s | evaluate s | submit to score s | OpenCompass s | score |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, label in WORKER_RUNS.items():
        run = data["runs"].get(key)
        if run is None or "evaluate_s" not in run:
            continue
        lines.append(
            f"| {label} | {run['snapshot_s']} | {run['evaluate_s']} | {run['submit_to_score_s']} | "
            f"{run['opencompass_s']} | {run['summary_accuracy']} |"
        )
    lines.append("")
    for key, agreement in data.get("agreement", {}).items():
        lines.append(
            f"- Final answers equal to the warm worker's on T2, {WORKER_RUNS.get(key, key)}: "
            f"{agreement['equal_final_answers']:,} of {agreement['rows']:,}."
        )
    texts_file = RESULTS / f"{name}.texts.json.gz"
    if texts_file.exists():
        with gzip.open(texts_file, "rt", encoding="utf-8") as handle:
            texts = json.load(handle)
        first, again = texts.get("warm_T2_first"), texts.get("warm_T2")
        if first and again and len(first) == len(again):
            same = sum(a == b for a, b in zip(first, again, strict=True))
            lines.append(
                f"- The warm worker's T2 as its engine started and after T1: identical text in {same:,} "
                f"of {len(first):,}."
            )
    runs = data["runs"]
    warm, cold = runs.get("warm_T2"), runs.get("command_T2")
    if warm:
        command = f", the command {cold['submit_to_score_s']} s" if cold else " (the command not run)"
        lines.append(
            f"- Submit to score: warm worker {warm['submit_to_score_s']} s{command}; target ≤ "
            f"{WARM_TARGET_S:g} s: {'met' if warm['submit_to_score_s'] <= WARM_TARGET_S else 'not met'}."
        )
    lines += worker_engine_share(runs)
    return "\n".join(lines) + "\n"


def worker_engine_share(runs: dict[str, Any]) -> list[str]:
    """What OpenCompass and the worker add to the engine: the engine's own generation time in the
    warm worker's T2 (its log), and vLLM called directly on the same prompts in the same call."""
    warm, bare = runs.get("warm_T2") or {}, runs.get("bare_vllm_T2")
    lines = []
    if warm.get("engine_generate_s"):
        over = warm["opencompass_s"] / warm["engine_generate_s"]
        lines.append(
            f"- Of the warm worker's {warm['opencompass_s']} s on T2 the engine generated for "
            f"{warm['engine_generate_s']} s: OpenCompass's run **{over:.2f}×** its engine's generation "
            f"(target ≤ {ENGINE_SHARE_TARGET:g}×)."
        )
    if bare:
        lines.append(
            "- vLLM called directly on the same prompts: the split in "
            f"{', '.join(str(v) for v in bare['generate_s'])} s; the warm worker took "
            f"**{bare['opencompass_over_bare']}×** that (target ≤ {ENGINE_SHARE_TARGET:g}×)."
        )
    return lines


SNAPSHOT_RUNS = {
    "snapshot_copy_gpu": "the GPU machine",
    "snapshot_copy": "the development machine",
}


def snapshot_copy() -> str:
    """The grader's snapshot copy: blocks in parallel against the former one-stream loops."""
    lines = [
        "| where | weights | blocks in parallel s | one stream, hash beside s | one stream, hash after each "
        "write s | checks | date |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
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
            + f" | {'pass' if all(data[c] for c in checks) else 'FAIL'} | {data['date'][:10]} |"
        )
    return "\n".join(lines) + "\n"


def grader_tenants() -> str:
    """Another tenant's and the admin API's latencies, idle and under one tenant's flood."""
    run = load_results("grader_load")["runs"]["tenants"]
    data = run["tenants"]
    lines = [
        f"Measured {run['date']} on {data['machine']['cpus']} shared cores.",
        "",
        "| database | flood: 200 / 429 | other tenant's GET /scores p50 / p99, idle → flood (ms) "
        "| admin GET p50 / p99, idle → flood (ms) | p99 flood / idle (tenant, admin) | target |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
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
            f"{cell('other_tenant_scores')} | {cell('admin_get')} | "
            f"{ratio['other_tenant_scores']}×, {ratio['admin_get']}× | "
            f"≤ {r['target_p99_ratio']:g}×: {'met' if r['within_target'] else 'not met'} |"
        )
    return "\n".join(lines) + "\n"


RENDERERS: dict[str, Callable[[], str]] = {
    "generation": generation,
    "evaluate-engine": evaluate_engine,
    "opencompass-vllm": opencompass_vllm,
    "opencompass-cpu": opencompass_cpu,
    "grpo-throughput": grpo_throughput,
    "grpo-learning": grpo_learning,
    "grpo-headroom": grpo_headroom,
    "grpo-paths": grpo_paths,
    "bf16-agreement": bf16_agreement,
    "weight-swap": weight_swap,
    "autorl-run-gpu": autorl_run,
    "demo-cpu": demo_cpu,
    "grpo-trl-vllm": grpo_trl_vllm,
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
    PERFORMANCE.main()
