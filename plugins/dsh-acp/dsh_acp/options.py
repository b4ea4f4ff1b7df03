"""A session's settings as ACP session config options: ``mode`` (dsh's permission modes) and
``model`` (the models the person's config names), switched with
``session/set_config_option`` from the next prompt on.

The models offered are the session's own, the config's ``model`` and its ``[models.ID]``
aliases: an editor chooses among what the person configured, never a model id of its own
(``scripted:PATH``, a ``base_url``-carrying alias it made up)."""

from __future__ import annotations

from typing import Any

from acp import schema

MODE_WORDS = {"read-only": "Read only: no writes, no commands",
              "plan": "Plan: read, then propose a plan to approve",
              "ask": "Ask: writes and commands ask for permission",
              "auto-edit": "Auto-edit: writes in the workspace run, commands ask",
              "full-auto": "Full auto: everything inside the sandbox runs"}


def modes(current: str) -> schema.SessionModeState:
    from dsh.tools.approval import MODES

    return schema.SessionModeState(current_mode_id=current, available_modes=[
        schema.SessionMode(id=m, name=m, description=MODE_WORDS.get(m)) for m in MODES])


def models(acp_session: Any) -> list[str]:
    cfg = acp_session.app.config
    found = [acp_session.session.agent.model_id, acp_session.model, cfg.model, *cfg.models]
    return list(dict.fromkeys(m for m in found if isinstance(m, str) and m))


def config_options(acp_session: Any) -> list[Any]:
    from dsh.tools.approval import MODES

    current = acp_session.model or acp_session.session.agent.model_id
    return [
        schema.SessionConfigOptionSelect(
            type="select", id="mode", name="Permission mode", category="mode",
            current_value=acp_session.mode,
            options=[schema.SessionConfigSelectOption(value=m, name=m,
                                                      description=MODE_WORDS.get(m))
                     for m in MODES]),
        schema.SessionConfigOptionSelect(
            type="select", id="model", name="Model", category="model", current_value=current,
            options=[schema.SessionConfigSelectOption(value=m, name=m)
                     for m in models(acp_session)]),
    ]


def set_option(acp_session: Any, config_id: str, value: Any) -> None:
    """Apply ``config_id = value`` from the next prompt on; a ``ValueError`` names what is
    wrong. A model is built once now (under the session's directory) so that one that
    cannot be used is refused here, not at the next prompt."""
    from dsh.tools.approval import MODES

    if not isinstance(value, str):
        raise ValueError(f"{config_id} takes a name, not {type(value).__name__}")
    if config_id == "mode":
        if value not in MODES:
            raise ValueError(f"unknown mode {value!r} (modes: {', '.join(MODES)})")
        acp_session.mode = value
        return
    if config_id != "model":
        raise ValueError(f"unknown config option {config_id!r} (options: mode, model)")
    offered = models(acp_session)
    if value not in offered:
        raise ValueError(f"model {value!r} is not one of the configured models "
                         f"({', '.join(offered)})")
    from dsh_acp.turns import in_directory

    before = acp_session.model
    acp_session.model = value
    try:
        with in_directory(acp_session.cwd):
            acp_session.agent()
    except Exception:
        acp_session.model = before
        raise
