"""Optional internet access for the agent (``autorl run --egress``), without the host.

slirp4netns gives the agent's network namespace a user-mode network stack (``tap0``, default
route through 10.0.2.2, DNS at 10.0.2.3) whose connections leave from the host like any
program's. ``--disable-host-loopback`` keeps 10.0.2.2 from reaching the host's 127.0.0.1; a
firewall inside the agent's namespace, which the agent has no capability to change, rejects the
host's own addresses (where services listening on every interface would answer), the gateway
and link-local addresses (cloud metadata services). The internet stays reachable.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import select
import shutil
import subprocess
from collections.abc import Sequence

from autorl.errors import AutoRLError
from autorl_agent_runner.sandbox.netns import network_owner_fd

TAP_DEVICE = "tap0"
SLIRP_GATEWAY = "10.0.2.2"
SLIRP_DNS = "10.0.2.3"
SLIRP_MTU = 65520
READY_TIMEOUT_S = 10.0
TOOLS = ("slirp4netns", "nft", "nsenter", "ip")
RESOLV_CONF = f"nameserver {SLIRP_DNS}\n"
ALWAYS_BLOCKED = ("169.254.0.0/16", "fe80::/10", f"{SLIRP_GATEWAY}/32")


class EgressError(AutoRLError):
    """Egress cannot be set up here."""


def check_tools() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise EgressError(
            f"--egress needs {', '.join(missing)} (apt-get install slirp4netns nftables iproute2 "
            "util-linux, or `make setup`); drop --egress to run without internet access"
        )


def host_addresses() -> list[str]:
    """Every address of every interface of the host (IPv4 and IPv6)."""
    done = subprocess.run(["ip", "-json", "addr"], capture_output=True, text=True, check=True)
    found = []
    for interface in json.loads(done.stdout):
        for info in interface.get("addr_info", []):
            if "local" in info:
                found.append(str(info["local"]))
    return sorted(set(found))


def firewall_rules(blocked: Sequence[str]) -> str:
    """An nftables ruleset for the agent's namespace that rejects connections to ``blocked``."""
    v4 = sorted({str(ipaddress.ip_network(a, strict=False)) for a in blocked if ":" not in a})
    v6 = sorted({str(ipaddress.ip_network(a, strict=False)) for a in blocked if ":" in a})
    lines = [
        "table inet autorl_egress {",
        "  chain output {",
        "    type filter hook output priority 0; policy accept;",
        '    oifname "lo" accept',
    ]
    if v4:
        lines.append(f"    ip daddr {{ {', '.join(v4)} }} reject")
    if v6:
        lines.append(f"    ip6 daddr {{ {', '.join(v6)} }} reject")
    lines += ["  }", "}", ""]
    return "\n".join(lines)


class Egress:
    """slirp4netns attached to the agent's namespace, plus the firewall; ``close()`` stops it."""

    def __init__(self, process: subprocess.Popen[bytes], exit_fd: int) -> None:
        self._process = process
        self._exit_fd = exit_fd

    @classmethod
    def start(cls, sandbox_pid: int) -> Egress:
        check_tools()
        # Root has every capability over the agent's namespaces from outside; otherwise the
        # tools act from inside the user namespace that owns the agent's network.
        owner = None if os.geteuid() == 0 else network_owner_fd(sandbox_pid)
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        try:
            _run_in_netns(
                sandbox_pid, owner, ["nft", "-f", "-"], firewall_rules([*host_addresses(), *ALWAYS_BLOCKED])
            )
            command = [
                "slirp4netns",
                "--configure",
                f"--mtu={SLIRP_MTU}",
                "--disable-host-loopback",
                "--enable-seccomp",
                f"--ready-fd={ready_w}",
                f"--exit-fd={exit_r}",
                "--netns-type=path",
            ]
            if owner is None:
                # Its own mount namespace and no capabilities; it needs to be root to set that up.
                command.append("--enable-sandbox")
            else:
                command.append(f"--userns-path=/proc/self/fd/{owner}")
            command += [f"/proc/{sandbox_pid}/ns/net", TAP_DEVICE]
            process = subprocess.Popen(
                command,
                pass_fds=(ready_w, exit_r, *([owner] if owner is not None else [])),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except BaseException:
            os.close(exit_w)
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
            os.close(exit_r)
            if owner is not None:
                os.close(owner)
        egress = cls(process, exit_w)
        try:
            readable, _, _ = select.select([ready_r], [], [], READY_TIMEOUT_S)
            if not readable or os.read(ready_r, 1) != b"1":
                raise EgressError(f"slirp4netns did not start: {egress._stderr()}")
        except BaseException:
            egress.close()
            raise
        finally:
            os.close(ready_r)
        return egress

    def _stderr(self) -> str:
        self._process.kill()
        _, err = self._process.communicate(timeout=5)
        return (err or b"").decode(errors="replace").strip()[-500:] or "no message"

    def close(self) -> None:
        """Closing the exit descriptor tells slirp4netns to stop."""
        with contextlib.suppress(OSError):
            os.close(self._exit_fd)
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stderr is not None:
            self._process.stderr.close()


def _run_in_netns(pid: int, owner: int | None, command: list[str], stdin: str) -> None:
    namespaces = [f"--net=/proc/{pid}/ns/net"]
    if owner is not None:
        namespaces = [f"--user=/proc/self/fd/{owner}", "--preserve-credentials", *namespaces]
    done = subprocess.run(
        ["nsenter", *namespaces, *command],
        input=stdin,
        capture_output=True,
        text=True,
        pass_fds=() if owner is None else (owner,),
    )
    if done.returncode != 0:
        raise EgressError(f"cannot set the agent's firewall ({' '.join(command)}): {done.stderr.strip()}")
