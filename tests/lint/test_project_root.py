"""`ddp-doctor lint FILE` uses the repository around the file (issue 24): the answer for a file does
not depend on whether the user typed the file or the repository."""
import shutil
from pathlib import Path

from ddp_doctor.lint import lint_paths
from ddp_doctor.lint.roots import project_root

from .conftest import FIXTURES


def _findings(res, path: Path) -> set[tuple[str, int]]:
    return {(f.code, f.location.line) for f in res.findings if Path(f.location.path).resolve() == path.resolve()}


def test_a_file_inside_a_repository_is_linted_with_the_repository_around_it(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES / "projects" / "rank_through_constructor" / "broken", repo)
    (repo / ".git").mkdir()
    runner = repo / "engine" / "runner.py"
    whole = _findings(lint_paths([repo]), runner)
    assert ("DDP201", 25) in whole  # the rank comes from start.py, outside engine/
    assert _findings(lint_paths([runner]), runner) == whole


def test_project_root_prefers_git_then_project_files_then_the_top_package(tmp_path):
    (tmp_path / "r" / ".git").mkdir(parents=True)
    (tmp_path / "r" / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "r" / "pkg" / "pyproject.toml").write_text("")
    f = tmp_path / "r" / "pkg" / "sub" / "m.py"
    f.write_text("")
    assert project_root(f) == (tmp_path / "r").resolve()
    (tmp_path / "r" / ".git").rmdir()
    assert project_root(f) == (tmp_path / "r" / "pkg").resolve()
    lone = tmp_path / "plain" / "a" / "b"
    lone.mkdir(parents=True)
    (lone / "__init__.py").write_text("")
    (lone.parent / "__init__.py").write_text("")
    (lone / "x.py").write_text("")
    assert project_root(lone / "x.py") == (tmp_path / "plain").resolve()  # above the top package
    assert project_root(lone) == lone.resolve()  # a directory is its own root


def test_an_installed_package_is_not_climbed_out_of(tmp_path):
    pkg = tmp_path / "lib" / "site-packages" / "torchish" / "nn"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("")
    assert project_root(pkg / "mod.py") == pkg.parent.resolve()


def test_a_script_in_tools_without_a_repository_marker_takes_the_folder_of_the_package_it_imports(tmp_path):
    # an unpacked archive (no .git, no setup.py): `python tools/train_net.py` imports `core.parallel`
    repo = tmp_path / "unpacked"
    shutil.copytree(FIXTURES / "projects" / "helper_returns" / "broken", repo)
    (repo / "tools").mkdir()
    script = repo / "tools" / "train.py"
    shutil.move(repo / "train.py", script)
    assert project_root(script) == repo.resolve()
    assert _findings(lint_paths([script]), script) == _findings(lint_paths([repo]), script) != set()
    (tmp_path / "alone").mkdir()
    (tmp_path / "alone" / "s.py").write_text("import os\nimport json\n")
    assert project_root(tmp_path / "alone" / "s.py") == (tmp_path / "alone").resolve()
