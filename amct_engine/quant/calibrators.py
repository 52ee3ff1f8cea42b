"""The activation-calibrator table: one entry per PTQ calibration algorithm (docs/spec/engine.md §4.3, §4.10).

Torch-free on purpose, as the weight-quantiser table (quant/registry.py): the calibration cfg reader
(config/calibration_cfg.py) and the PTQ JSON (config/ptq_json.py) read an entry's field names and check
its values without torch; PTQ (ptq.py) builds the observer the entry names. An entry's `params` are the
names of its settings, spelt the same in the calibration `.cfg` message, in the PTQ JSON's
`activation_quant_params` and in `PtqLayerSpec`. Adding a calibrator: its `.cfg` message in
calibration_config_pytorch.proto's `act_algo` oneof (and `PtqLayerSpec` fields for new settings), an
observer class with `from_spec`, and one `register_calibrator` call (docs/architecture.md, "Add an
activation calibrator").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from amct_engine.registry import Registry, load_object

Problems = Callable[[Mapping[str, Any]], Iterator[tuple[str | None, str]]]


def _no_problems(values: Mapping[str, Any]) -> Iterator[tuple[str | None, str]]:
    return iter(())


@dataclass(frozen=True)
class CalibratorEntry:
    name: str  # the short name PtqLayerSpec.act_algo holds ("ifmr")
    cfg_field: str  # its message in the cfg's act_algo oneof, and its act_algo value in the PTQ JSON
    params: tuple[str, ...]  # the settings it reads (cfg field = JSON key = PtqLayerSpec field)
    implementation: str  # "package.module:Class": an observer with `from_spec(spec, batch_num, asymmetric)`
    # (param or None for the whole message, what is wrong) for each bad value of its settings
    problems: Problems = _no_problems

    def observer_class(self) -> type:
        return load_object(self.implementation)


CALIBRATORS: Registry[CalibratorEntry] = Registry("activation calibrator")


def register_calibrator(entry: CalibratorEntry, *, replace: bool = False) -> CalibratorEntry:
    return CALIBRATORS.register(entry.name, entry, replace=replace)


def by_cfg_field(cfg_field: str) -> CalibratorEntry | None:
    return next((entry for entry in CALIBRATORS.values() if entry.cfg_field == cfg_field), None)


def cfg_fields() -> tuple[str, ...]:
    return tuple(entry.cfg_field for entry in CALIBRATORS.values())


# docs/spec/engine.md §1.6: the bin counts HFMG accepts.
HFMG_BINS = (1024, 2048, 4096, 8192)


def _ifmr_problems(values: Mapping[str, Any]) -> Iterator[tuple[str | None, str]]:
    start, end, step = values["search_range_start"], values["search_range_end"], values["search_step"]
    if not (0 < start < end and step > 0):
        yield None, "IFMR needs 0 < search_range_start < search_range_end and search_step > 0"
    for name in ("max_percentile", "min_percentile"):
        if not 0 < values[name] <= 1:
            yield name, f"{name} must be in (0, 1]"


def _hfmg_problems(values: Mapping[str, Any]) -> Iterator[tuple[str | None, str]]:
    if values["num_of_bins"] not in HFMG_BINS:
        yield "num_of_bins", f"num_of_bins must be one of {', '.join(map(str, HFMG_BINS))}, got {values['num_of_bins']}"


register_calibrator(
    CalibratorEntry(
        "ifmr",
        "ifmr_quantize",
        ("search_range_start", "search_range_end", "search_step", "max_percentile", "min_percentile"),
        "amct_engine.quant.ifmr:IfmrObserver",
        _ifmr_problems,
    )
)
register_calibrator(
    CalibratorEntry("hfmg", "hfmg_quantize", ("num_of_bins",), "amct_engine.quant.hfmg:HfmgObserver", _hfmg_problems)
)
