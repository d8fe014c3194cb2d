#!/usr/bin/env python3
"""The plan explorer in a real browser (issue 40): headless Chromium (Debian's chromium and
chromium-driver, driven by selenium) opens `loom-dump PLANS --html` pages and checks
- the grid has a cell per rank;
- hovering a rank names its groups; clicking it shows its programs as a graph, a node per
  instruction of the chosen program;
- a collective call's hover names its group and members;
- the timeline draws a bar per span the page keeps (the counts the page carries from the
  simulator);
- the memory view draws a row per stage;
- loomc check's verdict is on the page;
- the console has no error.
It prints each page's load time (navigation start to the grid drawn) and, with --screenshots DIR,
saves a PNG of every view. A `loomc search --html` page (--search): a table row and a scatter point
per candidate, a click on a column sorts by it, no console error.

  plan_explorer_browser.py --page NAME=PAGE.html:WORLD [--page ...] [--search PAGE.html] [--screenshots DIR]
"""
import argparse
import json
import os
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By


def browser():
    options = Options()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                 "--allow-file-access-from-files"):
        options.add_argument(flag)
    options.binary_location = "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def check(driver, name, path, world, shots):
    failures = []

    def expect(ok, what):
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {what}", flush=True)
        if not ok:
            failures.append(what)

    started = time.time()
    driver.get("file://" + os.path.abspath(path))
    cells = driver.find_elements(By.CSS_SELECTOR, "#gridsvg rect")
    load = time.time() - started
    print(f"     {name}: loaded and drawn in {load:.2f} s ({os.path.getsize(path) / 2**20:.1f} MiB)", flush=True)
    expect(len(cells) == world, f"{len(cells)} grid cells for {world} ranks")
    verdict = driver.find_element(By.ID, "check").text
    expect(verdict.startswith("loomc check: checked "), f"the checker's verdict shown: {verdict[:80]!r}")
    data = json.loads(driver.execute_script("return document.getElementById('data').textContent"))
    r = min(5, world - 1)
    cell = driver.find_element(By.CSS_SELECTOR, f"#gridsvg rect[data-rank='{r}']")
    ActionChains(driver).move_to_element(cell).perform()
    info = driver.find_element(By.ID, "rankinfo").text
    expect(f"rank {r} " in info and "tp group: [" in info and "dp group: [" in info, f"hovering rank {r} names its groups")
    if shots:
        driver.save_screenshot(os.path.join(shots, f"explorer-{name}-grid.png"))
    driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", cell)
    title = driver.find_element(By.ID, "progtitle").text
    expect(title.startswith(f"rank {r} runs"), f"clicking rank {r} shows its programs ({title})")
    programs = data["programFiles"][data["ranks"][r][5]]["programs"]
    nodes = driver.find_elements(By.CSS_SELECTOR, "#graph g.node")
    expect(len(nodes) == len(programs[0]["instructions"]),
           f"the graph of {programs[0]['name']}: {len(nodes)} nodes for {len(programs[0]['instructions'])} instructions")
    tip = nodes[0].find_element(By.TAG_NAME, "title").get_attribute("textContent") if nodes else ""
    expect(" on " in tip and "inputs:" in tip and ", from loom." in tip,
           f"a node's hover names its op, stream, operands and IR op: {tip.splitlines()[0] if tip else ''!r}")
    if shots:
        driver.save_screenshot(os.path.join(shots, f"explorer-{name}-programs.png"))
    driver.find_element(By.CSS_SELECTOR, "nav button[data-view='collectives']").click()
    calls = driver.find_elements(By.CSS_SELECTOR, "#colltable tr.call")
    hover = calls[0].get_attribute("title") if calls else ""
    expect(bool(calls) and hover.startswith("group ") and "ranks [" in hover,
           f"{len(calls)} collective rows; the first's hover: {hover!r}")
    if shots:
        driver.save_screenshot(os.path.join(shots, f"explorer-{name}-collectives.png"))
    driver.find_element(By.CSS_SELECTOR, "nav button[data-view='timeline']").click()
    bars = len(driver.find_elements(By.CSS_SELECTOR, "#tl rect.bar"))
    t = data["timeline"]
    want = t["programBars"] + t["communicationBars"] if t else 0
    expect(t is not None and bars == want, f"{bars} timeline bars, the simulator's spans kept: {want}")
    if shots:
        driver.save_screenshot(os.path.join(shots, f"explorer-{name}-timeline.png"))
    driver.find_element(By.CSS_SELECTOR, "nav button[data-view='memory']").click()
    rows = len(driver.find_elements(By.CSS_SELECTOR, "#mem text")) // 2
    expect(rows == len(data["memoryRanks"]), f"{rows} memory rows, one per stage")
    if shots:
        driver.save_screenshot(os.path.join(shots, f"explorer-{name}-memory.png"))
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    expect(not errors, f"no console errors {errors[:2] if errors else ''}")
    return failures


def check_search(driver, path, shots):
    failures = []

    def expect(ok, what):
        print(f"{'ok  ' if ok else 'FAIL'} search: {what}", flush=True)
        if not ok:
            failures.append(what)

    driver.get("file://" + os.path.abspath(path))
    data = json.loads(driver.execute_script("return document.getElementById('data').textContent"))
    rows = driver.find_elements(By.CSS_SELECTOR, "#table tr.candidate")
    points = driver.find_elements(By.CSS_SELECTOR, "#scatter circle.point")
    expect(len(rows) == len(data) and len(points) == len(data),
           f"{len(rows)} table rows and {len(points)} points for {len(data)} candidates")
    header = [th for th in driver.find_elements(By.CSS_SELECTOR, "#table th") if th.text.startswith("memory MiB")][0]
    header.click()
    memory = [float(r.find_elements(By.TAG_NAME, "td")[15].text)
              for r in driver.find_elements(By.CSS_SELECTOR, "#table tr.candidate")]
    expect(memory == sorted(memory), "a click on 'memory MiB' sorts the rows by it")
    if shots:
        driver.save_screenshot(os.path.join(shots, "explorer-search.png"))
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    expect(not errors, f"no console errors {errors[:2] if errors else ''}")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--page", action="append", required=True, help="NAME=PAGE.html:WORLD")
    ap.add_argument("--search", default="", help="a loomc search --html page")
    ap.add_argument("--screenshots", default="")
    args = ap.parse_args()
    if args.screenshots:
        os.makedirs(args.screenshots, exist_ok=True)
    driver = browser()
    failures = []
    try:
        for spec in args.page:
            name, rest = spec.split("=", 1)
            path, world = rest.rsplit(":", 1)
            failures += check(driver, name, path, int(world), args.screenshots)
        if args.search:
            failures += check_search(driver, args.search, args.screenshots)
    finally:
        driver.quit()
    print(f"{'FAIL' if failures else 'ok'}: {len(failures)} checks failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
