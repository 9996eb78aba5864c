"""``rediss://``: TLS to a real redis-server, failing closed on a wrong CA or hostname."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest

from tests.redis_harness import REDIS_SERVER, free_port
from typedq import App, BrokerError

pytestmark = [pytest.mark.redis, pytest.mark.asyncio_only]


class Ping(msgspec.Struct):
    n: int


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


# The extensions a strict verifier asks for. Python 3.13 turns on VERIFY_X509_STRICT in
# ssl.create_default_context(), which refuses a CA without keyUsage and a certificate without
# an authority key identifier; writing them all out (instead of relying on the defaults in the
# system's openssl.cnf) makes the certificates the same on every interpreter and OpenSSL.
CA_EXTENSIONS = """\
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""

SERVER_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
subjectAltName = {san}
"""


def request_config(common_name: str, extensions: str = "") -> str:
    """An openssl ``req`` config of its own, so the system's openssl.cnf adds nothing."""
    return (
        "[req]\nprompt = no\ndistinguished_name = dn\n"
        f"[dn]\nCN = {common_name}\n"
        f"[ext]\n{extensions}"
    )


def make_ca(cwd: Path, name: str) -> None:
    (cwd / f"{name}.cnf").write_text(request_config(name, CA_EXTENSIONS))
    openssl(
        "req",
        "-x509",
        "-config",
        f"{name}.cnf",
        "-extensions",
        "ext",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        cwd=cwd,
    )


def make_server_cert(cwd: Path, ca: str, name: str, san: str) -> None:
    (cwd / f"{name}.cnf").write_text(request_config("typedq-test-server"))
    openssl(
        "req",
        "-new",
        "-config",
        f"{name}.cnf",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        cwd=cwd,
    )
    (cwd / f"{name}.ext").write_text(SERVER_EXTENSIONS.format(san=san))
    openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.crt",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        cwd=cwd,
    )


def strict_context(cafile: Path) -> ssl.SSLContext:
    """The client context of Python 3.13 on every interpreter: strict X.509 checks included."""
    context = ssl.create_default_context(cafile=str(cafile))
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    return context


class TlsRedis:
    def __init__(self, certs: Path, cert: str) -> None:
        self.port = free_port()
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--tls-cert-file",
                str(certs / f"{cert}.crt"),
                "--tls-key-file",
                str(certs / f"{cert}.key"),
                "--tls-ca-cert-file",
                str(certs / "ca.crt"),
                "--tls-auth-clients",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(certs),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            self._wait_ready(certs)
        except BaseException:
            self.stop()  # a server that never became ready must not outlive the test
            raise

    def _wait_ready(self, certs: Path) -> None:
        context = strict_context(certs / "ca.crt")
        context.check_hostname = False
        deadline = time.monotonic() + 10
        while True:
            try:
                raw = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
                with context.wrap_socket(raw) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def certs() -> Iterator[Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make test certificates")
    folder = Path(tempfile.mkdtemp(prefix="typedq-tls-"))
    make_ca(folder, "ca")
    make_ca(folder, "other-ca")
    make_server_cert(folder, "ca", "good", "DNS:localhost,IP:127.0.0.1")
    make_server_cert(folder, "ca", "wrong-name", "DNS:elsewhere.example")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def tls_app(server: TlsRedis, certs: Path, ca: str) -> tuple[App, object]:
    url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={certs / f'{ca}.crt'}"
    app = App("tls", broker=url)

    @app.task
    async def echo(ping: Ping) -> Ping:
        return ping

    return app, echo


@pytest.mark.anyio
async def test_rediss_runs_jobs_end_to_end(certs: Path) -> None:
    server = TlsRedis(certs, "good")
    try:
        app, _ = tls_app(server, certs, "ca")
        echo = app.tasks["echo"]
        with anyio.fail_after(20):
            async with app, app.worker(concurrency=2):
                job = await echo.enqueue(Ping(n=5))
                assert await job.result(timeout=10) == Ping(n=5)
    finally:
        server.stop()


@pytest.mark.anyio
@pytest.mark.parametrize(("cert", "ca"), [("good", "other-ca"), ("wrong-name", "ca")])
async def test_rediss_fails_closed(certs: Path, cert: str, ca: str) -> None:
    """An untrusted CA, or a certificate for another host name, is refused."""
    server = TlsRedis(certs, cert)
    try:
        app, _ = tls_app(server, certs, ca)
        echo = app.tasks["echo"]
        with anyio.fail_after(30), pytest.raises(BrokerError) as info:
            async with app:
                await echo.enqueue(Ping(n=1))
        message = str(info.value)
        assert "certificate verify failed" in message, message
        assert "pw" not in message
    finally:
        server.stop()


def test_certificates_pass_strict_verification(certs: Path) -> None:
    """The test CA and server certificate satisfy VERIFY_X509_STRICT (Python 3.13's default),
    checked on every interpreter so an older one cannot hide a certificate 3.13 refuses."""
    server = TlsRedis(certs, "good")
    try:
        context = strict_context(certs / "ca.crt")
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as sock,
        ):
            sock.sendall(b"PING\r\n")
            assert sock.recv(16).startswith(b"+PONG")
    finally:
        server.stop()
