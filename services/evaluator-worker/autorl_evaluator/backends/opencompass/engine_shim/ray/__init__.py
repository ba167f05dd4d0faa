"""OpenCompass's vLLM model asks Ray whether it is running before it starts an engine; with the
resident engine (``engine_server.py``) nothing of Ray is used, and it is not installed."""


def is_initialized() -> bool:
    return False


def shutdown() -> None:
    return None
