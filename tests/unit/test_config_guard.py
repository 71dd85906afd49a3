"""The config's last-stop checks, piece by piece: credentials by value (and what is not taken
for one), names as folder names, YAML scalars that YAML 1.1 and 1.2 read differently, and the
schema's messages in words. The catalogue (tests/workflow/test_bad_input.py) runs them through
the loader; these pin down the edges, the accepted side above all."""

from __future__ import annotations

import copy
import secrets
import string
from pathlib import Path

import pytest
import yaml
from cellbench.common.secrets import credential_kind
from cellbench.config import loader
from cellbench.config.names import _problem
from cellbench.config.strict_yaml import ConfigError, read_yaml

ROOT = Path(__file__).resolve().parents[2]

# Values a config holds for good reasons: ids, paths, refs, digests, words, numbers.
BENIGN = [
    "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8",
    "Qwen3-Coder-480B-A35B-Instruct-FP8-Dynamic",
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "docker.io/vllm/vllm-openai-rocm:nightly",
    "/opt/rocm/lib/llvm/bin",
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "sha256:" + "0123456789abcdef" * 4,
    "TritonFusedMoE_Config_2026_v3_final",
    "MyProjectRun20261207T081300Z",
    "http://127.0.0.1:8000/v1",
    "https://user@host/path",  # a user name alone is no secret
    "VLLM_ROCM_USE_AITER",
    "--gpu-memory-utilization",
    "0.95",
    "someorg/sk-llama-3-8b-instruct-finetuned-v2",
]


@pytest.mark.parametrize("value", BENIGN)
def test_ids_paths_and_digests_are_not_taken_for_credentials(value):
    assert credential_kind(value) is None


@pytest.mark.parametrize(
    "value, kind",
    [
        ("postgres://admin:s3cr3t@db:5432/x", "a URL with a user name and password"),
        ("hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7", "a Hugging Face token"),
        ("ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "a GitHub token"),
        ("github_pat_" + "11ABCDEFG0123456789_abcdefghij", "a GitHub token"),
        ("sk-proj-" + "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8", "an API key"),
        ("AKIAIOSFODNN7EXAMPLE", "an AWS access key id"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn", "a private key"),
        ("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.sig", "a JSON web token"),
    ],
)
def test_known_shapes_are_named_and_the_value_is_not(value, kind):
    found = credential_kind(value)
    assert found is not None and found.startswith(kind)
    assert value not in found


def test_random_keys_are_caught_only_where_asked():
    key = "Zx8Qp2LmN4vR7tY1uW3sK9bH6cJ0"
    assert credential_kind(key).startswith("a random-looking string")
    assert credential_kind(key, random_runs=False) is None  # outside env: ids and paths


def test_most_random_base62_keys_of_32_characters_are_caught():
    """The measured rate the docs quote (about 99% at 32 characters), with room for chance."""
    alphabet = string.ascii_letters + string.digits
    keys = ["".join(secrets.choice(alphabet) for _ in range(32)) for _ in range(400)]
    caught = sum(credential_kind(k) is not None for k in keys)
    assert caught >= 0.95 * len(keys)


@pytest.mark.parametrize(
    "name, problem",
    [
        ("m" * 101, "101 characters, more than 100"),
        ("..", "'..' names a folder itself"),
        (".", "'.' names a folder itself"),
        (".env", "starts with '.'"),
        ("README.md", "ends in '.md', like a file"),
        ("a/b", "holds '/'"),
        ("a b", "holds ' '"),
        ("", "is empty"),
    ],
)
def test_names_that_cannot_be_folders(name, problem):
    assert problem in (_problem(name) or "")


@pytest.mark.parametrize("name", ["rocm7.0", "qwen3.5-35b-a3b-fp8", "m" * 100, "tiny_moe-16e"])
def test_names_that_can(name):
    assert _problem(name) is None


@pytest.mark.parametrize(
    "text, said",
    [
        ("a: 040", "040 is a YAML 1.1 octal number (read as 32)"),
        ("a: -017", "-017 is a YAML 1.1 octal number (read as -15)"),
        ("a: 2:00", "2:00 is a YAML 1.1 base-60 number (read as 120)"),
        ("a: 1_000", "1_000 is a YAML 1.1 number with '_' separators (read as 1000)"),
        ("a: 0b11", "0b11 is a YAML 1.1 binary number (read as 3)"),
        ("a: Yes", "Yes is a YAML 1.1 boolean (read as true)"),
        ("a: OFF", "OFF is a YAML 1.1 boolean (read as false)"),
    ],
)
def test_yaml_1_1_only_scalars_are_refused_with_their_line(tmp_path, text, said):
    path = tmp_path / "c.yaml"
    path.write_text("b: 1\n" + text + "\n")
    with pytest.raises(ConfigError) as err:
        read_yaml(path)
    assert f"config file {str(path)!r}, line 2: {said}" in str(err.value)


def test_scalars_both_versions_read_alike_pass(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: [0, 10, -3, 0.5, 3.0, .inf, 0x1F, true, false, '040', \"2:00\", 'yes']\n")
    assert read_yaml(path) == {
        "a": [0, 10, -3, 0.5, 3.0, float("inf"), 31, True, False, "040", "2:00", "yes"]
    }


@pytest.mark.parametrize(
    "edit, said",
    [
        (("models", "qwen3-30b-a3b-fp8", "block_shape", "128x128"),
         'block_shape = "128x128": expected "auto", null or a list of 2 integers >= 1'),
        (("serve", "repeats", -0.0), "serve.repeats = -0.0: expected an integer >= 1"),
        (("cells", []), "cells = []: expected a list of mappings, at least 1"),
        (("images", "rocm7.0", "rocm_version", "7"), "expected a version as MAJOR.MINOR"),
    ],
)  # fmt: skip
def test_schema_messages_say_what_is_expected(tmp_path, edit, said):
    cfg = copy.deepcopy(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    *path, value = edit
    node = cfg
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    file = tmp_path / "c.yaml"
    file.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as err:
        loader.load(file)
    assert said in str(err.value)
    assert "was expected" not in str(err.value) and "does not match" not in str(err.value)
