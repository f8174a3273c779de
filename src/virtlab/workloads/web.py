"""web: nginx serving a static page and a CGI program in the environment measured, loaded by wrk
from the native side (seed 001's web server scenario, WebBench's role), requests/s and latency.

Who runs what (``served_by_cell``): the cell runs the server, the peer (default the study's
baseline, the native side) the client, over virtlab's network; the native cell is served over
loopback.

Server, started by virtlab with a configuration of its own (never the system's nginx or its
service), listening only on the environment's address on virtlab's network (``port``: HTTP,
``port + 1``: HTTPS, plus twice the client's slot):

- nginx, run as ``www-data`` (see ``virtlab.workloads._service``), serving ``/page.html``
  (``page_bytes`` of text made per study) and ``/cgi-bin/webcgi`` through FastCGI, all else 404;
  HTTPS with a self-signed RSA-2048 certificate made per study (``openssl req`` on this host),
  TLS 1.2 and 1.3. Its other settings are nginx's defaults (``worker_processes auto``: one
  worker per CPU the environment has; keep-alive connections, closed after 1000 requests).
- fcgiwrap, started beside it with one process per client connection, forks and executes the CGI
  program for each CGI request, as a CGI server does. The program is the ``webcgi`` kernel: it
  reads the page and hashes it ``cgi_rounds`` times (FNV-1a), and the client checks every answer
  against the hash virtlab computed, so a CGI request that did not do its work is an error.

The profiles (seed 001): STD-CGI runs the CGI program for 16% of the HTTP requests and 2% of the
HTTPS requests; MIN-CGI is STD-CGI "without the 16% CGI-HTTP requests" (the seed's words), so 0%
of HTTP and still 2% of HTTPS. ``cgi_http_pct`` / ``cgi_https_pct`` replace a profile's shares.

Client: wrk, with a Lua script (``mix.lua``) that draws each thread's requests from a shuffled
deck of 100 holding exactly the CGI percentage of CGI requests (so the share is exact over every
100 requests of a thread and no connection is favoured), checks every response, and reports its
counts and wrk's latency distribution as 1000 quantiles. wrk cannot mix HTTP and HTTPS in one
run: two wrk clients run at once for ``duration_s``, one over HTTP and one over HTTPS, the
``connections`` split between them by ``https_pct``. Each connection is closed-loop (the next
request when the answer arrived), so the share of *requests* that are HTTPS follows from what
each kind costs the server; it is measured and reported (``https_request_pct``), not set. Every
HTTPS connection makes a full TLS handshake when it opens; when nginx closes it after 1000
requests, wrk connects again and may resume the session (nginx's session tickets): the server's
log counts the requests served on resumed sessions (``tls_resumed_requests``).

Figures:

- ``requests_per_s``: both clients' requests per second (wrk's own), added.
- ``latency_p50_ms``, ``latency_p90_ms``, ``latency_p99_ms``: percentiles of every request's
  latency, of both clients together: the mixture of the two latency distributions (each given by
  wrk as 1000 quantiles), weighted by their request counts. Each client's own percentiles, as
  wrk's ``--latency`` prints them, are in the metadata.

Errors: wrk's socket errors (connect, read, write, timeout: no answer within
``request_timeout_s``) plus every answer that is not a 200 with the expected content. A trial
whose errors exceed ``max_error_pct`` of its requests fails. After the load, the client fetches
nginx's access log (at a path holding a per-study token) and the server's own count of what it
served, by scheme, status, FastCGI status and TLS version and cipher, is in the metadata, with the
CPU time both wrk clients took on the client's host (the shell's ``times``): on a small host the
load generator shares the CPUs with what it measures. The client keeps its files (the Lua script,
wrk's outputs) in a directory of its own made for the run, so that clients of this workload
measured at once never share one.
"""

from __future__ import annotations

import bisect
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import RunsForADuration, WorkloadParams, register_workload
from virtlab.workloads._peer import MAX_PEERS, PairParams, PeerWorkload, Role
from virtlab.workloads._service import (
    PRIVATE_DIR,
    client_cpu_seconds,
    split_sections,
    study_token,
    with_run_as,
)

KERNEL = "webcgi"
PORT = 18080
USER = "www-data"
# seed 001: the percentage of HTTP and of HTTPS requests that run the CGI program
PROFILES = {"STD-CGI": (16, 2), "MIN-CGI": (0, 2)}
TIMEOUT_MARGIN_S = 60.0
"""Beyond the load: both servers starting (a TCG guest is slow), fetching the access log."""
MAX_HASHED_BYTES = 16 * 2**20
"""page_bytes x cgi_rounds at most: virtlab hashes it once per study in Python, to check answers."""
FNV_OFFSET, FNV_PRIME, MASK64 = 0xCBF29CE484222325, 0x100000001B3, 2**64 - 1
QUANTILES = 1000
"""How many quantiles of its latency distribution each wrk client reports (0.1% apart)."""
PERCENTILES = (50, 90, 99)

# Run in the server's environment before the servers start: "$1" virtlab's directory, "$2" the user.
_PREPARE = with_run_as(r"""
cd -- "$1" || exit 1
mkdir -p tmp htdocs/cgi-bin || exit 1
own "$2"
""")
# fcgiwrap: "$1" the directory, "$2" bin_dir (the CGI kernel), "$3" the user, "$4" its processes.
# The kernel is copied next to the page (as root, who can read bin_dir wherever it is).
_FCGIWRAP = with_run_as(r"""
cd -- "$1" || exit 125
cp -- "$2/webcgi" htdocs/cgi-bin/webcgi || exit 125
fcgiwrap=$(command -v fcgiwrap || echo /usr/sbin/fcgiwrap)
run_as "$3" "$fcgiwrap" -c "$4" -s unix:fcgiwrap.sock
""")
# nginx: "$1" the directory, "$2" the address, "$3" the HTTP port, "$4" the HTTPS port, "$5" the
# user. It starts once fcgiwrap listens, so that no early CGI request finds nobody there; the
# addresses are known only now (the configuration placed before includes this file).
_NGINX = with_run_as(r"""
cd -- "$1" || exit 125
waited=0
until [ -S fcgiwrap.sock ]; do
    waited=$((waited + 1))
    [ "$waited" -le 600 ] || { echo "virtlab: fcgiwrap's socket did not appear in 60 s" >&2; exit 125; }
    sleep 0.1
done
printf 'listen %s:%s;\nlisten %s:%s ssl;\n' "$2" "$3" "$2" "$4" > listen.conf || exit 125
nginx=$(command -v nginx || echo /usr/sbin/nginx)
run_as "$5" "$nginx" -p "$PWD/" -c nginx.conf -e stderr
""")
# The client, where the peer runs: both wrk clients at once, then the server's access log, then the
# CPU time the clients took (the shell's ``times``: its children's user and system seconds).
# $1 wrk's Lua script  $2 address  $3 HTTP port  $4 HTTP connections  $5 HTTP threads  $6 HTTP CGI %
# $7 HTTPS port  $8 HTTPS connections  $9 HTTPS threads  ${10} HTTPS CGI %  ${11} duration (s)
# ${12} request timeout (s)  ${13} page bytes  ${14} expected CGI answer  ${15} seed
# ${16} CGI rounds  ${17} the access log's path on the server
# Its files are in a directory of its own, made here: clients of the same workload measured at once
# (consolidation tiles) never share one, and no other trial's clean-up can remove it.
_CLIENT = (
    PRIVATE_DIR
    + r"""
host=$2 duration=${11} timeout=${12} page=${13} answer=${14} seed=${15} rounds=${16} log=${17}
printf '%s' "$1" > "$dir/mix.lua" || exit 1
load() {  # load SCHEME PORT CONNECTIONS THREADS CGI_PCT
    [ "$3" -gt 0 ] || return 0
    wrk -t "$4" -c "$3" -d "${duration}s" --latency --timeout "${timeout}s" -s "$dir/mix.lua" \
        "$1://$host:$2/" -- "$5" "$page" "$answer" "$seed" "$rounds" > "$dir/$1.out" 2>&1
}
load http "$3" "$4" "$5" "$6" &
http=$!
load https "$7" "$8" "$9" "${10}" &
https=$!
wait "$http"
http_status=$?
wait "$https"
https_status=$?
for scheme in http https; do
    [ -f "$dir/$scheme.out" ] || continue
    echo "=== wrk $scheme"
    cat "$dir/$scheme.out"
done
echo "=== wrk status http=$http_status https=$https_status"
[ "$http_status" = 0 ] && [ "$https_status" = 0 ] || exit 1
echo "=== client cpu"
times
curl -sS --max-time 60 -o "$dir/access.log" "http://$host:$3$log" || exit 1
echo "=== server log"
sort "$dir/access.log" | uniq -c
"""
)
# wrk's script: see the module doc. Arguments: CGI %, page bytes, the CGI's answer, seed, rounds.
MIX_LUA = r"""-- virtlab's request mix for wrk (virtlab/workloads/web.py)
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end

function init(args)
  cgi_pct = tonumber(args[1])
  page_bytes = tonumber(args[2])
  expected = args[3] .. "\n"
  math.randomseed(tonumber(args[4]) * 1000 + id)
  static_request = wrk.format("GET", "/page.html")
  cgi_request = wrk.format("GET", "/cgi-bin/webcgi?rounds=" .. args[5])
  deck, position = {}, 101
  for i = 1, 100 do deck[i] = i <= cgi_pct end
  sent_cgi, sent_static, got_cgi, got_static, bad, server = 0, 0, 0, 0, 0, ""
end

local function shuffle()
  for i = 100, 2, -1 do
    local j = math.random(i)
    deck[i], deck[j] = deck[j], deck[i]
  end
  position = 1
end

function request()
  if position > 100 then shuffle() end
  local cgi = deck[position]
  position = position + 1
  if cgi then
    sent_cgi = sent_cgi + 1
    return cgi_request
  end
  sent_static = sent_static + 1
  return static_request
end

function response(status, headers, body)
  if headers["X-Virtlab-Cgi"] then
    got_cgi = got_cgi + 1
    if status ~= 200 or body ~= expected then bad = bad + 1 end
  else
    got_static = got_static + 1
    if status ~= 200 or #body ~= page_bytes then bad = bad + 1 end
  end
  if server == "" and headers["Server"] then server = headers["Server"] end
end

function done(summary, latency, requests)
  local keys = {"sent_cgi", "sent_static", "got_cgi", "got_static", "bad"}
  local totals, server = {}, ""
  for _, key in ipairs(keys) do totals[key] = 0 end
  for _, thread in ipairs(threads) do
    for _, key in ipairs(keys) do totals[key] = totals[key] + thread:get(key) end
    if server == "" then server = thread:get("server") end
  end
  local e = summary.errors
  io.write(string.format("virtlab requests=%d duration_us=%d bytes=%d connect=%d read=%d write=%d " ..
    "status=%d timeout=%d", summary.requests, summary.duration, summary.bytes, e.connect, e.read,
    e.write, e.status, e.timeout))
  for _, key in ipairs(keys) do io.write(string.format(" %s=%d", key, totals[key])) end
  io.write(string.format(" server=%s\nvirtlab_quantiles_us", (server:gsub("%s", "_"))))
  -- wrk answers 0 for the 100th percentile: the last quantile is the maximum
  for i = 1, 999 do io.write(string.format(" %d", latency:percentile(i / 10))) end
  io.write(string.format(" %d", latency.max))
  io.write("\n")
end
"""


class WebParams(PairParams, RunsForADuration):
    timeout_margin_s: ClassVar[float] = TIMEOUT_MARGIN_S
    planned_as: ClassVar[str] = "duration_s + request_timeout_s"

    @classmethod
    def planned_s(cls, values: Mapping[str, Any]) -> float:
        # the last requests may wait request_timeout_s past the run
        return float(values["duration_s"] + values["request_timeout_s"])

    profile: Literal["STD-CGI", "MIN-CGI"] = Field(
        default="STD-CGI",
        description="seed 001's load profile: STD-CGI = 16% of HTTP and 2% of HTTPS requests run the "
        "CGI program; MIN-CGI = without the 16% of HTTP (0% HTTP, 2% HTTPS)",
    )
    cgi_http_pct: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="% of HTTP requests that run the CGI program; unset: the profile's",
    )
    cgi_https_pct: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="% of HTTPS requests that run the CGI program; unset: the profile's",
    )
    https_pct: int = Field(
        default=25,
        ge=0,
        le=100,
        description="% of the connections that speak HTTPS (a second wrk client); the seed does not say",
    )
    connections: int = Field(
        default=8, ge=1, le=1024, description="client connections, both schemes together"
    )
    threads: int = Field(
        default=2, ge=1, le=64, description="threads of each wrk client (at most its connections)"
    )
    duration_s: int = Field(default=10, ge=1, le=3600, description="seconds of load per trial")
    page_bytes: int = Field(default=4096, ge=1, le=2**20, description="size of the static page")
    cgi_rounds: int = Field(
        default=64, ge=1, le=100_000, description="times the CGI program hashes the page per request"
    )
    request_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="a request unanswered this long counts as an error (wrk --timeout)",
    )
    max_error_pct: float = Field(
        default=0.1, ge=0, le=100, description="a trial with more errors than this % of its requests fails"
    )
    port: int = Field(
        default=PORT, ge=1024, le=65535 - 2 * MAX_PEERS, description="nginx's HTTP port; HTTPS is port + 1"
    )
    seed: int = Field(default=1, ge=0, le=2**31, description="seeds each wrk thread's shuffled deck")
    timeout_s: float = Field(
        default=10 + 10 + TIMEOUT_MARGIN_S,
        gt=0,
        description="a trial running longer fails; unless given, duration_s + request_timeout_s + 60",
    )

    @model_validator(mode="after")
    def _consistent(self) -> WebParams:
        if 0 < self.https_pct < 100 and self.connections < 2:
            raise ValueError("HTTP and HTTPS together need connections >= 2 (one wrk client each)")
        if self.page_bytes * self.cgi_rounds > MAX_HASHED_BYTES:
            raise ValueError(
                f"page_bytes x cgi_rounds = {self.page_bytes * self.cgi_rounds} is over {MAX_HASHED_BYTES} "
                "(virtlab hashes it once to check the CGI's answers)"
            )
        return self

    def cgi_pcts(self) -> tuple[int, int]:
        """The % of HTTP and of HTTPS requests that run the CGI program."""
        http, https = PROFILES[self.profile]
        return (
            http if self.cgi_http_pct is None else self.cgi_http_pct,
            https if self.cgi_https_pct is None else self.cgi_https_pct,
        )

    def split(self) -> tuple[int, int]:
        """The connections of the HTTP and of the HTTPS client."""
        https = round(self.connections * self.https_pct / 100)
        if 0 < self.https_pct < 100:
            https = min(max(https, 1), self.connections - 1)
        return self.connections - https, https


@register_workload
class Web(PeerWorkload):
    kind: ClassVar[str] = "web"
    headline_metric: ClassVar[str | None] = "requests_per_s"
    summary: ClassVar[str] = (
        "nginx with a static page and a CGI program (fcgiwrap) in the environment, loaded by wrk over "
        "HTTP and HTTPS from the native side (seed 001 STD-CGI / MIN-CGI), requests/s and latency"
    )
    Params: ClassVar[type[WorkloadParams]] = WebParams
    kernels: ClassVar[tuple[str, ...]] = (KERNEL,)
    tools: ClassVar[tuple[str, ...]] = ("nginx", "fcgiwrap", "wrk", "curl", "setpriv", "unshare", "timeout")
    served_by_cell: ClassVar[bool] = True
    params: WebParams

    # -- what goes where -------------------------------------------------------------
    @cached_property
    def _token(self) -> str:
        return study_token()

    def directory(self, slot: int = 0) -> str:
        """virtlab's directory in the server's working directory, for one client's slot."""
        return f"virtlab-web-{self._token}-{slot}"

    def own_first_port(self) -> int:
        return self.params.port

    def port_block(self) -> int:
        return 2  # one slot's nginx: HTTP, and HTTPS on the next port

    def log_path(self) -> str:
        """Where nginx serves its access log, to the client only (a per-study token in the path)."""
        return f"/virtlab-{self._token}/access.log"

    @cached_property
    def page(self) -> bytes:
        """The static page: lines of random letters and digits, made once per study."""
        alphabet = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        page = bytearray(alphabet[b % len(alphabet)] for b in secrets.token_bytes(self.params.page_bytes))
        page[79::80] = b"\n" * len(page[79::80])
        return bytes(page)

    @cached_property
    def cgi_answer(self) -> str:
        """What the CGI program answers: FNV-1a 64 of the page repeated ``cgi_rounds`` times, in hex."""
        return f"{fnv1a64(self.page * self.params.cgi_rounds):016x}"

    @cached_property
    def _certificate(self) -> dict[str, bytes]:
        """A self-signed certificate and its key, made once per study on this host."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise OSError("web: openssl is not installed on this host: apt-get install openssl")
        with tempfile.TemporaryDirectory(prefix="virtlab-web-tls-") as tmp:
            key, cert = Path(tmp) / "key.pem", Path(tmp) / "cert.pem"
            argv = [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "30", "-subj", "/CN=virtlab-web"]  # fmt: skip
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            if done.returncode != 0:
                raise OSError(f"web: openssl req failed: {done.stderr.strip()}")
            return {"key.pem": key.read_bytes(), "cert.pem": cert.read_bytes()}

    def nginx_conf(self) -> str:
        """nginx's whole configuration (paths relative to its directory, the listen lines apart)."""
        return _NGINX_CONF.replace("@LOG@", self.log_path())

    def files(self, role: Role, slot: int = 0) -> dict[str, bytes]:
        if role == "client":
            return {}  # the client makes its own directory (see _CLIENT)
        where = self.directory(slot)
        return {
            f"{where}/nginx.conf": self.nginx_conf().encode(),
            f"{where}/htdocs/page.html": self.page,
            **{f"{where}/{name}": content for name, content in self._certificate.items()},
        }

    def setup_commands(self, role: Role, slot: int = 0) -> list[list[str]]:
        if role == "client":
            return []
        return [["sh", "-c", _PREPARE, "virtlab-web-prepare", self.directory(slot), USER]]

    def cleanup_commands(self, role: Role, slot: int = 0) -> list[list[str]]:
        return [["rm", "-rf", "--", self.directory(slot)]] if role == "server" else []

    # -- the programs ------------------------------------------------------------------
    def server_commands(self, bin_dir: str, slot: int = 0, bind: str | None = None) -> list[list[str]]:
        where, (http, https) = self.directory(slot), self.ports(slot)
        processes = str(self.params.connections)  # one CGI at a time per connection, never a queue
        fcgiwrap = ["sh", "-c", _FCGIWRAP, "virtlab-fcgiwrap", where, bin_dir, USER, processes]
        nginx = ["sh", "-c", _NGINX, "virtlab-nginx", where, bind or "127.0.0.1", str(http), str(https), USER]
        return [self.bounded(fcgiwrap), self.bounded(nginx)]

    def client_command(self, bin_dir: str, server_address: str, slot: int = 0) -> list[str]:
        p = self.params
        (http, https), (http_conns, https_conns) = self.ports(slot), p.split()
        cgi_http, cgi_https = p.cgi_pcts()
        per_scheme = [
            str(http), str(http_conns), str(min(p.threads, max(http_conns, 1))), str(cgi_http),
            str(https), str(https_conns), str(min(p.threads, max(https_conns, 1))), str(cgi_https),
        ]  # fmt: skip
        return ["sh", "-c", _CLIENT, "virtlab-web-client", MIX_LUA, server_address, *per_scheme,
                str(p.duration_s), f"{p.request_timeout_s:g}", str(p.page_bytes), self.cgi_answer,
                str(p.seed), str(p.cgi_rounds), self.log_path()]  # fmt: skip

    # -- what it says --------------------------------------------------------------------
    def parse(self, output: str) -> list[Sample]:
        p = self.params
        sections = split_sections(output)
        status = sections.get("wrk status", "")
        if status and "http=0 https=0" not in status:
            raise ParseError(f"web: a wrk client failed ({status.strip()})")
        clients = {}
        for scheme, connections, cgi_pct in zip(("http", "https"), p.split(), p.cgi_pcts(), strict=True):
            if connections == 0:
                continue
            if f"wrk {scheme}" not in sections:
                raise ParseError(f"web: no output of the {scheme} wrk client")
            clients[scheme] = parse_wrk(sections[f"wrk {scheme}"], scheme)
            clients[scheme]["cgi_pct_asked"] = cgi_pct
        if "server log" not in sections:
            raise ParseError("web: no access log of the server after the load")
        served = parse_server_log(sections["server log"])
        try:
            cpu = client_cpu_seconds(sections.get("client cpu", ""))
        except ParseError as error:
            raise ParseError(f"web: {error}") from None
        return self._samples(clients, served, cpu)

    def _samples(
        self, clients: dict[str, dict[str, Any]], served: dict[str, Any], cpu: dict[str, float]
    ) -> list[Sample]:
        p = self.params
        requests = sum(c["requests"] for c in clients.values())
        errors = sum(c["errors"] for c in clients.values())
        attempts = requests + sum(c["socket_errors"] for c in clients.values())
        if requests == 0:
            raise ParseError("web: no request was answered")
        error_pct = 100 * errors / max(attempts, 1)
        if error_pct > p.max_error_pct:
            details = "; ".join(f"{s}: {c['error_detail']}" for s, c in clients.items())
            raise ParseError(
                f"web: {errors} errors in {attempts} requests ({error_pct:.3f}%), over max_error_pct "
                f"{p.max_error_pct:g}% ({details})"
            )
        rate = sum(c["requests_per_s"] for c in clients.values())
        mixed = mixture_percentiles(
            [(c["requests"], c["quantiles_us"]) for c in clients.values()], PERCENTILES
        )
        per_client = {
            scheme: {k: v for k, v in c.items() if k not in ("quantiles_us", "error_detail")}
            for scheme, c in clients.items()
        }
        cgi = sum(c["got_cgi"] for c in clients.values())
        https = clients.get("https", {}).get("requests", 0)
        http_conns, https_conns = p.split()
        cgi_http, cgi_https = p.cgi_pcts()
        metadata = {
            "tool": "wrk",
            "profile": p.profile,
            "cgi_http_pct": cgi_http,
            "cgi_https_pct": cgi_https,
            "https_pct": p.https_pct,
            "http_connections": http_conns,
            "https_connections": https_conns,
            "duration_s": p.duration_s,
            "page_bytes": p.page_bytes,
            "cgi_rounds": p.cgi_rounds,
            "requests": requests,
            "errors": errors,
            "error_pct": round(error_pct, 4),
            "https_request_pct": round(100 * https / requests, 3),
            "cgi_request_pct": round(100 * cgi / requests, 3),
            "server_software": next((c["server"] for c in clients.values() if c["server"]), None),
            "clients": per_client,
            "server_requests": served["requests"],
            "server_cgi_requests": served["cgi"],
            "server_by_scheme": served["by_scheme"],
            "tls": served["tls"],
            "tls_resumed_requests": served["resumed"],
            **cpu,
        }
        samples = [Sample("requests_per_s", rate, "req/s", "higher", metadata)]
        for percentile, value in zip(PERCENTILES, mixed, strict=True):
            samples.append(Sample(f"latency_p{percentile}_ms", value / 1000, "ms", "lower", metadata))
        return samples


_NGINX_CONF = """\
# virtlab's web workload: nginx's configuration (virtlab/workloads/web.py); paths are relative to
# the directory nginx is started in (-p), listen.conf is written there when the server starts.
worker_processes auto;
pid nginx.pid;
daemon off;

events {
    worker_connections 4096;
}

http {
    default_type text/html;
    sendfile on;
    keepalive_requests 1000;
    client_body_temp_path tmp/client_body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    log_format virtlab '$scheme $status $upstream_status $ssl_protocol $ssl_cipher $ssl_session_reused';
    access_log access.log virtlab;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate cert.pem;
    ssl_certificate_key key.pem;

    server {
        include listen.conf;
        root htdocs;

        location = /page.html {
        }
        location = /cgi-bin/webcgi {
            fastcgi_pass unix:fcgiwrap.sock;
            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
            fastcgi_param QUERY_STRING $query_string;
            fastcgi_param REQUEST_METHOD $request_method;
            fastcgi_param DOCUMENT_ROOT $document_root;
            fastcgi_param SERVER_PROTOCOL $server_protocol;
            fastcgi_param GATEWAY_INTERFACE CGI/1.1;
            fastcgi_param HTTPS $https if_not_empty;
        }
        location = @LOG@ {
            alias access.log;
            access_log off;
            default_type text/plain;
        }
        location / {
            return 404;
        }
    }
}
"""

# -- parsing -------------------------------------------------------------------------------
_WRK_RATE = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_WRK_TOTAL = re.compile(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m|h), ([\d.]+)(B|KB|MB|GB|TB) read", re.M)
_WRK_SHAPE = re.compile(r"^\s*(\d+) threads and (\d+) connections", re.M)
_WRK_PCT = re.compile(r"^\s*(50|75|90|99)%\s+([\d.]+)(us|ms|s|m|h)\s*$", re.M)
_WRK_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_WRK_NON2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_TIME_US = {"us": 1.0, "ms": 1e3, "s": 1e6, "m": 60e6, "h": 3600e6}
_COUNTS = ("requests", "duration_us", "bytes", "connect", "read", "write", "status", "timeout", "sent_cgi",
           "sent_static", "got_cgi", "got_static", "bad")  # fmt: skip


def parse_wrk(text: str, scheme: str) -> dict[str, Any]:
    """One wrk client's figures: its own text (``--latency``) and the counts and quantiles its Lua
    script printed, each checked against the other."""
    rate, total, shape = _WRK_RATE.search(text), _WRK_TOTAL.search(text), _WRK_SHAPE.search(text)
    line = next((line for line in text.splitlines() if line.startswith("virtlab requests=")), None)
    quantile_line = next(
        (line for line in text.splitlines() if line.startswith("virtlab_quantiles_us")), None
    )
    if rate is None or total is None or shape is None:
        raise ParseError(f"web: the {scheme} wrk output has no Requests/sec or request count (did wrk run?)")
    if line is None or quantile_line is None:
        raise ParseError(f"web: the {scheme} wrk output lacks virtlab's summary (was mix.lua given?)")
    words = dict(word.split("=", 1) for word in line.split()[1:] if "=" in word)
    try:
        counts = {key: int(words[key]) for key in _COUNTS}
        quantiles = [float(value) for value in quantile_line.split()[1:]]
    except (KeyError, ValueError) as error:
        raise ParseError(f"web: the {scheme} wrk summary is incomplete ({error!r})") from None
    if len(quantiles) != QUANTILES or quantiles != sorted(quantiles):
        raise ParseError(f"web: the {scheme} wrk latency quantiles are not {QUANTILES} ascending values")
    if counts["requests"] != int(total.group(1)):
        raise ParseError(f"web: wrk's {scheme} request count {total.group(1)} and its summary's differ")
    if counts["got_cgi"] + counts["got_static"] != counts["requests"]:
        raise ParseError(f"web: the {scheme} responses by kind do not add up to wrk's request count")
    text_pcts = {int(pct): float(value) * _TIME_US[unit] for pct, value, unit in _WRK_PCT.findall(text)}
    if set(text_pcts) != {50, 75, 90, 99}:
        raise ParseError(f"web: the {scheme} wrk output has no latency distribution (was --latency given?)")
    for pct, value in text_pcts.items():
        # wrk prints two decimals of the unit it picks: within that rounding of the exact figure
        exact = quantiles[pct * QUANTILES // 100 - 1]
        if abs(exact - value) > max(0.01 * exact, 10.0):
            raise ParseError(f"web: wrk's {scheme} p{pct} ({value:g} us) is not its quantile ({exact:g} us)")
    socket = _WRK_SOCKET.search(text)
    non2xx = _WRK_NON2XX.search(text)
    socket_errors = counts["connect"] + counts["read"] + counts["write"] + counts["timeout"]
    if socket is not None and sum(int(n) for n in socket.groups()) != socket_errors:
        raise ParseError(f"web: wrk's {scheme} socket errors and its summary's differ")
    if non2xx is not None and int(non2xx.group(1)) != counts["status"]:
        raise ParseError(f"web: wrk's {scheme} non-2xx count and its summary's differ")
    answered = counts["requests"]
    return {
        "requests": answered,
        "requests_per_s": float(rate.group(1)),
        "threads": int(shape.group(1)),
        "connections": int(shape.group(2)),
        "seconds": round(counts["duration_us"] / 1e6, 3),
        "bytes": counts["bytes"],
        "latency_p50_ms": round(text_pcts[50] / 1000, 4),
        "latency_p90_ms": round(text_pcts[90] / 1000, 4),
        "latency_p99_ms": round(text_pcts[99] / 1000, 4),
        "got_cgi": counts["got_cgi"],
        "got_static": counts["got_static"],
        "cgi_pct_observed": round(100 * counts["got_cgi"] / answered, 3) if answered else None,
        "bad_answers": counts["bad"],
        "socket_errors": socket_errors,
        "errors": socket_errors + counts["bad"],
        "error_detail": (
            f"connect {counts['connect']}, read {counts['read']}, write {counts['write']}, timeout "
            f"{counts['timeout']}, non-200 or wrong content {counts['bad']}"
        ),
        "server": "" if words.get("server", "") in ("", "_") else words["server"],
        "quantiles_us": quantiles,
    }


def parse_server_log(text: str) -> dict[str, Any]:
    """nginx's access log, counted (``uniq -c``: count, scheme, status, FastCGI status, TLS
    protocol, cipher, session resumed): requests served, CGI requests (those FastCGI answered), by
    scheme and TLS."""
    by_scheme: dict[str, dict[str, int]] = {}
    tls: dict[str, int] = {}
    requests = cgi = resumed = 0
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if len(words) != 7 or not words[0].isdigit():
            raise ParseError(f"web: an access log count not understood: {line.strip()!r}")
        count, scheme, status, upstream, protocol, cipher, reused = int(words[0]), *words[1:]
        requests += count
        kind = "static" if upstream == "-" else "cgi"
        cgi += count if kind == "cgi" else 0
        counts = by_scheme.setdefault(scheme, {"requests": 0, "cgi": 0, "not_200": 0})
        counts["requests"] += count
        counts["cgi"] += count if kind == "cgi" else 0
        counts["not_200"] += count if status != "200" else 0
        if protocol != "-":
            tls[f"{protocol} {cipher}"] = tls.get(f"{protocol} {cipher}", 0) + count
        resumed += count if reused == "r" else 0
    return {"requests": requests, "cgi": cgi, "by_scheme": by_scheme, "tls": tls, "resumed": resumed}


def mixture_percentiles(
    components: list[tuple[int, list[float]]], percentiles: tuple[int, ...]
) -> list[float]:
    """Percentiles of the requests of several clients together. Each client is (its request count,
    its latency distribution as ascending quantiles, evenly spaced): the whole is their mixture
    weighted by request count, and a percentile is the smallest quantile value where the mixture's
    distribution function reaches it. One client gives back its own quantiles."""
    parts = [(n, q) for n, q in components if n > 0 and q]
    if not parts:
        raise ValueError("no client with requests")
    total = sum(n for n, _ in parts)

    def below(x: float) -> float:
        """The share of all requests at most ``x``."""
        return sum(n * bisect.bisect_right(q, x) / len(q) for n, q in parts) / total

    candidates = sorted({x for _, q in parts for x in q})
    found = []
    for percentile in percentiles:
        wanted = percentile / 100 - 1e-12
        lo, hi = 0, len(candidates) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if below(candidates[mid]) >= wanted:
                hi = mid
            else:
                lo = mid + 1
        found.append(candidates[lo])
    return found


def fnv1a64(data: bytes) -> int:
    """FNV-1a, 64 bits, as the webcgi kernel computes it."""
    value = FNV_OFFSET
    for byte in data:
        value = ((value ^ byte) * FNV_PRIME) & MASK64
    return value
