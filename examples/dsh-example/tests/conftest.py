"""The configuration the tests start from: dsh.testing builds ``dsh_app`` from it."""

from __future__ import annotations

from typing import Any

import pytest

REVIEW = "Review your answer; reply with the final answer only."


@pytest.fixture
def dsh_config() -> dict[str, Any]:
    """`writer` enables the plugin and reviews its answers; `chat` does not enable it. No
    model is named, so both answer with the scripted model (``dsh_script``)."""
    return {
        "agent": "writer",
        "agents": {
            "writer": {"plugins": ["example"],
                       "plugin_settings": {"example": {"review": REVIEW}}},
            "chat": {"plugins": []},
        },
        "plugins": {"example": {"blocked": ["password"],
                                "shorthands": {"tldr": "summarise in one sentence"}}},
    }


@pytest.fixture
def review() -> str:
    """The follow-up `writer` asks for once per turn."""
    return REVIEW
