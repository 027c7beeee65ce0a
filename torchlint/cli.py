"""The command line: `torchlint [check] PATH...`, `torchlint rule CODE`, `torchlint rules`, ...

The `torchlint` command enters through `torchlint/client.py`, which calls `main` here.

Exit codes follow ruff: 0 nothing found, 1 findings reported, 2 usage, configuration or
internal errors.  A traceback never reaches the user unless `--verbose` is given.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

import click

from . import __version__

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class _DefaultGroup(click.Group):
    """`torchlint PATH...` means `torchlint check PATH...`."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version", "-V")):
            args = ["check"] + list(args)
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="torchlint", message="%(prog)s %(version)s")
def main():
    """torchlint: find the bugs that make PyTorch training silently wrong."""


def _err(msg: str) -> None:
    click.echo(f"torchlint: error: {msg}", err=True)


def _codes(values):
    out = []
    for v in values or ():
        out.extend(c.strip() for c in v.split(",") if c.strip())
    return out


@main.command("check")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--select", multiple=True, help="Rule codes or prefixes to enable (TL1 = TL1xx).")
@click.option("--ignore", multiple=True, help="Rule codes or prefixes to disable.")
@click.option("--extend-select", multiple=True, help="Codes to enable on top of `select`.")
@click.option("--output-format", type=click.Choice(["text", "concise", "json", "json-lines", "github", "sarif", "lsp"]),
              default=None, help="How findings are printed.")
@click.option("--output-file", "-o", type=click.Path(dir_okay=False), help="Write the report to a file.")
@click.option("--statistics", is_flag=True, help="Count findings per rule.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when findings are reported.")
@click.option("--quiet", "-q", is_flag=True, help="Print findings only, no summary.")
@click.option("--verbose", "-v", is_flag=True,
              help="Show tracebacks of internal errors, and the cache files that were ignored and why.")
@click.option("--config", "config_path", type=click.Path(), help="A pyproject.toml or torchlint.toml to use.")
@click.option("--no-cache", is_flag=True, help="Neither read nor write the cache.")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Where the cache lives (default .torchlint_cache).")
@click.option("--jobs", "-j", type=int, default=None, help="Worker processes (default: CPU count).")
@click.option("--fix", is_flag=True, help="Apply safe fixes.")
@click.option("--unsafe-fixes", is_flag=True, help="Also apply (with --fix/--diff) or show unsafe fixes.")
@click.option("--diff", is_flag=True, help="Print the fixes as a unified diff; write nothing.")
@click.option("--show-fixes", is_flag=True, help="List the fixes that were applied.")
@click.option("--fix-only", is_flag=True, hidden=True)
@click.option("--baseline", type=click.Path(dir_okay=False), help="Report only findings not in this baseline.")
@click.option("--write-baseline", type=click.Path(dir_okay=False), help="Record the current findings as a baseline.")
@click.option("--add-noqa", is_flag=True, help="Add `# noqa: TLxxx` for every current finding.")
@click.option("--changed-since", metavar="REV", help="Lint files changed since a git revision, and their dependents.")
@click.option("--force-exclude", is_flag=True, help="Apply exclusions to paths named on the command line too.")
@click.option("--no-progress", is_flag=True, help="Never show a progress bar.")
@click.option("--color/--no-color", default=None, help="Colourise text output (default: when a terminal).")
@click.option("--dynamic", is_flag=True, help="After the static run, confirm findings by running code (opt-in).")
@click.option("--device", default="cpu", show_default=True, help="Dynamic mode: cpu, cuda or cuda:N.")
@click.option("--entry", default=None, help="Dynamic mode: a command that runs the training, e.g. 'python train.py'.")
@click.option("--steps", default=3, show_default=True, help="Dynamic mode: training steps to run.")
@click.option("--timeout", default=120.0, show_default=True, help="Dynamic mode: seconds before the child is killed.")
@click.option("--stdin-filename", metavar="PATH",
              help="Read the source from stdin (also with PATH `-`) and report it under this name; "
                   "the configuration and per-file ignores of that path apply.")
def check(paths, select, ignore, extend_select, output_format, output_file, statistics, exit_zero, quiet,
          verbose, config_path, no_cache, cache_dir, jobs, fix, unsafe_fixes, diff, show_fixes, fix_only,
          baseline, write_baseline, add_noqa, changed_since, force_exclude, no_progress, color, dynamic, device, entry,
          steps, timeout, stdin_filename):
    """Lint PATHS (files or directories; default: the current directory; `-`: the source on stdin)."""
    kwargs = dict(locals())
    interrupted = _watch_interrupts()
    try:
        code = _check(**kwargs)
    except click.exceptions.Exit:
        raise
    except KeyboardInterrupt:
        interrupted.append(True)
        code = EXIT_ERROR
    except Exception as exc:  # last line of defence: a message, never a traceback
        if verbose or os.environ.get("TORCHLINT_DEBUG"):
            traceback.print_exc()
        _err(f"internal error: {type(exc).__name__}: {exc} (run with --verbose for the traceback)")
        code = EXIT_ERROR
    if interrupted:
        # also when the KeyboardInterrupt was swallowed on its way up (Python ignores one raised
        # in a finalizer, e.g. a generator being closed): a ^C never looks like a finished run
        _err("interrupted")
        code = EXIT_ERROR
    sys.exit(code)


def _watch_interrupts() -> list:
    """A list that gets an item on each SIGINT, which still raises KeyboardInterrupt."""
    import signal
    import threading

    seen: list = []
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return seen

    def on_sigint(signum, frame):
        seen.append(True)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    return seen


def _check(paths, select, ignore, extend_select, output_format, output_file, statistics, exit_zero, quiet,
           verbose, config_path, no_cache, cache_dir, jobs, fix, unsafe_fixes, diff, show_fixes, fix_only,
           baseline, write_baseline, add_noqa, changed_since, force_exclude, no_progress, color, dynamic, device, entry,
           steps, timeout, stdin_filename) -> int:
    from .config import ConfigError, load_config
    from .runner import Runner

    stdin = "-" in paths or (stdin_filename is not None and not paths)
    if stdin:
        if len(paths) > 1:
            _err("`-` (read from stdin) cannot be combined with other paths")
            return EXIT_ERROR
        for flag, used in (("--add-noqa", add_noqa), ("--write-baseline", write_baseline),
                           ("--changed-since", changed_since), ("--dynamic", dynamic)):
            if used:
                _err(f"{flag} cannot be used when reading from stdin")
                return EXIT_ERROR
        # the configuration that applies to the named file (ruff's rule), else the current folder's
        where = os.path.dirname(os.path.abspath(stdin_filename)) if stdin_filename else "."
        start = where if os.path.isdir(where) else "."
    else:
        paths = list(paths) or ["."]
        start = paths[0] if os.path.exists(paths[0]) else "."
    try:
        cfg = load_config(config_path, start=start)
        from .selection import validate_codes

        sel = _codes(select) or cfg.select
        ign = _codes(ignore) + cfg.ignore
        ext = _codes(extend_select) + cfg.extend_select
        validate_codes(_codes(select), "--select")
        validate_codes(_codes(ignore), "--ignore")
        validate_codes(_codes(extend_select), "--extend-select")
        if cache_dir and not no_cache:
            from .config import check_cache_dir

            check_cache_dir(cache_dir, cfg.root, "--cache-dir")
    except ConfigError as exc:
        _err(str(exc))
        return EXIT_ERROR
    runner = Runner(cfg, select=sel, ignore=ign, extend_select=ext, jobs=jobs,
                    cache=None if no_cache else (cache_dir or cfg.cache_dir or os.path.join(cfg.root, ".torchlint_cache")),
                    verbose=verbose, progress=not no_progress and (output_format or "text") in ("text", "concise"),
                    force_exclude=force_exclude)
    try:
        if stdin:
            return runner.main_stdin(stdin_filename or "-", output_format=output_format or "text",
                                     output_file=output_file, statistics=statistics, exit_zero=exit_zero, quiet=quiet,
                                     fix=fix or fix_only, unsafe_fixes=unsafe_fixes, diff=diff, show_fixes=show_fixes,
                                     baseline=baseline, color=color)
        return runner.main(paths, output_format=output_format or "text", output_file=output_file,
                           statistics=statistics, exit_zero=exit_zero, quiet=quiet, fix=fix or fix_only,
                           unsafe_fixes=unsafe_fixes, diff=diff, show_fixes=show_fixes, baseline=baseline,
                           write_baseline=write_baseline, add_noqa=add_noqa, changed_since=changed_since,
                           color=color, dynamic=dynamic, device=device, entry=entry, steps=steps, timeout=timeout)
    finally:
        if verbose:
            from .integrity import take_notes

            for line in take_notes():
                click.echo(line, err=True)


@main.command("rule")
@click.argument("code")
@click.option("--output-format", type=click.Choice(["text", "json"]), default="text")
def rule_cmd(code, output_format):
    """Explain a rule: what it does, why it matters, examples."""
    from .docs import rule_markdown
    from .rule import all_rules

    rules = all_rules()
    code = code.upper()
    if code not in rules:
        _err(f"unknown rule code `{code}` (see `torchlint rules`)")
        sys.exit(EXIT_ERROR)
    if output_format == "json":
        click.echo(json.dumps(_rule_json(rules[code]), indent=2))
    else:
        click.echo(rule_markdown(rules[code]))


def _rule_json(r) -> dict:
    return {"code": r.code, "name": r.name, "summary": r.summary, "explanation": r.why,
            "example": r.example, "use_instead": r.use_instead, "fix": r.fix_safety, "fix_doc": r.fix_doc,
            "url": r.url(), "preview": not r.default, "default": r.default,
            "exempt_in_tests": r.exempt_in_tests}


@main.command("rules")
@click.option("--output-format", type=click.Choice(["text", "json"]), default="text")
def rules_cmd(output_format):
    """List every rule."""
    from .rule import all_rules

    rules = all_rules()
    if output_format == "json":
        click.echo(json.dumps([_rule_json(r) for r in rules.values()], indent=2))
        return
    for code, r in rules.items():
        fix = {"safe": "[*]", "unsafe": "[!]"}.get(r.fix_safety or "", "   ")
        mark = "[preview] " if not r.default else ""
        click.echo(f"{code}  {fix} {r.name:<38} {mark}{r.summary}")
    if any(not r.default for r in rules.values()):
        click.echo("\n[preview]: off by default; select it by its full code (`--select TL201`).")


@main.command("lsp")
def lsp_cmd():
    """Run the language server over stdio (needs pygls and lsprotocol: `pip install '.[lsp]'`)."""
    try:
        from .lsp import serve
    except ImportError as exc:
        _err(f"the language server needs pygls and lsprotocol (the `lsp` extra: `pip install '.[lsp]'` "
             f"in a checkout of torchlint): {exc}")
        sys.exit(EXIT_ERROR)
    serve()


@main.command("confirm")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--device", default="cpu", show_default=True)
@click.option("--entry", default=None)
@click.option("--steps", default=3, show_default=True)
@click.option("--timeout", default=120.0, show_default=True)
@click.option("--select", multiple=True)
@click.option("--probe-all", is_flag=True, default=False,
              help="Also run every file with a __main__ block with every probe on, and report what the probes "
                   "see where no static finding is.")
@click.option("--output-format", type=click.Choice(["text", "json", "json-lines", "github", "sarif", "lsp"]),
              default="text")
def confirm_cmd(paths, device, entry, steps, timeout, select, probe_all, output_format):
    """Confirm static findings by running a minimal reproduction (executes your code)."""
    from .config import ConfigError, load_config
    from .runner import Runner

    paths = list(paths) or ["."]
    try:
        cfg = load_config(None, start=paths[0] if os.path.exists(paths[0]) else ".")
    except ConfigError as exc:
        _err(str(exc))
        sys.exit(EXIT_ERROR)
    runner = Runner(cfg, select=_codes(select) or cfg.select, ignore=cfg.ignore, extend_select=cfg.extend_select,
                    jobs=None, cache=None, verbose=False, progress=False)
    sys.exit(runner.main(paths, output_format=output_format, dynamic=True, device=device, entry=entry,
                         steps=steps, timeout=timeout, probe_all=probe_all))
