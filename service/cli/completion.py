"""``tiletune completion {bash,zsh}``: a shell completion script made from the command's own parser.

The script completes subcommands and their actions (``tiletune sweeps <TAB>``: ``list show
cancel``), each one's options, the values of options that have a fixed set (``--state``,
``--backend`` choices), and file names elsewhere (``FILE``, ``-o``, ``--token-file``). It is
generated from the argparse parser at run time, so it always matches the installed release.

Install::

    tiletune completion bash > ~/.local/share/bash-completion/completions/tiletune
    source <(tiletune completion zsh)      # in ~/.zshrc, after compinit

Both scripts walk the words typed so far to find the subcommand path (``/sweeps/list``), then
answer from one ``case`` per path; the two differ only in how they offer words (bash:
``compgen``/``COMPREPLY``, zsh: ``compadd``) and fall back to file names (bash: ``complete -o
default``, zsh: ``_files``).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

from tiletune.service.cli.options import Commands

SHELLS = ("bash", "zsh")
#: A word the scripts may offer: anything else (never in this parser today) is left out, so a
#: generated script cannot be broken by quoting.
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_.:/@+=-]+$")


@dataclass
class Scope:
    """One parser of the tree: its path (``/sweeps/list``), subcommands, options, and the options
    that take a value (with their choices, empty when any value goes)."""

    path: str
    subcommands: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    values: dict[str, list[str]] = field(default_factory=dict)


def scopes(parser: argparse.ArgumentParser, path: str = "") -> Iterator[Scope]:
    """``parser`` and every subcommand under it, depth first."""
    scope = Scope(path)
    children: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:  # argparse keeps its options and subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                scope.subcommands.append(name)
                children.append((name, sub))
            continue
        for option in action.option_strings:
            scope.options.append(option)
            if action.nargs != 0:
                scope.values[option] = [str(choice) for choice in action.choices or ()]
    yield scope
    for name, sub in children:
        yield from scopes(sub, f"{path}/{name}")


def _words(words: list[str]) -> str:
    return " ".join(word for word in words if _SAFE_WORD.match(word))


@dataclass(frozen=True)
class Dialect:
    """How a shell offers words and falls back to file names."""

    head: str
    offer: str  # a format with {words}
    files: str
    tail: str
    first_word: int


BASH = Dialect(
    head="_tiletune() {\n    local cur prev scope word i\n    COMPREPLY=()\n"
    '    cur="${COMP_WORDS[COMP_CWORD]}"\n    prev="${COMP_WORDS[COMP_CWORD-1]}"\n    scope=""\n'
    "    for ((i = {first}; i < COMP_CWORD; i++)); do\n"
    '        word="${COMP_WORDS[i]}"\n',
    offer='COMPREPLY=($(compgen -W "{words}" -- "$cur"))',
    files="COMPREPLY=()",
    tail="}\ncomplete -o default -F _tiletune tiletune\n",
    first_word=1,
)
ZSH = Dialect(
    head="_tiletune() {\n    local cur prev scope word i\n"
    '    cur="${words[CURRENT]}"\n    prev="${words[CURRENT-1]}"\n    scope=""\n'
    "    for ((i = {first}; i < CURRENT; i++)); do\n"
    '        word="${words[i]}"\n',
    offer="compadd -- {words}",
    files="_files",
    tail="}\nif (( $+functions[compdef] )); then\n    compdef _tiletune tiletune\nfi\n",
    first_word=2,
)


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell`` (one of :data:`SHELLS`)."""
    dialect = BASH if shell == "bash" else ZSH
    tree = list(scopes(parser))
    lines = [f"# {shell} completion for tiletune, made by `tiletune completion {shell}`", ""]
    lines.append(dialect.head.replace("{first}", str(dialect.first_word)).rstrip("\n"))
    nested = [f'"{scope.path}"' for scope in tree if scope.path]
    lines += ['        case "$scope/$word" in', f'            {"|".join(nested)}) scope="$scope/$word" ;;']
    lines += ["        esac", "    done", '    case "$scope:$prev" in']
    for scope in tree:
        for option, choices in scope.values.items():
            answer = dialect.offer.format(words=_words(choices)) if choices else dialect.files
            lines.append(f'        "{scope.path}:{option}") {answer}; return 0 ;;')
    lines += ["    esac", '    case "$scope" in']
    for scope in tree:
        if scope.subcommands:
            answer = dialect.offer.format(words=_words(scope.subcommands + scope.options))
        else:
            options = dialect.offer.format(words=_words(scope.options))
            answer = f'if [[ "$cur" == -* ]]; then {options}; else {dialect.files}; fi'
        lines.append(f'        "{scope.path}") {answer} ;;')
    lines += ["    esac", "    return 0", dialect.tail]
    return "\n".join(lines)


def cmd_completion(args: argparse.Namespace, root: argparse.ArgumentParser) -> None:
    """Print the completion script of ``root`` for ``args.shell``."""
    print(script(root, args.shell), end="")


def add_completion_parser(commands: Commands, root: argparse.ArgumentParser) -> None:
    """The ``completion`` subcommand; its script covers every command ``root`` has when it runs."""
    completion = commands.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script for the shell, made from this command's parser: "
        "subcommands, their actions and options, option values with a fixed set, file names "
        "elsewhere. bash: `tiletune completion bash > "
        "~/.local/share/bash-completion/completions/tiletune`; zsh: `source <(tiletune completion "
        "zsh)` in ~/.zshrc after compinit.",
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    completion.set_defaults(handler=partial(cmd_completion, root=root))
