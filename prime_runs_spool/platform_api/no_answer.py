"""What a request that got no answer means: not sent where no connection was made (to the
platform, or to the proxy it goes through), else in doubt; and the reason, in the words a
person fixes it by. One wording for every request sync makes, the platform's and Prime
Traces' (platform_api/traces.py), so a retry line reads alike whichever service failed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prime_runs_spool.errors import FailureKind, PlatformError

if TYPE_CHECKING:
    import httpx

    from prime_runs_spool.platform_api.proxy import Proxy


#: What a gateway in front of a service answers for it (502: bad gateway; 504: its timeout):
#: the request may have reached the service and been acted on, so it is in doubt, as one
#: with no answer is. The platform's and Prime Traces' alike (their gateways are one).
GATEWAY_STATUSES = (502, 504)
#: Rate limited: the request was not acted on.
RATE_LIMITED = 429
#: A redirect that says the request was acted on where it went (RFC 9110: the result of
#: processing it is elsewhere), as a create answered in the post/redirect/get way: in doubt.
#: Any other redirect says it was not acted on here. Sync follows none, to the platform or to
#: Prime Traces: the API key, and the episodes, would go wherever it leads.
SEE_OTHER = 303


def answered_kind(status: int) -> FailureKind:
    """A retryable status as a failure kind: rate limited, not acted on (``NOT_SENT``); a
    gateway's, in doubt; another (500, 503: the service answered, done with the request)
    ``ANSWERED``."""
    if status == RATE_LIMITED:
        return FailureKind.NOT_SENT
    return FailureKind.IN_DOUBT if status in GATEWAY_STATUSES else FailureKind.ANSWERED


def classify_transport_error(method: str, path: str, exc: httpx.TransportError,
                             proxy: Proxy | None = None) -> PlatformError:
    """A request with no answer: not sent where it could not connect (to the platform, or to
    the ``proxy`` it goes through, which a proxy's refusal of the tunnel is too), else in doubt."""
    import httpx

    if proxy is not None and isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError)):
        why = transport_reason(exc, host=proxy.host)
        return PlatformError(FailureKind.NOT_SENT,
                             f"{method} {path}: cannot connect through the proxy {proxy.shown} (from {proxy.variable}: "
                             f"{why}); check it, or add the platform's host to NO_PROXY")
    why = transport_reason(exc)
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return PlatformError(FailureKind.NOT_SENT, f"{method} {path}: cannot connect ({why})")
    return PlatformError(FailureKind.IN_DOUBT, f"{method} {path}: no answer ({why})")


def transport_reason(exc: BaseException, host: str | None = None) -> str:
    """Why a request got no answer, in the words a person fixes it by: the connection was
    refused, the host's name did not resolve (naming the host: a typo is the usual cause),
    TLS failed, or a wait timed out; else the exception's own class. ``host``: the one
    connected to, where it is not the request's (a proxy)."""
    import httpx

    host = host or _host_of(exc)
    text = " ".join(str(part) for part in (exc, exc.__cause__, exc.__context__) if part is not None)
    lowered = text.lower()
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    if "name or service not known" in lowered or "name resolution" in lowered or "nodename nor servname" in lowered \
            or "no address associated" in lowered or "getaddrinfo" in lowered:
        return f"host name {host or '?'} not resolved"
    if "refused" in lowered:
        return f"connection refused by {host or 'the host'}"
    if "ssl" in lowered or "certificate" in lowered or "tls" in lowered:
        said = next((str(part) for part in (exc, exc.__cause__, exc.__context__) if part is not None and str(part)),
                    type(exc).__name__)
        return f"TLS failed with {host or 'the host'}: {said[:160]}"
    if "reset" in lowered:
        return "connection reset"
    return type(exc).__name__


def _host_of(exc: BaseException) -> str | None:
    try:
        url = exc.request.url  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return None
    port = f":{url.port}" if url.port else ""
    return f"{url.host}{port}"
