"""``VLLMwithChatTemplate`` imports ray only to shut down an instance it might have started:
none runs here (bench/vllm_replay/vllm)."""


def is_initialized() -> bool:
    return False


def shutdown() -> None:
    return None
