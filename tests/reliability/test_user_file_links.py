"""Issue 25 item 4, review finding: a user's specs and templates linked file by file.

GNU stow and Nix home-manager make every file of ~/.config a symbolic link (into
~/.dotfiles, or into /nix/store, whose files are root's and read-only). Before, any link
out of `harnesses/` or `templates/` was refused, so such a user's agents did not load. Now
a link out is followed to a file the user chose: theirs at the same place of a mirror
tree (as stow's package repeats `.config/mlx-kit/harnesses/toy.toml`), or root's in
/nix/store; changed by no one else, it and its folders; and not where keys or startup code
live. Mode bits do not prove a file public (a 0644 file under a 0750 home is private), so
a link to any other file of the user's is refused whatever its mode. Real files and links
in a throwaway HOME; the root and other-user cases need root (and setpriv, to run the
reader as `nobody`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kit.harness.render import context, render
from kit.harness.spec_loader import load_all, load_spec
from tests.conftest import REPO

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can make nobody's files")

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
MODELS = [{"id": "local", "name": "SmolLM2 135M", "model": "mlx-kit/SmolLM2-135M-Instruct",
           "context_window": 8192, "max_tokens": 2048,
           "capabilities": {"tools": True, "reasoning": True, "vision": False}}]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HOME with no XDG or mlx-kit settings (as tests/harness/conftest.py's)."""
    for key in list(os.environ):
        if key.startswith(("XDG_", "MLX_KIT_", "HF_")):
            monkeypatch.delenv(key)
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    return path


def _stow(home: Path, package: Path, names: list[str]) -> None:
    """Link each of ``names`` (relative to ~) to its copy under ``package``, relatively,
    one link per file, as `stow` does when the folders exist already."""
    for name in names:
        link = home / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(package / name, link.parent))


def test_a_stowed_config_whose_every_file_is_a_link_loads_and_renders(home):
    package = home / ".dotfiles" / "mlx-kit"
    spec = package / ".config/mlx-kit/harnesses/toy.toml"
    template = package / ".config/mlx-kit/templates/toy/toy.json.j2"
    template.parent.mkdir(parents=True)
    spec.parent.mkdir(parents=True)
    spec.write_text(TOY)
    template.write_text("{{ marker }} {{ models | map(attribute='id') | join(',') }}\n")
    (home / ".config/mlx-kit/harnesses").mkdir(parents=True)
    (home / ".config/mlx-kit/templates/toy").mkdir(parents=True)
    _stow(home, package, [".config/mlx-kit/harnesses/toy.toml",
                          ".config/mlx-kit/templates/toy/toy.json.j2"])
    assert (home / ".config/mlx-kit/harnesses/toy.toml").is_symlink()
    agents = load_all()
    assert agents.problems == {} and "toy" in agents.specs
    [text] = render(load_spec("toy"), context("http://127.0.0.1:1/v1", MODELS, "t")).values()
    assert text == "mlx-kit:generated (do not edit) local\n"


def _spec_link(home: Path, target: Path) -> Path:
    folder = home / ".config/mlx-kit/harnesses"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "toy.toml"
    link.symlink_to(target)
    return link


#: where a dotfiles tree keeps the spec the link stands for
MIRROR = ".config/mlx-kit/harnesses/toy.toml"
KEPT_ELSEWHERE = ("which is not kept at harnesses/toy.toml of a dotfiles tree, as a stow or "
                  "home-manager link's file is: mlx-kit copies no other file of yours into "
                  "an agent's config")


def _target(home: Path, case: str) -> tuple[Path, str]:
    """A file the link out points to, made as ``case`` says, and why it is refused. Each
    is at a mirror place unless the case is that it is not."""
    if case == "others-may-change":
        target = home / ".dotfiles" / MIRROR
        target.parent.mkdir(parents=True)
        target.write_text(TOY)
        target.chmod(0o646)
        return target, "which others may change (mode 0646)"
    if case == "private":
        target = home / ".aws" / "credentials"  # 0600, as every secret is kept
        target.parent.mkdir()
        target.write_text("[default]\naws_secret_access_key = SECRET\n")
        target.chmod(0o600)
        return target, KEPT_ELSEWHERE
    if case == "world-readable-elsewhere":
        target = home / ".kube" / "config"  # 0644 after a `cp`, private by its home's mode
        target.parent.mkdir()
        target.write_text("client-key-data: SECRET\n")
        target.chmod(0o644)
        return target, KEPT_ELSEWHERE
    if case == "ssh":
        target = home / ".ssh" / MIRROR  # at a mirror place, but where keys live
        target.parent.mkdir(parents=True)
        target.write_text(TOY)
        target.chmod(0o644)
        return target, ("where no agent's file may come from: files in ~/.ssh hold keys or "
                        "start programs")
    if case == "kit-state":
        state = home / ".local/state/mlx-kit"
        target = state / "harnesses/toy.toml"
        target.parent.mkdir(parents=True)
        target.write_text(TOY)
        target.chmod(0o644)
        return target, f"where no agent's file may come from: {state} is mlx-kit's own"
    if case == "folder-others-may-write":
        folder = home / "drop"
        target = folder / "harnesses/toy.toml"
        target.parent.mkdir(parents=True)
        folder.chmod(0o757)
        target.write_text(TOY)
        target.chmod(0o644)
        return target, f"in {folder}, which others may write (they could swap the file)"
    if case == "fifo":
        target = home / "pipe"
        os.mkfifo(target)
        return target, "which is not a regular file"
    if case == "another-users":
        target = home / "theirs.toml"
        target.write_text(TOY)
        target.chmod(0o644)
        os.chown(target, NOBODY, NOBODY)
        return target, f"which belongs to another user (uid {NOBODY})"
    assert case == "another-users-folder"
    folder = home / "theirs"
    target = folder / "harnesses/toy.toml"
    target.parent.mkdir(parents=True)
    target.write_text(TOY)
    target.chmod(0o644)
    os.chown(folder, NOBODY, NOBODY)
    return target, f"in {folder}, which belongs to another user (uid {NOBODY})"


@pytest.mark.parametrize("case", [
    "others-may-change", "private", "world-readable-elsewhere", "ssh", "kit-state",
    "folder-others-may-write", "fifo",
    pytest.param("another-users", marks=as_root),
    pytest.param("another-users-folder", marks=as_root)])
def test_a_link_out_of_the_config_folder_is_refused_unless_the_file_is_the_users_choice(
        home, case):
    target, why = _target(home, case)
    link = _spec_link(home, target)
    agents = load_all()
    assert [p.message for p in agents.problems.values()] == [
        f"{link}: links to {target}, outside {link.parent}, {why}"]
    assert "toy" not in agents.specs and "pi" in agents.specs
    assert "SECRET" not in json.dumps([p.message + p.hint for p in agents.problems.values()])


def test_a_template_linked_to_a_private_file_renders_nothing_of_it(home):
    # the same rule for templates (read in the render child): the secret stays out of
    # the agent's config and of the error
    (home / ".config/mlx-kit/harnesses").mkdir(parents=True)
    (home / ".config/mlx-kit/harnesses/toy.toml").write_text(TOY)
    (home / ".config/mlx-kit/templates/toy").mkdir(parents=True)
    secret, _ = _target(home, "private")
    (home / ".config/mlx-kit/templates/toy/toy.json.j2").symlink_to(secret)
    why = KEPT_ELSEWHERE.replace("harnesses/toy.toml", "templates/toy/toy.json.j2")
    from kit.errors import HarnessError

    with pytest.raises(HarnessError) as exc:
        render(load_spec("toy"), context("http://127.0.0.1:1/v1", MODELS, "t"))
    assert f"template 'toy/toy.json.j2': links to {secret}, outside " \
           f"{home / '.config/mlx-kit/templates'}, {why}" in exc.value.message
    assert "SECRET" not in exc.value.message + exc.value.hint


# Run as `nobody`, so that root is another user: the reader is the real read_inside, with
# NIX_STORE pointed at a folder standing in for /nix/store (which cannot be made here
# without touching the machine's own root folder)
READ_AS_NOBODY = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from kit.harness import files
files.NIX_STORE = sys.argv[2]
out = {}
for link in sys.argv[3:]:
    try:
        out[link] = files.read_inside(Path(link).parent, Path(link), 1 << 16).decode()
    except files.UnsafeFile as e:
        out[link] = "refused: " + str(e)
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to read as nobody")
def test_a_home_manager_link_into_the_nix_store_is_followed_for_roots_read_only_file(
        sticky_box):
    store = sticky_box / "nix" / "store"
    hm = store / "aaaa-home-manager-files" / ".config/mlx-kit/harnesses"
    hm.mkdir(parents=True)
    (store / "bbbb-hm_toy.toml").write_text(TOY)
    (hm / "toy.toml").symlink_to(store / "bbbb-hm_toy.toml")  # the store links inside too
    elsewhere = sticky_box / "etc"
    elsewhere.mkdir()
    (elsewhere / "toy.toml").write_text(TOY)
    for f in (store / "bbbb-hm_toy.toml", elsewhere / "toy.toml"):
        f.chmod(0o444)  # root's, read-only, as the store keeps it
    for d in (hm, *hm.parents):
        if d == sticky_box:
            break
        d.chmod(0o555 if store in d.parents else 0o755)
    home = sticky_box / "home"
    spec_dir = home / ".config/mlx-kit/harnesses"
    spec_dir.mkdir(parents=True)
    (spec_dir / "toy.toml").symlink_to(hm / "toy.toml")
    (spec_dir / "etc.toml").symlink_to(elsewhere / "toy.toml")
    for d in (spec_dir, *spec_dir.parents):
        if d == sticky_box:
            break
        os.lchown(d, NOBODY, NOBODY)
    for link in spec_dir.iterdir():
        os.lchown(link, NOBODY, NOBODY)
    try:
        r = subprocess.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup",
                            "--clear-groups", sys.executable, "-c", READ_AS_NOBODY,
                            str(REPO), str(store), str(spec_dir / "toy.toml"),
                            str(spec_dir / "etc.toml")],
                           capture_output=True, text=True, timeout=60, cwd="/", check=False)
    finally:
        for d in (hm, *hm.parents):  # sticky_box's own rmtree must get in
            if d == sticky_box:
                break
            d.chmod(0o755)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got[str(spec_dir / "toy.toml")] == TOY
    assert got[str(spec_dir / "etc.toml")] == (
        f"refused: links to {elsewhere / 'toy.toml'}, outside {spec_dir}, which belongs to "
        f"root, outside {store}")
