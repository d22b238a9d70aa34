"""Where no agent's config file goes: places whose files run as code or hold keys, and
mlx-kit's own records. A user's spec may come from anywhere (docs/agents/adding-an-agent.md
says to copy one), and ``harness install`` of it must configure an agent, not add a key
to ``~/.ssh/authorized_keys``, a line to ``~/.bashrc`` or a unit to systemd: the marker
that leads a drop-in is a comment there, so a template could write such a file whole.
"""

from __future__ import annotations

import os
from pathlib import Path

from kit.paths import config_dir, data_dir, log_dir, state_dir

#: folders under HOME whose files hold keys or start programs (login, a session, a shell,
#: systemd's user manager, Python and IPython at start-up)
_HOME_FOLDERS = (".ssh", ".gnupg", ".config/autostart", ".config/systemd",
                 ".local/share/systemd", ".config/containers/systemd",
                 ".config/environment.d", ".config/fish/conf.d", ".local/bin", "bin",
                 "Library/LaunchAgents", ".kde/Autostart", ".ipython/profile_default/startup")
#: files under HOME that a shell or a session runs
_HOME_FILES = (".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".bash_aliases",
               ".profile", ".zshrc", ".zshenv", ".zprofile", ".zlogin", ".zlogout", ".login",
               ".cshrc", ".tcshrc", ".kshrc", ".mkshrc", ".xprofile", ".xinitrc", ".xsession",
               ".xsessionrc", ".pam_environment", ".config/fish/config.fish",
               ".gitconfig", ".config/git/config", ".npmrc", ".netrc", ".pypirc")
#: file names that Python runs at start-up wherever they sit on its path (a ``.pth``
#: file's ``import`` lines run in every interpreter that reads its folder)
_CODE_NAMES = ("sitecustomize.py", "usercustomize.py")
_CODE_SUFFIXES = (".pth",)


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _fold(path: str) -> str:
    """``path`` case-folded: macOS's and Windows' default file systems ignore case, so
    ``~/.SSH/authorized_keys`` is ``~/.ssh/authorized_keys`` there. Folding on every
    platform refuses a few harmless names on Linux (``~/.BASHRC``), which no agent uses."""
    return os.path.normcase(path).casefold()


def forbidden(path: Path) -> str | None:
    """Why no agent's file may be written at ``path`` (resolved through links), or None.

    Refused (compared case-folded): the files and folders of :data:`_HOME_FILES` and
    :data:`_HOME_FOLDERS`, Python's start-up files anywhere (``*.pth``,
    ``sitecustomize.py``, ``usercustomize.py``), and
    mlx-kit's own agents (``harnesses/``, ``templates/`` of its config folder: a spec must
    not write specs), state, data and log folders (the manifest and backups live there).
    """
    real = _fold(os.path.realpath(path))
    home = _fold(os.path.realpath(Path.home()))
    name = os.path.basename(real)
    if name in _CODE_NAMES or name.endswith(_CODE_SUFFIXES):
        return "Python runs that file at start-up"
    for name in _HOME_FILES:
        if real == os.path.join(home, name):
            return "a shell or session runs that file"
    for name in _HOME_FOLDERS:
        if _inside(real, os.path.join(home, name)):
            return f"files in ~/{name} hold keys or start programs"
    ours = [config_dir() / "harnesses", config_dir() / "templates", data_dir(), state_dir(),
            log_dir()]
    for folder in ours:
        if _inside(real, _fold(os.path.realpath(folder))):
            return f"{folder} is mlx-kit's own"
    return None
