import report_samples as S
from ddp_doctor.report.snippets import attach_snippets, read_snippet


def test_attach(tmp_path):
    src = tmp_path / "t.py"
    src.write_text("".join(f"line{i}\n" for i in range(1, 11)))
    r = S.get("lint_only")
    r["findings"][0]["location"] = {"path": str(src), "line": 1, "function": None}
    r["findings"][1]["location"] = {"path": str(src), "line": 10, "function": None}
    attach_snippets(r, context=2, allowed={str(src)})
    assert r["findings"][0]["location"]["snippet"] == {"start": 1, "lines": ["line1", "line2", "line3"]}
    assert r["findings"][1]["location"]["snippet"] == {"start": 8, "lines": ["line8", "line9", "line10"]}


def test_never_raises(tmp_path):
    (tmp_path / "bin.py").write_bytes(b"\0\1\2")
    (tmp_path / "d").mkdir()
    for path, line in [("/nonexistent/x.py", 3), (str(tmp_path / "bin.py"), 1), (str(tmp_path / "d"), 1),
                       (None, None), ("x", "abc"), (str(tmp_path / "bin.py"), 99)]:
        assert read_snippet(path, line) is None
    r = S.get("hang")
    r["findings"].append({"code": "DDP204", "location": {"path": str(tmp_path / "d"), "line": 1}})
    r["findings"].append("garbage")
    attach_snippets(r)
    assert "snippet" not in r["findings"][1]["location"]
    # existing snippets are kept
    assert r["findings"][0]["location"]["snippet"]["start"] == 39


def test_only_files_the_job_ran(tmp_path):
    """A path merely written in a report is never read; a saved report's sources must be Python files."""
    src = tmp_path / "train.py"
    src.write_text("a = 1\nb = 2\n")
    r = S.get("lint_only")
    r["findings"][0]["location"] = {"path": "/etc/passwd", "line": 1, "function": None}
    r["findings"][1]["location"] = {"path": str(src), "line": 2, "function": None}
    attach_snippets(r)  # no sources: nothing is read
    assert all("snippet" not in f["location"] for f in r["findings"][:2])
    r["sources"] = ["/etc/passwd", str(src)]  # a hostile report lists /etc/passwd as run
    attach_snippets(r)
    assert "snippet" not in r["findings"][0]["location"]
    assert r["findings"][1]["location"]["snippet"] == {"start": 1, "lines": ["a = 1", "b = 2"]}
    link = tmp_path / "passwd.py"
    link.symlink_to("/etc/passwd")  # a .py name leading elsewhere
    r["findings"][0]["location"] = {"path": str(link), "line": 1, "function": None}
    r["sources"].append(str(link))
    attach_snippets(r)
    assert "snippet" not in r["findings"][0]["location"]


def test_stack_sources_are_absolute_python_files_of_the_stacks():
    from ddp_doctor.report.snippets import stack_sources

    stacks = [[{"path": "/job/train.py", "line": 3}, {"path": "<frozen runpy>", "line": 1}],
              [{"path": "/job/data.py", "line": 9}, {"path": "relative.py", "line": 2}, {"path": "/etc/passwd"}]]
    assert stack_sources(stacks) == ["/job/data.py", "/job/train.py"]
