"""A 12 MB .npz that unpacks to 2 GiB, uploaded to a real `amct serve`: the API streams it and checks
its values in chunks, so the server process's peak RSS stays under 0.6 GB (issue 16 item 5; before,
it read the arrays whole and went from 0.41 to 2.50 GB)."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from tests.service.live_server import LiveServer

pytestmark = pytest.mark.slow

CHUNK = 4 << 20  # float32 elements per chunk written (16 MiB)
CHUNKS = 128  # 2 GiB in all


def _sparse_npz(path) -> int:
    """`inputs` of float32 [2**29] mostly zeros (one value in 800: ~175:1 deflated, under the zip check's
    200:1), written chunk by chunk so the test never holds it whole either. Returns the unpacked size."""
    rng = np.random.default_rng(0)
    chunk = np.zeros(CHUNK, np.float32)
    chunk[rng.integers(0, CHUNK, CHUNK // 800)] = 1.0
    header = {"descr": "<f4", "fortran_order": False, "shape": (CHUNK * CHUNKS,)}
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf,
        zf.open("inputs.npy", "w", force_zip64=True) as f,
    ):
        np.lib.format.write_array_header_1_0(f, header)
        for _ in range(CHUNKS):
            f.write(chunk.tobytes())
    return CHUNK * CHUNKS * 4


def _peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(ln for ln in f if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def test_a_2_gib_npz_is_checked_without_unpacking_it_in_the_api(tmp_path):
    path = tmp_path / "big.npz"
    unpacked = _sparse_npz(path)
    assert path.stat().st_size < 16 << 20 and unpacked == 2 << 30
    server = LiveServer(tmp_path)
    try:
        before = _peak_rss_bytes(server.proc.pid)
        with server.client() as client, open(path, "rb") as f:
            response = client.post("/v1/datasets", files={"file": ("big.npz", f)}, data={"name": "big"}, timeout=300)
        assert response.status_code == 201, response.text
        description = response.json()["description"]
        assert description["arrays"]["inputs"] == {"shape": [CHUNK * CHUNKS], "dtype": "float32", "finite": True}
        peak = _peak_rss_bytes(server.proc.pid)
        print(f"API process peak RSS: {before / 2**30:.2f} GiB before the upload, {peak / 2**30:.2f} GiB after")
        assert peak < 0.6e9, f"peak RSS {peak / 1e9:.2f} GB"
    finally:
        server.stop()
