"""``serve``'s API key: ``--api-key-file PATH`` (the user's own file, 0600 or stricter, as
ssh's StrictModes asks of a private key), ``$MLX_KIT_API_KEY``, or ``--api-key KEY``, which
still works but warns: a process's command line is readable by every local user
(``ps``, ``/proc/PID/cmdline``), so the flag meant to keep them out would hand them the key."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable, Optional

from kit.errors import ConfigError

API_KEY_ENV = "MLX_KIT_API_KEY"
MAX_KEY_FILE = 4096  # bytes: a key, not a document; bounded before it is read

ARGV_WARNING = ("warning: --api-key puts the key on the command line, where other local "
                "users can read it (ps, /proc/PID/cmdline); use --api-key-file PATH (0600) "
                f"or {API_KEY_ENV} instead")


def read_key_file(path: Path) -> str:
    """The key in ``path``: its first line, stripped. The file is checked on the descriptor
    that is read (no race with a swap of the path): a regular file, owned by this user,
    with no group or other permission bits, at most :data:`MAX_KEY_FILE` bytes.

    Raises:
        ConfigError: the file is missing or unreadable, not a regular file, another
            user's, readable or writable by others (the message names the path and its
            mode), too large, not UTF-8, or holds no key.
    """
    try:  # O_NONBLOCK: a FIFO planted at the path must not hang the start
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ConfigError(f"--api-key-file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"--api-key-file {path}: not a regular file")
        if st.st_uid != os.geteuid():
            raise ConfigError(f"--api-key-file {path}: owned by uid {st.st_uid}, not by you",
                              hint="use a key file of your own")
        if mode & 0o077:
            raise ConfigError(f"--api-key-file {path}: mode {mode:04o} lets other users "
                              "read or change it; it must be 0600 or stricter",
                              hint=f"chmod 600 {path}")
        data = os.read(fd, MAX_KEY_FILE + 1)  # a regular file: one read returns it all
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE:
        raise ConfigError(f"--api-key-file {path}: larger than {MAX_KEY_FILE} bytes")
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"--api-key-file {path}: not UTF-8 text") from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise ConfigError(f"--api-key-file {path}: no key on its first line")
    return key


def resolve_api_key(api_key: Optional[str], api_key_file: Optional[str],
                    warn: Callable[[str], None], from_argv: bool = False) -> Optional[str]:
    """The key ``serve`` requires (None: none), from ``--api-key-file``, else
    ``--api-key`` / ``$MLX_KIT_API_KEY`` (:class:`kit.config.EngineConfig`'s ``api_key``);
    ``warn`` gets :data:`ARGV_WARNING` when the key came from the command line
    (``from_argv``).

    Raises:
        ConfigError: both ``--api-key`` and ``--api-key-file`` given; ``$MLX_KIT_API_KEY``
            and the file hold different keys (a client reading the variable would be
            refused); or the file fails :func:`read_key_file`.
    """
    if api_key_file is not None:
        if from_argv:
            raise ConfigError("--api-key and --api-key-file both give a key",
                              hint="pass one (--api-key-file keeps it off the command line)")
        key = read_key_file(Path(api_key_file).expanduser())
        if api_key and api_key != key:
            raise ConfigError(f"{API_KEY_ENV} and --api-key-file {api_key_file} hold "
                              "different keys",
                              hint=f"unset {API_KEY_ENV} or make it the file's key")
        return key
    if api_key and from_argv:
        warn(ARGV_WARNING)
    return str(api_key) if api_key else None
