"""The real Python dynamic-provider host, started and driven the way the Pulumi engine does it.

The engine runs a dynamic resource's provider with the `pulumi-resource-pulumi-python` plugin,
which executes `python -u -m pulumi.dynamic` from the project's virtualenv with the project root as
working directory. The host (pulumi/dynamic/__main__.py of the installed `pulumi` package) binds a
gRPC server to 127.0.0.1 on a free port and prints the port on stdout; the engine reads it and calls
the `pulumirpc.ResourceProvider` service (pulumi/runtime/proto/provider_pb2_grpc.py): `Configure`
with the stack config, then `Check`, `Diff`, `Create`, `Read`, `Update`, `Delete`, each carrying the
resource's properties as a protobuf Struct that includes the serialized provider under `__provider`
(dill, base64), and `Cancel` on the first Ctrl-C. Numbers travel as floats, and a value unknown at
preview as the sentinel string `pulumi.runtime.rpc.UNKNOWN`. The program registers `__provider` as a
secret; the host answers Configure with `acceptSecrets: false`, so the engine sends it unwrapped.

`serialized_training_run` takes the TrainingRun's inputs, `__provider` included, from a mocks run of
`__main__.py` (`tests.harness.program.run_program`), so the host gets what the program really registers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2, json_format, struct_pb2
from pulumi.runtime import rpc
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from tests.harness.program import ROOT, TRAINING_RUN, dev_config, run_program

URN = f"urn:pulumi:dev::eks-ray-train::{TRAINING_RUN}::training"


def serialized_training_run(**overrides: str) -> dict[str, Any]:
    """The TrainingRun's inputs as the program registers them on the dev stack (with `overrides` of
    its config), `__provider` included."""
    plan = run_program(dev_config(**overrides))
    return {key: rpc.unwrap_rpc_secret(value) for key, value in plan.one(TRAINING_RUN).inputs.items()}


def struct(values: Mapping[str, Any]) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(dict(values))
    return message


def plain(message: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(message)


def _default_sigint() -> None:
    """SIGINT at its default in the host, as under an engine run from a terminal. A test run started
    in the background (`nohup`, `&` in a script) ignores SIGINT, and a child inherits an ignored
    signal across exec (POSIX); Python then installs no KeyboardInterrupt handler and SIGINT does
    nothing to the host."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class ProviderHost:
    """One `python -m pulumi.dynamic` process and a gRPC stub to it."""

    env: Mapping[str, str]
    stderr_path: Path
    process: subprocess.Popen = field(init=False)
    stub: provider_pb2_grpc.ResourceProviderStub = field(init=False)

    def start(self) -> ProviderHost:
        self._stderr = self.stderr_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-m", "pulumi.dynamic"],
            cwd=ROOT,
            env=dict(self.env),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,  # the engine gives each plugin its own process group
            preexec_fn=_default_sigint,
        )
        assert self.process.stdout is not None
        port = int(self.process.stdout.readline().decode().strip())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = provider_pb2_grpc.ResourceProviderStub(self.channel)
        return self

    def stop(self) -> None:
        self.channel.close()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self._stderr.close()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def configure(self, config: Mapping[str, Any]) -> None:
        self.stub.Configure(
            provider_pb2.ConfigureRequest(args=struct(config), acceptSecrets=True, acceptResources=True),
            timeout=30,
        )

    def check(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> provider_pb2.CheckResponse:
        return self.stub.Check(
            provider_pb2.CheckRequest(urn=URN, olds=struct(olds), news=struct(news)), timeout=30
        )

    def diff(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> provider_pb2.DiffResponse:
        return self.stub.Diff(
            provider_pb2.DiffRequest(id="run-id", urn=URN, olds=struct(olds), news=struct(news)), timeout=30
        )

    def create(self, properties: Mapping[str, Any], timeout_s: float = 60) -> provider_pb2.CreateResponse:
        return self.stub.Create(
            provider_pb2.CreateRequest(urn=URN, properties=struct(properties), timeout=timeout_s),
            timeout=timeout_s,
        )

    def create_future(self, properties: Mapping[str, Any], timeout_s: float = 60) -> grpc.Future:
        return self.stub.Create.future(
            provider_pb2.CreateRequest(urn=URN, properties=struct(properties), timeout=timeout_s),
            timeout=timeout_s,
        )

    def update(
        self, olds: Mapping[str, Any], news: Mapping[str, Any], timeout_s: float = 60
    ) -> provider_pb2.UpdateResponse:
        """`olds`: the resource's recorded outputs, as the engine sends them (UpdateRequest `olds`)."""
        return self.stub.Update(
            provider_pb2.UpdateRequest(
                id="run-id", urn=URN, olds=struct(olds), news=struct(news), timeout=timeout_s
            ),
            timeout=timeout_s,
        )

    def read(self, properties: Mapping[str, Any]) -> provider_pb2.ReadResponse:
        return self.stub.Read(
            provider_pb2.ReadRequest(
                id="run-id", urn=URN, properties=struct(properties), inputs=struct(properties)
            ),
            timeout=30,
        )

    def delete(self, properties: Mapping[str, Any]) -> None:
        self.stub.Delete(
            provider_pb2.DeleteRequest(id="run-id", urn=URN, properties=struct(properties)), timeout=30
        )

    def cancel(self) -> None:
        self.stub.Cancel(empty_pb2.Empty(), timeout=10)
