#!/bin/bash
# Starts Claude Code on the task: the prompt is the workspace's description.md and instructions.md,
# the workspace's listing and a sample of the train split. It stops RESERVE_S seconds before the
# platform's deadline (GET $GRADING_SERVER_URL/time), so that its last submission can be scored.
set -uo pipefail

CLAUDE="${CLAUDE_BIN:-claude}"
MODEL="${CLAUDE_MODEL:-sonnet}"
RESERVE_S="${RESERVE_S:-300}"
cd "$WORKSPACE"

if [ -z "${ANTHROPIC_API_KEY:-}" ] && [ -z "${CLAUDE_CODE_OAUTH_TOKEN:-}" ]; then
    echo "ERROR: no ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN): pass it with --env-file .env or --env"
    exit 2
fi
if ! command -v "$CLAUDE" >/dev/null; then
    echo "ERROR: '$CLAUDE' not found: npm install -g @anthropic-ai/claude-code (or set CLAUDE_BIN)"
    exit 2
fi

REMAINING=$(python3 -c '
import os, requests
print(int(requests.get(os.environ["GRADING_SERVER_URL"] + "/time", timeout=30).json()["remaining"]))')
LIMIT=$((REMAINING - RESERVE_S))
if [ "$LIMIT" -le 60 ]; then
    echo "ERROR: only ${REMAINING}s left, less than RESERVE_S=${RESERVE_S}s plus a minute"
    exit 2
fi

PROMPT="You are an AI researcher doing RL post-training. Complete the whole task on your own.

Task: ${TASK}. Base model: ${BASE_MODEL} at ${MODEL_PATH} (read-only). Train split: ${DATA_PATH}.
Save checkpoints under ${OUTPUT_DIR} (e.g. ${OUTPUT_DIR}/v1) and submit each with
  curl -s -X POST \"\$GRADING_SERVER_URL/submit\" -H 'Content-Type: application/json' -d '{\"model_path\": \"${OUTPUT_DIR}/v1\"}'
Read the answer's score and improvement, then improve and submit v2, v3, ... The best score counts.
You have ${LIMIT} seconds; \`curl -s \$GRADING_SERVER_URL/time\` shows what is left. Start simple,
get a first score early, then iterate. Write your code in code/.

## description.md
$(cat description.md)

## instructions.md
$(cat instructions.md)

## The workspace
$(ls -la)

## The first lines of the train split
$(head -n 3 "$DATA_PATH"/*.jsonl)"

echo "=== Claude Code (${MODEL}) on ${TASK}: ${LIMIT}s, prompt of ${#PROMPT} characters ==="
timeout --kill-after=30 "$LIMIT" "$CLAUDE" --print --verbose --output-format stream-json \
    --model "$MODEL" --dangerously-skip-permissions "$PROMPT"
CODE=$?
echo "=== Claude Code exited with ${CODE}; output/ holds: $(ls "$OUTPUT_DIR" | tr '\n' ' ') ==="
exit "$CODE"
