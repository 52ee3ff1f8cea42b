"""What a `.cfg` is good for: parsed by the engine's loader, with a verdict for each job kind that takes it.

POST /v1/configs stores the summary with the cfg and POST /v1/jobs reads its verdict for the job's kind
(service/job_submission.py); `amct compress` judges a local cfg with the same two functions before its
engine starts (service/local_compress.py). FastAPI-free, so the CLI does not import the app for it.
"""

from __future__ import annotations

from typing import Any

from job_host.kinds import JOB_KINDS, kinds_for_cfg
from service.job_rules import JobRuleError


def summarise_cfg(text: str | bytes, kind: str, filename: str) -> dict:
    """Parse (ConfigError on a bad file) and say which job kinds accept the cfg, and why not.

    Each job kind that takes a cfg of this `kind` gets a verdict: its engine API family's check
    (docs/spec/engine.md §1.2-§1.4), or just the parse when it names none (job_host/kinds.py).
    """
    if kind == "llm":
        return _summarise_llm(text)
    # Imported on first use: the engine pulls in torch, which the API needs for nothing else.
    from amct_engine.config.cfg_checks import check_cfg_for_api
    from amct_engine.config.cfg_loader import parse_cfg_document
    from amct_engine.config.errors import ConfigError

    doc = parse_cfg_document(text, kind, filename)
    job_kinds: dict[str, dict[str, Any]] = {}
    for job_kind in kinds_for_cfg(kind):
        try:
            if job_kind.engine_api is not None:
                check_cfg_for_api(doc, job_kind.engine_api)  # type: ignore[arg-type]  # an ENGINE_APIS name
            job_kinds[job_kind.name] = {"ok": True}
        except ConfigError as e:
            job_kinds[job_kind.name] = {"ok": False, "detail": str(e), "line": e.line, "column": e.column}
    return {"job_kinds": job_kinds}


def _summarise_llm(text: str | bytes) -> dict:
    """An amct.quantize config dict as JSON (docs/spec/llm.md §2): LlmConfigError (a ConfigError whose `field` is
    the dotted path, e.g. quant_cfg.weights.group_size) unless it parses; every llm kind takes what parses."""
    from amct_engine.llm.config import describe_config, load_config_json, parse_config  # torch-free

    cfg = parse_config(load_config_json(text))
    return {"job_kinds": {k.name: {"ok": True} for k in kinds_for_cfg("llm")}, "llm": describe_config(cfg)}


def check_cfg_suits(summary: dict, cfg_kind: str, kind_name: str, what: str, field: str) -> None:
    """JobRuleError (naming `field`) unless the cfg (`what`: how a message calls it) of `cfg_kind` whose summary
    is `summary` suits a job of kind `kind_name`."""
    kind = JOB_KINDS[kind_name]
    if cfg_kind != kind.cfg_kind:
        raise JobRuleError(f"{what} is a {cfg_kind} cfg; a {kind_name} job needs a {kind.cfg_kind} cfg", field)
    verdict = summary.get("job_kinds", {}).get(kind_name)
    if verdict is None:  # the cfg was checked at upload, before this job kind was registered
        raise JobRuleError(
            f"{what} was uploaded before the job kind {kind_name} existed; upload it again to have it checked for "
            "that kind",
            field,
        )
    if not verdict["ok"]:
        raise JobRuleError(
            f"{what} does not suit {kind_name}: {verdict['detail']}",
            field,
            line=verdict.get("line"),
            column=verdict.get("column"),
        )
