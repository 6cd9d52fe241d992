"""End-to-end test of the console at /ui in headless Chromium (run by .ci/browser.sh).

A real `commitpoint serve` with an admin token, two tenant tokens and the built-in
simulator provider is given real data over the JSON API (extractions the simulator
commits, one whose worker answer fails the schema), then the console is driven like an
operator would: log in, compare the overview with /v1/stats, pause the provider, retry the
failed extraction and see it pending, and check the refusals (wrong token, POST without a
CSRF token, another tenant's page). Screenshots of every page, wide and narrow, go to
$SCREENSHOTS.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

URL = os.environ["CONSOLE_URL"]
ADMIN = os.environ["ADMIN_TOKEN"]
ACME = os.environ["ACME_TOKEN"]
SHOTS = os.environ["SCREENSHOTS"]
WIDE = (1280, 800)
NARROW = (390, 844)

checks = []


def check(name, condition, detail=""):
    checks.append(name)
    if not condition:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok  {name}")


def api(method, path, body=None, token=ADMIN, headers=None, form=None):
    data = None
    all_headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None:
        data = json.dumps(body).encode()
        all_headers["Content-Type"] = "application/json"
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
        all_headers["Content-Type"] = "application/x-www-form-urlencoded"
    all_headers.update(headers or {})
    request = urllib.request.Request(URL + path, data=data, method=method, headers=all_headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            return response.status, (json.loads(text) if text.startswith("{") else text)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_for(what, predicate, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def seed():
    """Real data: committed work from the simulator, and one failed extraction."""
    status, _ = api("POST", "/v1/admin/providers/simulator/pause")
    assert status == 200, status
    status, bad = api("POST", "/v1/extractions", {
        "tenant": "acme", "source_id": "broken-answer", "schema": "code-review@1",
        "content": "fn main() { let x = 1; }"})
    assert status == 201, (status, bad)
    status, claims = api("POST", "/v1/claims", {"worker": "browser-test", "limit": 1, "lease_seconds": 60})
    assert status == 200 and claims["claims"], (status, claims)
    grant = claims["claims"][0]
    status, _ = api("POST", f"/v1/extractions/{grant['extraction_id']}/result", {
        "lease_token": grant["lease_token"], "output": {"not": "a code review"}, "reask": False})
    assert status == 422, status
    status, _ = api("POST", "/v1/admin/providers/simulator/resume")
    assert status == 200, status
    for i in range(6):
        tenant = "acme" if i % 2 else "globex"
        status, _ = api("POST", "/v1/extractions", {
            "tenant": tenant, "source_id": f"PR-{i}", "schema": "code-review@1",
            "content": f"fn f{i}() -> u32 {{ {i} }}\n// TODO: handle overflow"})
        assert status == 201, status

    def settled():
        _, stats = api("GET", "/v1/stats")
        counts = stats["extractions"]
        busy = sum(counts.get(s, 0) for s in ("pending", "claimed", "submitted", "ready"))
        return stats if busy == 0 else None

    stats = wait_for("the simulator to commit the work", settled, timeout=120)
    # The sink nobody listens on (.ci/browser.sh) turns each event into a dead letter.
    wait_for("dead letters", lambda: api("GET", "/v1/outbox?state=dead")[1].get("events"), timeout=60)
    return grant["extraction_id"], stats


def browser():
    options = Options()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-extensions",
                 f"--user-data-dir={os.environ['CHROME_PROFILE']}", f"--window-size={WIDE[0]},{WIDE[1]}"):
        options.add_argument(flag)
    service = Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    return driver


def shoot(driver, name):
    for label, (w, h) in (("wide", WIDE), ("narrow", NARROW)):
        driver.set_window_size(w, h)
        time.sleep(0.2)
        # Usable when narrow: the page itself never scrolls sideways (tables scroll in
        # their own box).
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        check(f"{name} fits a {label} window", overflow <= 1, f"{overflow}px wider than the window")
        driver.save_screenshot(os.path.join(SHOTS, f"{name}-{label}.png"))
    driver.set_window_size(*WIDE)


def text(driver, element_id):
    return driver.find_element(By.ID, element_id).text.strip()


def main():
    os.makedirs(SHOTS, exist_ok=True)
    failed_id, stats = seed()
    driver = browser()
    try:
        # A wait that reads the page while a post's redirect replaces it may hold an
        # element of the old page for a moment: look again.
        wait = WebDriverWait(driver, 20, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))
        # Not logged in: every page leads to the login form.
        driver.get(URL + "/ui")
        check("the console asks for a token", driver.current_url.endswith("/ui/login"), driver.current_url)
        shoot(driver, "login")

        driver.find_element(By.ID, "token").send_keys("not-the-token-at-all")
        driver.find_element(By.ID, "login").click()
        # The refusal is a new page: wait for it rather than read the old one.
        wait.until(EC.presence_of_element_located((By.ID, "login-error")))
        check("a wrong token is refused", "not valid" in text(driver, "login-error"))
        login_csrf = driver.find_element(By.CSS_SELECTOR, "input[name='csrf']").get_attribute("value")
        login_cookie = {"Cookie": f"cp_login={driver.get_cookie('cp_login')['value']}"}
        status, _ = api("POST", "/ui/login", token=None, headers=login_cookie,
                        form={"token": "not-the-token-at-all", "csrf": login_csrf})
        check("a wrong token answers 401", status == 401, status)
        status, _ = api("POST", "/ui/login", token=None, headers=login_cookie, form={"token": ADMIN})
        check("a login POST without its CSRF token answers 403", status == 403, status)

        driver.find_element(By.ID, "token").send_keys(ADMIN)
        driver.find_element(By.ID, "login").click()
        wait.until(EC.presence_of_element_located((By.ID, "count-total")))
        check("the admin token opens the overview", driver.current_url.rstrip("/").endswith("/ui"), driver.current_url)
        cookie = driver.get_cookie("cp_console")
        check("the session cookie is HttpOnly and SameSite=Strict",
              cookie and cookie.get("httpOnly") and cookie.get("sameSite") == "Strict", cookie)
        check("the session cookie expires", cookie and cookie.get("expiry"), cookie)
        # The quiet refresh swaps a page's content while the checks below read it: it is
        # paused (remembered per browser) until its own check turns it on.
        driver.execute_script("window.localStorage.setItem('commitpoint-refresh', 'off')")
        driver.refresh()
        wait.until(EC.presence_of_element_located((By.ID, "count-total")))

        # The overview's counts are /v1/stats' (read again: nothing is moving now).
        _, stats = api("GET", "/v1/stats")
        for state, count in stats["extractions"].items():
            check(f"overview count {state} = /v1/stats", text(driver, f"count-{state}") == str(count),
                  f"{text(driver, f'count-{state}')} != {count}")
        check("overview total = /v1/stats", text(driver, "count-total") == str(stats["total"]))
        check("the throughput chart is an SVG", driver.find_elements(By.CSS_SELECTOR, "svg.chart rect"))
        y_ticks = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "svg.chart text.y-tick")]
        # Each bar's hover title is "<minute>: <committed> / <failed>".
        minutes = [t.get_attribute("textContent") for t in driver.find_elements(By.CSS_SELECTOR, "svg.chart g > title")]
        per_minute = [sum(int(v) for v in m.rsplit(": ", 1)[1].split(" / ")) for m in minutes]
        hour_total = int(text(driver, "hour-committed")) + int(text(driver, "hour-failed"))
        check("the legend's hour totals are the bars' sum", per_minute and sum(per_minute) == hour_total,
              (per_minute, hour_total))
        check("the chart's y axis is labelled from 0 up to at least the busiest minute",
              y_ticks and y_ticks[0] == "0" and all(t.isdigit() for t in y_ticks)
              and int(y_ticks[-1]) >= max(per_minute), (y_ticks, max(per_minute or [0])))
        x_ticks = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "svg.chart text.x-tick")]
        check("the chart's x axis names UTC minutes", x_ticks and all(len(t) == 5 and t[2] == ":" for t in x_ticks), x_ticks)
        check("the minutes before the server started are shaded, not zero",
              driver.find_elements(By.CSS_SELECTOR, "svg.chart rect.unsampled"))
        driven = driver.find_element(By.CSS_SELECTOR, "tr[data-provider='simulator'] .driver").text
        check("the provider is driven by this instance (/v1/stats)",
              stats["store"]["drivers"].get("simulator") == stats["store"]["instance"] and driven == "this instance",
              f"{driven!r}, {stats['store']}")
        shoot(driver, "overview")

        # Pause the provider (confirming the dialog) and see it paused.
        row = driver.find_element(By.CSS_SELECTOR, "tr[data-provider='simulator']")
        row.find_element(By.XPATH, ".//button[text()='Pause']").click()
        wait.until(EC.alert_is_present()).accept()
        wait.until(lambda d: "paused" in d.find_element(By.CSS_SELECTOR, "tr[data-provider='simulator'] .provider-state").text)
        check("the provider shows paused", True)
        _, providers = api("GET", "/v1/admin/providers")
        check("the API agrees the provider is paused",
              any(p["name"] == "simulator" and p["operator_paused"] for p in providers["providers"]), providers)

        # A POST without the CSRF token is refused, even with the session cookie.
        status, body = api("POST", "/ui/providers/simulator/resume", token=None, form={},
                           headers={"Cookie": f"cp_console={cookie['value']}"})
        check("a POST without the CSRF token answers 403", status == 403, status)
        status, body = api("POST", "/ui/providers/simulator/resume", token=None, form={"csrf": "00" * 32},
                           headers={"Cookie": f"cp_console={cookie['value']}"})
        check("a POST with a wrong CSRF token answers 403", status == 403, status)
        _, providers = api("GET", "/v1/admin/providers")
        check("the refused POST changed nothing",
              any(p["name"] == "simulator" and p["operator_paused"] for p in providers["providers"]), providers)

        # The failed extraction: find it by filter, open it, retry it, see it pending
        # (the provider is paused, so it stays pending).
        driver.get(URL + "/ui/extractions?state=failed")
        shoot(driver, "extractions-failed")
        row = driver.find_element(By.CSS_SELECTOR, f"a[href='/ui/extractions/{failed_id}']").find_element(
            By.XPATH, "./ancestor::tr")
        failure = row.find_element(By.CSS_SELECTOR, "td.failure").text
        check("the failed list shows the failure's class and reason",
              failure.startswith("validation") and len(failure) > len("validation "), failure)
        driver.find_element(By.CSS_SELECTOR, f"a[href='/ui/extractions/{failed_id}']").click()
        check("the failed extraction shows failed", text(driver, "state") == "failed")
        check("its failure names the class", text(driver, "failure").startswith("validation"))
        shoot(driver, "extraction-failed")
        driver.find_element(By.ID, "retry").click()
        wait.until(lambda d: d.find_element(By.ID, "state").text.strip() == "pending")
        check("after retry it is pending", text(driver, "state") == "pending")
        status, record = api("GET", f"/v1/extractions/{failed_id}")
        check("the API agrees it is pending", record["state"] == "pending" and record["attempts"] == 2, record)

        driver.get(URL + "/ui/extractions")
        shoot(driver, "extractions")
        newest = api("GET", "/v1/extractions?order=newest&limit=1")[1]["extractions"][0]["extraction_id"]
        first_row = driver.find_element(By.CSS_SELECTOR, "#extractions tbody tr td a").get_attribute("href")
        check("extractions are listed newest first", first_row.endswith(newest), (first_row, newest))
        tenants = {o.get_attribute("value") for o in driver.find_elements(By.CSS_SELECTOR, "select[name='tenant'] option")}
        check("the tenant filter is a choice of the tenants", {"acme", "globex"} <= tenants, tenants)
        updated = driver.find_element(By.CSS_SELECTOR, "#extractions tbody tr td:last-child time")
        check("list times read as time ago, the exact time on hover",
              updated.text.endswith("ago") and updated.get_attribute("title").endswith("Z"), updated.text)
        # The quiet refresh: the page's content is read again without a reload, and the
        # button pauses it.
        toggle = driver.find_element(By.ID, "refresh-toggle")
        check("auto-refresh stays paused once paused", toggle.text == "Auto-refresh: paused", toggle.text)
        toggle.click()
        check("the button turns it on", toggle.text == "Auto-refresh: on", toggle.text)
        main_of = lambda d: d.find_element(By.TAG_NAME, "main").get_attribute("data-refreshed")
        WebDriverWait(driver, 20).until(main_of)
        check("the extractions page refreshed itself", main_of(driver))
        toggle.click()
        check("the button pauses it", toggle.text == "Auto-refresh: paused", toggle.text)
        paused_at = main_of(driver)
        time.sleep(7)
        check("a paused page is not refreshed", main_of(driver) == paused_at, (paused_at, main_of(driver)))
        committed = api("GET", "/v1/extractions?state=committed&tenant=globex")[1]["extractions"][0]["extraction_id"]
        driver.get(URL + f"/ui/extractions/{committed}")
        check("a committed extraction shows findings and its raw result",
              "Raw result" in driver.page_source and text(driver, "state") == "committed")
        shoot(driver, "extraction-committed")
        driver.get(URL + "/ui/batches")
        shoot(driver, "batches")
        history = [int(r.get_attribute("data-batch")) for r in driver.find_elements(By.CSS_SELECTOR, "#batch-history tbody tr")]
        check("the batch history lists closed batches newest first",
              history and history == sorted(history, reverse=True) and "closed: " in text(driver, "batch-history"),
              history)
        driver.find_element(By.CSS_SELECTOR, f"#batch-history a[href='/ui/batches/{history[0]}']").click()
        wait.until(EC.presence_of_element_located((By.ID, "batch-members")))
        members = driver.find_elements(By.CSS_SELECTOR, "#batch-members tbody tr")
        check("a batch's page lists its members, linked", members and all(
            m.find_element(By.CSS_SELECTOR, "a").get_attribute("href").count("/ui/extractions/") == 1 for m in members),
            len(members))
        shoot(driver, "batch")
        driver.get(URL + "/ui/costs?tenant=globex")
        check("costs show a charged total", text(driver, "charged").startswith("$"))
        cost_ticks = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "svg.chart text.y-tick")]
        check("the cost chart's y axis is in dollars", cost_ticks and all(t.startswith("$") for t in cost_ticks), cost_ticks)
        shoot(driver, "costs")
        driver.get(URL + "/ui/dead-letters")
        shoot(driver, "dead-letters")
        payloads = driver.find_elements(By.CSS_SELECTOR, "#dead-letters details.payload")
        check("the dead-letters page lists the sink's dead events", payloads, "none listed")
        payloads[0].click()
        check("a dead letter shows its payload", '"type"' in payloads[0].text and "extraction" in payloads[0].text,
              payloads[0].text[:200])

        # Resume through the console, for a clean end.
        driver.get(URL + "/ui")
        driver.find_element(By.CSS_SELECTOR, "tr[data-provider='simulator']").find_element(
            By.XPATH, ".//button[text()='Resume']").click()
        wait.until(lambda d: "running" in d.find_element(By.CSS_SELECTOR, "tr[data-provider='simulator'] .provider-state").text)
        check("the provider resumes", True)

        # A tenant token sees its own tenant only.
        driver.delete_all_cookies()
        driver.get(URL + "/ui/login")
        driver.find_element(By.ID, "token").send_keys(ACME)
        driver.find_element(By.ID, "login").click()
        wait.until(EC.presence_of_element_located((By.ID, "extractions")))
        rows = driver.find_elements(By.CSS_SELECTOR, "#extractions tbody tr")
        check("a tenant sees only its own extractions",
              rows and all(r.find_elements(By.TAG_NAME, "td")[1].text == "acme" for r in rows))
        driver.get(URL + f"/ui/extractions/{committed}")
        check("another tenant's extraction is not found", "404" in driver.find_element(By.TAG_NAME, "h1").text)
        shoot(driver, "tenant-view")
    finally:
        driver.quit()
    print(f"browser test: {len(checks)} checks passed; screenshots in {SHOTS}")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED {e}", file=sys.stderr)
        sys.exit(1)
