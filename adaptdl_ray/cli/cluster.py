"""The one cluster a command talks to, found from ``--address`` or ``RAY_ADDRESS``.

Every verb takes whatever address people use for Ray (``RAY_API_SERVER_ADDRESS`` or
``RAY_ADDRESS`` when ``--address`` is not given):

* the dashboard URL (``http://HEAD:8265``, what ``ray job submit`` takes);
* the GCS address (``HEAD:6379``, what ``ray start --head`` prints);
* a Ray Client address (``ray://HEAD:10001``);
* ``auto``: the one Ray instance running on this machine.

Without any, the cluster is found as ``ray job submit`` finds it: the dashboard at
``127.0.0.1:8265``, else the Ray instance on this machine. An explicit address is the only
cluster a command talks to: Job Submission goes to its dashboard, and a verb that joins
as a Ray driver (``ls`` for the allocator's trials, ``start``, ``status``) joins by that
cluster's own GCS address (a dashboard URL's is asked of the cluster itself, see
:mod:`.gcs_address`), never by a search among the machine's instances. No contact waits
without bound (:func:`~adaptdl_ray.cli.errors.answer_within`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlparse

from adaptdl_ray.cli.errors import PROG, CliError, answer_within

__all__ = ["Cluster", "ADDRESS_VARS", "DEFAULT_DASHBOARD", "contact_timeout_s",
           "TIMEOUT_ENV"]

#: The variables an address is read from when ``--address`` is not given (Ray's own).
ADDRESS_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
#: Where ``ray job submit`` looks first without an address.
DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
#: Seconds a verb waits for a cluster's answer before it gives up (default 30).
TIMEOUT_ENV = "ADAPTDL_CLI_TIMEOUT_S"
# One HTTP request to a dashboard, or one TCP connection: an instance that does not
# answer this soon is taken as unresponsive.
_QUICK_S = 5.0


def contact_timeout_s() -> float:
    """Seconds a verb waits for a cluster (``$ADAPTDL_CLI_TIMEOUT_S``, default 30: a
    driver joining a busy cluster takes a few seconds).

    Raises:
        CliError: the variable is not a number of seconds > 0."""
    text = os.environ.get(TIMEOUT_ENV, "30")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise CliError(f"{TIMEOUT_ENV}={text!r}: must be a number of seconds > 0")
    return value


def _kind(address: str | None) -> str:
    """``search``, ``auto``, ``dashboard``, ``client`` or ``gcs``."""
    if address is None:
        return "search"
    if address == "auto":
        return "auto"
    scheme = urlparse(address).scheme if "://" in address else ""
    if scheme in ("http", "https"):
        return "dashboard"
    if scheme == "ray":
        return "client"
    if scheme:
        raise CliError(f"address {address!r}: use the dashboard URL http://HEAD:8265, the GCS "
                       "address HEAD:6379, ray://HEAD:10001 or auto")
    return "gcs"


def _listening(address: str) -> bool:
    """Whether something accepts connections at ``address`` (a URL or ``host:port``)."""
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    if not parsed.hostname or parsed.port is None:
        return True  # (let Ray judge an address without a port)
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=_QUICK_S):
            return True
    except OSError:
        return False


class Cluster:
    """The cluster a command talks to (see the module docstring).

    Args:
        address: what the user gave (``None``: search as ``ray job submit`` does).
        source: where it came from (``--address``, ``RAY_ADDRESS``...), for messages.
    """

    def __init__(self, address: str | None, source: str | None = None) -> None:
        self.address = address
        self.source = source
        self.kind = _kind(address)
        self._jobs: Any = None
        self._session: str | None = None
        self._dashboard: str | None = address if self.kind == "dashboard" else None

    @classmethod
    def from_options(cls, opts: argparse.Namespace) -> "Cluster":
        """The cluster of parsed options: ``--address``, else the address variables."""
        if getattr(opts, "address", None):
            return cls(opts.address, "--address")
        for var in ADDRESS_VARS:
            if os.environ.get(var):
                return cls(os.environ[var], var)
        return cls(None)

    def describe(self) -> str:
        """How messages name the cluster."""
        if self.kind == "search":
            return "the local Ray cluster"
        if self.kind == "auto":
            return "the Ray instance on this machine"
        given = f" (from {self.source})" if self.source and self.source != "--address" else ""
        return f"the cluster at {self.address}{given}"

    # -- Job Submission --------------------------------------------------------------
    def jobs(self) -> Any:
        """The cluster's Job Submission client (made once).

        Raises:
            CliError: nothing answers there, it wants a token, or several Ray instances
                run on this machine and none was named."""
        if self._jobs is None:
            self._jobs = self._job_client()
        return self._jobs

    def _job_client(self) -> Any:
        from ray.job_submission import JobSubmissionClient
        # (Ray's client says at INFO what it uploads and where it connects: not ours to
        # print. Its loggers are configured when Ray is imported, so this comes after.)
        for name in ("ray", "ray.dashboard.modules.dashboard_sdk"):
            logging.getLogger(name).setLevel(logging.WARNING)
        target = self.address
        if self.kind == "search":
            target = DEFAULT_DASHBOARD if _listening(DEFAULT_DASHBOARD) else "auto"
        if target.startswith(("http://", "https://")):
            self._dashboard = target
            self._session = self._dashboard_session(target)
        elif self.kind == "gcs" and not _listening(target):
            raise self.no_cluster()
        with answer_within(contact_timeout_s(), self.describe(), self._fix()):
            try:
                return JobSubmissionClient(target)
            except Exception as exc:  # noqa: BLE001 - each of Ray's errors as one line
                raise self._error(exc) from None

    def _dashboard_session(self, url: str) -> str | None:
        """The Ray session the dashboard at ``url`` serves (``None``: it does not say).

        Raises:
            CliError: nothing listens there, or it does not answer within a few seconds."""
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/api/version",
                                        timeout=_QUICK_S) as reply:
                return json.loads(reply.read().decode()).get("session_name")
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise self._token_error() from None
            return None
        except (socket.timeout, TimeoutError):
            raise CliError(f"{self.describe()} accepts connections but did not answer within "
                           f"{_QUICK_S:g} s: is its Ray instance hung? {self._fix()}") from None
        except (OSError, ValueError):
            raise self.no_cluster() from None

    def no_cluster(self) -> CliError:
        """The error for an address where no cluster answers."""
        if self.kind == "search":
            where = (f"(no address given: nothing at {DEFAULT_DASHBOARD} and no Ray instance "
                     "on this machine)")
        else:
            where = f"at {self.address}"
            if self.source and self.source != "--address":
                where += f" (from {self.source})"
        return CliError(f"no Ray cluster {where}: start one with `ray start --head`, or pass "
                        "--address (the dashboard URL http://HEAD:8265 or the GCS address "
                        "HEAD:6379)")

    def _fix(self) -> str:
        return ("check that its Ray instance runs (`ray status`), or pass another --address "
                "(the dashboard URL http://HEAD:8265 or the GCS address HEAD:6379); "
                f"{TIMEOUT_ENV} sets how long to wait")

    def _token_error(self) -> CliError:
        return CliError(f"{self.describe()} wants a token: set RAY_AUTH_MODE=token and "
                        "RAY_AUTH_TOKEN to the cluster's token (or put it in "
                        "~/.ray/auth_token)")

    def _error(self, exc: BaseException) -> CliError:
        """One line for an error of Ray's client."""
        import ray
        if isinstance(exc, ray.exceptions.AuthenticationError):
            return self._token_error()
        text = " ".join(str(exc).split())
        if "multiple active Ray instances" in text:
            found = text.split("instances:", 1)[-1].split("}", 1)[0].strip(" {")
            return CliError(f"several Ray instances run on this machine ({found}): name one "
                            "with --address (its dashboard URL or its GCS address HOST:PORT)")
        if isinstance(exc, ConnectionError) or "Could not find any running Ray instance" in text:
            return self.no_cluster()
        return CliError(f"cannot reach {self.describe()}: {text or type(exc).__name__}")

    # -- joining as a driver -------------------------------------------------------------
    def driver_address(self) -> str:
        """The address a Ray driver joins this cluster by: the GCS or Ray Client address
        given, ``auto`` for the one local instance, else the GCS address the cluster behind
        the dashboard reports (see :mod:`.gcs_address`).

        Raises:
            CliError: the cluster cannot be reached or cannot tell its GCS address."""
        if self.kind in ("gcs", "client", "auto"):
            return self.address
        self.jobs()  # (finds the dashboard, when searching)
        if self._dashboard is None:
            return "auto"  # (a search that found the local instance, not a dashboard)
        from adaptdl_ray.cli.gcs_address import gcs_address
        with answer_within(contact_timeout_s(), self.describe(), self._fix()):
            return gcs_address(self._dashboard, self.jobs(), self._session)

    def connect(self) -> None:
        """Join the cluster as a Ray driver (bounded in time), quietly.

        Raises:
            CliError: it cannot be joined (one line, with the fix)."""
        import ray
        address = self.driver_address()
        with answer_within(contact_timeout_s(), f"{self.describe()} (joined at {address})",
                           self._fix()):
            try:
                ray.init(address=address, log_to_driver=False,
                         logging_level=logging.WARNING)
            except Exception as exc:  # noqa: BLE001 - each of Ray's errors as one line
                raise self._error(exc) from None
        joined = ray.get_runtime_context().get_session_name()
        if self._session is not None and joined != self._session:
            ray.shutdown()
            raise CliError(f"{address} is Ray session {joined}, not the cluster whose "
                           f"dashboard is {self._dashboard} ({self._session}): pass its GCS "
                           f"address with --address; `{PROG}` cached the wrong one")
