"""The model catalog without a model: the snapshot a server serves while a rescan runs in
the background, capabilities read from only the head of tokenizer.json, and the one list
of entries that a server shows and harness templates bake."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from kit.models.catalog import CatalogCache, CatalogEntry, capabilities, served_entries


class Scanner:
    """A scan whose calls return the given lists in order, each once its gate opens (more
    calls than lists: the last list at once)."""

    def __init__(self, *results: list[CatalogEntry]) -> None:
        self.results = list(results)
        self.gates = [threading.Event() for _ in results]
        self.started = [threading.Event() for _ in results]
        self.calls = 0

    def __call__(self) -> list[CatalogEntry]:
        n = self.calls
        self.calls += 1
        if n >= len(self.results):
            return self.results[-1]
        self.started[n].set()
        assert self.gates[n].wait(10)
        result = self.results[n]
        if isinstance(result, Exception):
            raise result
        return result


def entries(*ids: str) -> list[CatalogEntry]:
    return [CatalogEntry(i, None) for i in ids]


def ids(snapshot) -> list[str]:
    return [e.id for e in snapshot]


def test_a_read_during_a_rescan_gets_the_last_snapshot_at_once():
    scan = Scanner(entries("a"), entries("a", "b"))
    cache = CatalogCache(scan, ttl=0)
    scan.gates[0].set()
    assert ids(cache.get()) == ["a"]
    assert ids(cache.peek()) == ["a"]  # stale (ttl 0): starts a rescan, answers at once
    assert scan.started[1].wait(5)      # the rescan runs (blocked in its gate) ...
    assert ids(cache.peek()) == ["a"]   # ... and readers still get the last snapshot
    assert scan.calls == 2              # one rescan at a time, however many readers
    future = cache.refresh()
    scan.gates[1].set()
    assert ids(future.result(5)) == ["a", "b"]
    assert ids(cache.peek()) == ["a", "b"]


def test_the_first_read_waits_for_the_first_scan():
    scan = Scanner(entries("a"))
    cache = CatalogCache(scan)
    assert cache.peek() is None and scan.started[0].wait(5)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(cache.get(10)))
    reader.start()
    assert got == []
    scan.gates[0].set()
    reader.join(10)
    assert ids(got[0]) == ["a"] and scan.calls == 1


def test_a_failed_rescan_keeps_serving_the_last_snapshot():
    scan = Scanner(entries("a"), OSError("hub cache unreadable"), entries("a", "c"))
    for gate in scan.gates:
        gate.set()
    cache = CatalogCache(scan, ttl=3600)  # rescans only when asked for here
    assert ids(cache.get()) == ["a"]
    with pytest.raises(OSError):
        cache.refresh().result(5)
    assert ids(cache.get()) == ["a"]
    assert ids(cache.refresh().result(5)) == ["a", "c"]  # the next rescan works again


def test_a_forced_rescan_is_not_overwritten_by_an_older_one_that_ends_later():
    # A swap that built a starter forces a rescan while an older one (started before
    # the starter existed) still runs: the older result must not replace the newer.
    scan = Scanner(entries("a"), entries("a"), entries("a", "starter-4bit"))
    cache = CatalogCache(scan, ttl=0)
    scan.gates[0].set()
    cache.get()
    old = cache.refresh()
    assert scan.started[1].wait(5)
    forced = cache.refresh(force=True)
    scan.gates[2].set()
    assert ids(forced.result(5)) == ["a", "starter-4bit"]
    scan.gates[1].set()
    old.result(5)
    assert ids(cache.peek()) == ["a", "starter-4bit"]


def test_served_entries_put_local_first_then_the_model_then_the_other_loadable_ones():
    catalog = [CatalogEntry("org/b", None, context_window=2048),
               CatalogEntry("org/broken", None, loadable=False, reason="no config.json"),
               CatalogEntry("org/a", None, context_window=32768)]
    listed = served_entries(catalog, "org/a", context_window=4096, loaded=True,
                            detected={"tools": True})
    assert [(e["id"], e["model"]) for e in listed] == [
        ("local", "org/a"), ("org/a", "org/a"), ("org/b", "org/b")]
    assert [e["context_window"] for e in listed] == [4096, 4096, 2048]
    assert [e["loaded"] for e in listed] == [True, True, False]
    assert [e["capabilities"]["tools"] for e in listed] == [True, True, False]
    assert listed[0]["name"] == "org/a (mlx-kit)" and listed[1]["name"] == "org/a"


def test_served_entries_default_to_the_starter_behind_local():
    listed = served_entries([])
    assert [(e["id"], e["model"]) for e in listed] == [
        ("local", "mlx-kit/SmolLM2-135M-Instruct"),
        ("mlx-kit/SmolLM2-135M-Instruct", "mlx-kit/SmolLM2-135M-Instruct")]


def tokenizer_json(folder: Path, added: list[str], size: int = 0) -> Path:
    """A tokenizer.json with ``added`` special tokens, padded (sparsely) to ``size`` bytes:
    its vocabulary is what makes real ones tens of MB."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    head = json.dumps({"version": "1.0", "truncation": None, "padding": None,
                       "added_tokens": [{"id": i, "content": t, "special": True}
                                        for i, t in enumerate(added)]})[:-1]
    with open(path, "w") as f:
        f.write(head + ', "normalizer": null, "model": {"vocab": {')
        if size:
            f.truncate(size)  # a hole: no disk used, but reading it all would take ages
    return path


def test_reasoning_is_read_from_the_special_tokens_at_the_head_of_tokenizer_json(tmp_path):
    tokenizer_json(tmp_path / "think", ["<|im_start|>", "<think>", "</think>"])
    tokenizer_json(tmp_path / "plain", ["<|im_start|>", "<|im_end|>"])
    assert capabilities(tmp_path / "think", {}).reasoning is True
    assert capabilities(tmp_path / "plain", {}).reasoning is False


def test_a_huge_tokenizer_json_is_never_read_whole(tmp_path):
    # Regression (review F10): the catalog read each model's whole tokenizer.json.
    tokenizer_json(tmp_path / "huge", ["<think>", "</think>"], size=8 << 30)  # 8 GiB, sparse
    tokenizer_json(tmp_path / "huge-plain", ["<s>"], size=8 << 30)
    t0 = time.monotonic()
    assert capabilities(tmp_path / "huge", {}).reasoning is True
    assert capabilities(tmp_path / "huge-plain", {}).reasoning is False
    assert time.monotonic() - t0 < 5  # reading 16 GiB would take minutes (or run out of RAM)
