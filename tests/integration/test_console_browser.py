"""The web console in a real browser (Debian's chromium, driven by selenium through
chromedriver) against a real ``zeroserve up``: log in, register a model, watch its
activation live, call it (API keys on, as by default), see its request count, GPU-seconds
and timeline move, create an API key in the console, call the model with it, revoke it and
see the call refused, change its scaling, delete it; a wrong token and a change without the
CSRF token are refused. Screenshots of each page go to ``test-artifacts/console/``."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_platform_e2e import (
    SLOW_MODEL,
    TOKEN,
    Platform,
    start_platform,
)
from tests.models import write_python_model

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"
WAIT_S = 90.0
INPUT = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]}


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    running = start_platform(
        tmp_path_factory.mktemp("console"),
        "console",
        ZEROSERVE_CONTROL_PLANE_FOLLOW_POLL_S="0.2",
        ZEROSERVE_CONTROL_PLANE_USAGE_FLUSH_S="0",
        # Keys on, as by default: the model calls send one, as a user's would.
        ZEROSERVE_ACTIVATOR_AUTH="keys",
    )
    try:
        yield running
    finally:
        running.stop()
        running.wait_workers_gone()
        running.kill_leftovers()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("needs Debian's chromium and chromium-driver (apt)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def until(what: str, check: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    """``check()``'s first truthy answer, polled; fails naming ``what`` after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = check()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def shot(browser: WebDriver, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def text_of(browser: WebDriver, css: str) -> str:
    """The first match's text; "" when none, or when the page replaced it as it was read (a
    reload the page makes itself): callers poll, so the next read sees the new page."""
    try:
        found = browser.find_elements(By.CSS_SELECTOR, css)
        return found[0].text if found else ""
    except StaleElementReferenceException:
        return ""


def attribute_of(browser: WebDriver, element_id: str, name: str) -> str | None:
    """``text_of`` for one attribute of the element with ``element_id``."""
    try:
        found = browser.find_elements(By.ID, element_id)
        return found[0].get_attribute(name) if found else None
    except StaleElementReferenceException:
        return None


def submit(browser: WebDriver, button_id: str) -> None:
    browser.find_element(By.ID, button_id).click()


def log_in(browser: WebDriver, platform: Platform, token: str) -> None:
    browser.get(f"{platform.admin}/console/login")
    field = browser.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    submit(browser, "login")


def create_key(platform: Platform) -> str:
    """A key for every model, made through the admin API."""
    with httpx.Client(timeout=WAIT_S) as http:
        created = http.post(
            f"{platform.admin}/admin/v1/keys",
            json={"name": "console-test"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    assert created.status_code == 201, created.text
    key: str = created.json()["key"]
    return key


def infer(platform: Platform, model: str, key: str) -> httpx.Response:
    with httpx.Client(timeout=WAIT_S) as http:
        return http.post(
            f"{platform.public}/v2/models/{model}/infer",
            json=INPUT,
            headers={"Authorization": f"Bearer {key}"},
        )


def test_the_console_from_login_to_delete(platform: Platform, browser: WebDriver):
    admin = platform.admin
    key = create_key(platform)
    # Without a session every page sends the browser to the login form.
    browser.get(f"{admin}/console/models")
    assert browser.current_url.endswith("/console/login")
    log_in(browser, platform, "not-the-token")
    until("the refusal", lambda: "wrong admin token" in text_of(browser, "#login-error"), 10)
    shot(browser, "login-refused")

    log_in(browser, platform, TOKEN)
    until("the models page", lambda: browser.current_url.endswith("/console/models"))
    (cookie,) = browser.get_cookies()
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"

    model_dir = write_python_model(platform.models_dir, "slow-console", SLOW_MODEL, dims=(4,))
    browser.find_element(By.ID, "reg-name").send_keys("slow-console")
    browser.find_element(By.ID, "reg-storage").send_keys(str(model_dir))
    submit(browser, "reg-submit")
    until("the model page", lambda: "registered slow-console" in text_of(browser, ".msg"))
    assert text_of(browser, "#state") == "scaled_to_zero"
    shot(browser, "model-registered")

    # The CLI follows the same activation through the admin API's server-sent events.
    watch = subprocess.Popen(
        [sys.executable, "-m", "zeroserve.cli", "models", "--url", admin, "--token", TOKEN]
        + ["activations", "slow-console", "--watch", "--wait-s", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        submit(browser, "load")
        # The model takes seconds in initialize(): its load is seen while it runs.
        until(
            "the live activation",
            lambda: attribute_of(browser, "live-summary", "data-outcome") == "running",
        )
        current = attribute_of(browser, "live-summary", "data-current")
        # Read after "running", the page may already have ended the activation and reloaded.
        assert current in ("worker_starting", "loading", None), current
        shot(browser, "model-activation-live")
        # Once it ends the page reloads and draws it.
        until("the loaded model", lambda: text_of(browser, "#state") == "ready")
        watched, errors = watch.communicate(timeout=WAIT_S)
    finally:
        if watch.poll() is None:
            watch.kill()
        watch.wait(timeout=WAIT_S)
        # Closed on failure too: left open, their ResourceWarning fails whichever test runs
        # when they are collected.
        for pipe in (watch.stdout, watch.stderr):
            if pipe is not None:
                pipe.close()
    assert watch.returncode == 0, errors
    assert re.search(r"admin: (worker_starting|loading)", watched), watched
    assert re.search(r"admin: ready on \S+ in ", watched), watched
    bars = browser.find_elements(By.CSS_SELECTOR, "article.outcome-ready svg.timeline rect")
    assert len(bars) >= 3  # worker start, fetch, engine build, publish
    # Asked of the replica's worker: the one version folder the model has.
    assert text_of(browser, "#served-versions") == "1"
    shot(browser, "model-loaded")

    assert infer(platform, "slow-console", key).is_success
    browser.get(f"{admin}/console/models")
    row = "tr[data-model='slow-console']"
    assert text_of(browser, f"{row} .requests-hour") == "1"
    assert text_of(browser, f"{row} .cold-hour") == "0"

    # The replica's time so far (its load at least) shows as GPU-seconds, once the reaper
    # has written the model's usage.
    def gpu_seconds() -> float:
        browser.get(f"{admin}/console/models")
        return float(text_of(browser, f"{row} .gpu-hour").split()[0])

    until("GPU-seconds", lambda: gpu_seconds() > 0)
    assert "loading" in text_of(browser, f"{row} .gpu-day")
    shot(browser, "models")

    # Unloaded, the next request is a cold start: a second timeline, counted as one.
    browser.get(f"{admin}/console/models/slow-console")
    submit(browser, "unload")
    until("the unload", lambda: "unloaded slow-console" in text_of(browser, ".msg"))
    assert infer(platform, "slow-console", key).is_success
    browser.get(f"{admin}/console/models/slow-console")
    articles = browser.find_elements(By.CSS_SELECTOR, "article.activation")
    assert len(articles) == 2 and "request" in articles[0].text
    browser.get(f"{admin}/console/models")
    assert text_of(browser, f"{row} .requests-hour") == "2"
    assert text_of(browser, f"{row} .cold-hour") == "1"

    browser.get(f"{admin}/console/workers")
    assert "slow-console" in text_of(browser, "#workers")
    shot(browser, "workers")
    # A key made in the console, shown once, calls the model until it is revoked there.
    browser.get(f"{admin}/console/keys")
    assert "console-test" in text_of(browser, "#keys")
    browser.find_element(By.ID, "key-name").send_keys("from-the-console")
    browser.find_element(By.ID, "key-models").send_keys("slow-console")
    submit(browser, "key-submit")
    until("the new key", lambda: bool(browser.find_elements(By.ID, "new-key")))
    console_key = text_of(browser, "#new-key")
    assert console_key.startswith("zs_")
    shot(browser, "keys-created")
    assert infer(platform, "slow-console", console_key).is_success
    browser.get(f"{admin}/console/keys")
    assert console_key not in browser.page_source  # shown once only
    key_row = f"tr[data-key='{console_key.split('_')[1]}']"
    assert text_of(browser, f"{key_row} .key-state") == "active"
    browser.find_element(By.CSS_SELECTOR, f"{key_row} button.revoke").click()
    until("the confirmation", lambda: _alert(browser)).accept()
    until("the revocation", lambda: "revoked key" in text_of(browser, ".msg"))
    assert text_of(browser, f"{key_row} .key-state") == "revoked"
    shot(browser, "keys")
    until("the refusal", lambda: infer(platform, "slow-console", console_key).status_code == 401)
    assert infer(platform, "slow-console", key).is_success

    browser.get(f"{admin}/console/models/slow-console")
    field = browser.find_element(By.ID, "max-replicas")
    field.clear()
    field.send_keys("2")
    submit(browser, "scaling-submit")
    until("the scaling change", lambda: "scaling changed" in text_of(browser, ".msg"))
    assert browser.find_element(By.ID, "max-replicas").get_attribute("value") == "2"

    submit(browser, "delete")
    until("the confirmation", lambda: _alert(browser)).accept()
    until("the deletion", lambda: "deleted slow-console" in text_of(browser, ".msg"))
    assert not browser.find_elements(By.CSS_SELECTOR, row)
    shot(browser, "models-after-delete")
    with httpx.Client(timeout=WAIT_S) as http:
        gone = http.get(
            f"{admin}/admin/v1/models/slow-console", headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert gone.status_code == 404


def _alert(browser: WebDriver) -> Any:
    try:
        return browser.switch_to.alert
    except NoAlertPresentException:
        return None


def test_a_change_without_the_csrf_token_is_refused(platform: Platform):
    admin = platform.admin
    model_dir = write_python_model(platform.models_dir, "csrf-probe", SLOW_MODEL, dims=(4,))
    form = {"name": "csrf-probe", "storage_uri": str(model_dir)}
    with httpx.Client(base_url=admin, timeout=WAIT_S) as http:
        assert http.post("/console/models", data=form).status_code == 401
        login = http.post("/console/login", data={"token": TOKEN})
        assert login.status_code == 303
        session = login.cookies["zeroserve_console"]
        # Secure cookies travel only over https in httpx: the session is sent by hand.
        cookie = {"Cookie": f"zeroserve_console={session}"}
        page = http.get("/console/models", headers=cookie)
        assert page.status_code == 200
        assert "default-src 'self'" in page.headers["content-security-policy"]
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert csrf is not None

        for refused in (form, {**form, "csrf": "0" * 64}):
            response = http.post("/console/models", data=refused, headers=cookie)
            assert response.status_code == 403
            assert "CSRF" in response.text
        cross = http.post(
            "/console/models",
            data={**form, "csrf": csrf.group(1)},
            headers={**cookie, "Origin": "https://elsewhere.example"},
        )
        assert cross.status_code == 403
        listed = http.get("/admin/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
        assert "csrf-probe" not in [m["name"] for m in listed.json()["models"]]

        # The same form with the session's token goes through.
        accepted = http.post(
            "/console/models", data={**form, "csrf": csrf.group(1)}, headers=cookie
        )
        assert accepted.status_code == 303
        assert accepted.headers["location"].startswith("/console/models/csrf-probe?msg=")
        deleted = http.delete(
            "/admin/v1/models/csrf-probe", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert deleted.status_code == 204
