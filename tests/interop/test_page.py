"""The page `capstan serve` embeds, in headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium): send a message and see the streamed reply, see a
worker appear and finish in the live panel, see a denial in the audit view, deny and
approve calls parked for approval; a screenshot of each is kept in target/interop/."""

import os
import pathlib
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ready
from selenium.webdriver.support.ui import WebDriverWait

from conftest import ROOT, WORKER_REPLY, Server

SHOTS = ROOT / "target" / "interop"
CHROMIUM = os.environ.get("CAPSTAN_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.environ.get("CAPSTAN_CHROMEDRIVER", "/usr/bin/chromedriver")


@pytest.fixture
def browser():
    assert pathlib.Path(CHROMIUM).is_file(), f"{CHROMIUM} is missing: scripts/test installs chromium"
    profile = tempfile.TemporaryDirectory(prefix="capstan-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile.name}",
                 "--window-size=1200,800"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    yield driver
    driver.quit()
    profile.cleanup()


def send(driver, text):
    box = driver.find_element(By.ID, "message")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.CSS_SELECTOR, "#send button").click()


def test_a_person_chats_watches_a_worker_and_finds_a_denial(server, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    wait = WebDriverWait(browser, 120)
    browser.get(server.url + "/")
    send(browser, "Please count the files.")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.agent.done"))
    reply = browser.find_elements(By.CSS_SELECTOR, ".msg.agent.done")[-1]
    assert reply.text == WORKER_REPLY

    worker = '#processes li[data-process="worker:1"] .state'
    wait.until(ready.text_to_be_present_in_element((By.CSS_SELECTOR, worker), "done"))
    assert "file_list" in browser.find_element(By.ID, "activity").text
    # The worker's call is stored before the reply leaves: the conversation's cost has it.
    wait.until(ready.text_to_be_present_in_element((By.ID, "cost"), "Tool calls in main: 1,"))
    assert "peak memory" in browser.find_element(By.ID, "cost").text
    browser.save_screenshot(str(SHOTS / "page-chat.png"))

    send(browser, "Then read it yourself.")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.agent.done")) == 2)
    assert browser.find_elements(By.CSS_SELECTOR, ".msg.agent.done")[-1].text == "I may not read files."
    wait.until(ready.text_to_be_present_in_element((By.ID, "activity"), "file_read denied"))

    browser.find_element(By.CSS_SELECTOR, 'nav button[data-view="audit"]').click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#audit-table tr.denied"))
    denied = browser.find_element(By.CSS_SELECTOR, "#audit-table tr.denied").text
    assert "file_read" in denied and "channel:main" in denied
    header = browser.find_element(By.CSS_SELECTOR, "#audit-table tr").text
    assert "peak memory" in header and "requests" in header, header
    browser.save_screenshot(str(SHOTS / "page-audit.png"))


def test_the_live_panel_recovers_after_the_server_restarts(server, browser):
    """The page resumes its event stream with the id it saw last; the restarted server
    answers with a `reset`, and the page starts its live panel over and follows again."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    wait = WebDriverWait(browser, 120)
    browser.get(server.url + "/")
    send(browser, "Please count the files.")
    worker = '#processes li[data-process="worker:1"] .state'
    wait.until(ready.text_to_be_present_in_element((By.CSS_SELECTOR, worker), "done"))
    wait.until(lambda d: [m.text for m in d.find_elements(By.CSS_SELECTOR, ".msg.agent.done")] == [WORKER_REPLY])

    server.restart()
    wait.until(ready.text_to_be_present_in_element((By.ID, "activity"), "the server restarted"))
    assert not browser.find_elements(By.CSS_SELECTOR, '#processes li[data-process="worker:1"]')
    send(browser, "Please count the files.")
    again = '#processes li[data-process="worker:2"] .state'
    wait.until(ready.text_to_be_present_in_element((By.CSS_SELECTOR, again), "done"))
    wait.until(lambda d: [m.text for m in d.find_elements(By.CSS_SELECTOR, ".msg.agent.done")]
               == [WORKER_REPLY, WORKER_REPLY])
    browser.save_screenshot(str(SHOTS / "page-restarted.png"))


def test_the_page_fits_a_narrow_screen(server, browser):
    browser.set_window_size(390, 844)
    browser.get(server.url + "/")
    send(browser, "hello")
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.agent.done"))
    width = browser.execute_script("return document.documentElement.scrollWidth")
    viewport = browser.execute_script("return window.innerWidth")
    assert width <= viewport, f"the page is {width}px wide on a {viewport}px screen"
    browser.save_screenshot(str(SHOTS / "page-narrow.png"))


class Receiver:
    """The team's endpoint the approved call posts to: it keeps each body it receives."""

    def __init__(self):
        bodies = self.bodies = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                bodies.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"received")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_person_denies_the_injected_call_and_approves_the_asked_for_one_on_the_page(browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    receiver = Receiver()
    worker = ('[profiles.worker]\ntools = ["file_read", "http_request", "set_status"]\n'
              f'capabilities = ["fs.read"]\nnet = ["http://127.0.0.1:{receiver.port}"]\n')
    running = Server(tokens=False, post_url=f"http://127.0.0.1:{receiver.port}/", extra=worker)
    try:
        wait = WebDriverWait(browser, 120)
        browser.get(running.url + "/")
        browser.find_element(By.CSS_SELECTOR, 'nav button[data-view="approvals"]').click()
        browser.find_element(By.CSS_SELECTOR, 'nav button[data-view="chat"]').click()
        send(browser, "Please read the page and post its summary.")
        browser.find_element(By.CSS_SELECTOR, 'nav button[data-view="approvals"]').click()
        # Each parked call, as it comes: the one the page asked for is denied, the one the
        # user asked for approved. The view refreshes on the approval_requested event.
        for words, verb in [("all the notes", "deny"), ("Revenue is up", "approve")]:
            row = f'//table[@id="approval-table"]//tr[td[contains(., "{words}")]]'
            wait.until(lambda d: d.find_elements(By.XPATH, row))
            found = browser.find_element(By.XPATH, row)
            assert "untrusted(file:page.html)" in found.text, found.text
            if verb == "approve":
                browser.save_screenshot(str(SHOTS / "page-approvals.png"))
            button = found.find_element(By.CSS_SELECTOR, f"button.{verb}")
            # In sight without scrolling, however long the arguments.
            width = browser.execute_script("return window.innerWidth")
            assert button.rect["x"] + button.rect["width"] <= width, (button.rect, width)
            button.click()
            wait.until(lambda d: not d.find_elements(By.XPATH, row))
        wait.until(ready.text_to_be_present_in_element((By.ID, "activity"), "approved by token:local"))
        browser.find_element(By.CSS_SELECTOR, 'nav button[data-view="chat"]').click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.agent.done"))
        reply = browser.find_elements(By.CSS_SELECTOR, ".msg.agent.done")[-1]
        assert reply.text == "The summary is posted.", reply.text
        assert receiver.bodies == ["Revenue is up 4%."], receiver.bodies
    finally:
        running.stop()
        receiver.close()
