"""Render an agent's templates with Jinja2.

Every value that lands in a generated file goes through a filter that makes it a literal
of the target language (``js``: a JSON/TypeScript literal, also read by YAML; ``toml``: a
TOML string), so a quote, backslash or newline in a model name or URL can neither break the
file nor inject code. A value that the agent itself expands like a shell word (Crush's
``base_url``) first goes through ``sh_escape``.

Templates see the shared :func:`context` and, as ``vars``, their own agent's ``[vars]``
table only; each spec renders from its own templates folder (bundled or the user's).
"""

from __future__ import annotations

import functools

import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.sandbox
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.loaders import split_template_path
from jinja2.utils import object_type_repr

from kit import STABLE_MODEL_ID, __version__
from kit.errors import HarnessError
from kit.knobs import env
from kit.harness.files import UNSAFE_HINT, UnsafeFile, read_inside
from kit.harness.render_box import render_in_child

if TYPE_CHECKING:  # the render child (kit.harness.render_box) needs no pydantic
    from kit.harness.spec import HarnessSpec

#: First line of every generated file; ``remove`` only deletes files that carry it.
MARKER = "mlx-kit:generated (do not edit)"
PROVIDER_ID = "mlx-kit"
API_KEY_ENV = "MLX_KIT_API_KEY"


def _defined(value: Any) -> Any:
    """``value``, or the template's UndefinedError when it names nothing (json.dumps would
    raise a TypeError that says nothing about the template)."""
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    return value


def js_literal(value: Any, escape: str = "") -> str:
    """A JSON value as a JavaScript/TypeScript literal: ASCII-only (so U+2028/2029 and
    every control character are escaped) and with ``<``, ``>`` and ``&`` escaped as well.

    Args:
        escape: more characters to write as ``\\uXXXX`` inside strings, for an agent that
            substitutes patterns in its config's raw text before parsing it: ``"{"`` for
            opencode, which replaces ``{env:VAR}`` and ``{file:path}`` anywhere (a model
            named ``{file:x}`` would stop it from loading the file).
    """
    value = _defined(value)
    if escape and isinstance(value, dict):
        return "{" + ", ".join(f"{js_literal(str(k), escape)}: {js_literal(v, escape)}"
                               for k, v in value.items()) + "}"
    if escape and isinstance(value, (list, tuple)):
        return "[" + ", ".join(js_literal(v, escape) for v in value) + "]"
    text = json.dumps(value, ensure_ascii=True, indent=None)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    if isinstance(value, str):  # every character of a string literal is content
        for ch in escape:
            text = text.replace(ch, f"\\u{ord(ch):04x}")
    return text


def toml_literal(value: Any) -> str:
    """A TOML basic string (or boolean, integer, finite float). Not ``js``: TOML refuses
    the surrogate pairs JSON writes for a character beyond U+FFFF (``"\\ud83e\\udd99"``),
    so those stay as they are; quotes, backslashes, control characters and Unicode line
    breaks are escaped."""
    value = _defined(value)
    if isinstance(value, (bool, int)) or isinstance(value, float) and math.isfinite(value):
        return json.dumps(value)
    text = json.dumps(str(value), ensure_ascii=False)
    for ch in "\x7f\x85\u2028\u2029":
        text = text.replace(ch, f"\\u{ord(ch):04x}")
    return text


def shell_literal(value: Any) -> str:
    """``value`` with ``\\``, ``$`` and backquotes escaped by a backslash: literal text for
    an agent that expands a config value like a shell here-document (``$VAR``, ``$(cmd)``;
    quotes are not special there), as Crush does with ``base_url``."""
    return re.sub(r"([\\$`])", r"\\\1", str(_defined(value)))


#: The most text one template may render, and the largest value ``*`` or ``**`` may make
#: inside one: a config file is a few KiB, and a user's template must not be able to fill
#: memory or the disk (``{{ "x" * 10**12 }}``).
MAX_RENDERED_CHARS = 1024 * 1024


class _Sandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with ``*`` and ``**`` bounded (the sandbox bounds only
    ``range``)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(left, int) and isinstance(right, int) \
                and abs(left) > 1 and right * max(abs(left).bit_length(), 1) > 64 * 1024:
            raise jinja2.sandbox.SecurityError(f"{left} ** {right} is too large")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) \
                        and len(seq) * n > MAX_RENDERED_CHARS:
                    raise jinja2.sandbox.SecurityError(
                        f"a {type(seq).__name__} of {len(seq)} times {n} is too large")
        return super().call_binop(context, operator, left, right)


#: The largest template file read (a config file's template is a few KiB).
MAX_TEMPLATE_BYTES = 256 * 1024


class _RefusedFile(jinja2.TemplateError):
    """A template file :func:`kit.harness.files.read_inside` refused."""


class _FolderLoader(jinja2.BaseLoader):
    """Templates of one folder, each read through :func:`kit.harness.files.read_inside`:
    through a link out of the folder only to a file the user chose (theirs at the same
    place of a dotfiles tree or root's in /nix/store, changed by no one else, not where
    keys live), never a FIFO or a device, at most
    :data:`MAX_TEMPLATE_BYTES`. (jinja2's FileSystemLoader follows any link and reads a
    whole file.) ``..`` is refused by jinja2's ``split_template_path``."""

    def __init__(self, root: str) -> None:
        self.root = root

    def get_source(self, environment: jinja2.Environment, template: str):
        path = os.path.join(self.root, *split_template_path(template))
        try:
            data = read_inside(Path(self.root), Path(path), MAX_TEMPLATE_BYTES)
            mtime = os.path.getmtime(path)
        except FileNotFoundError:
            raise jinja2.TemplateNotFound(template) from None
        except UnsafeFile as e:
            raise _RefusedFile(f"template {template!r}: {e}") from None
        except OSError as e:
            raise jinja2.TemplateError(f"template {template!r}: cannot read it: "
                                       f"{e.strerror or e}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise jinja2.TemplateError(f"template {template!r}: not UTF-8 text") from None

        def uptodate() -> bool:
            try:
                return os.path.getmtime(path) == mtime
            except OSError:
                return False

        return text, path, uptodate


# One environment per template folder: Jinja then compiles each template once (it still
# reloads a template whose file changed, auto_reload).
@functools.lru_cache(maxsize=32)
def _environment_for(templates: str) -> jinja2.Environment:
    # Sandboxed: a template is data, and the user's own may come from anywhere (a spec +
    # template copied from the web). A plain Environment lets `{{ cycler.__init__.__globals__
    # .os.popen(...) }}` run commands, even under `harness show` or `install --dry-run`;
    # Jinja's sandbox refuses underscore attributes and mutating methods, which no
    # template needs.
    env = _Sandbox(
        loader=_FolderLoader(templates),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # not HTML: each value is escaped by its target-language filter
    )
    env.filters["js"] = js_literal
    env.filters["sh_escape"] = shell_literal
    env.filters["toml"] = toml_literal
    return env


def context(base_url: str, models: list[dict[str, Any]], baked_source: str) -> dict[str, Any]:
    """The variables every template sees.

    Args:
        base_url: the server's OpenAI base URL, ending in ``/v1``.
        models: /v1/models entries to bake in (``local`` first). An embedding model's
            entry (``capabilities.embeddings``, ``local-embed``) is not a chat model: it
            becomes ``embed_model`` (None when the server serves none), the rest
            ``models``.
        baked_source: where ``models`` came from, for a comment.
    """
    def embeds(m: dict[str, Any]) -> bool:
        caps = m.get("capabilities")
        return isinstance(caps, dict) and caps.get("embeddings") is True

    embed_model = next((m for m in models if embeds(m)), None)
    models = [m for m in models if not embeds(m)]
    return {
        "marker": MARKER,
        "kit_version": __version__,
        "provider_id": PROVIDER_ID,
        "model_id": STABLE_MODEL_ID,
        "base_url": base_url,
        "root_url": base_url.removesuffix("/v1"),
        "api_key_env": API_KEY_ENV,
        # whether the user set a key: a config that can only name a key it then requires
        # (llm's api_key_name) names it only then, so keyless direct use keeps working
        "api_key_set": bool(env(API_KEY_ENV)),
        "models": models,
        "embed_model": embed_model,
        "baked_source": baked_source,
    }


def render(spec: HarnessSpec, ctx: dict[str, Any]) -> dict[str, str]:
    """Render each of ``spec``'s files with ``ctx`` plus ``vars`` (the spec's own
    ``[vars]``, as attributes: ``{{ vars.name }}``). A user's templates render in a child
    process bounded in time and memory (:mod:`kit.harness.render_box`); the bundled ones
    (ours, like the code) here.

    Returns:
        ``{spec file path: text}``, in the spec's order.

    Raises:
        HarnessError: a template does not parse, names an undefined value, does what the
            sandbox refuses (an underscore attribute, a mutating method, a huge value),
            fails (a division by zero), renders more than :data:`MAX_RENDERED_CHARS`
            (counted while it renders: the text stops there), or a user's takes longer
            than :data:`kit.harness.render_box.TIME_LIMIT_S` or more memory than
            :data:`kit.harness.render_box.MEMORY_LIMIT` (the message names the template,
            and the line where known).
    """
    job = {"name": spec.name, "templates": str(spec.templates), "vars": dict(spec.vars),
           "files": [[f.path, f.template] for f in spec.files], "values": ctx}
    if spec.builtin:
        return render_job(job)
    return render_in_child(job)


class _TooLong(Exception):
    pass


def _bounded(chunks: Iterator[str], limit: int) -> str:
    """The text of ``chunks`` (a template's ``generate()``), refused as soon as it passes
    ``limit`` characters: the text is never built past the bound."""
    out, n = [], 0
    for chunk in chunks:
        n += len(chunk)
        if n > limit:
            raise _TooLong
        out.append(chunk)
    return "".join(out)


def render_job(job: dict[str, Any]) -> dict[str, str]:
    """:func:`render`'s work, on plain data (what crosses to the child process as JSON):
    ``name``, ``templates`` (the folder), ``vars``, ``files`` (``[path, template]``
    pairs) and ``values`` (the shared :func:`context`).

    Raises:
        HarnessError: as :func:`render` says.
    """
    name, templates = job["name"], Path(job["templates"])
    env = _environment_for(str(templates))
    values = {**job["values"], "vars": SimpleNamespace(**job["vars"])}
    out = {}
    for path, template in job["files"]:
        where = templates / template
        try:
            out[path] = _bounded(env.get_template(template).generate(**values),
                                 MAX_RENDERED_CHARS)
        except _TooLong:
            raise HarnessError(f"{where}: renders more than {MAX_RENDERED_CHARS} characters",
                               hint="a config file is a few KiB") from None
        except _RefusedFile as e:
            raise HarnessError(f"{where}: {e}", hint=UNSAFE_HINT) from None
        except jinja2.TemplateNotFound as e:  # an include/import (the loader refuses "..")
            raise HarnessError(f"{where}: includes {e.name!r}, not a template in "
                               f"{templates}", hint="a template may include only "
                               "templates of its own templates folder") from None
        except jinja2.TemplateSyntaxError as e:
            raise HarnessError(f"{where}:{e.lineno}: {e.message}",
                               hint=f"the template of {name}'s {path}") from None
        except jinja2.UndefinedError as e:  # say "vars", not "types.SimpleNamespace object"
            text = str(e).replace(repr(object_type_repr(values["vars"])), "vars")
            raise HarnessError(f"{where}: {text}",
                               hint=f"{name}'s [vars]: " + (", ".join(job["vars"]) or "none")
                               ) from None
        except jinja2.TemplateError as e:  # the sandbox's SecurityError included
            raise HarnessError(f"{where}: {e}",
                               hint=f"the template of {name}'s {path}; the values "
                               "it may use: docs/agents/adding-an-agent.md") from None
        except (ArithmeticError, ValueError, TypeError, LookupError, RecursionError) as e:
            # a user's template can divide by zero, index past a list's end, ...
            raise HarnessError(f"{where}: {type(e).__name__}: {e}",
                               hint=f"the template of {name}'s {path}") from None
    return out
