#!/bin/bash
# Started as the reference starts it: `bash start.sh`, in the workspace, with TASK, BASE_MODEL,
# MODEL_PATH, DATA_PATH, OUTPUT_DIR, GRADING_SERVER_URL and WORKSPACE set, plus config.yaml's env_vars.
set -euo pipefail
echo "=== reference-style GRPO agent: task $TASK, model $BASE_MODEL ==="
exec python3 "$(dirname "$0")/train.py"
