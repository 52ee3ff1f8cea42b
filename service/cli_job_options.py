"""The job-setting options `amct compress` and `amct jobs submit` share, made once from `JobParams`.

A command decorated with `@job_options(...)` declares only its own options and takes `params: JobParams`;
the decorator adds one typer option per JobParams field to the signature typer reads (the field's default
and description are the option's: job_host/spec.py is where both live), and hands the command the
validated JobParams. A value JobParams refuses ends the command with one line naming the option, before
anything runs or uploads, as POST /v1/jobs would answer it.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from job_host.spec import JobParams, validation_message
from service.cli_common import DeployFormat, DeployTarget, fail

# Fields offered as a fixed list of choices (the tables' names); the others take their plain type.
_CHOICES: dict[str, Any] = {"deploy_format": DeployFormat, "deploy_target": DeployTarget}


def _option_type(name: str, annotation: Any) -> Any:
    if name in _CHOICES:
        return _CHOICES[name]
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(
        annotation
    )
    base = next(a for a in typing.get_args(annotation) if a is not type(None)) if optional else annotation
    base = base if base in (int, float, bool) else str  # a Literal or a table's name: checked by JobParams
    return base | None if optional else base


def _parameter(name: str) -> inspect.Parameter:
    field = JobParams.model_fields[name]
    default = field.default
    if name in _CHOICES and default is not None:
        default = _CHOICES[name](default)
    help_text = (field.description or "").split(";")[0] or None  # the first clause: a help line, not a page
    annotation = Annotated[_option_type(name, field.annotation), typer.Option(help=help_text)]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


def job_options(*, exclude: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command every JobParams field but `exclude` as an option; it receives them as `params`."""
    names = [name for name in JobParams.model_fields if name not in exclude]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "params"]
        added = [_parameter(name) for name in names]

        @functools.wraps(command)
        def run(**options: Any) -> Any:
            values = {name: options.pop(name) for name in names}
            return command(**options, params=params_from_options(values))

        run.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in (*own, *added)}
        return run

    return decorate


def params_from_options(values: dict[str, Any]) -> JobParams:
    """The options' JobParams; a refused value ends the command naming its option."""
    plain = {k: getattr(v, "value", v) for k, v in values.items() if v is not None}
    try:
        return JobParams(**plain)
    except ValidationError as e:
        error = e.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "job"
        raise fail(f"--{name.replace('_', '-')} {plain.get(name)}: {validation_message(error)}") from None
