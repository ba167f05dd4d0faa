"""The load benchmark's yardstick: a bare FastAPI route answering what ``GET /a/<token>/time`` does,
with no authentication and no database, served the same way (one uvicorn process)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI

app = FastAPI()
STARTED = time.time()
TIMEOUT_S = 3600


@app.get("/a/{token}/time")
def time_left(token: str) -> dict[str, Any]:
    now = time.time()
    remaining = round(STARTED + TIMEOUT_S - now, 3)
    return {
        "start_time": round(STARTED, 3),
        "timeout_s": TIMEOUT_S,
        "end_time": round(STARTED + TIMEOUT_S, 3),
        "remaining": remaining,
        "remaining_s": remaining,
        "last_submit_time": None,
        "now": round(now, 3),
    }
