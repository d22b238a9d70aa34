"""LoRA adapters mounted on the loaded model, one active at a time (``serve --adapter``).

Each adapter is built once, at load, with mlx-lm's own ``linear_to_lora_layers`` (the
modules ``mlx_lm.lora`` trained: LoRA or DoRA wrappers around the model's linear layers)
and its weights; the model is then put back to its base modules. Switching adapter swaps
the wrapped modules in and the base ones out with ``update_modules``: a few hundred
references, no copy of weights: about 0.1 ms, so a request that switches costs no more
than one that does, within the noise (bench/adapters.py, docs/adapters.md). The base
model runs its own modules, at its own speed.

One adapter is active for the whole model, so requests with different adapters never
decode in one batch: the scheduler runs them apart (:mod:`kit.engine.decode.engine`,
:func:`kit.engine.decode.batch.run_batch`), and the prompt cache keys each adapter's KV
apart (:mod:`kit.engine.decode.pipeline`).
"""

from __future__ import annotations

import logging
from typing import Any

from kit import mlx_lm_api
from kit.errors import ModelError
from kit.models.adapters import Adapter

log = logging.getLogger("mlx_kit.engine")

#: the attributes under which mlx-lm's LoRA/DoRA modules hold the module they wrap
_WRAPPED = ("linear.", "embedding.")


class AdapterSet:
    """The adapters mounted on one loaded model.

    Attributes:
        active: the adapter the model runs with now (None: the base model).
        names: the adapters' names, in the order given.
        nbytes: the adapters' weights, bytes.
    """

    def __init__(self, model: Any, base: dict[str, Any],
                 mounted: dict[str, list[tuple[str, Any]]], nbytes: int) -> None:
        self._model = model
        self._base = base  # module name -> the model's own module there
        self._mounted = mounted  # adapter -> [(module name, its LoRA module)]
        self.names = list(mounted)
        self.nbytes = nbytes
        self.active: str | None = None

    def use(self, name: str | None) -> None:
        """Run the model with adapter ``name`` (None: the base model) from now on.

        Raises:
            KeyError: no adapter of that name is mounted.
        """
        if name == self.active:
            return
        from mlx.utils import tree_unflatten

        swap: dict[str, Any] = {}
        if self.active is not None:
            swap.update((k, self._base[k]) for k, _ in self._mounted[self.active])
        if name is not None:
            swap.update(self._mounted[name])
        self._model.update_modules(tree_unflatten(list(swap.items())))
        self.active = name


def mount(model: Any, adapters: dict[str, Adapter]) -> AdapterSet:
    """Build each adapter of ``adapters`` on ``model`` (which stays the base model).

    Raises:
        ModelError: naming the adapter's file: mlx-lm cannot put LoRA layers on this
            model type or these keys, or ``adapters.safetensors`` does not fit the model
            (a weight the model has no place for, a shape that differs, a layer without
            its weights: an adapter trained on another model).
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    before = dict(model.named_modules())
    base: dict[str, Any] = {}
    mounted: dict[str, list[tuple[str, Any]]] = {}
    nbytes = 0
    for name, adapter in adapters.items():
        config = adapter.config
        where = f"adapter {name!r} ({adapter.path})"
        try:
            mlx_lm_api.linear_to_lora_layers(
                model, config.num_layers, config.lora_parameters.model_dump(),
                use_dora=config.fine_tune_type == "dora")
        except (ValueError, AttributeError, KeyError) as e:
            _restore(model, before)
            raise ModelError(f"{where}: cannot put its layers on this model: {e}") from None
        changed = _replaced(model, before)
        try:
            weights = mx.load(str(adapter.weights))
        except Exception as e:
            _restore(model, before)
            raise ModelError(f"{where}: cannot read {adapter.weights}: {e}") from None
        expected = {f"{k}.{p}": v.shape for k, m in changed
                    for p, v in tree_flatten(m.parameters()) if not p.startswith(_WRAPPED)}
        problem = _mismatch(weights, expected)
        if problem:
            _restore(model, before)
            params = config.lora_parameters
            raise ModelError(f"{where}: {adapter.weights} {problem}: it does not match its "
                             f"{adapter.path.name}/adapter_config.json (num_layers "
                             f"{config.num_layers}, rank {params.rank}, fine_tune_type "
                             f"{config.fine_tune_type}), or it was trained on another model "
                             f"(it records {config.model or 'none'})",
                             hint="an adapter runs only on the model it was trained on, "
                                  "with the config mlx_lm.lora wrote beside it; fix the "
                                  "--adapter flag or the folder and restart the server")
        model.load_weights(list(weights.items()), strict=False)
        for _, module in changed:
            module.eval()  # LoRA dropout is for training
        mx.eval([m.parameters() for _, m in changed])
        nbytes += sum(v.nbytes for v in weights.values())
        mounted[name] = changed
        base.update((k, before[k]) for k, _ in changed)
        model.update_modules(tree_unflatten([(k, before[k]) for k, _ in changed]))
        log.info("adapter %s: %d layers (%s, rank %d) from %s", name, len(changed),
                 config.fine_tune_type, config.lora_parameters.rank, adapter.path)
    return AdapterSet(model, base, mounted, nbytes)


def _mismatch(weights: dict[str, Any], expected: dict[str, tuple[int, ...]]) -> str | None:
    """What keeps ``weights`` from being the adapter layers ``expected`` (name -> shape)
    describes, as words; None when they match."""
    extra = sorted(set(weights) - set(expected))
    if extra:
        return f"has weights this model has no LoRA layer for ({', '.join(extra[:3])})"
    for key, shape in expected.items():
        if key not in weights:
            return f"has no weights for {key}"
        if tuple(weights[key].shape) != tuple(shape):
            return (f"has {key} of shape {tuple(weights[key].shape)}, the model's layer "
                    f"needs {tuple(shape)}")
    return None


def _replaced(model: Any, before: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(name, module)`` of each module of ``model`` that is not the one ``before`` (name
    -> module, from ``named_modules``) had there: the wrappers ``linear_to_lora_layers``
    put in."""
    return [(k, m) for k, m in model.named_modules() if k in before and m is not before[k]]


def _restore(model: Any, before: dict[str, Any]) -> None:
    """Put back every module of ``model`` that is not the one ``before`` had."""
    from mlx.utils import tree_unflatten

    changed = [(k, before[k]) for k, _ in _replaced(model, before)]
    if changed:
        model.update_modules(tree_unflatten(changed))
