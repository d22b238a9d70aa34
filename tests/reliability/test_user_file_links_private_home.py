"""Review finding (issue 25, user specs' links): "readable by every user" was judged on
the file's own mode bits only.

read_inside followed a link out of harnesses/ or templates/ to any world-readable (0644)
file of the user's, on the grounds that such a file is no secret. Under a home folder
others cannot enter (0750 is Ubuntu's default since 21.04, 0700 Fedora's), a 0644 file is
private all the same: ``~/.kube/config`` copied with ``cp`` (a client key),
``~/.m2/settings.xml``, ``~/.aws/config``. A spec repository cloned into the config folder
could reach them by a relative link (``../../../.kube/config``) and a template could
``{% include %}`` the text into an agent's config. Now a link out is followed only to a
file kept at the same place of a mirror tree, as stow and home-manager make them, whatever
its mode: stow's ~/.dotfiles under a private home (with umask 077 too) still loads."""

from __future__ import annotations

import os

import pytest

from kit.harness.files import UnsafeFile, read_inside
from kit.harness.render import context, render
from kit.harness.spec_loader import load_all, load_spec

TOY = '''name = "toy"
binary = "toy"
install = "true"
api = "openai-responses"
[config_dir]
default = "~/.toy"
[[files]]
path = "toy.json"
template = "toy/toy.json.j2"
'''


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A HOME that others cannot enter, as Fedora makes it, with no XDG settings."""
    for key in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "MLX_KIT_CONFIG_DIR"):
        monkeypatch.delenv(key, raising=False)
    path = tmp_path / "home"
    (path / ".config/mlx-kit/harnesses").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(path))
    yield path
    path.chmod(0o755)


def test_a_link_to_a_world_readable_file_under_a_private_home_is_refused(home):
    specs = home / ".config/mlx-kit/harnesses"
    (home / ".kube").mkdir()
    secret = home / ".kube/config"
    secret.write_text("client-key-data: SECRET\n")
    secret.chmod(0o644)
    home.chmod(0o750)
    (specs / "toy.toml").symlink_to("../../../.kube/config")
    with pytest.raises(UnsafeFile) as exc:
        read_inside(specs, specs / "toy.toml", 1 << 16)
    assert str(exc.value) == (
        f"links to {secret}, outside {specs}, which is not kept at harnesses/toy.toml of a "
        "dotfiles tree, as a stow or home-manager link's file is: mlx-kit copies no other "
        "file of yours into an agent's config")
    assert "SECRET" not in str(exc.value)


def test_a_stowed_private_spec_under_a_private_home_loads(home):
    # umask 077: the stow package's files are 0600, the home 0700; stow links each file
    package = home / ".dotfiles/mlx-kit"
    for name, text in ((".config/mlx-kit/harnesses/toy.toml", TOY),
                       (".config/mlx-kit/templates/toy/toy.json.j2", "{{ marker }}\n")):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
        (package / name).chmod(0o600)
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).symlink_to(os.path.relpath(package / name, (home / name).parent))
    home.chmod(0o700)
    agents = load_all()
    assert agents.problems == {}
    [text] = render(load_spec("toy"), context("http://127.0.0.1:1/v1", [], "t")).values()
    assert text == "mlx-kit:generated (do not edit)\n"
