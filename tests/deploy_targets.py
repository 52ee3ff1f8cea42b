"""Which deploy target a test compares with the PyTorch eval model bit for bit, on the CPU it runs on.

`auto` on an AVX2 CPU without VNNI stores 7-bit weight codes (export/deploy_target.py), so its file is exact
to itself but not to the eval model's 8-bit codes; `x86_avx2_u8u8` stores the record's codes there.
"""

from __future__ import annotations

from amct_engine.export.deploy_target import TARGETS, detect_deploy_target


def record_exact_target() -> str:
    """This CPU's target whose deploy file computes the record's 8-bit weight codes with exact kernels."""
    auto = TARGETS[detect_deploy_target()]
    return auto.name if auto.weight_bits == 8 else "x86_avx2_u8u8"


def full_int8_exact_here() -> bool:
    """True where int8 weights of the full 8-bit range (x86_vnni's, arm's) sum exactly on this CPU."""
    auto = TARGETS[detect_deploy_target()]
    return auto.signed_weights and auto.weight_bits == 8
