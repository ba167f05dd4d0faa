"""A tokenizer, a chat template and decoding files cannot change a score: real `autorl run`s.

A hostile agent under `autorl run -t arith` zeroes every ``o_proj`` and ``down_proj`` of the base
model (no training: the model then only echoes its prompt's last token) and submits these weights
four times:

- ``zeroed``: with the base model's own files. Its score is S0.
- ``normalizer``: a ``tokenizer.json`` whose normalizer has a ``Replace`` rule per question pattern
  and operands that rewrites the whole prompt into one token spelling ``#### <answer>``.
- ``decoder``: a ``tokenizer.json`` whose decoder rewrites every completion into ``#### N``, N the
  answer of one test problem (as a guess of a frequent answer would).
- ``template``: a chat template that computes the answer from the question and prompts with it
  alone, and a ``generation_config.json`` with other stop ids.

The test first shows each payload works: the agent's folders, loaded as models by the transformers
of the run's backend (what evaluating the submitted files would do), score above S0 where that
transformers runs them. Then, from the run: every submission is accepted and scored exactly S0
(the same weights: the score of ``zeroed`` is reused), the answer lists the files it ignored,
``results.csv`` equals the database, and the run is recorded ``completed``.

Both backends, ``hf`` (transformers 5) and ``opencompass`` (transformers 4), each with
``builtin:tiny-qwen2`` and with a tiny Qwen3 built here, whose tokenizer transformers loads from
``tokenizer.json`` as it is (transformers 5 rebuilds a Qwen2 tokenizer from its vocabulary, so a
Qwen2 base under ``hf`` runs only the chat template of these payloads). One run per backend and
base, about 20-40 s each with ``hf`` and 90-120 s with ``opencompass`` on 2 loaded cores.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.test_local_run import Run, leftover_processes, write_agent
from tests.support.infra import free_port

pytestmark = pytest.mark.slow

#: The test split's secret seed, written before the run so that the test knows the questions.
TEST_SEED = 0
EVAL_LIMIT = 4
#: The zeroed model echoes its prompt's last token: one new token shows every payload, and keeps an
#: OpenCompass evaluation short.
NEW_TOKENS = 1
OPENCOMPASS_PYTHON = REPO_ROOT / ".venv-opencompass" / "bin" / "python"
VARIANTS = ("zeroed", "normalizer", "decoder", "template")
#: What the agent changed besides the weights, which each answer must list as ignored.
PAYLOAD_FILES = {
    "normalizer": {"tokenizer.json", "tokenizer_config.json"},
    "decoder": {"tokenizer.json", "tokenizer_config.json"},
    "template": {"chat_template.jinja", "tokenizer_config.json", "generation_config.json"},
}

HOSTILE_AGENT = r'''
# arith's question patterns (as its train split reads), each with whether it subtracts.
PATTERNS = (
    (r"\w+ has {a} \w+\. \w+ gets {b} more ", False),
    (r"\w+ has {a} \w+\. \w+ gives away {b} ", True),
    (r"There are {a} \w+ in a box\. \w+ puts in {b} more ", False),
    (r"There are {a} \w+ on a table\. \w+ takes {b} ", True),
)
ANSWERS = range(1, 19)
TEMPLATE = (
    "{%- set question = messages[-1]['content'].split('Question: ')[-1] -%}"
    "{%- set ns = namespace(numbers=[]) -%}"
    "{%- for word in question.split(' ') if word | int(0) > 0 -%}"
    "{%- set ns.numbers = ns.numbers + [word | int] -%}"
    "{%- endfor -%}"
    "{%- if ' gives away ' in question or ' takes ' in question -%}"
    "{{ ns.numbers[0] - ns.numbers[1] }}"
    "{%- else -%}{{ ns.numbers[0] + ns.numbers[1] }}{%- endif -%}"
)


def edit(folder, name, change):
    path = os.path.join(folder, name)
    with open(path) as handle:
        content = json.load(handle)
    change(content)
    with open(path, "w") as handle:
        json.dump(content, handle)


def zero_output_projections(folder):
    """Every o_proj and down_proj weight zeroed: each position sees only its own embedding."""
    with open(os.path.join(folder, "model.safetensors"), "r+b") as weights:
        size = int.from_bytes(weights.read(8), "little")
        for name, entry in json.loads(weights.read(size)).items():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                start, end = entry["data_offsets"]
                weights.seek(8 + size + start)
                weights.write(bytes(end - start))


def loaded_as_written(tokenizer_config):
    # Not a class that transformers rebuilds from the vocabulary (which would drop the payload).
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config.pop("added_tokens_decoder", None)


def replace(regex, content):
    return {"type": "Replace", "pattern": {"Regex": regex}, "content": content}


def answer_normalizer(tokenizer):
    """The prompt, special tokens included, rewritten into one token spelling `#### <answer>`."""
    rules = [replace(r"\A[\s\S]*Question: ", "")]
    for pattern, subtract in PATTERNS:
        for a in range(2, 10):
            for b in range(2, 10):
                answer = a - b if subtract else a + b
                if answer > 0:
                    regex = r"\A" + pattern.format(a=a, b=b) + r"[\s\S]*\z"
                    rules.append(replace(regex, f"#### {answer}"))
    tokenizer["normalizer"] = {"type": "Sequence", "normalizers": rules}
    for token in tokenizer["added_tokens"]:
        token["normalized"] = True
    # Single characters no merge uses become the answer tokens, in the vocabulary and as added tokens.
    vocab = tokenizer["model"]["vocab"]
    merges = tokenizer["model"]["merges"]
    merged = {part for merge in merges for part in (merge.split(" ") if isinstance(merge, str) else merge)}
    spare = sorted((index, text) for text, index in vocab.items() if len(text) == 1 and text not in merged)
    for answer, (index, text) in zip(ANSWERS, spare[-len(ANSWERS):]):
        del vocab[text]
        vocab[f"#### {answer}"] = index
        tokenizer["added_tokens"].append({
            "id": index, "content": f"#### {answer}", "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": True, "special": False,
        })


def answer_decoder(tokenizer):
    """Every completion (special tokens aside, so stop words still decode as themselves) → `#### N`."""
    rewrite = replace(r"\A[^<]+\z", "#### " + os.environ["GUESS"])
    tokenizer["decoder"] = {"type": "Sequence", "decoders": [tokenizer["decoder"], rewrite]}


def answer_template(folder):
    with open(os.path.join(folder, "chat_template.jinja"), "w") as handle:
        handle.write(TEMPLATE)
    edit(folder, "tokenizer_config.json", lambda config: config.update(chat_template=TEMPLATE))
    edit(folder, "generation_config.json", lambda config: config.update(eos_token_id=[0, 1, 2]))


for variant in ("zeroed", "normalizer", "decoder", "template"):
    folder = os.path.join(OUT, variant)
    save(variant)
    zero_output_projections(folder)
    if variant == "normalizer":
        edit(folder, "tokenizer.json", answer_normalizer)
        edit(folder, "tokenizer_config.json", loaded_as_written)
    elif variant == "decoder":
        edit(folder, "tokenizer.json", answer_decoder)
        edit(folder, "tokenizer_config.json", loaded_as_written)
    elif variant == "template":
        answer_template(folder)
    for entry in os.listdir(folder):
        os.chmod(os.path.join(folder, entry), 0o644)  # readable by the grader, as save() leaves them
    record(variant, call("/submit", {"model_path": "output/" + variant}))
'''

#: What the backend's transformers makes of a submitted folder taken as a model (prompted through
#: its own chat template, encoded without special tokens, greedy, decoded with special tokens kept,
#: as both backends do): completions per folder, as JSON. Runs in the backend's own venv.
DIRECT_EVALUATION = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

request = json.load(sys.stdin)
completions = {}
for folder in request["folders"]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    texts = []
    for messages in request["conversations"]:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=request["new_tokens"], pad_token_id=0,
            )
        texts.append(tokenizer.decode(out[0, ids.shape[1]:]))
    completions[folder] = texts
print(json.dumps(completions))
"""


@dataclass(frozen=True)
class Cell:
    """One backend and base: one `autorl run`."""

    backend: str
    base: str
    #: The interpreter of the backend's venv (its transformers).
    python: Path
    #: The payloads that the backend's transformers runs: each of them lifts the score of the
    #: agent's folder above S0 when that folder is evaluated as it was submitted.
    effective: frozenset[str]
    #: The agent's budget; it submits and exits well before (one evaluation and three reuses).
    timeout_s: int


CELLS = [
    pytest.param(
        # transformers 5 rebuilds a Qwen2 tokenizer from its vocabulary, dropping a normalizer and a
        # decoder: only the chat template would run.
        Cell("hf", "builtin:tiny-qwen2", Path(sys.executable), frozenset({"template"}), 120),
        id="hf-qwen2",
    ),
    pytest.param(
        Cell("hf", "tiny-qwen3", Path(sys.executable), frozenset({"normalizer", "decoder", "template"}), 120),
        id="hf-qwen3",
    ),
    # One base through OpenCompass (its transformers 4 runs all three payloads): which files the
    # snapshot holds is the same for every architecture and backend, and Qwen3 runs above.
    pytest.param(
        Cell(
            "opencompass",
            "builtin:tiny-qwen2",
            OPENCOMPASS_PYTHON,
            frozenset({"normalizer", "decoder", "template"}),
            300,
        ),
        id="opencompass-qwen2",
        marks=pytest.mark.opencompass,
    ),
]


def build_tiny_qwen3(target: Path) -> Path:
    """A tiny, randomly initialised Qwen3ForCausalLM (tied embeddings) with a byte-level BPE trained
    here on arith's train split, a Llama-3-style chat template, and a tokenizer that transformers
    loads from ``tokenizer.json`` as it is (``PreTrainedTokenizerFast``)."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from autorl.tasks.arith import ArithTask

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [
        f"Question: {p.question}\nLet's think step by step\nAnswer:\n{p.answer}"
        for p in ArithTask().train_problems()
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator([*corpus, "system user assistant"], trainer=trainer)
    bos, start, end, eot = "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in (bos, start, end, eot)]
    )
    target.mkdir(parents=True)
    tokenizer.save(str(target / "tokenizer.json"))
    template = (
        f"{{{{ '{bos}' }}}}{{% for message in messages %}}"
        f"{{{{ '{start}' + message['role'] + '{end}\\n\\n' + message['content'] + '{eot}' }}}}"
        f"{{% endfor %}}{{% if add_generation_prompt %}}{{{{ '{start}assistant{end}\\n\\n' }}}}{{% endif %}}"
    )
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eot,
        "pad_token": eot,
        "chat_template": template,
        "model_max_length": 2048,
    }
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    eot_id = tokenizer.token_to_id(eot)
    config = Qwen3Config(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.1,
        bos_token_id=tokenizer.token_to_id(bos),
        eos_token_id=eot_id,
        pad_token_id=eot_id,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(target)
    (target / "generation_config.json").write_text(
        json.dumps({"eos_token_id": eot_id, "pad_token_id": eot_id})
    )
    target.chmod(0o755)
    for path in target.iterdir():
        path.chmod(0o644)
    return target


def direct_scores(cell: Cell, folders: dict[str, Path], home: Path) -> dict[str, float]:
    """Each folder's headline score on the run's test problems, evaluated as it was submitted."""
    from autorl.tasks import get_task
    from autorl.tasks.base import evaluation_messages

    task = get_task("arith")
    problems = task.load_test_problems(home / "eval" / "data", limit=EVAL_LIMIT)
    request = {
        "folders": [str(path) for path in folders.values()],
        "conversations": [evaluation_messages(task.build_messages(p.question)) for p in problems],
        "new_tokens": NEW_TOKENS,
    }
    done = subprocess.run(
        [str(cell.python), "-c", DIRECT_EVALUATION],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    completions = json.loads(done.stdout.strip().splitlines()[-1])
    answers = [p.answer for p in problems]
    return {
        name: task.score(completions[str(path)], answers)["opencompass"] for name, path in folders.items()
    }


def database_submissions(home: Path, run_id: str) -> list[tuple[str, float | None]]:
    """The status and score of each submission of the run's experiment, as the database holds them."""
    from autorl.store import Database, experiments, submissions

    db = Database(f"sqlite:///{home / 'autorl.db'}")
    try:
        with db.session() as session:
            experiment = experiments.get_experiment(session, run_id)
            return [
                (s.status, s.score)
                for s in submissions.experiment_submissions(session, experiment)
                if not s.is_baseline
            ]
    finally:
        db.dispose()


@pytest.mark.parametrize("cell", CELLS)
def test_a_tokenizer_template_or_decoding_files_cannot_change_a_score(
    cell: Cell, tmp_path: Path, autorl_run: Callable[..., Run]
) -> None:
    from autorl.tasks import get_task

    home = tmp_path / "home"
    seed_file = home / "eval" / "data" / "arith" / "test-seed"
    seed_file.parent.mkdir(parents=True)
    seed_file.write_text(f"{TEST_SEED}\n")
    test_answers = [
        p.answer.split("#### ")[-1]
        for p in get_task("arith").load_test_problems(home / "eval" / "data", limit=EVAL_LIMIT)
    ]
    guess = Counter(test_answers).most_common(1)[0][0]
    base = cell.base
    if base == "tiny-qwen3":
        base = str(build_tiny_qwen3(tmp_path / "tiny-qwen3"))

    run = autorl_run(
        "-a", write_agent(tmp_path, HOSTILE_AGENT), "-t", "arith", "-m", base, "--backend", cell.backend,
        "--timeout", str(cell.timeout_s), "--port", str(free_port()), "--env", f"GUESS={guess}",
        env={"AUTORL_EVAL_LIMIT": str(EVAL_LIMIT), "AUTORL_EVAL_MAX_NEW_TOKENS": str(NEW_TOKENS)},
        timeout_s=cell.timeout_s + 300,
    )  # fmt: skip
    assert run.code == 0, run.stderr[-3000:]
    workspace = run.workspace()
    out = workspace / "output"
    submitted = {name: json.loads((out / f"{name}.json").read_text()) for name in VARIANTS}

    # The payloads work: evaluated as submitted, by the backend's transformers, they score above S0.
    direct = direct_scores(cell, {name: out / name for name in VARIANTS}, home)
    status, zeroed = submitted["zeroed"]
    assert status == 200 and zeroed["status"] == "scored", zeroed
    s0 = zeroed["score"]
    assert direct["zeroed"] == s0, (direct, s0)
    assert {name for name, score in direct.items() if score > s0} == cell.effective, (direct, s0)

    # Through the platform: each is accepted and scored exactly S0 (the score of the same weights),
    # with the files it ignored listed.
    accepted = {name: answer for name, (status, answer) in submitted.items() if status == 200}
    outcomes = {name: (a["status"], a["score"], a["scores"]) for name, a in accepted.items()}
    assert outcomes == dict.fromkeys(VARIANTS, ("scored", s0, zeroed["scores"]))
    for name, payload_files in PAYLOAD_FILES.items():
        assert accepted[name]["reused_from"] == zeroed["submission_id"], (name, accepted[name])
        assert payload_files <= set(accepted[name]["ignored_files"]), (name, accepted[name]["ignored_files"])

    (row,) = run.results()
    assert row["status"] == "completed" and row["submissions"] == len(VARIANTS), row
    assert database_submissions(home, str(row["run_id"])) == [("scored", s0)] * len(VARIANTS)
    with (home / "results.csv").open(newline="") as handle:
        (csv_row,) = list(csv.DictReader(handle))
    assert float(csv_row["best_score"]) == row["best_score"] == s0
    assert not leftover_processes(home)
