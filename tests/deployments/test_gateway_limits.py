"""The gateway shields Triton from bodies that would harm it: real nginx in front of a real tritonserver 2.51,
which a 12 MB JSON body whose data is longer than its shape crashes with SIGSEGV when it reaches it."""

import http.client
import http.server
import json
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest
import requests

from demo.iris import MAX_BATCH_SIZE, build_iris_model_dir
from modelyard_agent.adapters.triton import gateway_request_limit
from modelyard_agent.formats.request_limits import ENVELOPE_BYTES, RequestLimit, request_limit, signature_bound
from modelyard_agent.formats.triton_config import parse_model_config
from modelyard_agent.runtimes.gateway import TritonGateway
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.deployments.test_gateway import BODY
from tests.deployments.test_triton_runtime import MODEL, load_config, put_iris
from tests.fixtures.services import free_port

pytestmark = pytest.mark.integration

# The body of the advisory: a JSON infer request whose data (3 million numbers, 12 MB) is far longer than
# the shape it declares ([1, 4]).
CRASHING = json.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",
                                   "data": [0.5] * 3_000_000}]}).encode()


@pytest.fixture
def shielded(triton_server, tmp_path, gateway_dir):
    """iris v1 on a real Triton behind a running gateway, which holds iris's limit as a deployment sets it."""
    put_iris(triton_server.model_repository, tmp_path, versions=[1])
    TritonRuntime(triton_server.http_url, load_timeout=120).load(MODEL, load_config(triton_server, [1]))
    front = TritonGateway(gateway_dir, free_port(), triton=triton_server.http_url.removeprefix("http://"),
                          listen_host="127.0.0.1")
    front.ensure_running()
    config_text = (triton_server.model_repository / MODEL / "config.pbtxt").read_text()
    front.limit = gateway_request_limit(front, {"config_text": config_text})
    front.set_request_limit(MODEL, front.limit.bytes)
    front.url = f"http://127.0.0.1:{front.listen_port}"
    front.config_text = config_text
    yield front
    front.stop()


@pytest.fixture
def gateway_dir():
    """A directory for a gateway's files that nginx's workers can reach (they run as nobody under a root
    agent, and read and write request bodies over client_body_buffer_size in its tmp/)."""
    home = Path(tempfile.mkdtemp(prefix="modelyard-gateway-limits-"))
    home.chmod(0o711)
    yield home / "gateway"
    shutil.rmtree(home, ignore_errors=True)


def _good(url: str) -> requests.Response:
    return requests.post(f"{url}/v2/models/{MODEL}/infer", json=BODY, timeout=30)


def _chunked(host: str, port: int, path: str, body: bytes, chunk: int) -> tuple[int, bytes]:
    """POST ``body`` in chunks of ``chunk`` bytes (Transfer-Encoding: chunked, no Content-Length)."""
    connection = http.client.HTTPConnection(host, port, timeout=60)
    try:
        connection.putrequest("POST", path)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        for start in range(0, len(body), chunk):
            piece = body[start:start + chunk]
            connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        connection.send(b"0\r\n\r\n")
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_iris_takes_the_bound_of_its_signature(tmp_path):
    assert MAX_BATCH_SIZE > 1
    text = (build_iris_model_dir(tmp_path, name=MODEL) / "config.pbtxt").read_text()
    # One FP32 input of dims [4]: MAX_BATCH_SIZE × 4 elements, 32 characters each in JSON, plus the envelope.
    expected = MAX_BATCH_SIZE * 4 * 32 + ENVELOPE_BYTES + 1024
    assert signature_bound(parse_model_config(text)) == expected
    limit = request_limit(text, overrides=None, host_default=1 << 26)
    assert (limit.bytes, limit.basis) == (expected, "signature")
    # A deployment's max_batch_size counts; its own limit wins; nothing goes above the host's.
    assert request_limit(text, overrides={"max_batch_size": 2}, host_default=1 << 26).bytes == 2 * 4 * 32 + \
        ENVELOPE_BYTES + 1024
    assert request_limit(text, overrides=None, host_default=1 << 26, deployment_limit=5000).bytes == 5000
    assert request_limit(text, overrides=None, host_default=10000) == RequestLimit(10000, "host")
    variable = text.replace("dims: [ 4 ]", "dims: [ -1 ]")
    assert request_limit(variable, overrides=None, host_default=1 << 26) == RequestLimit(1 << 26, "host")


def test_the_crashing_body_is_refused_with_413_naming_the_limit_and_triton_stays_live(shielded, triton_server):
    refused = requests.post(f"{shielded.url}/v2/models/{MODEL}/infer", data=CRASHING, timeout=60,
                            headers={"Content-Type": "application/json"})
    assert refused.status_code == 413, refused.text[:300]
    said = refused.json()
    assert said["limit_bytes"] == shielded.limit.bytes and said["body_bytes"] == len(CRASHING)
    assert said["model"] == MODEL and f"limit of {shielded.limit.bytes} bytes for iris" in said["error"]
    # The same through the path that names a version.
    named = requests.post(f"{shielded.url}/v2/models/{MODEL}/versions/1/infer", data=CRASHING, timeout=60)
    assert named.status_code == 413 and named.json()["limit_bytes"] == shielded.limit.bytes
    assert TritonRuntime(triton_server.http_url).is_live()
    assert triton_server.process.poll() is None
    good = _good(shielded.url)
    assert good.status_code == 200 and good.json()["model_version"] == "1"


def test_a_chunked_body_over_the_limit_is_refused_too_and_one_within_it_is_answered(shielded, triton_server):
    status, body = _chunked("127.0.0.1", shielded.listen_port, f"/v2/models/{MODEL}/infer", CRASHING[:200_000],
                            chunk=64)
    assert status == 413 and json.loads(body)["body_bytes"] == 200_000
    # A good request in 3-byte chunks (thousands of tiny chunks: the vector of CVE-2025-23310) is answered.
    status, body = _chunked("127.0.0.1", shielded.listen_port, f"/v2/models/{MODEL}/infer",
                            json.dumps(BODY).encode(), chunk=3)
    assert status == 200 and json.loads(body)["model_name"] == MODEL, body[:300]
    assert triton_server.process.poll() is None and _good(shielded.url).status_code == 200


def test_a_model_without_a_limit_of_its_own_takes_the_hosts(triton_server, tmp_path, gateway_dir):
    put_iris(triton_server.model_repository, tmp_path, versions=[1])
    TritonRuntime(triton_server.http_url, load_timeout=120).load(MODEL, load_config(triton_server, [1]))
    front = TritonGateway(gateway_dir, free_port(), triton=triton_server.http_url.removeprefix("http://"),
                          listen_host="127.0.0.1", max_request_bytes=1 << 20)
    front.ensure_running()
    try:
        assert front.request_limits() == {"default": 1 << 20, "models": {}}
        url = f"http://127.0.0.1:{front.listen_port}"
        refused = requests.post(f"{url}/v2/models/{MODEL}/infer", data=CRASHING, timeout=60)
        assert refused.status_code == 413 and refused.json()["limit_bytes"] == 1 << 20
        assert "over the limit of 1048576 bytes (the default of this host)" in refused.json()["error"]
        # A chunked body past the host's ceiling: nginx's own 413, in the same JSON.
        status, body = _chunked("127.0.0.1", front.listen_port, f"/v2/models/{MODEL}/infer",
                                CRASHING[: 2 << 20], chunk=16384)
        assert status == 413 and json.loads(body)["limit_bytes"] == 1 << 20
        assert triton_server.process.poll() is None and _good(url).status_code == 200
    finally:
        front.stop()


def test_limits_survive_a_restart_of_the_gateway_and_bad_ones_are_refused(shielded):
    held = shielded.request_limits()
    assert held["models"] == {MODEL: shielded.limit.bytes}
    shielded.stop()
    shielded.ensure_running()
    assert shielded.request_limits() == held
    with pytest.raises(ValueError):
        shielded.set_request_limit(MODEL, 0)
    assert shielded.set_request_limit("other", 1 << 40)["models"]["other"] == shielded.max_request_bytes
    assert shielded.set_request_limit("other", None)["models"] == {}
    assert shielded.request_limits()["models"] == {MODEL: shielded.limit.bytes}


def test_huge_headers_are_refused_by_the_gateway_and_triton_stays_live(shielded, triton_server):
    answer = requests.post(f"{shielded.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30,
                           headers={"X-Padding": "a" * 20000})
    assert answer.status_code in (400, 431) and triton_server.process.poll() is None
    assert _good(shielded.url).status_code == 200


class _Recorder(http.server.BaseHTTPRequestHandler):
    """An upstream that records the framing headers of each request it gets, to see what the gateway sends."""

    seen: list[dict] = []
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 - the handler's protocol
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        type(self).seen.append({"content-length": self.headers.get("Content-Length"),
                                "transfer-encoding": self.headers.get("Transfer-Encoding")})
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_a_chunked_client_body_reaches_the_runtime_with_a_content_length(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    front = TritonGateway(tmp_path / "gateway", free_port(), triton=f"127.0.0.1:{port}", listen_host="127.0.0.1")
    front.ensure_running()
    try:
        body = json.dumps(BODY).encode()
        status, _ = _chunked("127.0.0.1", front.listen_port, f"/v2/models/{MODEL}/infer", body, chunk=5)
        assert status == 200
        assert _Recorder.seen == [{"content-length": str(len(body)), "transfer-encoding": None}]
    finally:
        front.stop()
        server.shutdown()


def _stalled(port: int, request: bytes, wait: float) -> bytes:
    """Send ``request`` (a head, or a head and part of a body), then nothing; return what the gateway sends
    back before it closes the connection (b"" for a plain close), within ``wait`` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as client:
        client.sendall(request)
        received = b""
        while chunk := client.recv(4096):
            received += chunk
        return received


def test_a_client_that_stalls_in_its_headers_or_its_body_is_cut_off_before_anything_reaches_triton(tmp_path):
    """With 1-s client timeouts (30 s and 15 s by default), a client that stops sending is cut off by nginx,
    and the runtime sees no request at all; a client that keeps sending is answered."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Recorder", (_Recorder,), {"seen": []}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    front = TritonGateway(tmp_path / "gateway", free_port(), triton=f"127.0.0.1:{server.server_address[1]}",
                          listen_host="127.0.0.1", client_header_timeout=1, client_body_timeout=1)
    front.ensure_running()
    path = f"/v2/models/{MODEL}/infer"
    try:
        # A read timeout of 20 s is longer than the cut-off configured here but not than the 30-s default:
        # a socket.timeout below means the setting did not take.
        head_only = _stalled(front.listen_port, f"POST {path} HTTP/1.1\r\nHost: gateway\r\n".encode(), wait=20)
        part_body = _stalled(front.listen_port, (f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Length: 1000"
                                                 "\r\nContent-Type: application/json\r\n\r\n{\"inputs\"").encode(),
                             wait=20)
        for received in (head_only, part_body):
            assert received == b"" or received.startswith(b"HTTP/1.1 408"), received
        assert server.RequestHandlerClass.seen == []
        body = json.dumps(BODY).encode()
        status, _ = _chunked("127.0.0.1", front.listen_port, path, body, chunk=len(body))
        assert status == 200 and len(server.RequestHandlerClass.seen) == 1
    finally:
        front.stop()
        server.shutdown()


def test_the_gateway_listens_where_gateway_listen_says_and_else_at_the_inference_urls_port(
        agent_settings, tmp_path, triton_server):
    from modelyard_agent.adapters.triton import triton_gateway

    chosen = free_port()
    agent_settings(model_repository=triton_server.model_repository, staging_dir=tmp_path / "staging",
                   triton_url=triton_server.http_url, gateway_listen=f"127.0.0.1:{chosen}")
    front = triton_gateway("http://gpu-0.internal:8000")  # the registered URL's port is not where it listens
    assert (front.listen_port, front.listen) == (chosen, f"127.0.0.1:{chosen}")
    front.ensure_running()
    try:
        assert requests.get(f"http://127.0.0.1:{chosen}/v2/health/live", timeout=10).status_code == 200
    finally:
        front.stop()
    agent_settings(model_repository=triton_server.model_repository, staging_dir=tmp_path / "staging",
                   triton_url=triton_server.http_url, gateway_listen="")
    assert triton_gateway("http://gpu-0.internal:8000").listen == "8000"  # every address, the URL's port
    assert triton_gateway("http://127.0.0.1:8000").listen == "127.0.0.1:8000"
