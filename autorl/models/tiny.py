"""The builtin model ``builtin:tiny-qwen2``: a tiny, randomly initialised Qwen2ForCausalLM with a
byte-level BPE tokenizer trained here, offline, on generated grade-school word problems.

torch, tokenizers and safetensors are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The BPE trainer's upper bound; the corpus below runs out of merges at about 1,300 tokens.
TINY_QWEN2_VOCAB_SIZE = 2048
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
#: Qwen2's pre-tokenization regex: contractions, letter runs, ONE digit per token, punctuation
#: runs, newlines, spaces. transformers 5 rebuilds a Qwen2Tokenizer from vocab and merges with
#: this exact pipeline (ignoring the one in tokenizer.json), and transformers 4's slow and fast
#: Qwen2 tokenizers use it too; training with it makes all of them produce the same ids.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
#: ChatML as Qwen2-Instruct writes it, default system turn included.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tiny_qwen2(target: Path, *, seed: int = 0) -> Path:
    """Write a tiny, randomly initialised Qwen2ForCausalLM with its own tokenizer into ``target``.

    Same seed → byte-identical files. The tokenizer is a Qwen2-style byte-level BPE (eos
    ``<|im_end|>``, pad ``<|endoftext|>``, ChatML template) trained here, without any download,
    on generated grade-school word problems and the GSM8K few-shot exemplars; it does not depend
    on the seed. The weights (hidden size 64, 2 layers, tied embeddings) are drawn from a seeded
    generator, independent of how a transformers version initialises modules.
    """
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    _save_tokenizer(tokenizer, target)
    config = _tiny_qwen2_config(
        vocab_size=len(vocab), eos_token_id=vocab[IM_END], pad_token_id=vocab[ENDOFTEXT]
    )
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation_config = {"eos_token_id": [vocab[IM_END], vocab[ENDOFTEXT]], "pad_token_id": vocab[ENDOFTEXT]}
    (target / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    _save_random_weights(config, target / "model.safetensors", seed=seed)
    for path in target.iterdir():
        # Written 0600 by some writers; the model is meant to be read by other users (an agent).
        path.chmod(0o644)
    return target


def _tiny_qwen2_config(*, vocab_size: int, eos_token_id: int, pad_token_id: int) -> dict[str, Any]:
    hidden_size, heads, kv_heads = 64, 4, 2
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 4 * hidden_size,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden_size // heads,
        "hidden_act": "silu",
        # Room for a 4-shot GSM8K prompt plus 512 generated tokens with this small vocabulary.
        "max_position_embeddings": 4096,
        # Wider than transformers' 0.02: with 0.02 the attention of a model this narrow starts out
        # flat over the ~370 tokens of a 4-shot prompt, and fine-tuning on arith did not learn to
        # read the question's numbers in 2,500 steps; with 0.1 it did in 300-600 (0.07 did not).
        "initializer_range": 0.1,
        "rms_norm_eps": 1e-6,
        # Both spellings: transformers 4 reads rope_theta, 5 reads rope_parameters.
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 2,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "torch_dtype": "float32",
    }


def qwen2_parameter_shapes(config: dict[str, Any]) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Qwen2ForCausalLM's state-dict layout (lm_head is tied to the embeddings, so absent)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q_out = config["num_attention_heads"] * config["head_dim"]
    kv_out = config["num_key_value_heads"] * config["head_dim"]
    yield "model.embed_tokens.weight", (config["vocab_size"], hidden)
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        yield f"{prefix}.input_layernorm.weight", (hidden,)
        yield f"{prefix}.self_attn.q_proj.weight", (q_out, hidden)
        yield f"{prefix}.self_attn.q_proj.bias", (q_out,)
        yield f"{prefix}.self_attn.k_proj.weight", (kv_out, hidden)
        yield f"{prefix}.self_attn.k_proj.bias", (kv_out,)
        yield f"{prefix}.self_attn.v_proj.weight", (kv_out, hidden)
        yield f"{prefix}.self_attn.v_proj.bias", (kv_out,)
        yield f"{prefix}.self_attn.o_proj.weight", (hidden, q_out)
        yield f"{prefix}.post_attention_layernorm.weight", (hidden,)
        yield f"{prefix}.mlp.gate_proj.weight", (inter, hidden)
        yield f"{prefix}.mlp.up_proj.weight", (inter, hidden)
        yield f"{prefix}.mlp.down_proj.weight", (hidden, inter)
    yield "model.norm.weight", (hidden,)


def _save_random_weights(config: dict[str, Any], path: Path, *, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, Any] = {}
    for name, shape in qwen2_parameter_shapes(config):
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            tensors[name] = torch.zeros(shape)
        else:
            tensors[name] = torch.normal(0.0, config["initializer_range"], shape, generator=generator)
    # transformers refuses safetensors files without the "format" metadata.
    save_file(tensors, str(path), metadata={"format": "pt"})


def _train_tokenizer() -> Any:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    special = [ENDOFTEXT, IM_START, IM_END]
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_QWEN2_VOCAB_SIZE - len(special),
        min_frequency=2,
        show_progress=False,
        # Every byte is in the vocabulary, so any text (other languages, symbols) still encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    # Added after training, so that, as in Qwen2, special tokens follow the BPE vocabulary.
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special])
    return tokenizer


def _save_tokenizer(tokenizer: Any, target: Path) -> None:
    """tokenizer.json for fast tokenizers, vocab.json + merges.txt for transformers 4's slow
    Qwen2Tokenizer (OpenCompass loads that one), and a tokenizer_config.json both versions read."""
    tokenizer.save(str(target / "tokenizer.json"))
    tokenizer.model.save(str(target))
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    added = {
        str(vocab[token]): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in (ENDOFTEXT, IM_START, IM_END)
    }
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 4096,
        "split_special_tokens": False,
    }
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_NAMES = _words(
    "Janet Tom Maria James Sarah John Lisa Mark Emma Carlos Aisha Wei Priya Omar Grace Liam Olivia "
    "Noah Sophia Ben Chloe Jack Mia Leo Zoe Sam Ella Max Nina Raj Hana Ivan Fatima Diego Yuki Paul "
    "Anna Kevin Rose Henry Lucy Adam Julia Peter Amy David Kate Brian Linda Oscar Tina Victor Wendy "
    "Frank Helen"
)
_ITEMS = _words(
    "apples oranges eggs cookies marbles books pencils stickers cupcakes candies flowers cards toys "
    "shirts tickets bottles boxes bags balloons muffins pies sandwiches chickens cows ducks trees "
    "pages coins shells stamps crayons dolls cars bricks plants seeds baskets cups plates chairs "
    "pizzas slices students rows seats songs videos photos emails puzzles games bananas lemons "
    "carrots potatoes tomatoes beads buttons nails boards tiles bowls spoons jars cans sheep goats "
    "horses pigs fish birds"
)
_UNITS = _words(
    "dollars cents hours minutes seconds miles pounds ounces gallons cups feet inches yards meters "
    "kilometers liters days weeks months years points laps"
)
_PLACES = _words("store market farm school bakery library park zoo garden shop class team party restaurant")
_GAINS = _words("buys finds gets picks makes bakes collects earns receives wins plants saves orders adds")
_LOSSES = _words("eats sells gives loses uses spends breaks shares donates drinks returns throws")
_FILLER = (
    "Every morning, the first, second, third and last of them go together. Each week her brother and "
    "sister, his mother and father, their friends and neighbors, the teacher and the coach decide "
    "whether to walk, drive, ride or run. Altogether, on average, the remaining rest costs twice, three "
    "times or half as much; a quarter, a third, a dozen, one hundred, a thousand, a million. What is the "
    "difference, the sum, the product, the ratio, the percentage, the price, the profit, the discount, "
    "the area, the perimeter, the length, the width, the speed, the distance, the time, the total?"
)


def _tokenizer_corpus() -> Iterator[str]:
    """Word problems and solutions in GSM8K's style, the 4-shot GSM8K exemplars that every
    evaluation prompt starts with (so they encode compactly) and the chat roles. Everything is
    fixed (a fixed seed, no download): the tokenizer is the same on every machine."""
    from autorl.tasks import get_task

    rng = random.Random(20240531)
    exemplars = "\n".join(message["content"] for message in get_task("gsm8k").few_shot_messages())
    for _ in range(3):
        yield exemplars
        yield _FILLER
        yield "system\nYou are a helpful assistant.\nuser\nassistant\n"
    for _ in range(8000):
        name, other = rng.sample(_NAMES, 2)
        item, unit, place = rng.choice(_ITEMS), rng.choice(_UNITS), rng.choice(_PLACES)
        gain, loss = rng.choice(_GAINS), rng.choice(_LOSSES)
        a, b, c = rng.randint(2, 99), rng.randint(2, 60), rng.randint(2, 12)
        price = f"{rng.randint(1, 40)}.{rng.randint(0, 99):02d}"
        big = rng.randint(1000, 999_999)
        percent = rng.choice((10, 20, 25, 30, 40, 50, 75))
        question = rng.choice(
            (
                f"{name} has {a} {item}. {name} {gain} {b} more {item} at the {place}. "
                f"How many {item} does {name} have now?",
                f"{name} had {a + b} {item} and {loss} {b} of them to {other}. How many {item} are left?",
                f"Each box holds {c} {item}. If {name} fills {a} boxes, how many {item} are there in total?",
                f"A {place} sells {item} for ${price} each. How much does {name} pay for {c} {item}?",
                f"{name} works {c} {unit} a day for {a} days. How many {unit} does {name} work in all?",
                f"The {place} had ${big:,} last year and {percent}% more this year. How much money is that?",
                f"{name} is {a} years old. {other} is {c} times as old as {name}. How old is {other}?",
                f"{name} splits {a * c} {item} equally among {c} friends. How many {item} does each get?",
                f"{name} spends {c} {unit} on {item} and {a} {unit} on {rng.choice(_ITEMS)}. "
                f"What is the total number of {unit} {name} spends?",
            )
        )
        reasoning = rng.choice(
            (
                f"{name} starts with {a} {item} and {gain} {b} more, so {a} + {b} = {a + b}.",
                f"There are {a + b} - {b} = {a} {item} left after {name} {loss} some.",
                f"That is {c} * {a} = {c * a} {item} in total.",
                f"Half of {2 * a} is {2 * a} / 2 = {a}, and {a} + {c} = {a + c}.",
                f"{percent}% of {big:,} is {big * percent / 100:,.2f}, "
                f"so the total is {big * (100 + percent) / 100:,.2f}.",
                f"Each friend gets {a * c} / {c} = {a} {item}.",
                f"{other} has {c} x {a} = {c * a} {unit}, which is {c * a - a} more than {name}.",
            )
        )
        answer = rng.choice((a + b, a * c, a, big))
        yield f"Question: {question}\nLet's think step by step\nAnswer:"
        yield f"{reasoning}\nThe answer is {answer}\n#### {answer}"
        yield f"{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n{reasoning}{IM_END}"
