"""Plain-Python config files plus --key=value overrides, validated against dataclass schemas.

    python train.py configs/quickstart.py --max_iters=100 --schedule=LG

A config file is executed as Python; every top-level name that does not start with '_' is a setting.
Unknown keys and wrong types fail with an error that names the key, the close matches and the expected type.
An overlay file (a few settings on top of another config) names its base in `_base = "configs/NAME.py"` and
refuses to run unless that file comes before it on the command line.
"""
import ast
import dataclasses
import difflib
import inspect
import io
import os
import re
import sys
import tokenize
import types
import typing


class ConfigError(ValueError):
    pass


def _expected_types(annotation):
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(t for t in typing.get_args(annotation))
    return (annotation,)


def _check_type(key, value, annotation):
    allowed = _expected_types(annotation)
    if value is None and type(None) in allowed:
        return value
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if any(t is not type(None) and type(value) is t for t in allowed):
        return value
    raise ConfigError(f"config key '{key}' expects {_type_names(annotation)}, got {type(value).__name__} {value!r}")


def _type_names(annotation):
    return " or ".join("None" if t is type(None) else t.__name__ for t in _expected_types(annotation))


def _parse_value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word is a string: --dataset=python_stdlib


def read_config_file(path, earlier_files=()):
    """The settings of a config file. earlier_files: the config files read before it (an overlay's base must be
    one of them)."""
    namespace = {}
    try:
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), namespace)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    base = namespace.get("_base")
    if base and os.path.basename(base) not in {os.path.basename(p) for p in earlier_files}:
        raise ConfigError(f"{path} is an overlay on {base}: put that file first, "
                          f"e.g. python train.py {base} {path}")
    return {k: v for k, v in namespace.items() if not k.startswith("_") and not isinstance(v, types.ModuleType)}


def parse_args(argv, *schemas):
    """argv: config file paths and --key=value overrides, applied in order.
    Returns one instance per schema (dataclass type), each built from the keys it declares."""
    fields = {f.name: f for schema in schemas for f in dataclasses.fields(schema)}
    values, files = {}, []
    for arg in argv:
        if arg.startswith("--"):
            key, sep, text = arg[2:].partition("=")
            if not sep and key in fields and fields[key].type is bool:
                text = "True"  # a bare --flag switches a boolean on
            elif not sep:
                raise ConfigError(f"override {arg!r} must look like --{key}=VALUE")
            values[key] = _parse_value(text)
        elif arg.endswith(".py"):
            values.update(read_config_file(arg, files))
            files.append(arg)
        else:
            raise ConfigError(f"argument {arg!r} is neither a config file (*.py) nor --key=value")
    for key, value in values.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; known keys: {', '.join(sorted(fields))}"
            raise ConfigError(f"unknown config key '{key}'{hint}")
        if isinstance(value, str) and str not in _expected_types(fields[key].type):
            raise ConfigError(f"config key '{key}' expects {_type_names(fields[key].type)}, got the string {value!r}")
        values[key] = _check_type(key, value, fields[key].type)
    try:
        return [schema(**{k: v for k, v in values.items() if k in {f.name for f in dataclasses.fields(schema)}})
                for schema in schemas]
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _field_comments(schema):
    """{field: the comment on its line in the class source} (what a setting means, written once, beside it)."""
    try:
        source = inspect.getsource(schema)
    except (OSError, TypeError):
        return {}
    comments, line_field = {}, {}
    for line_no, line in enumerate(source.splitlines(), 1):
        match = re.match(r"\s+(\w+)\s*:", line)
        if match:
            line_field[line_no] = match.group(1)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[0] in line_field:
            comments[line_field[tok.start[0]]] = tok.string.lstrip("# ").strip()
    return comments


def help_text(usage, *schemas):
    """The usage (a script's docstring) and every setting: --key=default, its type and what it means."""
    lines = [inspect.cleandoc(usage or "")]
    for schema in schemas:
        comments = _field_comments(schema)
        lines.append(f"\n{schema.__name__} settings (--key=value):")
        for f in dataclasses.fields(schema):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "")
            left = f"  --{f.name}={default!r}" if not isinstance(default, str) or default else f"  --{f.name}=''"
            right = f"{_type_names(f.type)}" + (f"; {comments[f.name]}" if f.name in comments else "")
            lines.append(f"{left:<40} {right}" if len(left) < 40 else f"{left}\n{'':<40} {right}")
    return "\n".join(lines)


def parse_args_or_exit(argv, *schemas, usage=None):
    """parse_args for a command line: --help (or -h) prints the usage and the settings and exits 0; a bad config
    ends the program with the error, not a traceback."""
    if any(arg in ("--help", "-h") for arg in argv):
        print(help_text(usage, *schemas))
        sys.exit(0)
    try:
        return parse_args(argv, *schemas)
    except ConfigError as e:
        sys.exit(f"config error: {e}")


def paths_and_settings(argv, schema, usage=None):
    """(paths, settings) of a command line that names files and sets --key=value: parse_args_or_exit on the
    options, the other arguments in order."""
    (settings,) = parse_args_or_exit([arg for arg in argv if arg.startswith("-")], schema, usage=usage)
    return [arg for arg in argv if not arg.startswith("-")], settings


def run_main(main, argv):
    """Run a script's main and return what it returns (an exit status, or None): an expected error (a bad
    setting, a missing or corrupt file) ends it with one line on stderr and exit status 1, not a traceback.
    NANOAHA_TRACEBACK=1 shows the traceback."""
    try:
        return main(argv)
    except (ValueError, OSError, ImportError) as e:  # ImportError: an optional dependency is missing
        if os.environ.get("NANOAHA_TRACEBACK"):
            raise
        sys.exit(f"error: {e}")
