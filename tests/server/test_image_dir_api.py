"""``serve --image-dir DIR``: a request may name an image file by path (OpenAI's
``image_url`` as ``file://``, Gemini's ``fileData``) only inside the folders the user
allowed; without the flag, or outside them (``..``, a link out, another folder), it is the
400 naming the part, and nothing is read. Model-free: the real app over the stand-in engine
that reports vision (tests/server/images.py)."""

from __future__ import annotations

import os

import pytest

from kit.server.content.image_files import allowed_folders, local_path
from kit.errors import ConfigError
from tests.server.images import PNG, chat_body, sha, vision_client


@pytest.fixture
def folders(tmp_path):
    allowed, other = tmp_path / "shots", tmp_path / "private"
    allowed.mkdir(), other.mkdir()
    (allowed / "a.png").write_bytes(PNG)
    (other / "secret.png").write_bytes(PNG)
    (allowed / "out.png").symlink_to(other / "secret.png")
    (allowed / "big.png").write_bytes(PNG + b"\0" * 4096)
    return allowed, other


def chat(client, url):
    return client.post("/v1/chat/completions", json=chat_body(
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}))


def gemini(client, uri):
    return client.post("/v1beta/models/local:generateContent", json={"contents": [
        {"role": "user", "parts": [{"fileData": {"mimeType": "image/png", "fileUri": uri}},
                                   {"text": "hi"}]}]})


def test_an_image_inside_the_allowed_folder_is_read_by_path_on_chat_and_gemini(folders):
    allowed, _ = folders
    client, engine = vision_client(image_dirs=allowed_folders([str(allowed)]))
    assert chat(client, (allowed / "a.png").as_uri()).status_code == 200
    assert gemini(client, str(allowed / "a.png")).status_code == 200
    assert [r.images[0].digest for r in engine.seen] == [sha(PNG)] * 2


@pytest.mark.parametrize("name", ["../private/secret.png", "out.png"])
def test_a_path_that_leaves_the_folder_is_refused_naming_the_part(folders, name):
    allowed, _ = folders
    client, engine = vision_client(image_dirs=allowed_folders([str(allowed)]))
    r = chat(client, "file://" + str(allowed) + "/" + name)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content.0"
    assert "not inside a folder this server reads images from" in r.json()["error"]["message"]
    assert engine.seen == []


def test_without_image_dir_no_file_is_read(folders):
    allowed, _ = folders
    client, engine = vision_client()
    r = gemini(client, str(allowed / "a.png"))
    assert r.status_code == 400 and "--image-dir" in r.json()["error"]["message"]
    assert engine.seen == []


def test_a_file_over_the_byte_bound_is_refused_before_it_is_read(folders):
    allowed, _ = folders
    client, _ = vision_client(image_dirs=allowed_folders([str(allowed)]),
                              max_image_bytes=len(PNG) + 100)
    r = chat(client, (allowed / "big.png").as_uri())
    assert r.status_code == 400 and r.json()["error"]["code"] == "image_too_large"


def test_a_fifo_or_a_folder_is_not_read(folders):
    allowed, _ = folders
    os.mkfifo(allowed / "pipe.png")
    client, _ = vision_client(image_dirs=allowed_folders([str(allowed)]))
    for name in ("pipe.png", "."):
        r = chat(client, "file://" + str(allowed / name))
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image"


def test_local_path_and_the_flags_check():
    assert local_path("file:///a/b%20c.png").as_posix() == "/a/b c.png"
    assert local_path("file://otherhost/a.png") is None and local_path("a.png") is None
    with pytest.raises(ConfigError, match="--image-dir"):
        allowed_folders(["/no/such/folder"])
