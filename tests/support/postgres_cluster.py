"""A private PostgreSQL cluster (its own ``initdb`` data folder and port) that a fault test may stop
and start; the machine's shared server is never touched."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.support.infra import free_port

PG_BIN = Path(os.environ.get("AUTORL_TEST_PG_BIN", "/usr/local/bin"))
#: initdb and postgres refuse to run as root: as root, the cluster runs as this user.
PG_USER = os.environ.get("AUTORL_TEST_PG_USER", "postgres")


class PostgresCluster:
    def __init__(self) -> None:
        # Not under pytest's temporary folder: its parents are private to root, and the server
        # runs as the postgres user.
        self.root = Path(tempfile.mkdtemp(prefix="autorl-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres:autorl-test@127.0.0.1:{self.port}/postgres"
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
        if os.geteuid() == 0:
            owner = pwd.getpwnam(PG_USER)
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self.root.chmod(0o700)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        command = [str(PG_BIN / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", PG_USER, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{tool} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w", "start"
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self, mode: str = "immediate") -> None:
        """``immediate``: the server dies as in a crash (no checkpoint), connections are cut."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(RuntimeError):  # not running
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
