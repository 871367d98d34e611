"""Builds the state-store provider jar into the wheel; everything else is in pyproject.toml.

The jar is compiled from executor_node/src/main/scala with the Scala compiler inside the
pyspark wheel (a build requirement), so an installed quorumstore carries it as package
data and never needs the checkout. Editable installs skip it: there
`quorumstore.spark.state_store.state_store_jar` builds the jar on first use.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

JAR_BUILD = Path(__file__).resolve().parent / "python" / "quorumstore" / "spark" / "jar_build.py"


class BuildPyWithJar(build_py):
    """build_py, then the provider jar into the build directory's package data."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        # Loaded by path: quorumstore itself is not importable while it is being built.
        spec = importlib.util.spec_from_file_location("quorumstore_jar_build", JAR_BUILD)
        assert spec is not None and spec.loader is not None
        jar_build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(jar_build)
        jar = jar_build.build(Path(self.build_lib) / jar_build.JAR_IN_PACKAGE)
        print(f"built {jar}")


setup(cmdclass={"build_py": BuildPyWithJar})
