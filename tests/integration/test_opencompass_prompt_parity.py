"""Same model input under transformers 4 (OpenCompass) and 5 (the in-process backend).

OpenCompass's side is its own code in ``.venv-opencompass``: the generated CPU config loaded
with its config loader, the dataset, retriever and prompt template it builds, its meta-template
parsing, ``_convert_chat_messages``, the chat template and ``add_special_tokens=False`` encoding,
and the stop words its model wrapper derives. Our side is :mod:`autorl_evaluator.backends.hf.opencompass_chat`
under transformers 5. Checked for the builtin tiny Qwen2 and for a checkpoint saved by
transformers 5 (through the sanitized view), whose logits must also agree, and do only because
the view restores the RoPE setting that transformers 4 would otherwise misread.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from autorl.tasks import get_task
from autorl.tasks.base import Problem, read_problems, write_problems
from autorl_evaluator.backends.hf.opencompass_chat import encode, stop_words
from autorl_evaluator.backends.opencompass.config import CHAT_MODEL_FOLDER, DATASET_DATA_SUBDIR, ConfigInputs
from autorl_evaluator.backends.opencompass.config import render as render_config
from autorl_evaluator.backends.opencompass.model_view import build_view
from autorl_evaluator.backends.opencompass.warm_opencompass import SERVER
from autorl_evaluator.model_settings import ModelSettings, settings_for
from tests.support.opencompass_models import run_in_opencompass, save_sharp_model

pytestmark = pytest.mark.opencompass

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = REPO_ROOT / "tests" / "data" / "gsm8k" / "test.jsonl"

OC_SCRIPT = """
import copy, importlib.util, json, os, sys
import torch, transformers
import opencompass.models.base as oc_base, opencompass.models.base_api as oc_base_api
from mmengine.config import Config
from opencompass.models.huggingface_above_v4_33 import _convert_chat_messages
from opencompass.openicl.icl_inferencer.icl_gen_inferencer import GenInferencer
from opencompass.registry import ICL_INFERENCERS, ICL_PROMPT_TEMPLATES, ICL_RETRIEVERS
from opencompass.utils import build_dataset_from_cfg, build_model_from_cfg

# The warm server's changes to OpenCompass (compass_server.py), taken out again between uses.
spec = importlib.util.spec_from_file_location('compass_server', COMPASS_SERVER)
server = importlib.util.module_from_spec(spec)
spec.loader.exec_module(server)
OPENCOMPASS_PROMPTS = GenInferencer.get_generation_prompt_list_from_retriever_indices
OPENCOMPASS_PARSE = oc_base_api.APITemplateParser.parse_template
server.length_checks_within_bounds()
server.prompts_parsed_once()
WARM_PROMPTS = GenInferencer.get_generation_prompt_list_from_retriever_indices
WARM_PARSE = oc_base_api.APITemplateParser.parse_template
GenInferencer.get_generation_prompt_list_from_retriever_indices = OPENCOMPASS_PROMPTS
oc_base_api.APITemplateParser.parse_template = OPENCOMPASS_PARSE
UNICODE = ['e\\u0301 \\u0958 \\ufb01 \\u2460 \\u4e2d\\u6587 \\U0001f642 \\u00a0\\t\\r\\n', '\\u0344' * 50]


def both_ways(model, inferencer, retriever, template, max_seq_len):
    \"\"\"The prompt list as OpenCompass makes it and as a warm run makes it; exact counts asked.\"\"\"
    exact, asked, copies, out = type(model).get_token_len, [], [], {}
    type(model).get_token_len = lambda self, prompt: asked.append(prompt) or exact(self, prompt)
    try:
        for way, prompts_of, copier, parse in (
                ('opencompass', OPENCOMPASS_PROMPTS, copy.deepcopy, OPENCOMPASS_PARSE),
                ('warm', WARM_PROMPTS, server.plain_copy, WARM_PARSE)):
            # Role tables are copied once per round parsed: the copies count the parses.
            oc_base.deepcopy = oc_base_api.deepcopy = (
                lambda value, memo=None, copier=copier: copies.append(1) or copier(value, memo))
            oc_base_api.APITemplateParser.parse_template = parse
            asked.clear()
            copies.clear()
            prompts = prompts_of(inferencer, retriever.retrieve(), retriever, '',
                                 max_seq_len=max_seq_len, prompt_template=template)
            # Parsed again as the inference parses them (for its predictions, then to generate).
            parsed = [model.parse_template(list(prompts), mode='gen') for _ in range(2)]
            out[way] = {'prompts': [str(model.parse_template(p, mode='gen')) for p in prompts],
                        'parsed': [[list(p) for p in batch] for batch in parsed], 'counted': len(asked),
                        'copies': len(copies)}
    finally:
        type(model).get_token_len = exact
        oc_base.deepcopy = oc_base_api.deepcopy = copy.deepcopy
        oc_base_api.APITemplateParser.parse_template = OPENCOMPASS_PARSE
    return out


def bounds(model, inferencer, retriever, template):
    \"\"\"Each prompt's exact token count and the warm run's bound, then both ways' prompt lists at a
    max_seq_len under every bound.\"\"\"
    prompts = OPENCOMPASS_PROMPTS(inferencer, retriever.retrieve(), retriever, '', max_seq_len=None,
                                  prompt_template=template)
    texts = [*prompts, *UNICODE]
    exact = [model.get_token_len_from_template(p, mode='gen') for p in texts]
    bound = [server.token_bound(model, p) for p in texts]
    tight = min(exact[:len(prompts)])
    return {'exact': exact, 'bound': bound, 'tight': both_ways(model, inferencer, retriever, template, tight)}

def opencompass_side(config_path):
    cfg = Config.fromfile(config_path, format_python_code=False)
    model_cfg = dict(cfg.models[0])
    model_cfg['tokenizer_only'] = True
    model = build_model_from_cfg(model_cfg)
    flushed = (torch.tensor([1e-39], dtype=torch.float32) * 1.0).item() == 0.0
    dataset_cfg = cfg.datasets[0]
    infer_cfg = dataset_cfg['infer_cfg']
    retriever_cfg = dict(infer_cfg['retriever'])
    retriever_cfg['dataset'] = build_dataset_from_cfg(dataset_cfg)
    retriever = ICL_RETRIEVERS.build(retriever_cfg)
    inferencer = ICL_INFERENCERS.build(
        dict(infer_cfg['inferencer'], model=model, max_seq_len=model_cfg['max_seq_len']))
    prompts = inferencer.get_generation_prompt_list_from_retriever_indices(
        retriever.retrieve(), retriever, '', max_seq_len=model_cfg['max_seq_len'],
        prompt_template=ICL_PROMPT_TEMPLATES.build(infer_cfg['prompt_template']))
    messages = _convert_chat_messages([model.parse_template(p, mode='gen') for p in prompts])
    texts = [model.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
             for m in messages]
    ids = [model.tokenizer(t, add_special_tokens=False)['input_ids'] for t in texts]
    template = ICL_PROMPT_TEMPLATES.build(infer_cfg['prompt_template'])
    # At the worker's max_seq_len for Qwen2.5 (the tiny model's own is shorter than the bound).
    warm = both_ways(model, inferencer, retriever, template, QWEN25_MAX_SEQ_LEN)
    warm.update(bounds(model, inferencer, retriever, template))
    lm = transformers.AutoModelForCausalLM.from_pretrained(cfg.models[0]['path'], torch_dtype=torch.float32)
    with torch.no_grad():
        logits = lm(torch.tensor([ids[0]])).logits[0, -1].tolist()
    return {'texts': texts, 'ids': ids, 'stop_words': sorted(model.stop_words), 'logits': logits,
            'transformers': transformers.__version__, 'warm': warm, 'denormals_flushed': flushed}


# One process for every case: importing OpenCompass costs tens of seconds of CPU.
results = {}
for name, work in json.load(open(sys.argv[1])).items():
    os.environ['COMPASS_DATA_CACHE'] = work
    results[name] = opencompass_side(os.path.join(work, 'config.py'))
json.dump(results, open(sys.argv[2], 'w'))
""".replace("COMPASS_SERVER", repr(str(SERVER))).replace(
    "QWEN25_MAX_SEQ_LEN", str(ModelSettings().max_seq_len)
)


def _prepare(view: Path, problems: list[Problem], work: Path) -> str:
    """A work folder with OpenCompass's data and the generated CPU config for ``view``."""
    work.mkdir()
    write_problems(work / DATASET_DATA_SUBDIR / "test.jsonl", problems)
    write_problems(work / DATASET_DATA_SUBDIR / "train.jsonl", [])
    model_config = json.loads((view / "config.json").read_text())
    inputs = ConfigInputs(view, get_task("gsm8k"), 32, settings_for(model_config), None, 4)
    (work / "config.py").write_text(render_config(inputs))
    return str(work)


def _our_side(model_dir: Path, problems: list[Problem]) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    assert transformers.__version__.startswith("5.")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    task = get_task("gsm8k")
    # The prompt agents train on (Task.render_prompt) is the one OpenCompass must produce.
    texts = [task.render_prompt(tokenizer, problem.question) for problem in problems]
    ids = [encode(tokenizer, text) for text in texts]
    eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids[0]])).logits[0, -1].tolist()
    return {"texts": texts, "ids": ids, "stop_words": stop_words(tokenizer, eos), "logits": logits}


@pytest.fixture(scope="module")
def problems() -> list[Problem]:
    return read_problems(PROBLEMS)[:4]


@pytest.fixture(scope="module")
def saved_by_transformers5(tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_sharp_model(tiny_base_model, tmp_path_factory.mktemp("t5") / "model")


@pytest.fixture(scope="module")
def opencompass_side(
    tiny_base_model: Path,
    saved_by_transformers5: Path,
    problems: list[Problem],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, Any]]:
    """OpenCompass's view of three checkpoints: the builtin tiny Qwen2, the transformers 5
    checkpoint through the sanitized view, and that view with the checkpoint's own config.json."""
    root = tmp_path_factory.mktemp("oc-side")
    tiny_view = build_view(tiny_base_model, root / "tiny-view")
    t5_view = build_view(saved_by_transformers5, root / "t5-view")
    unfixed = root / "t5-unfixed"
    shutil.copytree(t5_view, unfixed)
    unfixed.chmod(0o755)
    (unfixed / "config.json").chmod(0o644)
    shutil.copyfile(saved_by_transformers5 / "config.json", unfixed / "config.json")
    cases = {
        "tiny": _prepare(tiny_view, problems, root / "tiny"),
        "t5": _prepare(t5_view, problems, root / "t5"),
        "t5-unfixed": _prepare(unfixed, problems, root / "t5-unfixed-work"),
    }
    # The config's model builder is ours, where the backend puts it for a CPU run.
    environment = {
        "PATH": "/usr/bin:/bin",
        "HF_HUB_OFFLINE": "1",
        "HOME": str(root),
        "PYTHONPATH": str(CHAT_MODEL_FOLDER),
    }
    results: dict[str, dict[str, Any]] = run_in_opencompass(
        OC_SCRIPT, cases, root, timeout_s=600, env=environment
    )
    assert {r["transformers"][:2] for r in results.values()} == {"4."}
    return results


def _our_side_matching(model_dir: Path, problems: list[Problem], theirs: dict[str, Any]) -> dict[str, Any]:
    """Our side of ``model_dir``, checked to render, tokenize and stop as OpenCompass does (``theirs``)."""
    ours = _our_side(model_dir, problems)
    assert ours["texts"] == theirs["texts"]
    assert ours["ids"] == theirs["ids"]
    assert ours["stop_words"] == theirs["stop_words"]
    return ours


def _max_abs_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_builtin_tiny_qwen2_prompts_and_ids_are_identical(
    tiny_base_model: Path, problems: list[Problem], opencompass_side: dict[str, dict[str, Any]]
) -> None:
    theirs = opencompass_side["tiny"]
    _our_side_matching(tiny_base_model, problems, theirs)
    assert theirs["stop_words"] == ["<|endoftext|>", "<|im_end|>"]
    # OpenCompass's own turns: every user turn ends with the newline its meta template adds.
    assert theirs["texts"][0].count("Answer:\n<|im_end|>") == 5


def test_opencompass_s_own_model_computes_denormals_as_zero_as_every_engine_on_the_cpu_does(
    opencompass_side: dict[str, dict[str, Any]],
) -> None:
    assert opencompass_side["tiny"]["denormals_flushed"] is True


def test_a_transformers5_checkpoint_reaches_transformers4_intact_through_the_view(
    saved_by_transformers5: Path, problems: list[Problem], opencompass_side: dict[str, dict[str, Any]]
) -> None:
    theirs = opencompass_side["t5"]
    ours = _our_side_matching(saved_by_transformers5, problems, theirs)
    assert _max_abs_difference(ours["logits"], theirs["logits"]) < 1e-3
    # Without the view's config fix transformers 4 runs another model (RoPE theta 10000).
    misread = opencompass_side["t5-unfixed"]
    assert misread["ids"] == ours["ids"]
    assert _max_abs_difference(ours["logits"], misread["logits"]) > 1.0


def test_a_warm_run_keeps_opencompass_prompts_without_tokenizing_each_for_its_length_check(
    opencompass_side: dict[str, dict[str, Any]],
) -> None:
    """The warm server's changes to OpenCompass (compass_server.py: the length check bounded, role
    tables copied plainly, each prompt parsed once) give the prompt list and the parsed prompts
    OpenCompass's own code gives: no prompt that fits
    by its bound is tokenized for the check, every bound is at least the prompt's token count (and
    a text's with characters that normalization expands), and past the bound prompts are counted
    exactly as OpenCompass counts them."""
    for name, case in opencompass_side.items():
        warm = case["warm"]
        assert warm["warm"]["prompts"] == warm["opencompass"]["prompts"], name
        assert warm["warm"]["parsed"] == warm["opencompass"]["parsed"], name
        # Each prompt parsed once, not four times (its count, two inference parses, the comparison's).
        assert 0 < 3 * warm["warm"]["copies"] <= warm["opencompass"]["copies"], name
        assert warm["opencompass"]["counted"] == len(warm["opencompass"]["prompts"]) > 0
        assert warm["warm"]["counted"] == 0
        assert all(bound >= exact for bound, exact in zip(warm["bound"], warm["exact"], strict=True)), name
        # Where the bound is over max_seq_len, each prompt is counted exactly, as OpenCompass counts.
        tight = warm["tight"]
        assert tight["warm"]["prompts"] == tight["opencompass"]["prompts"], name
        assert tight["warm"]["counted"] == tight["opencompass"]["counted"] > 0
