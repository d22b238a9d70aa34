"""What a rank does about other local users before anything crosses the ring: it takes
the world's secret from where only the server put it (the environment a local rank
inherits, or one line on stdin that ``mlx.launch`` forwards over ssh to a remote one;
never argv, which every local user reads), and checks that every ring connection whose
far end is on this machine belongs to a process of this user (``/proc/net/tcp`` names
each socket's owner to everyone), so another user's relay on a ring port is refused
before the first share. Pure Python (no mlx); Linux's ``/proc`` for the peer check
(elsewhere it is skipped: docs/distributed.md says what is left then)."""

from __future__ import annotations

import ipaddress
import os
import select
from pathlib import Path
from typing import Any

from kit.engine.distributed.world_codec import KEY_BYTES, KEY_ENV
from kit.knobs import take_env

_STDIN_WAIT_S = 60.0  # the server writes the line at once; mlx.launch forwards it


class KeyMissing(Exception):
    """No world secret reached this rank (not started by an mlx-kit server)."""


def read_world_key(environ: dict[str, str] | None = None, stdin: int = 0) -> bytes:
    """The world's secret: :data:`KEY_ENV` (hex; removed from the environment once read),
    else the first line of ``stdin`` (at most 1 KiB, within 60 s).

    Raises:
        KeyMissing: neither holds :data:`KEY_BYTES` bytes of hex.
    """
    text = take_env(KEY_ENV) if environ is None else environ.pop(KEY_ENV, "")
    if not text:
        line = b""
        while not line.endswith(b"\n") and len(line) < 1024:
            ready, _, _ = select.select([stdin], [], [], _STDIN_WAIT_S)
            if not ready:
                break
            chunk = os.read(stdin, 1024 - len(line))
            if not chunk:
                break
            line += chunk
        text = line.decode("ascii", "replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise KeyMissing(f"no world secret ({KEY_ENV} or a line on stdin): a rank is started "
                         "by `mlx-kit serve --ranks/--hosts`, not by hand")
    return key


def _address(text: str) -> tuple[Any, int]:
    """``/proc/net/tcp``'s ``HEX_IP:HEX_PORT`` (the IP in host byte order per 32-bit word)."""
    ip, port = text.split(":")
    raw = b"".join(bytes.fromhex(ip[i:i + 8])[::-1] for i in range(0, len(ip), 8))
    address = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address, int(port, 16)


def socket_owners(proc: Path = Path("/proc/net")) -> dict[tuple, int] | None:
    """Every TCP socket on this machine: ``((local ip, port), (remote ip, port)) -> uid``;
    None where ``/proc/net/tcp`` is not there (not Linux)."""
    owners: dict[tuple, int] = {}
    found = False
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / name).read_text().splitlines()[1:]
        except OSError:
            continue
        found = True
        for line in lines:
            fields = line.split()
            if len(fields) > 7:
                owners[(_address(fields[1]), _address(fields[2]))] = int(fields[7])
    return owners if found else None


def foreign_peers(connections: list[tuple[tuple[str, int], tuple[str, int]]],
                  owners: dict[tuple, int], uid: int) -> list[tuple[tuple[str, int], int]]:
    """Which of our ``connections`` (``(local, remote)`` address pairs) end in a socket of
    this machine that another user owns: ``(remote address, its uid)`` each."""
    bad = []
    for local, remote in connections:
        mine = (ipaddress.ip_address(local[0]), local[1])
        theirs = (ipaddress.ip_address(remote[0]), remote[1])
        owner = owners.get((theirs, mine))
        if owner is not None and owner != uid:
            bad.append((remote, owner))
    return bad


def check_ring_peers(world: Any) -> None:
    """Refuse a ring whose connections end in another local user's socket (a relay on a
    ring port). Where the far end is another machine, or there is no ``/proc``, nothing
    can be told here (the MAC and the proof still hold: :meth:`World.prove`).

    Raises:
        kit.engine.distributed.world.WorldTampered: a connection's far end is another user's.
    """
    import psutil

    from kit.engine.distributed.world import WorldTampered

    owners = socket_owners()
    if owners is None:
        return
    process = psutil.Process()
    conns = getattr(process, "net_connections", process.connections)(kind="tcp")
    pairs = [((c.laddr.ip, c.laddr.port), (c.raddr.ip, c.raddr.port)) for c in conns
             if c.raddr and c.status == psutil.CONN_ESTABLISHED]
    bad = foreign_peers(pairs, owners, os.getuid())
    if bad:
        (ip, port), uid = bad[0]
        rank = ring_ports().get(port)
        link = world.links() if rank is None else \
            f"the ring link of rank {world.rank} to rank {rank}"
        raise WorldTampered(
            f"rank {world.rank} ({world.host}): its ring connection to {ip}:{port} ends in "
            f"a socket of another user (uid {uid}), not a rank: someone is on {link}")


def ring_ports() -> dict[int, int]:
    """Each ring port's rank, from the ring's host file (``MLX_HOSTFILE``, which
    ``mlx.launch`` writes: one list of ``ip:port`` per rank); empty when unreadable."""
    import json

    try:
        with open(os.environ.get("MLX_HOSTFILE", ""), "rb") as f:
            hosts = json.loads(f.read(1 << 20))
        return {int(str(a).rsplit(":", 1)[1]): r for r, node in enumerate(hosts)
                for a in node}
    except (OSError, ValueError, TypeError, IndexError, RecursionError):
        return {}
