"""Which CPU a deploy model is written for, and so how its INT8 weights are stored.

onnxruntime's x86 u8s8 kernels without VNNI (AVX2 `vpmaddubsw`) add pairs of uint8 x int8 products
in saturating 16-bit lanes: 2 x 255 x 127 > 32767, so full-range int8 weights give wrong sums there
(docs/spec/engine.md §5, "Weight codes of the deploy model"). VNNI (`vpdpbusd`, 32-bit sums) and ARM's
dot-product kernels are exact. So:
- "x86_vnni", "arm": signed int8 weights with zero point 0, ORT's fast U8S8 kernels;
- "x86_avx2": the convs' weights as 7-bit codes (-64..63, the record's clip range: 2 x 255 x 64 < 32768, so
  no pair saturates), signed with zero point 0: the same fast u8s8 kernels, exact; what onnxruntime's own
  quantiser calls `reduce_range`. MobileNetV2 at batch 1 / 8 ran 0.43x / 0.66x FP32's time so, 0.77x / 0.96x
  on the u8u8 kernels. Depthwise convs keep 8 bits (exact kernel), Linear / MatMul layers the record's 8 bits
  as uint8 + 128 (export/save.py `weight_codes`);
- "x86_avx2_reduce_range": as "x86_avx2", and the Linear / MatMul layers' weights as 7-bit signed codes too, on
  the fast u8s8 kernels instead of the exact u8u8 ones (what onnxruntime's `quantize_dynamic` runs, with its
  `reduce_range` for exactness). On the BBC task model (all-MiniLM-L6-v2 + a head, PTQ, AVX2 without VNNI):
  one-thread CPU time 0.60x / 0.59x FP32's at batch 1 / 32 against 0.73x / 0.70x with "x86_avx2"
  (quantize_dynamic: 0.65x / 0.60x), held-out accuracy 0.9640 against 0.9685 (FP32 0.9662;
  docs/benchmarks.md, "Transformers on AVX2"). Opt-in: the deploy model then no longer computes the PyTorch
  model's 8-bit Linear weights;
- "x86_avx2_u8u8": the record's 8-bit integers as uint8 codes + 128 (zero point 128), ORT's exact but
  slower u8u8 kernels: the deploy model computes the fake-quant model's weights bit for bit;
- "x86_amx" (AMX-INT8, e.g. Xeon Sapphire Rapids): as "x86_vnni", and each conv's weight zero point written
  so that ORT runs the conv on its QGEMM path, which uses AMX tiles (export/conv_int8_paths.py
  `convs_on_the_gemm_path`: the same zeros, not constant to the kernel);
- "auto": the exporting machine's kind (`/proc/cpuinfo` flags, `platform.machine()`).
Torch-free so that the API and the CLI can list the choices.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

from amct_engine.registry import Registry


@dataclass(frozen=True)
class DeployTarget:
    """A CPU kind a deploy model is written for: how its int8 weights are stored, and which of the deploy
    finaliser's target-specific conv rewrites apply (export/qdq/finalize.py `TARGET_REWRITES` names them)."""

    name: str
    signed_weights: bool  # int8 codes with zero point 0 (exact here); else uint8 codes + 128
    rewrites: tuple[str, ...] = ()
    weight_bits: int = 8  # the widest conv weight code the target's kernels sum exactly (export/save.py weight_codes)
    # Linear / MatMul weight codes where `weight_bits` < 8: 8 (uint8 + 128, the exact u8u8 kernels) or the
    # signed `weight_bits` codes of the convs (the fast u8s8 kernels; export/save.py weight_codes)
    reduce_linear: bool = False


TARGETS: Registry[DeployTarget] = Registry("deploy target")
DEFAULT_DEPLOY_TARGET = "auto"  # the exporting machine's kind (detect_deploy_target)
# The rewrites a target may name: the keys of export/qdq/finalize.py `TARGET_REWRITES` (a test holds them
# equal), listed here so that a target naming another fails when it is registered, not at its first save.
REWRITE_NAMES = ("float_stems", "padded_input_channels", "gemm_path_convs")


def register_deploy_target(target: DeployTarget, *, replace: bool = False) -> DeployTarget:
    unknown = [name for name in target.rewrites if name not in REWRITE_NAMES]
    if unknown:
        known = ", ".join(REWRITE_NAMES)
        raise ValueError(f"deploy target {target.name!r}: unknown rewrite {unknown[0]!r}; known: {known}")
    if target.name == DEFAULT_DEPLOY_TARGET:
        raise ValueError(f"deploy target {target.name!r}: the name is reserved for the exporting machine's kind")
    return TARGETS.register(target.name, target, replace=replace)


def deploy_target_names() -> tuple[str, ...]:
    """Every `deploy_target` a save, a job or the CLI accepts: "auto" first."""
    return (DEFAULT_DEPLOY_TARGET, *TARGETS)


# the float stem before the channel padding (export/conv_float_stems.py, export/conv_int8_paths.py)
register_deploy_target(DeployTarget("x86_amx", True, ("float_stems", "gemm_path_convs")))
register_deploy_target(DeployTarget("x86_vnni", True, ("float_stems", "padded_input_channels")))
register_deploy_target(DeployTarget("x86_avx2", True, ("float_stems", "padded_input_channels"), weight_bits=7))
register_deploy_target(
    DeployTarget("x86_avx2_reduce_range", True, ("float_stems", "padded_input_channels"), 7, reduce_linear=True)
)
register_deploy_target(DeployTarget("x86_avx2_u8u8", False))
register_deploy_target(DeployTarget("arm", True))


def check_deploy_target(name: object) -> str:
    if not isinstance(name, str) or name not in deploy_target_names():
        raise ValueError(f"deploy_target: unknown value {name!r}; choose one of {', '.join(deploy_target_names())}")
    return str(name)


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def detect_deploy_target(machine: str | None = None, flags: set[str] | None = None) -> str:
    """The kind of this machine: "arm", "x86_amx" (AMX-INT8), "x86_vnni" (AVX512-VNNI or AVX-VNNI) or
    "x86_avx2"."""
    machine = (machine or platform.machine()).lower()
    if machine.startswith(("aarch64", "arm")):
        return "arm"
    flags = cpu_flags() if flags is None else flags
    if "amx_int8" in flags:
        return "x86_amx"
    return "x86_vnni" if flags & {"avx512_vnni", "avx_vnni"} else "x86_avx2"


def resolve_deploy_target(name: str = DEFAULT_DEPLOY_TARGET) -> str:
    """A concrete target: `name` itself, or the exporting machine's kind for "auto"."""
    name = check_deploy_target(name)
    return detect_deploy_target() if name == "auto" else name
