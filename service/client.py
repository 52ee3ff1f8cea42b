"""A Python client for the service's REST API: what the `amct jobs …` commands and platforms use.

Only httpx (and httpx-sse for the event stream): no torch, no amct_engine, so it installs on any
machine that drives the service. Every error comes back as `ApiError` carrying the problem+json
body (`detail`, `field`); a server that cannot be reached is `ServiceUnreachable`.

    client = AmctClient("http://127.0.0.1:8000", api_key="amct_…")
    model = client.upload_model("cnn.pt", input_shape="1,1,28,28")
    job = client.submit("quant_retrain", model["id"], cfg["id"], data["id"], epochs=1)
    for event in client.events(job["id"]):
        print(event["type"], event.get("progress"))
    client.download_artifact(job["id"], "deploy", "out/")
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import connect_sse


class ApiError(RuntimeError):
    """A non-2xx answer; `problem` is the RFC 9457 body (or a stand-in built from the status)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status, self.problem = status, problem
        self.field = problem.get("field")
        where = f" [{self.field}]" if self.field else ""
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}{where}".strip())


class ServiceUnreachable(ConnectionError):
    """No HTTP answer at all: nothing listens at the URL, a DNS name that does not resolve, a timeout."""

    def __init__(self, base_url: str, cause: httpx.TransportError) -> None:
        self.base_url = base_url
        self.reason = str(cause) or type(cause).__name__
        super().__init__(f"cannot reach {base_url}: {self.reason}")


class ServiceSlow(ServiceUnreachable):
    """The server took the request but did not answer within the read timeout: it is there, but busy."""

    def __init__(self, base_url: str, cause: httpx.TransportError, waited_s: float | None) -> None:
        super().__init__(base_url, cause)
        self.waited_s = waited_s


# An upload is answered after the server's sandboxed check of the file (up to its validate_timeout_s, 300 s
# by default, more on a busy machine): the client waits that long and more, not the 60 s of other requests.
UPLOAD_READ_TIMEOUT_S = 900.0
DEFAULT_TIMEOUT_S = 60.0


class AmctClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`timeout`: seconds per request (DEFAULT_TIMEOUT_S); uploads wait UPLOAD_READ_TIMEOUT_S for their answer."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout or DEFAULT_TIMEOUT_S, transport=transport
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> AmctClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except (httpx.ReadTimeout, httpx.WriteTimeout) as e:
            timeout = kwargs.get("timeout") or self.http.timeout
            raise ServiceSlow(str(self.http.base_url), e, timeout.read) from e
        except httpx.TransportError as e:
            raise ServiceUnreachable(str(self.http.base_url), e) from e
        if response.status_code >= 400:
            raise ApiError(response.status_code, _problem(response))
        return response

    def _json(self, method: str, path: str, **kwargs) -> Any:
        return self._request(method, path, **kwargs).json()

    def _upload(self, path: str, file: str | Path, headers: dict[str, str] | None = None, **fields: str | None) -> dict:
        file = Path(file)
        with file.open("rb") as f:
            return self._json(
                "POST",
                path,
                headers=headers,
                files={"file": (file.name, f)},
                data={k: v for k, v in fields.items() if v is not None},
                timeout=httpx.Timeout(
                    self.http.timeout.connect, read=UPLOAD_READ_TIMEOUT_S, write=UPLOAD_READ_TIMEOUT_S
                ),
            )

    # -- resources ---------------------------------------------------------------------------------
    def me(self) -> dict:
        return self._json("GET", "/v1/me")

    def upload_model(
        self,
        file: str | Path,
        input_shape: str | None = None,
        name: str | None = None,
        input_dtype: str | None = None,
        inputs: str | list | None = None,
        wait: bool = True,
        poll_s: float = 0.5,
    ) -> dict:
        """`inputs`: the signature (a list of {name, shape, dtype}, or its JSON); else `input_shape`.

        The server answers once the file is stored (`Prefer: respond-async`) and checks it in the background;
        with `wait` this polls the model until the check ends and raises ApiError (422, `file`) when it refused
        the model, as a synchronous upload does. Without, the answer is the `validating` model."""
        if inputs is not None and not isinstance(inputs, str):
            inputs = json.dumps(inputs)
        model = self._upload(
            "/v1/models",
            file,
            headers={"Prefer": "respond-async"},
            input_shape=None if inputs else input_shape,
            name=name,
            input_dtype=input_dtype,
            inputs=inputs,
        )
        while wait and model["status"] == "validating":
            time.sleep(poll_s)
            model = self._json("GET", f"/v1/models/{model['id']}")
        if model["status"] == "invalid":
            detail = model.get("status_detail") or "the model was refused"
            raise ApiError(422, {"title": "Unprocessable Content", "detail": detail, "field": "file"})
        return model

    def upload_config(self, file: str | Path, kind: str = "retrain", name: str | None = None) -> dict:
        return self._upload("/v1/configs", file, kind=kind, name=name)

    def upload_dataset(self, file: str | Path, name: str | None = None) -> dict:
        return self._upload("/v1/datasets", file, name=name)

    def submit(
        self,
        kind: str,
        model_id: str,
        config_id: str,
        dataset_id: str,
        idempotency_key: str | None = None,
        **params: Any,
    ) -> dict:
        """`params`: epochs, batch_size, lr, device, eval_fraction, seed, deploy_format (see /docs)."""
        body = {
            "kind": kind,
            "model_id": model_id,
            "config_id": config_id,
            "dataset_id": dataset_id,
            **{k: v for k, v in params.items() if v is not None},
        }
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._json("POST", "/v1/jobs", json=body, headers=headers)

    def list(
        self,
        status: builtins.list[str] | None = None,
        kind: builtins.list[str] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> dict:
        """One page, newest first: `{items, next_cursor}`."""
        params = {"status": status or [], "kind": kind or [], "limit": limit}
        if cursor:
            params["cursor"] = cursor
        return self._json("GET", "/v1/jobs", params=params)

    def get(self, job_id: str) -> dict:
        return self._json("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict:
        return self._json("POST", f"/v1/jobs/{job_id}/cancel")

    def artifacts(self, job_id: str) -> builtins.list[dict]:
        return self._json("GET", f"/v1/jobs/{job_id}/artifacts")["items"]

    def artifact_bytes(self, artifact: dict) -> bytes:
        return self._request("GET", artifact["content_url"]).content

    def download(self, artifact: dict, dest: str | Path) -> Path:
        """Stream one artifact to `dest` (a folder: the artifact's filename inside it)."""
        target = Path(dest)
        if target.is_dir():
            target = target / artifact["filename"]
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.http.stream("GET", artifact["content_url"]) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ApiError(response.status_code, _problem(response))
                with target.open("wb") as f:
                    for chunk in response.iter_bytes():
                        f.write(chunk)
        except httpx.TransportError as e:
            raise ServiceUnreachable(str(self.http.base_url), e) from e
        return target

    def download_artifacts(
        self, job_id: str, dest: str | Path, kinds: builtins.list[str] | None = None, overwrite: bool = False
    ) -> builtins.list[Path]:
        """Every artifact of the job (or those of `kinds`) into the folder `dest`.

        Refuses with FileExistsError, before writing anything, when a file it would write exists,
        unless `overwrite`.
        """
        artifacts = self.artifacts(job_id)
        chosen = [a for a in artifacts if not kinds or a["kind"] in kinds]
        if kinds and not chosen:
            have = ", ".join(sorted({a["kind"] for a in artifacts})) or "none yet"
            raise ApiError(
                404,
                {
                    "title": "Not Found",
                    "field": "kind",
                    "detail": f"job {job_id} has no artifact of kind {', '.join(kinds)} (it has: {have})",
                },
            )
        names = [a["filename"] for a in chosen]
        # Two artifacts may share a filename: those get their kind as a prefix.
        targets = [
            Path(dest) / (a["filename"] if names.count(a["filename"]) == 1 else f"{a['kind']}-{a['filename']}")
            for a in chosen
        ]
        existing = [str(t) for t in targets if t.exists()]
        if existing and not overwrite:
            raise FileExistsError(f"would overwrite {', '.join(existing)}")
        Path(dest).mkdir(parents=True, exist_ok=True)
        return [self.download(a, target) for a, target in zip(chosen, targets, strict=True)]

    def report(self, job_id: str) -> dict | None:
        """The job's report.json, or None before the job has one."""
        report = next((a for a in self.artifacts(job_id) if a["kind"] == "report"), None)
        return None if report is None else self._request("GET", report["content_url"]).json()

    # -- progress ----------------------------------------------------------------------------------
    def events(self, job_id: str, after: int = 0, reconnects: int = 5) -> Iterator[dict]:
        """The job's events (SSE) until the job ends; reconnects with Last-Event-ID if the stream drops."""
        last, failures = after, 0
        while True:
            try:
                headers = {"Last-Event-ID": str(last)} if last else {}
                with connect_sse(
                    self.http,
                    "GET",
                    f"/v1/jobs/{job_id}/events",
                    headers=headers,
                    timeout=httpx.Timeout(self.http.timeout.connect, read=None),
                ) as source:
                    if source.response.status_code >= 400:
                        source.response.read()
                        raise ApiError(source.response.status_code, _problem(source.response))
                    for sse in source.iter_sse():
                        if not sse.data:
                            continue
                        event = sse.json()
                        last, failures = int(sse.id or event.get("seq", last)), 0
                        yield event
                return  # the server ends the stream once the job is finished and drained
            except httpx.TransportError as e:
                failures += 1
                if failures > reconnects:
                    raise ServiceUnreachable(str(self.http.base_url), e) from e
                time.sleep(min(2.0 * failures, 10.0))

    def wait(self, job_id: str) -> dict:
        """Follow the events to the end; returns the finished job."""
        for _ in self.events(job_id):
            pass
        return self.get(job_id)


def _problem(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    return {"title": response.reason_phrase, "status": response.status_code, "detail": response.text[:500]}
