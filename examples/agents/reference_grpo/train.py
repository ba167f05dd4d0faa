"""A GRPO agent written from the reference AutoRL-Bench instructions, using only what they promise:
the environment variables, `requests`, TRL's `GRPOTrainer`, `Trainer.save_model` into absolute
paths under $OUTPUT_DIR, and `POST $GRADING_SERVER_URL/submit`. Nothing here imports the platform.

Knobs (config.yaml's env_vars; override with `autorl run --env NAME=VALUE`): TRAIN_RATIO,
NUM_EPOCHS, MAX_STEPS, MAX_COMPLETION_LENGTH, NUM_GENERATIONS.
"""

import json
import os
import re
import time

import requests
import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def final_number(text):
    """The number after '####', else the last number in the text; None when there is none."""
    marked = re.search(r"####\s*(-?\d[\d,]*\.?\d*)", text)
    found = marked.group(1) if marked else (NUMBER.findall(text) or [None])[-1]
    if found is None:
        return None
    try:
        return float(found.replace(",", "").rstrip("."))
    except ValueError:
        return None


def correctness_reward(completions, answer, **_):
    rewards = []
    for completion, reference in zip(completions, answer):
        got, expected = final_number(completion), final_number(reference)
        rewards.append(1.0 if got is not None and expected is not None and abs(got - expected) < 1e-6 else -1.0)
    return rewards


def read_train_split(data_path, ratio):
    with open(os.path.join(data_path, "train.jsonl")) as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    keep = max(8, int(len(rows) * ratio))
    return [
        {
            "prompt": f"Solve the problem. End with '#### <number>'.\n\nQuestion: {row['question']}\nAnswer:",
            "answer": row["answer"],
        }
        for row in rows[:keep]
    ]


def submit(url, model_path):
    """POST /submit and print the answer; a refusal's 'error' says what to change."""
    response = requests.post(f"{url}/submit", json={"model_path": model_path}, timeout=600)
    body = response.json()
    if response.status_code == 200:
        print(f"  submitted {model_path}: score {body['score']} (baseline {body['baseline_score']})", flush=True)
    else:
        print(f"  submission of {model_path} answered {response.status_code}: {body.get('error')}", flush=True)
    return body


def main():
    model_path = os.environ["MODEL_PATH"]
    output_dir = os.environ["OUTPUT_DIR"]
    url = os.environ["GRADING_SERVER_URL"]
    epochs = int(os.environ.get("NUM_EPOCHS", "2"))
    dataset = Dataset.from_list(read_train_split(os.environ["DATA_PATH"], float(os.environ.get("TRAIN_RATIO", "0.1"))))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    started = time.time()
    current = model_path
    for epoch in range(1, epochs + 1):
        config = GRPOConfig(
            output_dir=os.path.join(output_dir, "trainer"),
            max_steps=int(os.environ.get("MAX_STEPS", "20")),
            per_device_train_batch_size=2,
            gradient_accumulation_steps=1,
            num_generations=int(os.environ.get("NUM_GENERATIONS", "4")),
            max_completion_length=int(os.environ.get("MAX_COMPLETION_LENGTH", "256")),
            learning_rate=1e-5,
            logging_steps=5,
            save_strategy="no",
            report_to="none",
            bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        )
        trainer = GRPOTrainer(
            model=current, reward_funcs=correctness_reward, args=config, train_dataset=dataset, processing_class=tokenizer
        )
        trainer.train()
        checkpoint = os.path.join(output_dir, f"checkpoint-epoch{epoch}")
        trainer.save_model(checkpoint)  # writes training_args.bin beside the weights: ignored at submit
        tokenizer.save_pretrained(checkpoint)
        submit(url, checkpoint)
        current = checkpoint
    print(f"done in {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
