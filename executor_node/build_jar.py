#!/usr/bin/env python3
"""Build the quorumstore StateStoreProvider jar offline, without sbt or Maven Central.

    python executor_node/build_jar.py           # build if sources changed; print the jar path
    python executor_node/build_jar.py --force   # rebuild unconditionally

Compiles executor_node/src/main/scala with the Scala 2.13 compiler that ships inside the
pyspark wheel (classpath: pyspark/jars/*, which also holds Spark and the shaded gRPC),
adds the Oxia client descriptor set generated from proto/oxia_client.proto and the list of
settings (python/quorumstore/spark/conf_keys.txt), and writes
executor_node/target/quorumstore-state-store.jar. A fingerprint of the inputs is stored in
the jar, so an unchanged tree is not rebuilt. Classes are compiled in a temporary
directory: the only file left behind is the jar.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = HERE / "src" / "main" / "scala"
#: Model checks of the provider's data structures (main methods), run by the Spark tests.
CHECK_SOURCES = HERE / "src" / "test" / "scala"
PROTO = ROOT / "proto" / "oxia_client.proto"
JAR = HERE / "target" / "quorumstore-state-store.jar"
#: Where the provider looks for the descriptor set (OxiaWire.DescriptorResource).
DESCRIPTOR_RESOURCE = "io/quorumstore/spark/state/oxia_client.desc"
#: The list of every spark.quorumstore.* setting, shared with Python (QuorumConf.KeysResource).
CONF_KEYS = ROOT / "python" / "quorumstore" / "spark" / "conf_keys.txt"
CONF_KEYS_RESOURCE = "io/quorumstore/spark/state/conf_keys.txt"
FINGERPRINT_ENTRY = "META-INF/quorumstore-build.sha256"


def pyspark_jars() -> Path:
    try:
        import pyspark
    except ImportError as e:
        raise SystemExit("pyspark is not installed: pip install 'quorumstore[spark]'") from e
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    if not any(jars.glob("scala-compiler_*.jar")) and not any(jars.glob("scala-compiler-*.jar")):
        raise SystemExit(
            f"no scala-compiler jar in {jars}: this pyspark wheel cannot compile Scala"
        )
    return jars


def scala_sources() -> list[Path]:
    files = sorted(SOURCES.rglob("*.scala"))
    if not files:
        raise SystemExit(f"no Scala sources under {SOURCES}")
    return files


def fingerprint(sources: list[Path], jars: Path) -> str:
    """Digest of everything the jar is made from, including this script and pyspark's version."""
    digest = hashlib.sha256()
    for path in [*sources, PROTO, CONF_KEYS, Path(__file__).resolve()]:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(",".join(sorted(p.name for p in jars.glob("spark-*.jar"))).encode())
    return digest.hexdigest()


def built_fingerprint() -> str | None:
    try:
        with zipfile.ZipFile(JAR) as jar:
            return jar.read(FINGERPRINT_ENTRY).decode()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def compile_scala(sources: list[Path], jars: Path, out: Path) -> None:
    java = shutil.which("java")
    if java is None:
        raise SystemExit("no `java` on PATH: a JDK 17+ is needed to compile the provider")
    cmd = [
        java,
        "-Xss8m",
        "-cp",
        f"{jars}{os.sep}*",
        "scala.tools.nsc.Main",
        "-usejavacp",
        "-deprecation",
        "-feature",
        "-d",
        str(out),
        *map(str, sources),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"scalac failed (exit {result.returncode})")
    if result.stdout.strip() or result.stderr.strip():
        sys.stderr.write(result.stdout + result.stderr)


def write_descriptor_set(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={PROTO.parent}",
        f"--descriptor_set_out={target}",
        "--include_imports",
        PROTO.name,
    ]
    result = subprocess.run(cmd, cwd=PROTO.parent, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit("protoc failed: is grpcio-tools installed? (pip install grpcio-tools)")


def write_jar(classes: Path, digest: str) -> None:
    """Zip `classes` into JAR atomically, so a concurrent reader never sees half a jar."""
    JAR.parent.mkdir(parents=True, exist_ok=True)
    partial = JAR.with_suffix(".jar.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
        jar.writestr(
            "META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: build_jar.py\r\n\r\n"
        )
        for path in sorted(classes.rglob("*")):
            if path.is_file():
                jar.write(path, path.relative_to(classes).as_posix())
        jar.writestr(FINGERPRINT_ENTRY, digest)
    partial.replace(JAR)


def build(force: bool = False) -> Path:
    """Build the jar unless it is up to date; return its path."""
    jars = pyspark_jars()
    sources = scala_sources()
    digest = fingerprint(sources, jars)
    # Serialise concurrent builds (test workers, bench); the lock lives outside the tree.
    lock_name = f"quorumstore-jar-{hashlib.sha256(str(JAR).encode()).hexdigest()[:16]}.lock"
    with open(Path(tempfile.gettempdir()) / lock_name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and built_fingerprint() == digest:
            return JAR
        with tempfile.TemporaryDirectory(prefix="quorumstore-jar-") as tmp:
            classes = Path(tmp)
            compile_scala(sources, jars, classes)
            write_descriptor_set(classes / DESCRIPTOR_RESOURCE)
            shutil.copyfile(CONF_KEYS, classes / CONF_KEYS_RESOURCE)
            write_jar(classes, digest)
    return JAR


def check_classpath(out: Path) -> str:
    """Compiles the provider and its checks into `out`; the class path to run a check with."""
    jars = pyspark_jars()
    compile_scala([*scala_sources(), *sorted(CHECK_SOURCES.rglob("*.scala"))], jars, out)
    return f"{out}{os.pathsep}{jars}{os.sep}*"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    print(build(force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
