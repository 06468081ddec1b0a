"""Drives the web console in headless Chromium, as an operator would, and prints what it saw.

Run by tests/tests/console.rs against a real 3-broker cluster. Each step waits (with a
deadline) for the page to show what the broker really holds, then acts through the page's
own controls:

  1. the Cluster page lists every broker and the owner of each partition;
  2. the Topics page shows the topic with the records produced to it, and a topic created
     through its form appears;
  3. the Groups page shows the group's lag;
  4. a partition moved with its Move button is shown owned by the target broker.

The caller checks the effects through the Kafka protocol afterwards. With --screenshots DIR,
a PNG of each page is saved there (docs/console-*.png come from such a run).
"""
import argparse
import json
import os
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

DEADLINE = 60


def browser():
    options = Options()
    options.add_argument("--headless=new")
    options.add_argument("--no-sandbox")  # CI runs as root, where Chromium's sandbox refuses to start
    options.add_argument("--disable-dev-shm-usage")
    options.add_argument("--window-size=1280,900")
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    service = Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=options, service=service)


def wait_for(driver, what, condition):
    """Waits until `condition(driver)` returns something truthy; fails naming `what`. The page
    re-renders its tables as it polls, so an element `condition` found can be replaced before
    it is read or clicked: that attempt counts as not yet, and the next poll finds the new one."""
    try:
        return WebDriverWait(driver, DEADLINE, poll_frequency=0.2,
                             ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: condition(d), message=what)
    except TimeoutException:
        status = driver.find_element(By.ID, "status").text
        sys.exit(f"timed out waiting for {what} (console status: {status!r})")


def cell(driver, selector, column):
    """The text of `column` in the first row matching `selector`, read in one step: the page
    re-renders its tables as it polls, so a row found in one call may be gone in the next."""
    return driver.execute_script(
        "const row = document.querySelector(arguments[0]);"
        "const cell = row && row.querySelector(arguments[1]);"
        "return cell ? cell.textContent : null;", selector, column)


def show(driver, tab):
    driver.find_element(By.CSS_SELECTOR, f'.tab[data-tab="{tab}"]').click()
    wait_for(driver, f"the {tab} page to load",
             lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == tab)


def screenshot(driver, directory, name):
    if directory:
        driver.save_screenshot(os.path.join(directory, f"console-{name}.png"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--brokers", required=True, help="comma-separated broker ids")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--lag", type=int, required=True)
    parser.add_argument("--create", required=True, help="a topic to create through the page")
    parser.add_argument("--move-partition", type=int, required=True)
    parser.add_argument("--to", type=int, required=True)
    parser.add_argument("--screenshots")
    args = parser.parse_args()
    brokers = sorted(int(b) for b in args.brokers.split(","))
    seen = {}

    driver = browser()
    try:
        driver.get(args.url + "#cluster")
        wait_for(driver, f"brokers {brokers} on the Cluster page", lambda d: sorted(
            int(r.get_attribute("data-broker"))
            for r in d.find_elements(By.CSS_SELECTOR, "#brokers tbody tr")) == brokers)
        name = f"{args.topic}-{args.move_partition}"
        row = f'#owners tr[data-partition="{name}"]'
        seen["owner_before"] = int(wait_for(driver, f"the owner of {name}",
                                            lambda d: cell(d, row, ".owner")))
        screenshot(driver, args.screenshots, "cluster")

        show(driver, "topics")
        topic_row = f'#topic-list tr[data-topic="{args.topic}"]'
        wait_for(driver, f"{args.records} records in {args.topic}",
                 lambda d: cell(d, topic_row, ".records") == str(args.records))
        seen["records"] = int(cell(driver, topic_row, ".records"))
        form = driver.find_element(By.ID, "create-topic")
        form.find_element(By.NAME, "name").send_keys(args.create)
        form.find_element(By.NAME, "partitions").send_keys("2")
        form.find_element(By.NAME, "configs").send_keys("retention.ms=3600000")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        created = f'#topic-list tr[data-topic="{args.create}"]'
        wait_for(driver, f"topic {args.create} listed",
                 lambda d: d.find_elements(By.CSS_SELECTOR, created))
        seen["created_row"] = wait_for(driver, f"the row of topic {args.create}", lambda d: d.execute_script(
            "const row = document.querySelector(arguments[0]); return row ? row.textContent : null;",
            created))
        screenshot(driver, args.screenshots, "topics")

        show(driver, "groups")
        group_row = f'#group-list tr[data-group="{args.group}"]'
        wait_for(driver, f"lag {args.lag} for group {args.group}",
                 lambda d: cell(d, group_row, ".lag") == str(args.lag))
        seen["lag"] = int(cell(driver, group_row, ".lag"))
        screenshot(driver, args.screenshots, "groups")

        show(driver, "cluster")
        started = time.monotonic()

        def move(d):
            # Choosing the target and clicking Move on one rendering of the row: a refresh in
            # between raises StaleElementReferenceException before the click, and wait_for
            # tries again on the new row.
            Select(d.find_element(By.CSS_SELECTOR, f"{row} .move-target")).select_by_value(str(args.to))
            d.find_element(By.CSS_SELECTOR, f"{row} .move").click()
            return True

        wait_for(driver, f"the Move control of {name}", move)
        wait_for(driver, f"{name} owned by broker {args.to}",
                 lambda d: cell(d, row, ".owner") == str(args.to))
        seen["owner_after"] = args.to
        seen["move_seen_after_s"] = round(time.monotonic() - started, 2)
        screenshot(driver, args.screenshots, "moved")
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        seen["browser_errors"] = [e.get("message") for e in errors]
    finally:
        driver.quit()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
