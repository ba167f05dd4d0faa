"""The small files of a model folder: what a submission's config must say, and the normalized
form of the base model's files that every snapshot holds beside a submission's weights.

- :data:`TOKENIZER_FILES` names the tokenizer files a model folder ships. A submission's are never
  read: every evaluation tokenizes, prompts and decodes with the base model's (autorl.checkpoints.snapshot).
- ``config.json`` is only *checked*: every field that fixes the architecture must equal the base
  model's, and ``auto_map`` (remote code) is refused. The snapshot holds the base model's own
  config, so no config key of a submission can change how it is evaluated.
- ``generation_config.json``: decoding is the platform's; only the base model's eos, pad and bos
  ids are kept.
- ``tokenizer_config.json``: an allow-list of keys; file paths, ``auto_map``, ``name_or_path``
  and loader options are dropped. The chat template, wherever the base model keeps it
  (``chat_template.jinja``, ``chat_template.json`` or this file), is resolved once, the way
  transformers resolves it, and stored here as one string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from autorl.checkpoints.agent_names import shown_value
from autorl.errors import CheckpointError

#: The tokenizer and chat template as a model folder ships them.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
#: config.json fields that fix the architecture; besides these, any field named like a size or a
#: count (num_*, *_size, n_*) is compared too, so an architecture not listed here is covered.
ARCHITECTURE_FIELDS = frozenset(
    {
        "model_type",
        "architectures",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "tie_word_embeddings",
        "max_position_embeddings",
        "rms_norm_eps",
        "layer_norm_eps",
        "layer_norm_epsilon",
        "attention_bias",
        "mlp_bias",
        "partial_rotary_factor",
        "rotary_dim",
        "sliding_window",
        "use_sliding_window",
        "quantization_config",
    }
)
#: The output embedding's tensor, which ``tie_word_embeddings`` makes the input embedding (the name
#: every causal LM of transformers gives it).
OUTPUT_EMBEDDING = "lm_head.weight"
_SIZE_FIELD = re.compile(r"^(num_|n_).+|.+_size$")
GENERATION_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
#: What transformers passes to a chat template besides the messages.
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
TOKENIZER_CONFIG_KEYS = frozenset(
    {
        "tokenizer_class",
        "added_tokens_decoder",
        "additional_special_tokens",
        "extra_special_tokens",
        *SPECIAL_TOKEN_KEYS,
        "add_bos_token",
        "add_eos_token",
        "add_prefix_space",
        "clean_up_tokenization_spaces",
        "do_lower_case",
        "errors",
        "legacy",
        "model_input_names",
        "model_max_length",
        "spaces_between_special_tokens",
        "split_special_tokens",
    }
)
_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SAVE = "save the model with model.save_pretrained(path) and tokenizer.save_pretrained(path)"


def parse_json_object(data: bytes, shown: str) -> dict[str, Any]:
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{shown} is not a readable JSON file ({exc}); {_SAVE}") from exc
    if not isinstance(parsed, dict):
        raise CheckpointError(f"{shown} is not a JSON object; {_SAVE}")
    return parsed


def dump_json(value: Mapping[str, Any]) -> bytes:
    """One byte form per value: equal content, equal bytes, equal fingerprint."""
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def check_config(config: Mapping[str, Any], base: Mapping[str, Any], shown: str) -> None:
    """Refuse a config.json of another architecture or size than the base model's."""
    if "auto_map" in config:
        raise CheckpointError(
            f"{shown} has auto_map (custom model code), which is never run here; save the base "
            "model's own class with model.save_pretrained(path)"
        )
    got = (config.get("architectures"), config.get("model_type"))
    want = (base.get("architectures"), base.get("model_type"))
    if got != want:
        raise CheckpointError(
            f"{shown} describes a {shown_value(got[0])} (model_type {shown_value(got[1])}), but the base "
            f"model is a {shown_value(want[0])} (model_type {shown_value(want[1])}); fine-tune the base "
            "model itself and save it with "
            "model.save_pretrained(path), keeping its architecture"
        )
    for key in sorted(set(config) | set(base)):
        if not (key in ARCHITECTURE_FIELDS or _SIZE_FIELD.match(key)):
            continue
        # A field only one side states, or states as null, is one transformers fills with its
        # default; the evaluator uses the base model's config, so only a stated difference matters.
        if config.get(key) is None or base.get(key) is None:
            continue
        if config[key] != base[key]:
            raise CheckpointError(
                f"{shown} sets {key} = {shown_value(config[key])}, the base model has "
                f"{shown_value(base[key])}; the architecture must be the base model's: fine-tune "
                "the base model itself and save it with model.save_pretrained(path)"
            )
    theta, base_theta = _rope_theta(config), _rope_theta(base)
    if theta is not None and base_theta is not None and theta != base_theta:
        raise CheckpointError(
            f"{shown} sets rope_theta {shown_value(theta)}, the base model has {shown_value(base_theta)}; "
            "the architecture must be the base model's: fine-tune the base model itself and save it "
            "with model.save_pretrained(path)"
        )


def _rope_theta(config: Mapping[str, Any]) -> Any:
    # transformers 4 writes rope_theta, transformers 5 rope_parameters.rope_theta.
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
        return rope["rope_theta"]
    return config.get("rope_theta")


def normalize_generation_config(config: Mapping[str, Any], vocab_size: int, shown: str) -> dict[str, Any]:
    """Only the token ids: sampling, penalties, suppressed tokens and biases are the platform's."""
    kept: dict[str, Any] = {}
    for key in GENERATION_KEYS:
        value = config.get(key)
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ids
        ):
            raise CheckpointError(
                f"{shown}: {key} must be a token id (or, for eos, a list of ids) below the vocabulary "
                f"size {vocab_size}; save it with model.generation_config.save_pretrained(path)"
            )
        kept[key] = value
    return kept


def resolve_chat_template(
    tokenizer_config: Mapping[str, Any], jinja_file: str | None, json_file: Mapping[str, Any] | None
) -> str | None:
    """The template transformers would use: ``chat_template.jinja``, else ``chat_template.json``,
    else the tokenizer config's; of named templates, the one named ``default``."""
    if jinja_file is not None:
        return jinja_file
    value = json_file.get("chat_template") if json_file is not None else tokenizer_config.get("chat_template")
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        value = named.get("default")
    elif isinstance(value, dict):
        value = value.get("default")
    return value if isinstance(value, str) else None


def normalize_tokenizer_config(
    config: Mapping[str, Any], chat_template: str | None, shown: str
) -> dict[str, Any]:
    """The allowed keys and the resolved template."""
    kept = {key: value for key, value in config.items() if key in TOKENIZER_CONFIG_KEYS}
    tokenizer_class = kept.get("tokenizer_class")
    if tokenizer_class is not None and not (
        isinstance(tokenizer_class, str) and _CLASS_NAME.fullmatch(tokenizer_class)
    ):
        raise CheckpointError(f"{shown}: tokenizer_class must name a transformers tokenizer class; {_SAVE}")
    if chat_template is not None:
        kept["chat_template"] = chat_template
    return kept


def normalize_special_tokens_map(tokens: Mapping[str, Any]) -> dict[str, Any]:
    """transformers merges every key of special_tokens_map.json into the tokenizer's arguments:
    only the special tokens are kept."""
    allowed = {*SPECIAL_TOKEN_KEYS, "additional_special_tokens", "extra_special_tokens"}
    return {key: value for key, value in tokens.items() if key in allowed}


def check_added_tokens(tokens: Mapping[str, Any], shown: str) -> dict[str, int]:
    """added_tokens.json maps token text to an id, nothing else."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in tokens.values()):
        raise CheckpointError(f"{shown} must map each added token to a token id; {_SAVE}")
    return dict(tokens)


def special_tokens(tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """The special tokens a chat template sees as variables (``bos_token``, ``eos_token``, ...)."""
    tokens: dict[str, str] = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = tokenizer_config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return tokens
