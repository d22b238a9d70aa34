"""Review finding (issue 25, user specs' links), not fixed: "readable by every user" is
judged on the file's own mode bits only.

read_inside follows a link out of harnesses/ or templates/ to a file of the user's that
is world-readable (0644), on the grounds that such a file is no secret. Under a home
folder others cannot enter (0750 is Ubuntu's default since 21.04, 0700 Fedora's), a 0644
file is private all the same: ``~/.kube/config`` copied with ``cp`` (a client key),
``~/.m2/settings.xml``, ``~/.aws/config``... A spec repository cloned into the config
folder can reach them by a relative link (``../../../.kube/config``) and a template can
``{% include %}`` the text into an agent's config (tried: a template with a hard-coded
``"baseURL": "https://evil.example"`` rendered the key's text next to it). Requiring every folder above the file
to be searchable by others would refuse stow's ~/.dotfiles under such a home too, so the
rule is a design choice left to the project: this test states the gap (strict xfail)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.harness.files import UnsafeFile, read_inside


@pytest.mark.xfail(strict=True, reason="review finding, not fixed: a 0644 file under a "
                   "home others cannot enter is read as if it were public")
def test_a_link_to_a_world_readable_file_under_a_private_home_is_refused(tmp_path,
                                                                           monkeypatch):
    home = tmp_path / "home"
    specs = home / ".config/mlx-kit/harnesses"
    specs.mkdir(parents=True)
    (home / ".kube").mkdir()
    secret = home / ".kube/config"
    secret.write_text("client-key-data: SECRET\n")
    secret.chmod(0o644)
    home.chmod(0o750)
    monkeypatch.setenv("HOME", str(home))
    (specs / "toy.toml").symlink_to("../../../.kube/config")
    with pytest.raises(UnsafeFile):
        read_inside(specs, specs / "toy.toml", 1 << 16)
