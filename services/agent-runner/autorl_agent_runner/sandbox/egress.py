"""Optional internet access for the agent (``autorl run --egress``), without the host.

slirp4netns gives the agent's network namespace a user-mode network stack (``tap0``, default
route through 10.0.2.2, DNS at 10.0.2.3) whose connections leave from the host like any
program's. ``--disable-host-loopback`` keeps 10.0.2.2 from reaching the host's 127.0.0.1; a
firewall inside the agent's namespace, which the agent has no capability to change, refuses the
gateway, the host's own addresses (where services listening on every interface would answer) and
every range that is not the public internet (:data:`NON_PUBLIC_RANGES`: private networks, CGNAT,
link-local with its cloud metadata services, multicast, ...), where the operator's own machines
live. Only the public internet stays reachable, plus what the operator names (``autorl run
--egress-allow CIDR``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import select
import shutil
import subprocess
from collections.abc import Iterable, Sequence

from autorl.errors import AutoRLError
from autorl.experiment import IPV4_SPELLING_PREFIXES
from autorl_agent_runner.sandbox.netns import network_owner_fd

TAP_DEVICE = "tap0"
SLIRP_GATEWAY = "10.0.2.2"
SLIRP_DNS = "10.0.2.3"
SLIRP_MTU = 65520
READY_TIMEOUT_S = 10.0
TOOLS = ("slirp4netns", "nft", "nsenter", "ip")
RESOLV_CONF = f"nameserver {SLIRP_DNS}\n"
#: Refused unless the operator names them: every destination that is not the public internet.
#: Python's ``ipaddress`` ``is_global`` list (RFC 6890 and its successors), multicast (which
#: ``is_global`` lets through), and NAT64's well-known prefix, which translates to any IPv4
#: address, private ones included. A whole block is refused where ``is_global`` excepts a few
#: anycast addresses inside it (192.0.0.0/24, 2001::/23): no agent needs those.
NON_PUBLIC_RANGES = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private (RFC 1918); the user-mode network itself is 10.0.2.0/24
    "100.64.0.0/10",  # carrier-grade NAT (RFC 6598), also many clusters' and VPNs' ranges
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local: cloud metadata services hand out credentials there
    "172.16.0.0/12",  # private (RFC 1918)
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation (TEST-NET-1)
    "192.168.0.0/16",  # private (RFC 1918)
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation (TEST-NET-2)
    "203.0.113.0/24",  # documentation (TEST-NET-3)
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the limited broadcast 255.255.255.255
    "::/127",  # unspecified and loopback
    "100::/64",  # discard-only
    "2001::/23",  # IETF protocol assignments (Teredo included)
    "2001:db8::/32",  # documentation
    "3fff::/20",  # documentation
    "5f00::/16",  # segment routing (SRv6) identifiers
    "fc00::/7",  # unique-local
    "fe80::/10",  # link-local
    "fec0::/10",  # site-local (deprecated)
    "ff00::/8",  # multicast
    *IPV4_SPELLING_PREFIXES,  # IPv4-mapped, NAT64, 6to4, ...: any IPv4 address behind them
)
#: How the firewall refuses: at once, and distinguishable from a destination that refuses
#: (EHOSTUNREACH, "no route to host", rather than a reset).
REFUSE = "reject with icmpx admin-prohibited"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


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


def allowed_network(text: str) -> Network:
    """An operator's ``--egress-allow`` value: a network (``192.168.1.0/24``) or one address.

    Raises EgressError naming the fix for anything else, host bits set included (``10.1.2.3/8``
    would allow all of 10.0.0.0/8: the operator says so).
    """
    try:
        return ipaddress.ip_network(text.strip(), strict=True)
    except ValueError:
        pass
    try:
        loose = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise EgressError(
            f"--egress-allow {text!r} is not an address or a network; give one such as 192.168.1.0/24, "
            "10.20.0.5 or fd12:3456::/48"
        ) from None
    host = text.strip().split("/")[0]
    raise EgressError(
        f"--egress-allow {text!r} has host bits set; write the network, {loose}, or one address, {host}"
    )


def _networks(addresses: Iterable[str | Network], version: int) -> list[str]:
    networks = [ipaddress.ip_network(a, strict=False) for a in addresses]
    chosen = [n for n in networks if n.version == version]
    return [str(n) for n in ipaddress.collapse_addresses(chosen)]  # type: ignore[type-var]


def refused_destinations(host: Sequence[str]) -> list[str]:
    """What the agent may not reach unless the operator names it: the host's own addresses (public
    ones included) and every non-public range."""
    return [*host, *NON_PUBLIC_RANGES]


def firewall_rules(refused: Sequence[str | Network], allowed: Sequence[str | Network] = ()) -> str:
    """An nftables ruleset for the agent's namespace: loopback kept; the gateway (this machine's
    loopback) refused whatever is allowed; the user-mode network's DNS kept; then what the
    operator ``allowed`` accepted before anything ``refused`` is refused; the rest (the internet)
    accepted."""
    lines = [
        "table inet autorl_egress {",
        "  chain output {",
        "    type filter hook output priority 0; policy accept;",
        '    oifname "lo" accept',
        f"    ip daddr {SLIRP_GATEWAY} {REFUSE}",
        f"    ip daddr {SLIRP_DNS} udp dport 53 accept",
        f"    ip daddr {SLIRP_DNS} tcp dport 53 accept",
    ]
    for verdict, addresses in (("accept", allowed), (REFUSE, refused)):
        for family, version in (("ip", 4), ("ip6", 6)):
            networks = _networks(addresses, version)
            if networks:
                lines.append(f"    {family} daddr {{ {', '.join(networks)} }} {verdict}")
    lines += ["  }", "}", ""]
    return "\n".join(lines)


class Egress:
    """slirp4netns attached to the agent's namespace, plus the firewall; ``close()`` stops it."""

    def __init__(self, process: subprocess.Popen[bytes], exit_fd: int) -> None:
        self._process = process
        self._exit_fd = exit_fd

    @classmethod
    def start(cls, sandbox_pid: int, allowed: Sequence[Network] = ()) -> Egress:
        """Connect the agent's namespace; ``allowed``: non-public destinations the operator named."""
        check_tools()
        # Root has every capability over the agent's namespaces from outside; otherwise the
        # tools act from inside the user namespace that owns the agent's network.
        owner = None if os.geteuid() == 0 else network_owner_fd(sandbox_pid)
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        try:
            rules = firewall_rules(refused_destinations(host_addresses()), allowed)
            _run_in_netns(sandbox_pid, owner, ["nft", "-f", "-"], rules)
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
