"""Wire contracts that need protoc (a subprocess) or a server: generated code is current,
the Oxia protocol matches the official definition, and a Replicate stream runs over loopback.

The reference for the Oxia client protocol is the ``client.proto`` shipped in the
official ``oxia`` package (a test dependency). It is located without importing
``oxia`` and compiled with grpc_tools.protoc into a FileDescriptorSet, then compared
element by element with the descriptor of our generated ``oxia_client_pb2``.
"""

from __future__ import annotations

import difflib
import importlib.util
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, text_format

from quorumstore.proto import oxia_client_pb2, oxia_client_pb2_grpc, replication_pb2_grpc
from quorumstore.proto import replication_pb2 as rpb

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OXIA_PACKAGE = "io.streamnative.oxia.proto"
FDP = descriptor_pb2.FieldDescriptorProto
U64_MAX = 2**64 - 1


# --------------------------------------------------------------------- helpers


def _reference_client_proto() -> Path:
    spec = importlib.util.find_spec("oxia")  # top-level: locates, does not import
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the official `oxia` package is not installed (pip install -e '.[test]')")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "internal" / "proto" / "client.proto"
        if candidate.is_file():
            return candidate
    pytest.fail(f"client.proto not found under {list(spec.submodule_search_locations)}")


def _default_json_name(name: str) -> str:
    """protoc's default JSON name: drop each '_' and upper-case the letter after it."""
    out, upper = [], False
    for ch in name:
        if ch == "_":
            upper = True
        else:
            out.append(ch.upper() if upper else ch)
            upper = False
    return "".join(out)


def _fill_json_names(messages) -> None:
    # Generated modules embed descriptors without json_name while protoc's
    # descriptor sets spell it out; an explicit json_name is kept and compared.
    for msg in messages:
        for field in msg.field:
            if not field.HasField("json_name"):
                field.json_name = _default_json_name(field.name)
        _fill_json_names(msg.nested_type)


def _compile(proto: Path, tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    out = tmp_path / f"{proto.stem}.pb"
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={proto.parent}",
        f"--descriptor_set_out={out}",
        "--include_imports",
        proto.name,
    ]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    assert result.returncode == 0, f"protoc failed on {proto}:\n{result.stderr}"
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (fdp,) = [f for f in fds.file if f.name == proto.name]
    _fill_json_names(fdp.message_type)
    return fdp


def _ours() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto()
    oxia_client_pb2.DESCRIPTOR.CopyToProto(fdp)
    _fill_json_names(fdp.message_type)
    return fdp


def _label(value: int) -> str:
    return FDP.Label.Name(value)


def _type(value: int) -> str:
    return FDP.Type.Name(value)


def _flatten_messages(messages, prefix: str = "") -> dict[str, descriptor_pb2.DescriptorProto]:
    out: dict[str, descriptor_pb2.DescriptorProto] = {}
    for msg in messages:
        name = f"{prefix}{msg.name}"
        out[name] = msg
        out.update(_flatten_messages(msg.nested_type, f"{name}."))
    return out


def _flatten_enums(
    fdp: descriptor_pb2.FileDescriptorProto,
) -> dict[str, descriptor_pb2.EnumDescriptorProto]:
    out = {e.name: e for e in fdp.enum_type}
    for name, msg in _flatten_messages(fdp.message_type).items():
        out.update({f"{name}.{e.name}": e for e in msg.enum_type})
    return out


def _field_summary(msg: descriptor_pb2.DescriptorProto, field: FDP) -> dict[str, object]:
    oneof = msg.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else None
    return {
        "number": field.number,
        "type": _type(field.type),
        "label": _label(field.label),
        "type_name": field.type_name,
        "json_name": field.json_name,
        "proto3_optional": field.proto3_optional,
        "oneof": oneof,
        "default_value": field.default_value,
        "options": text_format.MessageToString(field.options, as_one_line=True),
    }


def descriptor_mismatches(
    ref: descriptor_pb2.FileDescriptorProto, ours: descriptor_pb2.FileDescriptorProto
) -> list[str]:
    """Every difference that matters on the wire or to generated code, as text."""
    problems: list[str] = []

    def missing_or_extra(kind: str, ref_names, our_names) -> set[str]:
        sep = "" if kind.endswith(".") else " "
        for name in sorted(set(ref_names) - set(our_names)):
            problems.append(f"{kind}{sep}{name}: missing in ours")
        for name in sorted(set(our_names) - set(ref_names)):
            problems.append(f"{kind}{sep}{name}: not in the reference")
        return set(ref_names) & set(our_names)

    for attr in ("package", "syntax"):
        r, o = getattr(ref, attr), getattr(ours, attr)
        if r != o:
            problems.append(f"file {attr}: reference {r!r}, ours {o!r}")
    if list(ref.dependency) != list(ours.dependency):
        problems.append(
            f"file imports: reference {list(ref.dependency)}, ours {list(ours.dependency)}"
        )

    # Services and methods.
    ref_svcs = {s.name: s for s in ref.service}
    our_svcs = {s.name: s for s in ours.service}
    for svc in sorted(missing_or_extra("service", ref_svcs, our_svcs)):
        ref_m = {m.name: m for m in ref_svcs[svc].method}
        our_m = {m.name: m for m in our_svcs[svc].method}
        for name in sorted(missing_or_extra(f"rpc {svc}.", ref_m, our_m)):
            for attr in ("input_type", "output_type", "client_streaming", "server_streaming"):
                r, o = getattr(ref_m[name], attr), getattr(our_m[name], attr)
                if r != o:
                    problems.append(f"rpc {svc}.{name} {attr}: reference {r!r}, ours {o!r}")

    # Messages, nested ones included (map entries).
    ref_msgs = _flatten_messages(ref.message_type)
    our_msgs = _flatten_messages(ours.message_type)
    for name in sorted(missing_or_extra("message", ref_msgs, our_msgs)):
        rm, om = ref_msgs[name], our_msgs[name]
        if rm.options != om.options:
            problems.append(
                f"message {name} options: reference {text_format.MessageToString(rm.options, as_one_line=True)!r}, "
                f"ours {text_format.MessageToString(om.options, as_one_line=True)!r}"
            )
        r_oneofs = [o.name for o in rm.oneof_decl]
        o_oneofs = [o.name for o in om.oneof_decl]
        if r_oneofs != o_oneofs:
            problems.append(f"message {name} oneofs: reference {r_oneofs}, ours {o_oneofs}")
        for attr in ("reserved_range", "reserved_name", "extension_range"):
            if list(getattr(rm, attr)) != list(getattr(om, attr)):
                problems.append(f"message {name} {attr} differ")
        r_fields = {f.name: f for f in rm.field}
        o_fields = {f.name: f for f in om.field}
        for fname in sorted(missing_or_extra(f"field {name}.", r_fields, o_fields)):
            rs, os_ = _field_summary(rm, r_fields[fname]), _field_summary(om, o_fields[fname])
            for key in rs:
                if rs[key] != os_[key]:
                    problems.append(
                        f"field {name}.{fname} {key}: reference {rs[key]!r}, ours {os_[key]!r}"
                    )

    # Enums.
    ref_enums, our_enums = _flatten_enums(ref), _flatten_enums(ours)
    for name in sorted(missing_or_extra("enum", ref_enums, our_enums)):
        r_vals = {v.name: v.number for v in ref_enums[name].value}
        o_vals = {v.name: v.number for v in our_enums[name].value}
        for vname in sorted(missing_or_extra(f"enum value {name}.", r_vals, o_vals)):
            if r_vals[vname] != o_vals[vname]:
                problems.append(
                    f"enum value {name}.{vname}: reference {r_vals[vname]}, ours {o_vals[vname]}"
                )
        if ref_enums[name].options != our_enums[name].options:
            problems.append(f"enum {name} options differ")
    return problems


def _normalized(fdp: descriptor_pb2.FileDescriptorProto) -> str:
    """Text of a descriptor minus what cannot reach the wire: file name, options, docs."""
    copy = descriptor_pb2.FileDescriptorProto()
    copy.CopyFrom(fdp)
    copy.ClearField("name")
    copy.ClearField("options")
    copy.ClearField("source_code_info")
    return text_format.MessageToString(copy)


# ---------------------------------------------------------- generated code


def test_generated_code_is_up_to_date():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, (
        "python/quorumstore/proto/ is stale; run `python scripts/gen_proto.py`\n"
        + result.stdout
        + result.stderr
    )


# ----------------------------------------------------- Oxia compatibility


def test_oxia_descriptor_matches_reference(tmp_path):
    ref = _compile(_reference_client_proto(), tmp_path)
    ours = _ours()
    assert ref.package == OXIA_PACKAGE
    problems = descriptor_mismatches(ref, ours)
    assert not problems, "oxia_client.proto differs from the official client.proto:\n  " + (
        "\n  ".join(problems)
    )
    # Catch-all: nothing else differs either (declaration order included).
    if _normalized(ref) != _normalized(ours):
        diff = "\n".join(
            difflib.unified_diff(
                _normalized(ref).splitlines(),
                _normalized(ours).splitlines(),
                "reference",
                "ours",
                lineterm="",
            )
        )
        pytest.fail(f"descriptors differ beyond the compared attributes:\n{diff}")


def test_our_proto_source_compiles_to_the_generated_descriptor(tmp_path):
    from_source = _compile(ROOT / "proto" / "oxia_client.proto", tmp_path)
    assert _normalized(from_source) == _normalized(_ours())


def test_oxia_stub_uses_reference_method_paths(tmp_path, recording_channel):
    ref = _compile(_reference_client_proto(), tmp_path)
    (service,) = ref.service
    expected = {
        f"/{ref.package}.{service.name}/{m.name}": (m.client_streaming, m.server_streaming)
        for m in service.method
    }
    channel = recording_channel
    oxia_client_pb2_grpc.OxiaClientStub(channel)
    assert channel.methods == expected


class _EchoFollower(replication_pb2_grpc.ReplicationServicer):
    """Acks every Append at its last entry (or at 0 for a heartbeat)."""

    def Replicate(self, request_iterator, context):
        for append in request_iterator:
            head = append.entries[-1].offset if append.entries else 0
            yield rpb.Ack(
                namespace=append.namespace,
                shard=append.shard,
                term=append.term,
                head_offset=head,
                commit_offset=append.commit_offset,
                status=rpb.OK,
            )


def test_replicate_stream_over_loopback():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    replication_pb2_grpc.add_ReplicationServicer_to_server(_EchoFollower(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = replication_pb2_grpc.ReplicationStub(channel)
            appends = [
                rpb.Append(
                    namespace="ns",
                    shard=1,
                    term=2,
                    commit_offset=offset - 1,
                    entries=[rpb.LogEntry(term=2, offset=offset, checksum=offset, payload=b"p")],
                    leader_name="leader:1",
                )
                for offset in (1, 2, 3)
            ]
            acks = list(stub.Replicate(iter(appends), timeout=10))
    finally:
        server.stop(grace=None)
    assert [(a.head_offset, a.commit_offset, a.status) for a in acks] == [
        (1, 0, rpb.OK),
        (2, 1, rpb.OK),
        (3, 2, rpb.OK),
    ]
