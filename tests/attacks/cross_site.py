"""Issue 30, item 1, replayed in headless Chromium against the real binary.

A `commitpoint serve` without tokens (the packaged default) on 127.0.0.1, and an attacker's
page served from a second loopback origin (http://localhost:PORT). The page does what the
probe did: a `text/plain` intake (a CORS "simple" request, no preflight), bodyless admin
posts (backup, pause), a claim of all work, and a plain form post. Then a rebound DNS name
(Chromium's resolver maps rebind.attacker.example to 127.0.0.1, as a rebinding DNS server
would) tries to read the API and open a console session.

Every attempt must be refused: afterwards nothing is planted, claimed, paused or backed
up, and the rebound name reads nothing. Exit status 0 when every attack was refused, 1
when one went through.

Environment: COMMITPOINT_BIN (default target/debug/commitpoint), CHROMIUM, CHROMEDRIVER.
"""

import http.server
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

BIN = os.environ.get("COMMITPOINT_BIN", "target/debug/commitpoint")
REBOUND = "rebind.attacker.example"

PAGE = """<!doctype html><title>cute cats</title>
<form id="f" method="post" enctype="text/plain" action="TARGET/v1/admin/backup">
<input name='{"a":"' value='"}'></form>
<script>
async function attack() {
  const t = "TARGET", out = {};
  const intake = JSON.stringify({tenant: "acme", source_id: "planted-by-a-page",
                                 schema: "code-review@1", content: "fn x() {}"});
  const tries = {
    intake: [t + "/v1/extractions", {method: "POST", mode: "no-cors",
             headers: {"Content-Type": "text/plain"}, body: intake}],
    claims: [t + "/v1/claims", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
             body: JSON.stringify({worker: "page", limit: 1000, lease_seconds: 86400})}],
    backup: [t + "/v1/admin/backup", {method: "POST", mode: "no-cors"}],
    pause: [t + "/v1/admin/providers/simulator/pause", {method: "POST", mode: "no-cors"}],
  };
  for (const [name, [url, init]] of Object.entries(tries)) {
    try { await fetch(url, init); out[name] = "sent"; } catch (e) { out[name] = "blocked: " + e; }
  }
  return out;
}
</script>"""

failures = []


def check(name, held, detail=""):
    print(("ok  " if held else "BROKEN  ") + name + (f": {detail}" if detail and not held else ""))
    if not held:
        failures.append(name)


def start_server(work):
    out = open(os.path.join(work, "stdout"), "w+")
    err = open(os.path.join(work, "stderr"), "w")
    env = dict(os.environ, COMMITPOINT_LOG="warn")
    server = subprocess.Popen(
        [BIN, "serve", "--data-dir", os.path.join(work, "data"), "--listen", "127.0.0.1:0", "--provider", "simulator"],
        stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
    for _ in range(300):
        out.seek(0)
        match = re.search(r"^commitpoint listening on (\S+)", out.read(), re.M)
        if match:
            return server, match.group(1)
        if server.poll() is not None:
            break
        time.sleep(0.1)
    server.kill()
    sys.exit("commitpoint did not start: " + open(os.path.join(work, "stderr")).read())


def api(url, path, method="GET"):
    request = urllib.request.Request(url + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def attacker_site(target):
    page = PAGE.replace("TARGET", target).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    return site


def browser(profile):
    options = Options()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-extensions", f"--user-data-dir={profile}",
                 # What a rebinding DNS server does: the attacker's name now resolves to us.
                 f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"):
        options.add_argument(flag)
    service = Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    return driver


def main():
    work = tempfile.mkdtemp(prefix="commitpoint-attack-")
    server, url = start_server(work)
    site = attacker_site(url)
    driver = None
    try:
        driver = browser(os.path.join(work, "profile"))
        page = f"http://localhost:{site.server_address[1]}/"
        driver.get(page)
        sent = driver.execute_async_script("attack().then(arguments[arguments.length - 1])")
        print(f"    the page sent: {sent}")
        driver.execute_script("document.getElementById('f').submit()")
        time.sleep(1)
        answer = driver.find_element("tag name", "body").text
        check("a cross-site form post to /v1/admin/backup is refused", "cross_site" in answer, answer[:200])

        _, listing = api(url, "/v1/extractions")
        planted = [e for e in listing["extractions"] if e["source_id"] == "planted-by-a-page"]
        check("no extraction was planted by a text/plain post", not planted, planted)
        _, stats = api(url, "/v1/stats")
        check("no work was claimed", stats["extractions"].get("claimed", 0) == 0, stats["extractions"])
        _, providers = api(url, "/v1/admin/providers")
        paused = [p["name"] for p in providers["providers"] if p.get("operator_paused")]
        check("no provider was paused", not paused, paused)
        backups = os.listdir(os.path.join(work, "data", "backups")) if os.path.isdir(
            os.path.join(work, "data", "backups")) else []
        check("no backup was taken", not backups, backups)

        port = url.rsplit(":", 1)[1]
        rebound = f"http://{REBOUND}:{port}"
        driver.get(rebound + "/ui/login")
        text = driver.find_element("tag name", "body").text
        check("a rebound name gets no console session", "unknown_host" in text, text[:200])
        cookies = [c["name"] for c in driver.get_cookies()]
        check("and no session cookie", "cp_console" not in cookies, cookies)
        # A page of the rebound origin outside the console (whose CSP allows no fetch).
        driver.get(rebound + "/openapi.json")
        status = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch('/v1/extractions').then(r => r.status).then(done, e => done('blocked: ' + e))")
        check("a rebound name reads nothing (421)", status == 421, status)
    finally:
        if driver is not None:
            driver.quit()
        site.shutdown()
        server.terminate()
        server.wait(timeout=30)
    if failures:
        print(f"{len(failures)} attack(s) went through: {', '.join(failures)}")
        return 1
    print("every cross-site and rebinding attempt was refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
