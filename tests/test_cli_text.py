"""What the command line says: every argument described in ``--help``, and messages
in the CLI's own flags (``--force``), never the API's keywords (``overwrite=True``).
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import wdelta
from kit import Delta
from test_cli import ENV, assert_error, run
from wdelta.cli import app
from wdelta.cli.flags import API_TO_FLAG, in_flags

REFERENCE = Path(wdelta.__file__).resolve().parent


def _commands() -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)command's words and parser, ``chain`` and ``conformance`` included."""
    for group in (None, "chain", "conformance"):
        todo: list[tuple[tuple[str, ...], argparse.ArgumentParser]] = [
            ((), app.build_parser(group))
        ]
        while todo:
            words, parser = todo.pop()
            if not words or words[0] == (group or words[0]):
                yield words, parser
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    todo += [((*words, n), p) for n, p in action.choices.items()]


COMMANDS = sorted({" ".join(w) for w, _ in _commands() if w})


@pytest.mark.parametrize("command", COMMANDS)
def test_every_argument_has_a_description(command: str) -> None:
    parser = dict((" ".join(w), p) for w, p in _commands())[command]
    missing = [a.dest for a in parser._actions if not a.help]
    assert missing == [], f"wdelta {command}: no help for {missing}"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_describes_positional_arguments(command: str) -> None:
    """``wdelta COMMAND --help`` gives each positional argument a description."""
    parser = dict((" ".join(w), p) for w, p in _commands())[command]
    # A group's COMMAND is listed under "commands:" (the test below checks its text).
    positionals = [
        a
        for a in parser._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]
    result = run(*command.split(), "--help")
    assert result.returncode == 0, result.stderr
    if not positionals:
        assert "positional arguments:" not in result.stdout
        return
    section = result.stdout.split("positional arguments:\n")[1].split("\n\n")[0]
    entries = re.findall(r"^  (\S+)(.*)$", section, re.M)
    assert len(entries) == len(positionals), result.stdout
    for name, rest in entries:
        # An undescribed argument is a name alone on its line, followed by the next name.
        assert rest.strip() or section.split(name, 1)[1].startswith("\n      "), (name, section)


@pytest.mark.parametrize("words", [(), ("chain",), ("conformance",)])
def test_command_groups_describe_their_commands_argument(words: tuple[str, ...]) -> None:
    result = run(*words, "--help")
    assert result.returncode == 0
    assert re.search(r"^  COMMAND +`wdelta .*COMMAND --help` describes each$", result.stdout, re.M)


def _string_literals() -> Iterator[tuple[Path, str]]:
    """Every string constant of the package but docstrings (messages, parts of them)."""
    for path in sorted(REFERENCE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        strings = (n for n in ast.walk(tree) if isinstance(n, ast.Constant))
        for node in strings:
            if isinstance(node.value, str) and id(node) not in docs:
                yield path, node.value


def test_every_keyword_in_a_message_has_its_flag() -> None:
    """A message naming an API keyword (``name=True``, ``name=N``) must be one the CLI
    knows how to say as a flag; else a CLI user would read a Python keyword."""
    keyword = re.compile(r"\b[a-z]+(?:_[a-z]+)*=(?:True|False|[A-Z]+)\b")
    unknown = {
        (path.name, found)
        for path, text in _string_literals()
        if path.name != "flags.py"
        for found in keyword.findall(_mapped(text))
    }
    assert unknown == set()


def _mapped(text: str) -> str:
    """``text`` with the keywords of API_TO_FLAG replaced (and nothing else: a new API
    keyword must get its flag there, not the fallback meant for fields of files)."""
    for keyword, flag in API_TO_FLAG.items():
        text = text.replace(keyword, flag)
    return text


def test_in_flags_says_other_keywords_as_fields() -> None:
    assert in_flags("header says reversible=True, chunks imply False") == (
        "header says reversible: true, chunks imply False"
    )
    assert in_flags("pass overwrite=True; a_b=False") == "pass --force; a_b: false"


def test_in_flags_names_each_flag() -> None:
    for keyword, flag in API_TO_FLAG.items():
        assert in_flags(f"pass {keyword} to do it") == f"pass {flag} to do it"


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((64, 64)).astype(np.float32)
    target = base.copy()
    target[::3] += 1
    save_file({"w": base, "v": base[:2]}, str(tmp_path / "a.safetensors"))
    save_file({"w": target, "v": base[:2]}, str(tmp_path / "b.safetensors"))
    return tmp_path / "a.safetensors", tmp_path / "b.safetensors"


def test_existing_output_names_force(pair: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.write_bytes(b"x")
    result = run("diff", *pair, "-o", out)
    assert_error(result, "bad-argument")
    assert result.stderr.endswith("choose another output or pass --force to replace it\n")
    assert "overwrite" not in result.stderr


def test_header_limit_remedies_name_flags(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """The encoder's header-size refusal through the CLI (the limit lowered in the child)."""
    code = (
        "import sys, wdelta.ops.encoder, wdelta.cli\n"
        "wdelta.ops.encoder.MAX_HEADER_BYTES = 200\n"
        "sys.exit(wdelta.cli.run(sys.argv[1:]))\n"
    )
    argv = ["diff", *map(str, pair), "-o", str(tmp_path / "d.wdelta"), "--compat"]
    result = subprocess.run([sys.executable, "-c", code, *argv, "--chunk-elements", "64"],
                            capture_output=True, text=True, env=ENV, timeout=300)  # fmt: skip
    assert_error(result, "limit-exceeded")
    assert "the compact header form (without --compat)" in result.stderr
    assert "use larger chunks (--chunk-elements N)" in result.stderr
    assert "compact=" not in result.stderr and "chunk_elements" not in result.stderr


def test_signing_without_trust_names_the_flag(pair: tuple[Path, Path], tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    assert run("chain", "keygen", key).returncode == 0
    result = run("chain", "init", tmp_path / "c", pair[0], "--sign", key)
    assert_error(result, "bad-argument")
    assert result.stderr.endswith("signing needs the chain's trust root (--trust ROOT)\n")


PYTHON_KEYWORD = re.compile(r"\b[a-z]+(?:_[a-z]+)*=(?:True|False)\b")


def test_no_python_keyword_when_an_output_exists(pair: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "taken.safetensors"
    out.write_bytes(b"x")
    delta = tmp_path / "d.wdelta"
    assert run("diff", *pair, "-o", delta, "-q").returncode == 0
    result = run("apply", pair[0], delta, "-o", out)
    assert_error(result, "bad-argument")
    assert "pass --force to replace it" in result.stderr
    assert not PYTHON_KEYWORD.search(result.stderr), result.stderr


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_header_field_is_not_said_as_a_python_keyword(
    pair: tuple[Path, Path], tmp_path: Path, command: str
) -> None:
    """A header whose ``reversible`` contradicts its chunks: the library says
    ``reversible=True``; the CLI says it as the header spells it."""
    delta = tmp_path / "d.wdelta"
    wdelta.diff(*pair, delta, compact=False)
    d = Delta.read(delta)
    d.header["reversible"] = not d.header["reversible"]
    lie = d.write(tmp_path / "lie.wdelta")
    with pytest.raises(wdelta.WdeltaError, match="reversible=False"):
        wdelta.verify(lie)
    result = run(command, lie)
    assert_error(result, "header-invalid")
    assert "header says reversible: false, chunks imply True" in result.stderr, result.stderr
    assert not PYTHON_KEYWORD.search(result.stderr), result.stderr
