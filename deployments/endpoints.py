"""Serving-host URLs: checked, normalised, and compared by the endpoint they reach.

A host's ``inference_url`` and ``metrics_url`` take http or https, a host and a port; the inference
URL carries no path (Triton and the BentoML gateway answer at the root), the metrics URL the path of
its exposition (and any scrape parameters Prometheus passes as a query). Neither carries a fragment or
credentials, and the inference URL no query. Two spellings of one endpoint
must compare equal, or two hosts could share an endpoint and every metric would be counted twice:
host names are compared lower-cased, IPv4 literals in every form ``inet_aton`` accepts (``127.1``,
``0x7f.0.0.1``, ``2130706433``, ``127.000.000.001``) as dotted quads, IPv4-mapped IPv6 as IPv4,
``localhost`` as ``127.0.0.1``, and a missing port as the scheme's default (80, 443).
"""

import ipaddress
import socket
from urllib.parse import urlsplit

from modelyard.errors import InvalidInput

DEFAULT_PORTS = {"http": 80, "https": 443}


def _canonical_host(host: str) -> str:
    """The host as it is stored: lower case, IP literals in their canonical form."""
    host = host.lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is None and host and all(part.isalnum() for part in host.split(".")):
        try:  # the short and numeric IPv4 forms a resolver would accept
            address = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            address = None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address is None:
        return host
    return f"[{address}]" if address.version == 6 else str(address)


def normalise_url(value: str, field: str, *, path_allowed: bool) -> str:
    """Check a host URL and return its normalised form.

    Args:
        value: the URL as given, e.g. ``HTTP://GPU-0:8000/``.
        field: the field name, for messages.
        path_allowed: True for a metrics URL (its path names the exposition), False for an
            inference URL (no path).

    Returns:
        ``scheme://host[:port][/path]`` with scheme and host lower-cased, IP literals canonical,
        the scheme's default port dropped and no trailing slash.

    Raises:
        InvalidInput: not http(s), no host, credentials, a query or fragment, a bad port, or a
            path on an inference URL.
    """
    text = value.strip()
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise InvalidInput(f"{field} must be an http:// or https:// URL with a host, got {value!r}")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise InvalidInput(f"{field} must not carry credentials")
    if parts.fragment or text.endswith("#") or ((parts.query or text.endswith("?")) and not path_allowed):
        raise InvalidInput(f"{field} must not carry a query or a fragment, got {value!r}")
    try:
        port = parts.port
    except ValueError as exc:
        raise InvalidInput(f"{field} has an invalid port: {exc}") from exc
    if port == 0:
        raise InvalidInput(f"{field} has an invalid port: 0")
    path = parts.path.rstrip("/")
    if path and not path_allowed:
        raise InvalidInput(f"{field} takes a scheme, a host and a port only, no path; got {value!r}")
    host = _canonical_host(parts.hostname)
    shown_port = "" if port in (None, DEFAULT_PORTS[scheme]) else f":{port}"
    query = f"?{parts.query}" if parts.query else ""
    return f"{scheme}://{host}{shown_port}{path}{query}"


def endpoint_key(url: str) -> tuple[str, str, int, str, str] | None:
    """What two URLs must share to reach the same endpoint: ``(scheme, host, port, path, query)``, with
    ``localhost`` as ``127.0.0.1`` and ``[::1]`` too; None for an empty or unparsable URL (stored
    before URLs were normalised)."""
    if not url:
        return None
    try:
        parts = urlsplit(normalise_url(url, "url", path_allowed=True))
    except InvalidInput:
        return None
    host = parts.hostname or ""
    if host in ("localhost", "::1") or host.endswith(".localhost"):
        host = "127.0.0.1"
    return parts.scheme, host, parts.port or DEFAULT_PORTS[parts.scheme], parts.path, parts.query
