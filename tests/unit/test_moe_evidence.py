"""Reading which fused-MoE config a server used from its log (cellbench.serve.moe_evidence).
The log lines are vLLM's own formats (0.32-0.34 and the list form of later releases), as
servers print them with their process prefixes."""

from __future__ import annotations

from cellbench.serve.moe_evidence import arm_label, arm_problem, read_evidence

TUNED = "/cellbench/tuned-configs"
NAME = "E=64,N=768,device_name=AMD_Radeon_R9700,dtype=fp8_w8a8,block_shape=[128,128].json"
SHIPPED = (
    f"/usr/local/lib/python3.12/dist-packages/vllm/model_executor/layers/fused_moe/configs/{NAME}"
)
LOADED_TUNED = (
    "(Worker_TP0 pid=35966) INFO 12-04 06:46:35 [fused_moe.py:727] Using configuration from "
    f"{TUNED}/{NAME} for MoE layer."
)
LOADED_SHIPPED = (
    f"INFO 12-04 06:46:35 [fused_moe.py:727] Using configuration from {SHIPPED} for MoE layer."
)
DEFAULT_OLD = (
    "WARNING 02-13 15:01:39 fused_moe.py:806] Using default MoE config. Performance might be "
    f"sub-optimal! Config file not found at {TUNED}/{NAME}, {SHIPPED}"
)
DEFAULT_LIST = (
    "(Worker_TP1 pid=35967) WARNING 09-12 06:46:35 [fused_moe.py:727] Using default MoE config. "
    f"Performance might be sub-optimal! Config file not found at ['{SHIPPED}']"
)


def test_each_source_is_told_apart():
    assert read_evidence(f"boot\n{LOADED_TUNED}\nready", [TUNED])["source"] == "tuned"
    assert read_evidence(LOADED_SHIPPED, [TUNED])["source"] == "shipped"
    old = read_evidence(DEFAULT_OLD, [TUNED])
    assert old["source"] == "default" and old["searched"] == sorted([f"{TUNED}/{NAME}", SHIPPED])
    assert read_evidence(DEFAULT_LIST, [])["searched"] == [SHIPPED]
    assert read_evidence("INFO engine started\nINFO ready", [TUNED])["source"] == "none seen"
    mixed = read_evidence(f"{LOADED_TUNED}\n{DEFAULT_LIST}", [TUNED])
    assert mixed["source"] == "mixed" and len(mixed["log_lines"]) == 2


def test_tuned_arm_must_have_loaded_the_tuned_file():
    assert arm_problem("tuned", read_evidence(LOADED_TUNED, [TUNED])) is None
    aiter = arm_problem("tuned", read_evidence("", [TUNED]), {"VLLM_ROCM_USE_AITER": "1"})
    assert "VLLM_ROCM_USE_AITER=0" in aiter and "none seen" in aiter
    misnamed = arm_problem("tuned", read_evidence(DEFAULT_OLD, [TUNED]))
    assert "does not match" in misnamed and SHIPPED in misnamed
    assert "instead of the tuned file" in arm_problem(
        "tuned", read_evidence(LOADED_SHIPPED, [TUNED])
    )


def test_untuned_arm_may_use_a_shipped_file_but_not_the_tuned_one():
    shipped = read_evidence(LOADED_SHIPPED, [TUNED])
    assert arm_problem("untuned", shipped) is None and arm_label("untuned", shipped) == "shipped"
    assert arm_label("untuned", read_evidence(DEFAULT_OLD, [TUNED])) == "untuned"
    assert "must not see the tuned folder" in arm_problem(
        "untuned", read_evidence(LOADED_TUNED, [TUNED])
    )
