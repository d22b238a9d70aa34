"""Review finding (issue 25, prompt cache folder, low): a link of another user's on the
``--prompt-cache-dir`` path.

``not_private`` judged the folders along the path as given and as resolved, each through
``os.stat``, which follows links: ``/tmp/mlx-cache`` made by another user as a link to a
private folder of the victim's passed (every folder it resolves to is the victim's), so
that user chose where the cache lives: a folder of the victim's other cache (whose files
this server's eviction, at its own bound, then deletes) or anywhere else of theirs.
fs.protected_symlinks, off on this machine and absent on macOS, is the only other guard.
Now a link of another user's (not root's) anywhere on the path as given is refused; the
user's own links are followed as before."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from kit.engine.cache.safe_files import not_private
from tests import helpers

NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to make nobody's link")
def test_a_prompt_cache_dir_through_another_users_link_is_refused(tmp_path, sticky_box):
    victims = tmp_path / "my-other-cache"
    victims.mkdir(mode=0o700)
    link = sticky_box / "mlx-cache"
    subprocess.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                    "ln", "-s", str(victims), str(link)], check=True, timeout=30)
    why = f"{link} is a link of another user's (uid {NOBODY}): they chose where it leads"
    assert not_private(link) == why
    assert not_private(link / "sub") == why
    r = helpers.run_kit(tmp_path, "serve", "--prompt-cache-dir", str(link), "--model",
                        "/nonexistent", timeout=60)
    assert r.returncode == 1, r.stderr
    assert why in helpers.flat(r.stderr)
    # the user's own link to the same folder is followed
    mine = tmp_path / "cache-link"
    mine.symlink_to(victims)
    assert not_private(mine) is None
