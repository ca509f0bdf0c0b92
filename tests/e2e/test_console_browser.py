"""The console in a real browser (Debian's Chromium, driven by Selenium) on a stack of service
processes that answered real requests: sign in with an admin key, see the traffic on every page, find
the episodes that were sent, read each step of one, and see the requests the gateway refused a
rate-limited tenant. BATON_CONSOLE_SCREENSHOTS=DIR saves each page."""

import csv
import os
import shutil
import sys
from pathlib import Path

import openai
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from testbed import MMLU_PRO, default_config_data, running_stack, wait_for_episodes

from baton_platform.apikeys import hash_key, mint_key

ADMIN, CALLER, CAPPED = mint_key(), mint_key(), mint_key()
QUESTIONS = 6


def questions(n):
    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        rows = csv.DictReader(f)
        return [next(rows) for _ in range(n)]


@pytest.fixture(scope="module")
def served(kafka_bootstrap, tmp_path_factory):
    """A stack whose gateway answered QUESTIONS graded questions from three tenants, and refused the
    one allowed a request a minute its second request (429) and one for a model it does not serve."""
    data = default_config_data()
    data["gateway"] = {"auth": "keys"}
    data["tenants"] = [{"name": "acme", "budget_usd": 5, "keys": [{"sha256": hash_key(CALLER), "scopes": ["chat", "eval"]}]},
                       {"name": "ops", "keys": [{"sha256": hash_key(ADMIN), "scopes": ["admin", "chat", "eval"]}]},
                       {"name": "capped", "requests_per_minute": 1,
                        "keys": [{"sha256": hash_key(CAPPED), "scopes": ["chat", "eval"]}]}]
    data["reward_logger"]["flush_interval_s"] = 0.5
    # The stack's readiness checks read the dataset too: a page must not show that read, made before
    # the questions were asked, for the default 5 s.
    data["console"] = {"refresh_s": 0.2}
    with running_stack(data, tmp_path_factory.mktemp("console"), kafka_bootstrap) as stack:
        ids = []
        for i, row in enumerate(questions(QUESTIONS)):
            key = CALLER if i % 2 else CAPPED if i == 0 else ADMIN
            client = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=60)
            ask = {"messages": [{"role": "user", "content": row["prompt"]}],
                   "metadata": {"baton_eval": f"mmlu_pro:{row['sample_id']}"}}
            completion = client.chat.completions.create(model="baton", **ask)
            ids.append(completion.model_extra["baton"]["request_id"])
            if key == CAPPED:  # its one request of the minute is spent: the next is refused, as is an unknown model
                with pytest.raises(openai.RateLimitError) as limited:
                    client.chat.completions.create(model="baton", **ask)
                assert limited.value.code == "rate_limit_exceeded"
                with pytest.raises(openai.NotFoundError):
                    client.chat.completions.create(model="no-such-model", **ask)
        rows = wait_for_episodes(stack.dataset_dir, ids, 60)
        assert len(rows) == QUESTIONS
        stack.request_ids, stack.rows = ids, {r["request_id"]: r for r in rows}
        yield stack


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=ChromeService(shutil.which("chromedriver") or "chromedriver"), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def arrived(browser, heading: str) -> None:
    """Wait for the page a click led to: until then the old page's elements are still found."""
    WebDriverWait(browser, 10, ignored_exceptions=[StaleElementReferenceException]).until(
        lambda b: b.find_element(By.TAG_NAME, "h1").text == heading)


def shot(browser, name):
    folder = os.environ.get("BATON_CONSOLE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(folder) / f"{name}.png"))


@pytest.fixture(scope="module")
def signed_in(served, browser):
    browser.get(served.console_url + "/")
    assert browser.current_url.endswith("/login"), "the console asks for a key first"
    browser.find_element(By.NAME, "key").send_keys(ADMIN)
    browser.find_element(By.TAG_NAME, "button").click()
    arrived(browser, "Overview")
    return browser


def test_the_overview_charts_the_traffic_sent(served, signed_in):
    signed_in.get(served.console_url + "/")
    assert f"{QUESTIONS} episodes" in signed_in.find_element(By.TAG_NAME, "main").text
    assert "Live: following baton.responses" in signed_in.find_element(By.ID, "live").text, "and Kafka, live"
    charts = signed_in.find_elements(By.CSS_SELECTOR, "figure.chart svg")
    assert len(charts) == 5 and all(c.size["width"] > 300 for c in charts), "five charts, drawn"
    legends = {e.text for e in signed_in.find_elements(By.CSS_SELECTOR, "text.legend")}
    assert {"acme", "ops"} <= legends, "split by the tenants that sent them"
    shot(signed_in, "overview")


@pytest.mark.parametrize("path, heading", [("/quality", "Quality and cost"), ("/workflows", "Workflows"),
                                           ("/workers", "Workers"), ("/tenants", "Tenants")])
def test_every_page_draws_the_traffic(served, signed_in, path, heading):
    signed_in.get(served.console_url + path)
    assert signed_in.find_element(By.TAG_NAME, "h1").text == heading
    assert signed_in.find_elements(By.CSS_SELECTOR, "figure.chart svg"), f"{path} draws a chart"
    text = signed_in.find_element(By.TAG_NAME, "main").text
    workers = {s["worker"] for r in served.rows.values() for s in r["steps"]}
    if path in ("/workflows", "/workers"):
        marks = {e.text for e in signed_in.find_elements(By.CSS_SELECTOR, "svg text")}
        assert any(w in m for w in workers for m in marks), f"{path} names the workers that ran"
    if path == "/tenants":
        assert "acme" in text and "ops" in text
    shot(signed_in, path.strip("/"))


def test_the_tenants_page_draws_the_requests_the_gateway_refused(served, signed_in):
    signed_in.get(served.console_url + "/tenants")
    rows = {r.find_elements(By.TAG_NAME, "td")[0].text: [c.text for c in r.find_elements(By.TAG_NAME, "td")[1:]]
            for r in signed_in.find_elements(By.CSS_SELECTOR, "#refusals tr")[1:]}
    header = [h.text for h in signed_in.find_elements(By.CSS_SELECTOR, "#refusals th")]
    assert header == ["tenant", "rate limit", "other rejections", "total"]
    assert rows == {"capped": ["1", "1", "2"]}, "only the capped tenant was refused"
    (chart,) = [f for f in signed_in.find_elements(By.CSS_SELECTOR, "figure.chart")
                if f.find_element(By.TAG_NAME, "figcaption").text == "refused requests by tenant and reason"]
    assert chart.find_element(By.TAG_NAME, "svg").size["width"] > 300
    assert {e.text for e in chart.find_elements(By.CSS_SELECTOR, "text.legend")} == {"rate limit", "other rejections"}
    source = signed_in.find_element(By.ID, "refusals-source").text
    assert source.startswith(f"Read from {served.gateway_metrics_url}, since the gateway started")
    shot(signed_in, "tenants-refusals")


def test_the_episodes_sent_are_listed_and_found(served, signed_in):
    signed_in.get(served.console_url + "/episodes")
    listed = {a.text for a in signed_in.find_elements(By.CSS_SELECTOR, "#episodes a")}
    assert set(served.request_ids) <= listed
    shot(signed_in, "episodes")
    signed_in.find_element(By.NAME, "tenant").send_keys("acme")
    signed_in.find_element(By.TAG_NAME, "button").click()
    WebDriverWait(signed_in, 10).until(lambda b: "tenant=acme" in b.current_url)
    found = {a.text for a in signed_in.find_elements(By.CSS_SELECTOR, "#episodes a")}
    assert found == {rid for i, rid in enumerate(served.request_ids) if i % 2}, "the acme key sent the odd ones"


def test_one_episode_shows_every_step(served, signed_in):
    rid = served.request_ids[0]
    signed_in.get(served.console_url + "/episodes")
    signed_in.find_element(By.LINK_TEXT, rid).click()
    arrived(signed_in, f"Episode {rid}")
    row = served.rows[rid]
    steps = signed_in.find_elements(By.CSS_SELECTOR, "#steps tr.step")
    assert len(steps) == len(row["steps"]) > 0
    for shown, step in zip(steps, row["steps"]):
        assert step["worker"] in shown.text and (step["output"] or step["error"])[:40] in shown.text
    assert len(signed_in.find_elements(By.CSS_SELECTOR, "#plan tr")) == len(row["steps"]) + 1
    page = signed_in.find_element(By.TAG_NAME, "main").text
    assert f"quality {row['quality']}" in page and row["reward_detail"][:30] in page
    shot(signed_in, "episode")
