"""Reading a run's configuration: defaults, then config files, then --key=value flags.

train.py and sample.py keep their defaults as module-level names. A config file is plain Python
that assigns some of those names (see config/shakespeare.py); a flag overrides one name:

    python train.py config/shakespeare.py --batch_size=32 --kernels=torch

Every name must already exist in the defaults and keep its type, so a typo or a wrong type is
refused with a message naming the key (and the nearest valid names), never silently ignored.
"""
import difflib
import io
import os
import sys
import tokenize
import types


class ConfigError(ValueError):
    """A bad config file or flag; the message says which key and what to do."""


def load(defaults, argv):
    """Apply config files and --key=value flags from argv (in order) to a copy of defaults."""
    config = dict(defaults)
    for arg in argv:
        if arg.startswith("--"):
            key, has_value, text = arg[2:].partition("=")
            if not has_value:
                raise ConfigError(f"flag {arg!r} has no value; write it as --{key}=VALUE")
            _check_known(key, config, where=f"flag --{key}")
            config[key] = _parse(key, text, config[key])
        else:
            for key, value in _read_file(arg).items():
                _check_known(key, config, where=f"config file {arg}")
                config[key] = _check_type(key, value, config[key], where=f"config file {arg}")
    return config


def _read_file(path):
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} not found (flags are written --key=value; "
                          f"config files live in config/, e.g. config/shakespeare_cpu.py)")
    namespace = {}
    with open(path) as f:
        code = compile(f.read(), path, "exec")
    exec(code, namespace)
    # Names starting with '_' and imported modules are the file's own helpers, not settings.
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not isinstance(v, types.ModuleType)}


def _check_known(key, config, where):
    if key not in config:
        close = difflib.get_close_matches(key, list(config), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(f"{where}: unknown config key {key!r}{hint}")


def _parse(key, text, default):
    """Turn a flag's text into the type of its default."""
    kind = type(default)
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
    elif kind is int:
        try:
            return int(text)
        except ValueError:
            try:   # accept 5e3 for 5000, but not 0.5
                value = float(text)
                if value.is_integer():
                    return int(value)
            except ValueError:
                pass
    elif kind is float:
        try:
            return float(text)
        except ValueError:
            pass
    elif kind is str:
        return text
    raise ConfigError(f"flag --{key}: {text!r} is not a valid {kind.__name__} "
                      f"(the default is {default!r})")


def _check_type(key, value, default, where):
    kind = type(default)
    if kind is float and type(value) is int:   # lr = 1 in a config file means 1.0
        return float(value)
    if type(value) is not kind:
        raise ConfigError(f"{where}: {key} = {value!r} is a {type(value).__name__}, "
                          f"but {key} must be a {kind.__name__} (the default is {default!r})")
    return value


def defaults_from(namespace):
    """The settable names of a module namespace: public ints, floats, bools and strings
    (UPPER_CASE names are constants, not settings)."""
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not k.isupper() and type(v) in (int, float, bool, str)}


def setting_comments(source):
    """name -> the comment beside its assignment in a script's source, joined with the comment
    lines indented under it (how train.py documents a setting that needs two lines)."""
    comments, current, last_row = {}, None, 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.start[1] == 0:
            current, last_row = tok.string, tok.start[0]
        elif tok.type == tokenize.COMMENT and current is not None:
            row, col = tok.start
            if row == last_row and col > 0:                 # beside the assignment
                comments[current] = tok.string.lstrip("# ").strip()
            elif row == last_row + 1 and col > 0 and current in comments:   # continues it
                comments[current] += " " + tok.string.lstrip("# ").strip()
                last_row = row
            else:
                current = None
    return comments


def help_text(doc, defaults, source=None):
    """--help: the script's docstring, then each setting with its default and its comment."""
    comments = setting_comments(source) if source else {}
    lines = [f"  --{k}={v!r}" for k, v in defaults.items()]
    width = max(map(len, lines), default=0) + 2
    lines = [line.ljust(width) + comments[k] if comments.get(k) else line
             for line, k in zip(lines, defaults)]
    return doc + "\nsettings (defaults):\n" + "\n".join(lines)


def run_script(doc, defaults, argv, run, expected_errors, source_path=None):
    """The body of train.py's and sample.py's main(): --help prints `doc` and the settings (with
    the comments written beside them in source_path, the script itself); otherwise run(config)
    on the defaults, config files and --key=value flags of argv. An expected error (a
    ConfigError or one of `expected_errors`) is one line on stderr and exit status 1, not a
    traceback. Returns the exit status."""
    if any(a in ("-h", "--help") for a in argv):
        source = None
        if source_path:
            with open(source_path) as f:
                source = f.read()
        print(help_text(doc, defaults, source))
        return 0
    try:
        run(load(defaults, argv))
        return 0
    except (ConfigError, *expected_errors) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
