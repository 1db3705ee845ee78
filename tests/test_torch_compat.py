"""ember/torch_compat.py: the private torch surface in one module, the version range checked,
and tracing without torch._dynamo recognizing when the real module is needed by what the
stand-in was asked, not by an error's text."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import textwrap
import warnings

import pytest

from ember import torch_compat

EMBER = pathlib.Path(__file__).resolve().parents[1] / "ember"

PRIVATE = re.compile(
    r"torch\._C\.|torch\._ops\.|torch\._dispatch|torch\._higher_order_ops|torch\._utils\."
    r"|torch\._fused_sdp_choice|torch\.ops\.mkldnn\."
)
"""Private torch names that only torch_compat may use."""


def test_private_torch_names_live_in_torch_compat_only():
    found = [
        f"{path.relative_to(EMBER.parent)}:{n}: {line.strip()}"
        for path in sorted(EMBER.rglob("*.py"))
        if path.name != "torch_compat.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(line) and not line.lstrip().startswith(("#", "row-major"))
    ]
    assert not found, "\n".join(found)


def test_tested_versions_pass_and_others_are_refused_or_warned():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for version in torch_compat.TESTED:
            torch_compat.check_version(version)
        torch_compat.check_version("2.14.0+cpu")
    with pytest.raises(ImportError, match=r"ember needs torch 2\.13\.0 or newer \(found 2\.11\.0"):
        torch_compat.check_version("2.11.0")
    with pytest.warns(UserWarning, match=r"torch 2\.15\.0a0\+git1234 is newer"):
        torch_compat.check_version("2.15.0a0+git1234")


def test_a_missing_private_name_fails_with_its_name_and_the_tested_versions():
    with pytest.raises(ImportError, match=r"torch\._C\._no_such_thing.*tested: 2\.13\.0"):
        torch_compat._resolve("_C._no_such_thing")


def test_pyproject_admits_exactly_the_tested_range():
    pyproject = (EMBER.parent / "pyproject.toml").read_text()
    assert f'"torch>={torch_compat.TESTED[0][:4]},<={torch_compat.TESTED[-1]}"' in pyproject


SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from ember import torch_compat

    assert "torch._dynamo" not in sys.modules

    def plain():
        return torch._disable_dynamo(lambda: 3)()

    assert torch_compat.without_dynamo(plain) == 3
    assert "torch._dynamo" not in sys.modules, "disable() alone must not import Dynamo"

    def with_reason():  # torch.compiler.disable passes reason=; without fn it decorates
        decorated = torch._dynamo.disable(recursive=True, reason=None)(lambda: 4)
        return torch._dynamo.disable(decorated, True, reason="why")()

    assert torch_compat.without_dynamo(with_reason) == 4
    assert "torch._dynamo" not in sys.modules, "disable(reason=) must not import Dynamo"

    def unrelated():
        raise AttributeError("object has no attribute '_dynamo_thing'")

    try:
        torch_compat.without_dynamo(unrelated)
    except AttributeError as e:
        assert "_dynamo_thing" in str(e)
    else:
        raise AssertionError("an unrelated error must propagate")
    assert "torch._dynamo" not in sys.modules, "a message mentioning _dynamo is not a request"

    calls = []

    def wants_submodule():
        calls.append(1)
        from torch._dynamo.utils import counters  # noqa: F401

        return "imported"

    assert torch_compat.without_dynamo(wants_submodule) == "imported"
    assert len(calls) == 2 and "torch._dynamo" in sys.modules
    print("ok")
    """
)


def test_tracing_without_dynamo_retries_only_when_the_stand_in_was_asked():
    """In a fresh process (the suite has imported torch._dynamo long since)."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
