// Builds the quorumstore StateStoreProvider jar where sbt and Maven Central are at hand:
//   sbt package   ->  executor_node/target/quorumstore-state-store.jar
// Offline, `python -m quorumstore.spark.jar_build` builds the same jar from the same sources with
// the Scala compiler and Spark jars inside the pyspark wheel.

ThisBuild / scalaVersion := "2.13.18"

val sparkVersion = "4.3.0"

lazy val stateStore = (project in file("."))
  .settings(
    name := "quorumstore-state-store",
    version := "0.1.0",
    scalacOptions ++= Seq("-deprecation", "-feature"),
    Compile / scalaSource := baseDirectory.value / "executor_node" / "src" / "main" / "scala",
    libraryDependencies ++= Seq(
      "org.apache.spark" %% "spark-sql" % sparkVersion % Provided,
      // Carries the shaded gRPC and protobuf runtimes (org.sparkproject.connect.*) OxiaWire uses.
      "org.apache.spark" %% "spark-connect" % sparkVersion % Provided
    ),
    // The Oxia client descriptor set, generated from proto/ exactly as build_jar.py does.
    Compile / resourceGenerators += Def.task {
      val proto = baseDirectory.value / "proto"
      val out = (Compile / resourceManaged).value / "io" / "quorumstore" / "spark" / "state" /
        "oxia_client.desc"
      IO.createDirectory(out.getParentFile)
      val protoc = Seq("python3", "-m", "grpc_tools.protoc", s"--proto_path=$proto",
        s"--descriptor_set_out=$out", "--include_imports", "oxia_client.proto")
      if (scala.sys.process.Process(protoc, proto).! != 0) {
        sys.error("protoc failed: is grpcio-tools installed? (pip install grpcio-tools)")
      }
      Seq(out)
    }.taskValue,
    Compile / packageBin / artifactPath :=
      baseDirectory.value / "executor_node" / "target" / "quorumstore-state-store.jar"
  )
