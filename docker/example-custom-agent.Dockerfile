# A custom agent image (examples/experiment-custom-agent.yaml): the GRPO agent folder written to the
# reference's instructions (examples/agents/reference_grpo: requests, TRL's GRPOTrainer,
# Trainer.save_model), on the platform's agent image. It follows the workspace contract
# (docs/AGENTS.md): it reads MODEL_PATH, DATA_PATH and GRADING_SERVER_URL, writes checkpoints
# under OUTPUT_DIR and submits them; the agent runner starts the folder as `autorl run` does.
#   make images   (or: podman build -f docker/example-custom-agent.Dockerfile \
#                    --build-arg AGENT_RUNNER_IMAGE=autorl/agent-runner:0.1.0 -t autorl/example-custom-agent:0.1.0 .)
ARG AGENT_RUNNER_IMAGE=ghcr.io/autorl/agent-runner:0.1.0
FROM ${AGENT_RUNNER_IMAGE}
COPY examples/agents/reference_grpo/ /opt/agent/
ENTRYPOINT ["autorl", "agent-runner", "--agent", "/opt/agent", "--sandbox", "none"]
