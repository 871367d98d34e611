"""Builds the state-store provider jar with the Scala compiler inside the pyspark wheel.

    python -m quorumstore.spark.jar_build           # build if stale; print the jar's path
    python -m quorumstore.spark.jar_build --force   # rebuild unconditionally

The jar is built when the wheel is built (setup.py runs `build` into the wheel's package
data), so an installed quorumstore carries it and needs no Scala sources; in an editable
checkout, `quorumstore.spark.state_store.state_store_jar` runs `build` on first use.
Neither sbt nor Maven Central is needed: the compiler and every class the provider links
against (Spark, the shaded gRPC) are the jars of the installed pyspark.

The jar holds the compiled executor_node/src/main/scala, the Oxia client descriptor set
(serialized from the generated `quorumstore.proto.oxia_client_pb2`, so no protoc is
needed) and the list of settings (conf_keys.txt). A fingerprint of the inputs is stored
in the jar, so an unchanged tree is not rebuilt. This module imports nothing of
quorumstore at load time: setup.py loads it by path, before the package is installed.
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
from typing import Any

PACKAGE = Path(__file__).resolve().parent
#: The checkout's root when this module runs from one (editable install or wheel build).
ROOT = PACKAGE.parents[2]
SOURCES = ROOT / "executor_node" / "src" / "main" / "scala"
#: Model checks of the provider's data structures (main methods), run by the Spark tests.
CHECK_SOURCES = ROOT / "executor_node" / "src" / "test" / "scala"
#: Where the jar lives inside the package; also its path relative to a wheel's build dir.
JAR_IN_PACKAGE = Path("quorumstore") / "spark" / "jars" / "quorumstore-state-store.jar"
JAR = PACKAGE.parents[1] / JAR_IN_PACKAGE
PB2 = PACKAGE.parent / "proto" / "oxia_client_pb2.py"
#: Where the provider looks for the descriptor set (OxiaWire.DescriptorResource).
DESCRIPTOR_RESOURCE = "io/quorumstore/spark/state/oxia_client.desc"
#: The list of every spark.quorumstore.* setting, shared with Python (QuorumConf.KeysResource).
CONF_KEYS = PACKAGE / "conf_keys.txt"
CONF_KEYS_RESOURCE = "io/quorumstore/spark/state/conf_keys.txt"
FINGERPRINT_ENTRY = "META-INF/quorumstore-build.sha256"


class JarBuildError(RuntimeError):
    """The jar cannot be built here (no pyspark, no JDK, no sources, a compile error)."""


def have_sources() -> bool:
    """True when running from a checkout, which holds the provider's Scala sources."""
    return SOURCES.is_dir()


def pyspark_jars() -> Path:
    try:
        import pyspark
    except ImportError as e:
        raise JarBuildError("pyspark is not installed: pip install 'quorumstore[spark]'") from e
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    if not any(jars.glob("scala-compiler_*.jar")) and not any(jars.glob("scala-compiler-*.jar")):
        raise JarBuildError(f"no scala-compiler jar in {jars}: this pyspark cannot compile Scala")
    return jars


def scala_sources() -> list[Path]:
    files = sorted(SOURCES.rglob("*.scala"))
    if not files:
        raise JarBuildError(f"no Scala sources under {SOURCES}: the jar is built from a checkout")
    return files


def fingerprint(sources: list[Path], jars: Path) -> str:
    """Digest of everything the jar is made from, including this module and pyspark's version."""
    digest = hashlib.sha256()
    for path in [*sources, PB2, CONF_KEYS, Path(__file__).resolve()]:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(",".join(sorted(p.name for p in jars.glob("spark-*.jar"))).encode())
    return digest.hexdigest()


def built_fingerprint(jar: Path) -> str | None:
    try:
        with zipfile.ZipFile(jar) as built:
            return built.read(FINGERPRINT_ENTRY).decode()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def compile_scala(sources: list[Path], jars: Path, out: Path) -> None:
    java = shutil.which("java")
    if java is None:
        raise JarBuildError("no `java` on PATH: a JDK 17+ is needed to compile the provider")
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
    if result.stdout.strip() or result.stderr.strip():
        sys.stderr.write(result.stdout + result.stderr)
    if result.returncode != 0:
        raise JarBuildError(f"scalac failed (exit {result.returncode})")


def descriptor_set() -> bytes:
    """The Oxia client's FileDescriptorSet, dependencies first (as protoc --include_imports).

    Taken from the generated module, which embeds its serialized FileDescriptorProto, so
    building the jar needs protobuf but no protoc. The module is loaded by path: at wheel
    build time quorumstore is not importable.
    """
    import importlib.util

    from google.protobuf import descriptor_pb2

    spec = importlib.util.spec_from_file_location("_quorumstore_oxia_client_pb2", PB2)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    files = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(file_descriptor: Any) -> None:
        if file_descriptor.name in seen:
            return
        seen.add(file_descriptor.name)
        for dependency in file_descriptor.dependencies:
            add(dependency)
        file_descriptor.CopyToProto(files.file.add())

    add(module.DESCRIPTOR)
    return files.SerializeToString()


def write_jar(classes: Path, digest: str, jar: Path) -> None:
    """Zip `classes` into `jar` atomically, so a concurrent reader never sees half a jar."""
    jar.parent.mkdir(parents=True, exist_ok=True)
    partial = jar.with_suffix(".jar.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr(
            "META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: quorumstore\r\n\r\n"
        )
        for path in sorted(classes.rglob("*")):
            if path.is_file():
                out.write(path, path.relative_to(classes).as_posix())
        out.writestr(FINGERPRINT_ENTRY, digest)
    partial.replace(jar)


def build(jar: Path = JAR, force: bool = False) -> Path:
    """Builds `jar` unless it is up to date; returns its path."""
    jars = pyspark_jars()
    sources = scala_sources()
    digest = fingerprint(sources, jars)
    # Serialise concurrent builds (test workers, bench); the lock lives outside the tree.
    lock_name = f"quorumstore-jar-{hashlib.sha256(str(jar).encode()).hexdigest()[:16]}.lock"
    with open(Path(tempfile.gettempdir()) / lock_name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and built_fingerprint(jar) == digest:
            return jar
        with tempfile.TemporaryDirectory(prefix="quorumstore-jar-") as tmp:
            classes = Path(tmp)
            compile_scala(sources, jars, classes)
            descriptor = classes / DESCRIPTOR_RESOURCE
            descriptor.parent.mkdir(parents=True, exist_ok=True)
            descriptor.write_bytes(descriptor_set())
            shutil.copyfile(CONF_KEYS, classes / CONF_KEYS_RESOURCE)
            write_jar(classes, digest, jar)
    return jar


def check_classpath(out: Path) -> str:
    """Compiles the provider and its checks into `out`; the class path to run a check with."""
    jars = pyspark_jars()
    compile_scala([*scala_sources(), *sorted(CHECK_SOURCES.rglob("*.scala"))], jars, out)
    return f"{out}{os.pathsep}{jars}{os.sep}*"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--out", type=Path, default=JAR, help=f"the jar to write (default {JAR})")
    args = parser.parse_args(argv)
    try:
        print(build(args.out, force=args.force))
    except JarBuildError as e:
        raise SystemExit(str(e)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
