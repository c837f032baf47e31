"""The dashboard in a real browser (headless Chromium from Debian, driven by selenium).

Real ZooKeeper, real master and worker processes (``framework run``), the dashboard served
by hypercorn in the test's trio run.  The page must show a worker appear and vanish after
kill -9, a master failover, a dead letter requeued from its button that then succeeds, and
in its application selector the running app first (shown) and an app with no live process
marked stale; the worker deferring the app's duties to the leading master; the task list
(recent results, filtered by outcome), a schedule's next fire, a delayed task and a running
task revoked from their buttons (the running one is cancelled and listed as revoked, with its
type).

The application under test is defined here too (``framework run test_dashboard:Boss``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio

from framework import Session
from framework.runtime import (
    App,
    Client,
    Master,
    MasterContext,
    Task,
    TaskResult,
    Worker,
    every,
)
from framework.testing import Child, spawn
from framework.zk import wait_exists, watch_data

APP = App("dash")
OLD = App("old")  # an application with no live process: stale
CURE = f"{APP.base}/cure"  # the poison task succeeds once this node exists
SUBMITTED = f"{APP.base}/submitted"
TESTS = Path(__file__).parent
ROOT = TESTS.parent
CHILD_SESSION_TIMEOUT = 2.0
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
UI_WAIT = 30.0  # explicit waits of the driver, seconds (a bound, not an expectation)


# ------------------------------------------------------------------ the application


class Boss(Master):
    """Publishes a config, submits 12 short tasks and one poison task (once per job, not
    again after a failover), then idles."""

    app_name = APP.name
    # a slot every ~11.6 days: seen for the first time, it starts at its next slot (no fire)
    schedules = [every(1_000_000, "handle", name="rare")]

    async def lead(self, ctx: MasterContext) -> None:
        if await ctx.session.exists(SUBMITTED) is None:  # a new leader does not resubmit
            await ctx.publish_config({"greeting": "hello", "batch": 4})
            keys = [f"t{i:03d}" for i in range(12)]
            await ctx.submit_many("handle", [{"n": i} for i in range(12)], keys=keys)
            await ctx.submit("handle", {"poison": True}, key="poison")
            await ctx.term.commit(lambda txn: txn.create(SUBMITTED, b""))
        await trio.sleep_forever()


class Busy(Worker):
    """Reports progress and a ``pages`` counter (the counters hook); the poison task fails
    until the cure node exists."""

    app_name = APP.name
    concurrency = 2
    max_attempts = 2
    backoff_base = 0.05
    pages = 0

    def health(self) -> dict[str, Any]:
        return {"ok": True, "pages": self.pages}

    async def handle(self, task: Task) -> dict[str, Any]:
        assert self.session is not None
        payload = task.payload or {}
        if payload.get("poison") and await self.session.exists(CURE) is None:
            raise ValueError("poisoned payload: the cure node is missing")
        if payload.get("hold"):  # runs until revoked
            await self.report_progress(task, 0, 1, "held")
            await trio.sleep_forever()
        for step in (1, 2):
            await trio.sleep(0.05)  # the task's work
            await self.report_progress(task, step, 2, "working")
        self.pages += 1
        self.status_changed()
        return {"n": payload.get("n"), "by": self.name}


# ------------------------------------------------------------------ fixtures


async def _spawn(stack: AsyncExitStack, kind: str, hosts: str, chroot: str, name: str,
                 tmp_path: Path) -> Child:
    """``framework run test_dashboard:<kind>`` as a child (killed when ``stack`` closes)."""
    return await stack.enter_async_context(spawn(
        [sys.executable, "-m", "framework", "run", f"test_dashboard:{kind}", "--zk", hosts,
         "--chroot", chroot, "--name", name, "--session-timeout", str(CHILD_SESSION_TIMEOUT)],
        name=name, log_dir=tmp_path,
        env={"PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}", "FRAMEWORK_LOG_LEVEL": "info"}))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's package) under selenium; skipped if not installed."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.skip(f"Debian's chromium/chromium-driver are not installed ({', '.join(missing)} "
                    "missing; `make test` installs them as root: apt-get install chromium "
                    "chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
async def dashboard(zk_hosts: str, chroot: str) -> AsyncIterator[str]:
    """The dashboard (actions allowed) on a free port; yields its URL."""
    from framework.dashboard import serve_dashboard

    async with trio.open_nursery() as nursery:
        url = await nursery.start(lambda task_status: serve_dashboard(
            zk_hosts, port=0, allow_actions=True, chroot=chroot,
            schedules={APP.name: Boss.schedules}, task_status=task_status))
        yield url
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------ helpers


class Page:
    """The driver, used from trio through threads; every wait is the driver's explicit
    wait for an element state (WebDriverWait)."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def run(self, fn: Callable[[], Any]) -> Any:
        return await trio.to_thread.run_sync(fn)

    async def open(self, url: str) -> None:
        await self.run(lambda: self.driver.get(url))

    async def wait(self, condition: Callable[[Any], Any], what: str) -> Any:
        """Wait for ``condition``; an element replaced while it was read (the page
        re-renders what changed) is looked up again."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.support.ui import WebDriverWait

        return await self.run(lambda: WebDriverWait(
            self.driver, UI_WAIT, ignored_exceptions=(StaleElementReferenceException,)
        ).until(condition, message=f"the page never showed: {what}"))

    async def shown(self, css: str, text: str | None = None) -> Any:
        from selenium.webdriver.common.by import By

        def found(driver: Any) -> Any:
            for element in driver.find_elements(By.CSS_SELECTOR, css):
                if text is None or text in element.text:
                    return element
            return False

        return await self.wait(found, f"{css}" + (f" with {text!r}" if text else ""))

    async def click(self, css: str) -> None:
        """Click the element ``css`` once it is there (found again if it was replaced)."""
        from selenium.webdriver.common.by import By

        def clicked(driver: Any) -> bool:
            elements = driver.find_elements(By.CSS_SELECTOR, css)
            if elements:
                elements[0].click()
            return bool(elements)

        await self.wait(clicked, f"{css} to click")

    async def accept(self) -> None:
        """Accept the confirmation the page asked for."""
        from selenium.webdriver.support import expected_conditions

        alert = await self.wait(expected_conditions.alert_is_present(), "a confirmation")
        await self.run(alert.accept)

    async def choose(self, css: str, value: str) -> None:
        """Choose ``value`` in the select element ``css``."""
        from selenium.webdriver.support.ui import Select

        select = await self.shown(css)
        await self.run(lambda: Select(select).select_by_value(value))

    async def gone(self, css: str) -> None:
        from selenium.webdriver.common.by import By

        await self.wait(lambda d: not d.find_elements(By.CSS_SELECTOR, css), f"no {css}")

    async def screenshot(self, path: Path) -> None:
        def take() -> None:
            height = self.driver.execute_script("return document.documentElement.scrollHeight")
            self.driver.set_window_size(1400, min(int(height) + 140, 4000))  # + window frame
            self.driver.save_screenshot(str(path))
            self.driver.set_window_size(1400, 1000)

        await self.run(take)


async def succeeded(session: Session, key: str) -> None:
    """Return once the result record of ``key`` says it succeeded (a watch, no polling)."""
    async for snap in watch_data(session, APP.result_path(key)):
        if snap.data and TaskResult.decode(snap.data).ok:
            return


def shot_path(name: str) -> Path | None:
    """Screenshots go to docs/ when DASHBOARD_SCREENSHOTS=1 (how docs/dashboard*.png are
    made); otherwise nowhere."""
    return ROOT / "docs" / name if os.environ.get("DASHBOARD_SCREENSHOTS") == "1" else None


# ------------------------------------------------------------------ the tests


async def test_dashboard_live_in_a_browser(zk_hosts: str, chroot: str, tmp_path: Path,
                                           browser: Any, dashboard: str) -> None:
    page = Page(browser)
    app = f"#app-{APP.name}"
    with trio.fail_after(120):
        async with Session(zk_hosts, chroot=chroot) as session, AsyncExitStack() as procs:
            boss_a = await _spawn(procs, "Boss", zk_hosts, chroot, "boss-a", tmp_path)
            await wait_exists(session, APP.rendezvous)  # boss-a leads: the line is fixed
            await _spawn(procs, "Boss", zk_hosts, chroot, "boss-b", tmp_path)
            await _spawn(procs, "Busy", zk_hosts, chroot, "w1", tmp_path)
            await session.ensure_path(OLD.workers)
            await page.open(dashboard)
            # the running app comes first in the selector and is the one shown
            await page.shown(f"#selector a.app-link.selected[data-app='{APP.name}']",
                             "running")
            await page.shown(f"#selector a.app-link[data-app='{OLD.name}'][data-state='stale']",
                             "stale")
            await page.shown(f"{app} .leader[data-leader='boss-a']")
            await page.shown(f"{app} .standby[data-standby='boss-b']")
            await page.shown(f"{app} tr.worker[data-worker='w1'][data-kind='worker']")

            # the poison task dies twice and shows up as a dead letter with its error
            await page.shown(f"{app} tr.dead-letter[data-task='poison']",
                             "the cure node is missing")
            await page.shown(f"{app} tr.failure", "ValueError: poisoned payload")
            # the failure's traceback is stored with it and shown (folded) on the page
            summary = await page.shown(f"{app} tr.dead-letter[data-task='poison'] "
                                       "details.traceback summary")
            await page.run(summary.click)
            await page.shown(f"{app} tr.dead-letter[data-task='poison'] details.traceback pre",
                             "in handle")
            await page.shown(f"{app} .config", '"greeting": "hello"')
            await page.shown(f"{app} [data-counter='pages']")
            # durations as the worker timed them (published in its status record)
            await page.shown(f"{app} .durations .legend", "attempts")

            # the worker holding the app's duties defers them to the leading master
            await page.shown(f"{app} tr.worker[data-worker='w1'] td.duties"
                             "[data-duties='deferred']")
            await page.shown(f"{app} [data-stat='duties'] b", "w1")
            # each queue's depth and the workers serving it: a task put into a named queue
            # no worker serves waits there, the default queue is served by w1
            client = Client(session, APP.name)
            await client.submit("handle", {"n": 98}, key="gpu-bound", queue="gpu")
            await page.shown(f"{app} tr.queue-row[data-queue='gpu'] td.queue-depth", "1")
            await page.shown(f"{app} tr.queue-row[data-queue='gpu'] td.queue-workers", "none")
            await page.shown(f"{app} tr.queue-row[data-queue='default'] td.queue-workers",
                             "w1")
            # the task list, and a schedule's next fire (its definition given to the dashboard)
            await page.shown(f"{app} tr.result[data-outcome='succeeded']")
            await page.shown(f"{app} tr.schedule[data-schedule='rare'] td.next-fire", "(in ")
            # a delayed task revoked from its button
            await client.submit("handle", {"n": 99}, key="later", countdown=3600)
            await page.click(f"{app} tr.delayed-task[data-task='later'] button.revoke")
            await page.accept()
            await page.shown(f"{app} tr.delayed-task[data-task='later'] .revoked")
            # a running task revoked from its button: cancelled, listed as revoked, its type
            await client.submit("handle", {"hold": True}, key="held")
            await page.click(f"{app} .task[data-task='held'] button.revoke")
            await page.accept()
            await page.shown(f"{app} tr.result[data-task='held'][data-outcome='revoked']"
                             "[data-type='handle']")
            # filtered by outcome: only the revoked one
            await page.choose(f"{app} form.task-filter select[name='outcome']", "revoked")
            await page.gone(f"{app} tr.result[data-outcome='succeeded']")
            await page.shown(f"{app} tr.result[data-task='held']")
            if (path := shot_path("dashboard-tasks.png")) is not None:
                await page.screenshot(path)
            await page.choose(f"{app} form.task-filter select[name='outcome']", "")

            # a second worker appears, then vanishes after kill -9
            w2 = await _spawn(procs, "Busy", zk_hosts, chroot, "w2", tmp_path)
            await page.shown(f"{app} tr.worker[data-worker='w2']")
            if (path := shot_path("dashboard-browser-test.png")) is not None:
                await page.screenshot(path)
            killed = time.monotonic()
            w2.kill()
            await page.gone(f"{app} tr.worker[data-worker='w2']")
            print(f"worker row gone {time.monotonic() - killed:.2f}s after kill -9 "
                  f"(session timeout {CHILD_SESSION_TIMEOUT}s)")

            # master failover: kill -9 of the leader, the standby takes over
            boss_a.kill()
            await page.shown(f"{app} .leader[data-leader='boss-b']")
            await page.shown(f"{app} [data-stat='leader changes'] b", "1")

            # requeue the dead letter from its button; the task then succeeds
            await session.create(CURE, b"")
            await page.click(f"{app} tr.dead-letter[data-task='poison'] button.requeue")
            await page.gone(f"{app} tr.dead-letter[data-task='poison']")
            await succeeded(session, "poison")
            field = await page.shown(f"{app} form.lookup input[name='key']")
            await page.run(lambda: field.send_keys("poison\n"))
            await page.shown(f"{app} .lookup-status[data-status='ok']", "succeeded")
            # the task list too: the failed record, rewritten in place, is read again
            await page.shown(f"{app} tr.result[data-task='poison'][data-outcome='succeeded']")
            if (path := shot_path("dashboard-after-failover.png")) is not None:
                await page.screenshot(path)

            # the app's own count of results (12 tasks, the poison one and the revoked one),
            # whichever processes wrote them
            await page.shown(f"{app} [data-stat='results'] b", "14")

            # the stale app, chosen in the selector, says so
            await page.click(f"#selector a.app-link[data-app='{OLD.name}']")
            await page.shown(f"#app-{OLD.name} .job[data-state='stale']",
                             "stale: no live process")
            await page.gone(f"{app}:not([hidden])")

            # an app the address names that does not exist is said, not replaced
            await page.open(f"{dashboard}#app=nosuchapp")
            await page.shown("#empty[data-missing='nosuchapp']",
                             'No application "nosuchapp" in this ZooKeeper')
            await page.gone("article.app:not([hidden])")


async def test_a_browser_sends_the_token_it_was_given(zk_hosts: str, chroot: str,
                                                     browser: Any) -> None:
    """With a token, the browser's basic credentials (any user, the token as password)
    open the page, and the page's own event stream gets them too: it goes live."""
    from framework.dashboard import serve_dashboard

    page = Page(browser)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(lambda task_status: serve_dashboard(
                zk_hosts, port=0, chroot=chroot, token="t0ken-for-the-test",
                task_status=task_status))
            await page.open(url.replace("http://", "http://viewer:t0ken-for-the-test@"))
            await page.shown("#link.ok", "live")
            await page.shown("#zk.ok", "connected")
            nursery.cancel_scope.cancel()


async def test_read_only_dashboard_refuses_actions_and_serves_metrics(
        zk_hosts: str, chroot: str) -> None:
    from framework.dashboard import serve_dashboard

    def get(url: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def post(url: str, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(url, json.dumps(doc).encode(), method="POST",
                                         headers={"X-Dashboard-Action": "1"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    with trio.fail_after(30):
        async with Session(zk_hosts, chroot=chroot) as session:
            await session.ensure_path(APP.dead)
            await session.create(f"{APP.dead}/b-0000000000.i+0-0000000000000000-0000000001.3",
                                 b'{"id": "x1", "payload": null}')
            async with trio.open_nursery() as nursery:
                url = await nursery.start(lambda task_status: serve_dashboard(
                    zk_hosts, port=0, chroot=chroot, task_status=task_status))
                status, doc = await trio.to_thread.run_sync(lambda: post(
                    f"{url}/api/requeue", {"app": APP.name, "name": "whatever"}))
                assert status == 403 and "--allow-actions" in doc["error"]
                status, body = await trio.to_thread.run_sync(lambda: get(f"{url}/metrics"))
                assert status == 200 and b"framework_app_tasks_done_total" in body
                assert b"framework_dashboard_session_state_changes_total" in body
                status, body = await trio.to_thread.run_sync(
                    lambda: get(f"{url}/api/result?app={APP.name}&key=-bad"))
                assert status == 400 and b"task key" in body
                nursery.cancel_scope.cancel()
            assert await session.exists(f"{APP.dead}/b-0000000000.i+0-0000000000000000-"
                                        "0000000001.3") is not None


def test_taken_port_is_one_line(zk_hosts: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "framework", "dashboard", "--zk", zk_hosts, "--port",
             str(port)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "cannot listen on 127.0.0.1" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_unreachable_zookeeper_is_one_line() -> None:
    from framework.zkserver import free_ports

    (port,) = free_ports(1)
    result = subprocess.run(
        [sys.executable, "-m", "framework", "dashboard", "--zk", f"127.0.0.1:{port}",
         "--port", "0", "--connect-timeout", "1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "could not connect" in result.stderr
    assert "Traceback" not in result.stderr
