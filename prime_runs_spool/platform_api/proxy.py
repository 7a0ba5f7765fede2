"""The proxy a request to the platform goes through, as the environment names it.

Why: the sync sends on a transport of its own (``deadline.AnswerDeadlineTransport``), and
httpx reads ``HTTP_PROXY`` and its kin only for a client that has none; so a CI job behind a
proxy, where vf-eval's own pushes (httpx's defaults) go out, saw every sync request fail to
connect. The variables are read as the standard library and httpx read them: ``http_proxy``,
``https_proxy`` or ``all_proxy`` (either case, the lower-case one winning), ``no_proxy`` a
comma-separated list of host names (a suffix matches, ``*`` matches every host). A loopback
host (``localhost``, 127.0.0.0/8, ``::1``: ``--local``'s platform) never goes through one.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from prime_runs_spool.content.mask_text import mask_given_url
from prime_runs_spool.errors import InvalidSettingsError

#: The proxy schemes httpx's transport speaks without an extra package (SOCKS needs socksio).
SUPPORTED_SCHEMES = ("http", "https")


@dataclass(frozen=True)
class Proxy:
    """A proxy URL and the variable it came from, for a message that names both."""

    url: str
    variable: str

    @property
    def shown(self) -> str:
        """The URL as a message may print it: a password in it masked, one holding white
        space too (``mask_given_url``): it was printed in every retry's line."""
        return mask_given_url(self.url)

    @property
    def host(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def proxy_for(url: str) -> Proxy | None:
    """The proxy the environment names for ``url``, or None (none set, or ``no_proxy``
    names its host). Raises :class:`InvalidSettingsError` for a proxy this transport cannot
    use, at once, rather than a failure on every request."""
    if not any(name[-6:].lower() == "_proxy" for name in os.environ):
        return None  # the common case, without importing urllib.request (start-up)
    from urllib.request import getproxies_environment, proxy_bypass_environment

    proxies = getproxies_environment()
    scheme = urlsplit(url).scheme
    key = scheme if proxies.get(scheme) else "all"
    value = proxies.get(key)
    host = urlsplit(url).hostname
    if not value or not host or _is_loopback(host) or proxy_bypass_environment(host, proxies):
        return None
    proxy = Proxy(value if "://" in value else f"http://{value}", _variable(key, value))
    try:
        parts = urlsplit(proxy.url)
        port = parts.port
    except ValueError as exc:
        # An unclosed ``[``, a port that is no port (``:99999``, ``:abc``): it ended in 'internal
        # error: ValueError: Invalid IPv6 URL', or in every run's 'Port out of range 0-65535'.
        # Neither the URL nor Python's words are shown: the "port" of ``http://user:secret``
        # (the host left out) is a password, which no mask of a userinfo finds.
        why = str(exc).split(" as '", 1)[0].rstrip(".").lower()
        raise InvalidSettingsError(f"{proxy.variable}: not a proxy this sync can use (a URL that cannot be read: "
                                   f"{why}); correct it, or add the platform's host to NO_PROXY") from None
    if parts.scheme.lower() not in SUPPORTED_SCHEMES or not parts.hostname or port == 0:
        raise InvalidSettingsError(
            f"{proxy.variable}={proxy.shown}: not a proxy this sync can use (an http:// or https:// proxy URL"
            f"{', port 0 cannot be connected to' if port == 0 else ''}); correct it, or add the platform's host "
            "to NO_PROXY")
    return proxy


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine (``--local``'s platform, a test server): a proxy
    elsewhere cannot reach it, so it is never asked to."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _variable(key: str, value: str) -> str:
    """Which variable set ``key``'s proxy to ``value`` (the lower-case one is read first)."""
    for name in (f"{key}_proxy", f"{key.upper()}_PROXY"):
        if os.environ.get(name) == value:
            return name
    return f"{key.upper()}_PROXY"
