"""The hub's "my jobs" page on the lab (issue 48, item 5): two workshop participants each run
a busy plain sbatch job; each logs in to the real hub in a real headless chromium, opens
the page (a JupyterHub service behind the hub's login) and sees their own job with its CPU
and memory charts from the lab's Prometheus, refreshed while the page stays open, and never
the other's job: not in the page, not in its JSON, whatever the URL asks. A browser that
has not logged in is sent to the hub's login. The screenshot goes to build/screenshots
(`make docs-pictures`: docs/hub-my-jobs.png).
"""
from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from browser import SCREENSHOTS, chromium, screenshot
from test_directory import as_user, workshop
from test_hub import LAB, login, new_workshop, url, wait_for

from pyhpc.hub import api

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

#: A new name each run: Prometheus keeps a name's jobs, and a workshop made again with the
#: same name gives its participants' names again (docs/researchers/hub.md#my-jobs).
WORKSHOP = f"mj{secrets.token_hex(3)}"
#: Each job keeps its one CPU busy this long: the page has samples to chart meanwhile.
BUSY_S = 240
#: The page's first answer, then its refresh (every 30 s), and Prometheus' 5 s scrapes.
SHOWN_S = 150


def page_url() -> str:
    """The service at its own origin, my-jobs--service.<the hub's name> (JupyterHub's name
    for a service's subdomain)."""
    assert LAB.jupyterhub is not None
    return f"https://my-jobs--service.{api.hostname(LAB)}:{LAB.jupyterhub.port}/services/my-jobs/"


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, str]]]:
    """Two participants of a new workshop, each with a running job of their own (its id in
    the row's ``job``); the workshop is deleted afterwards, which cancels the jobs."""
    rows = new_workshop(tmp_path_factory, WORKSHOP, 1, 1)
    for row in rows:
        row["job"] = as_user(row["user"], (
            f"sbatch --parsable --reservation={row['reservation']} --ntasks=1 --time=6 "
            f"--wrap 'timeout {BUSY_S} sh -c \"while :; do :; done\"'")).stdout.strip()
    yield rows
    workshop("delete", WORKSHOP, "--homes", check=False)


def shown_jobs(driver: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [tr.get_attribute("data-job") for tr in driver.find_elements(By.CSS_SELECTOR, "tr[data-job]")]


def charts(driver: Any, job: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [svg.get_attribute("data-chart") for svg in
            driver.find_elements(By.CSS_SELECTOR, f"#job-{job} svg[data-chart]")]


def own_json(driver: Any, query: str = "") -> dict[str, Any]:
    """The page's JSON as this browser gets it (its cookies), ``query`` appended."""
    from selenium.webdriver.common.by import By

    driver.get(page_url() + "api/jobs" + query)
    data: dict[str, Any] = json.loads(driver.find_element(By.TAG_NAME, "body").text)
    return data


def test_a_browser_that_has_not_logged_in_is_sent_to_the_hubs_login() -> None:
    with chromium(insecure_tls=True) as driver:
        driver.get(page_url())
        assert driver.current_url.startswith(url() + "hub/login"), driver.current_url
        assert "data-job" not in driver.page_source


def own_page(me: dict[str, str], other: dict[str, str], shot: bool) -> None:
    """``me`` logs in, opens the page and waits for their job's charts; checks that the page
    refreshes in place, and that neither it nor its JSON shows ``other``'s job."""
    job, theirs = me["job"], other["job"]
    with chromium(width=1300, height=900, insecure_tls=True) as driver:
        login(driver, me["user"], me["password"])
        assert "services/my-jobs/" in driver.page_source  # the hub's Services menu
        driver.get(page_url())
        wait_for(f"{me['user']}'s job {job} charted",
                 lambda: "CPU" in charts(driver, job) or driver.refresh(), SHOWN_S, every=10)
        assert shown_jobs(driver) == [job]
        assert {"CPU", "Memory"} <= set(charts(driver, job))
        source = driver.page_source
        assert f'data-job="{theirs}"' not in source
        assert f'id="job-{theirs}"' not in source and f"Job {theirs} " not in source
        # The page stays open: its script swaps in a new part, no navigation.
        driver.execute_script("window.pyhpcStayed = true;")
        before = driver.find_element("id", "updated").text
        wait_for("the page's refresh",
                 lambda: driver.find_element("id", "updated").text != before, 75, every=3)
        assert driver.execute_script("return window.pyhpcStayed === true;")
        if shot:
            screenshot(driver, SCREENSHOTS / "hub-my-jobs.png")
        # The user is the hub's, never the request's.
        for query in ("", f"?user={other['user']}", f"?user={other['user']}&jobid={theirs}"):
            data = own_json(driver, query)
            assert data["user"] == me["user"] and [j["job_id"] for j in data["jobs"]] == [job]
            assert set(data["charts"]) == {job}


def test_each_participant_sees_their_own_job_charted_and_refreshed_never_the_others(
        busy: list[dict[str, str]]) -> None:
    own_page(busy[0], busy[1], shot=True)
    own_page(busy[1], busy[0], shot=False)
