"""The HTML report: static checks, then a real headless chromium that runs the page's script."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import report_samples as S
from ddp_doctor.report.files import save_reports
from ddp_doctor.report.html import json_for_script, render_html

ROOT = Path(__file__).resolve().parents[2]


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


CHROMIUM = _chromium()


@pytest.fixture
def browser():
    """The real browser these tests need: missing is a failure, never a skip (`make browser` installs it)."""
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: run `make browser` (apt-get install chromium) - "
                    "the HTML report must be checked in a real browser")
    return CHROMIUM


needs_browser = pytest.mark.usefixtures("browser")


def artifacts_dir(tmp_path):
    d = Path(os.environ.get("DDP_DOCTOR_ARTIFACTS", ROOT / "test-artifacts"))
    try:
        d.mkdir(parents=True, exist_ok=True)
        return d
    except OSError:
        return tmp_path


def chromium(tmp_path, url, *extra, timeout=90):
    ud = tmp_path / "chromium-profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
           f"--user-data-dir={ud}", *extra, url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def dump_dom(tmp_path, html_path):
    return chromium(tmp_path, html_path.as_uri(), "--window-size=1400,1000", "--dump-dom")


def test_self_contained_and_escaped(tmp_path):
    html = render_html(S.get("hang"))
    # no network: nothing but the SVG namespace looks like a URL
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", html)) - {"http://www.w3.org/2000/svg"}
    assert not urls, urls
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=", html)
    html = render_html(S.xss_report())
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("<script") == 3  # two JSON blocks and the renderer, nothing injected
    assert "</script><script>document" not in html
    assert json_for_script({"a": "</script><!--\u2028"}) == '{"a":"\\u003c/script\\u003e\\u003c!--\\u2028"}'


@pytest.mark.parametrize("name", list(S.ALL))
def test_renders_without_optional_fields(tmp_path, name):
    r = S.get(name)
    for rk in r["ranks"]:
        for k in ("timeline", "timing", "workers", "host", "pid"):
            rk.pop(k, None)
    for k in ("lint", "duration_s", "command", "started_at"):
        r.pop(k, None)
    path = tmp_path / "r.html"
    save_reports(r, None, str(path))
    text = path.read_text()
    for f in r["findings"]:
        assert f'data-code="{f["code"]}"' in text


@needs_browser
@pytest.mark.parametrize("name", list(S.ALL))
def test_browser_renders_ranks_and_findings(tmp_path, name):
    r = S.get(name)
    path = tmp_path / f"{name}.html"
    save_reports(r, None, str(path))
    dom = dump_dom(tmp_path, path)
    assert 'data-rendered="1"' in dom, "the page script did not run"
    for f in r["findings"]:
        assert f'data-code="{f["code"]}"' in dom
    for rk in r["ranks"]:
        assert f'id="rank-{rk["rank"]}"' in dom
        if rk.get("timeline"):
            assert re.search(rf'<g class="lane( bad)?" data-rank="{rk["rank"]}"', dom), "timeline lane not drawn"
        if rk.get("timing"):
            assert re.search(rf'<g class="bar( bad)?" data-rank="{rk["rank"]}"', dom), "step-time bar not drawn"
    if name == "hang":
        assert dom.count('class="lane bad"') == 2 and "stopped: train.py:63 in main" in dom
        assert 'fill="url(#hatch)"' in dom
    if name == "ok_perf":
        assert 'class="lane bad"' not in dom
    if not r["ranks"]:
        assert "lint-only" in dom or "Seen in the source" in dom


@needs_browser
def test_browser_xss_is_escaped_not_executed(tmp_path):
    path = tmp_path / "xss.html"
    save_reports(S.xss_report(), None, str(path))
    dom = dump_dom(tmp_path, path)
    assert 'data-rendered="1"' in dom
    assert "data-pwned" not in dom.split("<body", 1)[1].split(">", 1)[0], "injected script ran"
    assert "<script>alert(1)</script>" not in dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert dom.count("<script") == 3


@needs_browser
@pytest.mark.parametrize("name", ["hang", "ok_perf"])
def test_browser_screenshot(tmp_path, capsys, name):
    path = tmp_path / f"{name}.html"
    save_reports(S.get(name), None, str(path))
    shot = artifacts_dir(tmp_path) / f"report-{name}.png"
    chromium(tmp_path, path.as_uri(), f"--screenshot={shot}", "--window-size=1400,1000")
    assert shot.exists() and shot.stat().st_size > 10_000
    shutil.copy(path, shot.with_suffix(".html"))
    with capsys.disabled():
        print(f"\n[artifact] HTML report screenshot: {shot}  (page: {shot.with_suffix('.html')})")


@needs_browser
def test_browser_real_run_report(tmp_path):
    """A report written by ``ddp-doctor run`` (seed 000 on gloo: desync), rendered in the browser."""
    import json
    r = json.loads((Path(__file__).parent / "data" / "run_seed000_desync.json").read_text())
    path = tmp_path / "real.html"
    save_reports(r, None, str(path))
    dom = dump_dom(tmp_path, path)
    assert 'data-rendered="1"' in dom and 'data-code="DDP202"' in dom
    assert 'data-range="training"' in dom, "start-up should be skipped by default"
    assert re.search(r'<g class="lane bad" data-rank="0"', dom) and re.search(r'<g class="lane" data-rank="1"', dom)
    assert "stopped: train_buggy.py:26 in validate" in dom
    assert "also seen by lint: line 51" in dom and 'data-code="DDP406"' in dom


@needs_browser
def test_browser_crash_without_timeline(tmp_path):
    """A crash report whose ranks carry no timeline/timing still renders, with notes instead of charts."""
    r = S.get("desync")
    r["verdict"] = "crash"
    for rk in r["ranks"]:
        rk.pop("timeline", None)
        rk.pop("timing", None)
    path = tmp_path / "crash.html"
    save_reports(r, None, str(path))
    dom = dump_dom(tmp_path, path)
    assert 'data-rendered="1"' in dom and 'data-code="DDP203"' in dom
    assert "No timeline was recorded" in dom and "No step timing was recorded" in dom
    assert 'id="rank-0"' in dom and 'id="rank-1"' in dom


def test_restarted_attempt_has_its_own_section(tmp_path):
    from ddp_doctor.report.html import render_html

    page = render_html(S.restarted_report())
    assert '<a href="#restarts">Earlier attempts</a>' in page
    section = page.split('<section id="restarts">', 1)[1].split("</section>", 1)[0]
    assert "Attempt 0 ended in CRASH" in section and 'data-code="DDP204"' in section
    assert "stale file handle" in section
