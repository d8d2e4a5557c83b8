"""The pre-commit hook definition other repositories use (`- id: ddp-doctor-lint`)."""
from pathlib import Path

HOOKS = Path(__file__).resolve().parents[2] / ".pre-commit-hooks.yaml"


def test_precommit_hook_runs_ddp_doctor_lint_on_python_files():
    text = HOOKS.read_text(encoding="utf-8")
    try:
        import yaml
    except ImportError:  # the plain-text check below still holds
        yaml = None
    if yaml is not None:
        [hook] = yaml.safe_load(text)
        assert hook["id"] == "ddp-doctor-lint" and hook["language"] == "python"
        assert hook["types"] == ["python"] and hook["entry"] == "ddp-doctor lint"
    for line in ("- id: ddp-doctor-lint", "entry: ddp-doctor lint", "language: python", "types: [python]"):
        assert line in text
