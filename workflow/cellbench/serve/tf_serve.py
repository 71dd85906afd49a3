"""``transformers serve`` with the project's Triton fused-MoE kernel as the models' experts.

    python -m cellbench.serve.tf_serve [--cellbench-experts NAME] <transformers serve arguments>

runs transformers' own ``serve`` command (its FastAPI/uvicorn server, unchanged) in this
process, after registering ``cellbench.serve.experts_tf`` as an experts implementation and making
every model the server loads use it. The launch config of each MoE call comes from
``VLLM_TUNED_CONFIG_FOLDER`` (then vLLM's own folder, then vLLM's default rule), and the
server's stderr carries vLLM's line saying which file was used, for
``cellbench.serve.moe_evidence``.

``--cellbench-experts`` (default ``cellbench_triton``) picks another registered implementation
instead, e.g. ``eager`` to serve the same way without the kernel.

How the model gets the implementation: transformers 5.24's serve command builds a
``ModelManager`` (``transformers.cli.serving.model_manager``) whose ``_load_model`` calls
``from_pretrained`` with a fixed set of keyword arguments and offers no option, environment
variable or hook for ``experts_implementation``. So this module replaces that module's
``ModelManager`` with a subclass (a monkeypatch: ``Serve`` imports the class from the module
when it starts, so the subclass is what it builds). The subclass only adds one call after the
model is loaded, transformers' public ``model.set_experts_implementation(name)``, on models
that have experts to switch. Nothing else of the server changes.
"""

from __future__ import annotations

import sys

from cellbench.serve import (
    experts_tf,  # first: sets TRITON_INTERPRET (no GPU) before triton is imported
)

__all__ = ["OPTION", "main", "install", "split_args"]

OPTION = "--cellbench-experts"


def split_args(argv: list[str]) -> tuple[str, list[str]]:
    """(experts implementation, the arguments for ``transformers serve``)."""
    name, rest, i = experts_tf.NAME, [], 0
    while i < len(argv):
        a = argv[i]
        if a == OPTION:
            if i + 1 >= len(argv):
                raise SystemExit(f"cellbench.serve.tf_serve: {OPTION} needs a value")
            name, i = argv[i + 1], i + 2
            continue
        if a.startswith(OPTION + "="):
            name = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    if rest[:1] == ["serve"]:  # tolerate `tf_serve serve MODEL ...`
        rest = rest[1:]
    return name, rest


def _has_switchable_experts(model) -> bool:
    """Whether the model, or a model inside it (e.g. a multimodal model's MoE text model),
    dispatches its experts through transformers' experts registry."""
    return any(
        sub._can_set_experts_implementation()
        for sub in model.modules()
        if callable(getattr(sub, "_can_set_experts_implementation", None))
    )


def install(name: str) -> None:
    """Register the kernel and make the serve command's models load with ``name``."""
    if name == experts_tf.NAME:
        experts_tf.register(name)
    from transformers.cli.serving import model_manager as mm

    base = mm.ModelManager
    if getattr(base, "_cellbench_experts", None) is not None:
        base._cellbench_experts = name  # already installed: just change the name
        return

    class ModelManagerWithExperts(base):  # type: ignore[misc, valid-type]
        """transformers' ModelManager, plus the experts implementation after each load."""

        _cellbench_experts = name

        def _load_model(self, *args, **kwargs):
            model = super()._load_model(*args, **kwargs)
            if _has_switchable_experts(model):
                model.set_experts_implementation(type(self)._cellbench_experts)
            return model

    mm.ModelManager = ModelManagerWithExperts


def main(argv: list[str] | None = None) -> int:
    name, serve_args = split_args(list(sys.argv[1:] if argv is None else argv))
    install(name)
    print(
        f"cellbench.serve.tf_serve: transformers serve with experts_implementation={name!r}",
        file=sys.stderr,
        flush=True,
    )
    from transformers.cli.transformers import app

    # transformers' own CLI, minus its `main()`'s update check (this must run offline).
    app(args=["serve", *serve_args], prog_name="transformers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
