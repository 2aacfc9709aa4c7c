"""The chat page at / in headless Chromium against a running `synapse serve`: an answer streams
in (seen growing, not written once), Stop ends a stream, and a server error shows on the page.

    python tests/server/test_page.py --base-url http://127.0.0.1:PORT
"""

import argparse
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

LIMIT = 60  # seconds any one wait may take


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def wait_for(what, check):
    t0 = time.monotonic()
    while time.monotonic() - t0 < LIMIT:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    sys.exit(f"FAIL: no {what} within {LIMIT} s")


def fill(d, id, value):
    el = d.find_element(By.ID, id)
    el.clear()
    el.send_keys(value)


def ask(d, text):
    """Send `text`; the new assistant message's element once it is on the page."""
    before = len(d.find_elements(By.CSS_SELECTOR, ".assistant"))
    fill(d, "input", text)
    d.find_element(By.ID, "send").click()

    def new():
        return d.find_elements(By.CSS_SELECTOR, ".assistant")[before:]

    return wait_for("assistant message", new)[0]


def watch(d, el):
    """The distinct texts of `el` seen while the send button is disabled, and the final text."""
    send = d.find_element(By.ID, "send")
    seen = []
    t0 = time.monotonic()
    while not send.is_enabled():
        text = el.text
        if text and (not seen or text != seen[-1]):
            seen.append(text)
        if time.monotonic() - t0 > LIMIT:
            sys.exit(f"FAIL: still streaming after {LIMIT} s ({len(seen)} texts seen)")
        time.sleep(0.02)
    return seen, el.text


def streams(d):
    fill(d, "temperature", "0")
    fill(d, "max-tokens", "96")
    el = ask(d, "Write a short story about a robot who learns to paint.")
    seen, final = watch(d, el)
    print(f"streamed: {len(seen)} distinct texts while streaming, lengths {[len(s) for s in seen]}")
    print(f"final ({len(final)} chars): {final!r}")
    assert len(seen) >= 2, f"the answer was not seen growing: {seen}"
    for a, b in zip(seen, seen[1:]):
        assert b.startswith(a) and len(b) > len(a), f"changed other than by growing: {a!r} -> {b!r}"
    assert final.strip(), "the final answer is empty"
    assert final.startswith(seen[-1])
    assert d.find_element(By.ID, "send").is_enabled()
    assert not d.find_element(By.ID, "stop").is_enabled()
    assert not d.find_elements(By.CSS_SELECTOR, ".error"), "an error was shown"


def stops(d):
    fill(d, "max-tokens", "400")
    el = ask(d, "Now tell me a much longer story about the same robot.")
    wait_for("text before stopping", lambda: el.text)
    d.find_element(By.ID, "stop").click()
    wait_for("send button enabled after Stop", lambda: d.find_element(By.ID, "send").is_enabled())
    stopped = el.text
    time.sleep(0.5)
    notes = [n.text for n in d.find_elements(By.CSS_SELECTOR, ".note")]
    print(f"stopped at {len(stopped)} chars; notes: {notes}")
    assert el.text == stopped, "the answer kept growing after Stop"
    assert not d.find_element(By.ID, "stop").is_enabled()
    assert not d.find_elements(By.CSS_SELECTOR, ".error"), "Stop was shown as an error"


def shows_errors(d):
    fill(d, "temperature", "1000")
    fill(d, "input", "Hello")
    d.find_element(By.ID, "send").click()
    err = wait_for("error message", lambda: d.find_elements(By.CSS_SELECTOR, ".error"))[0].text
    print(f"error shown: {err!r}")
    assert "HTTP 400" in err and "temperature" in err, err
    assert d.find_element(By.ID, "send").is_enabled()
    given_back = d.find_element(By.ID, "input").get_attribute("value")
    assert given_back == "Hello", f"the failed message was not given back: {given_back!r}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    args = ap.parse_args()
    d = browser()
    try:
        d.get(args.base_url + "/")
        assert d.title == "synapse", d.title
        streams(d)
        stops(d)
        shows_errors(d)
        # The 400 asked for above is logged by the browser; anything else is the page's fault.
        logs = [
            e
            for e in d.get_log("browser")
            if e["level"] == "SEVERE" and "/v1/chat/completions" not in e["message"]
        ]
        assert not logs, f"the page logged errors: {logs}"
    finally:
        d.quit()
    print("test_page: ok")


if __name__ == "__main__":
    main()
