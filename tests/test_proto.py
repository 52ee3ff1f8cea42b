"""The committed _pb2 modules are what `make proto` generates from the .proto files."""

from __future__ import annotations

import glob
import os
import shutil

import pytest

grpc_tools = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (dev extra) regenerates the protos")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO_DIR = os.path.join("amct_engine", "proto")


def test_committed_pb2_modules_match_their_proto_files(tmp_path):
    protos = sorted(glob.glob(os.path.join(ROOT, PROTO_DIR, "*.proto")))
    assert len(protos) == 5
    # Generate from a copy so the import paths ("amct_engine/proto/x.proto") are the same as `make proto`.
    shutil.copytree(
        os.path.join(ROOT, PROTO_DIR),
        tmp_path / PROTO_DIR,
        ignore=shutil.ignore_patterns("*_pb2.py", "*_pb2.pyi", "__pycache__"),
    )
    args = ["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    args += [os.path.join(tmp_path, PROTO_DIR, os.path.basename(p)) for p in protos]
    assert grpc_tools.main(args) == 0
    for proto in protos:
        stem = os.path.basename(proto)[: -len(".proto")]
        for suffix in ("_pb2.py", "_pb2.pyi"):
            generated = (tmp_path / PROTO_DIR / f"{stem}{suffix}").read_text()
            with open(os.path.join(ROOT, PROTO_DIR, f"{stem}{suffix}")) as f:
                assert f.read() == generated, f"{stem}{suffix} is out of date: run `make proto`"


def test_an_amct_record_file_round_trips():
    from google.protobuf import text_format

    from amct_engine.proto import scale_offset_record_pytorch_pb2 as record_pb2

    text = """record { key: "layer1.0.conv1" value { scale_d: 0.5 offset_d: -128 scale_w: 0.1 scale_w: 0.2
      offset_w: 0 offset_w: 0 act_type: "INT8" wts_type: "INT8" } }
    prune_record { producer { name: "conv1" attr { name: "type" type: STRING s: "Conv" }
      attr { name: "prune_index" type: INTS ints: 1 ints: 3 } } }"""
    record = text_format.Parse(text, record_pb2.ScaleOffsetRecord())
    assert record.record[0].value.skip_fusion is False  # the repo proto's default (docs/spec/engine.md §2.3)
    assert list(record.prune_record[0].producer[0].attr[1].ints) == [1, 3]
    assert text_format.Parse(text_format.MessageToString(record), record_pb2.ScaleOffsetRecord()) == record
