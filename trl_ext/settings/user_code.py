"""User code named in an option: ``"package.module:name"`` or ``"path/to/file.py:name"``, as TRL's
``reward_funcs`` strings and ``--reward-fn`` name it. A registry (``trl_ext.settings.registry``) takes such a name for a
sampler, an estimator, a policy loss or a KL shaping; the reward loader takes it for a reward function."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from trl_ext.errors import InputError


def is_user_code(name: str) -> bool:
    """Whether an option's value names user code (``module:name``) rather than a registered name."""
    return ":" in name


def import_object(spec: str, what: str, error: type[Exception] = InputError):
    """The object ``spec`` names; ``error`` (naming ``what`` and ``spec``) when it cannot be found.

    A file is imported once per process, under its path: the registrations it makes happen once, however
    many options and processes' configs name it."""
    source, _, attribute = spec.rpartition(":")
    if not source or not attribute:
        raise error(f"{what} {spec!r}: expected 'module:name' or 'file.py:name'")
    module = _file_module(spec, source, what, error) if source.endswith(".py") else _module(spec, source, what, error)
    if not hasattr(module, attribute):
        raise error(f"{what} {spec!r}: {source!r} has no callable {attribute!r}")
    return getattr(module, attribute)


def import_callable(spec: str, what: str, error: type[Exception] = InputError):
    """``import_object`` of a callable (a function, a class, a factory): ``error`` where it is something else."""
    found = import_object(spec, what, error)
    if not callable(found):
        raise error(f"{what} {spec!r}: {spec.rpartition(':')[0]!r} has no callable {spec.rpartition(':')[2]!r}")
    return found


def _module(spec: str, source: str, what: str, error):
    # A module beside the user, as `python -m` finds it: the installed `trl-ext` script's path lacks the current
    # folder. Appended, so an installed package of the same name still comes first.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(source)
    except (ImportError, SyntaxError) as err:
        raise error(f"{what} {spec!r}: cannot import {source!r} ({_import_failure(err)})") from None


def _file_module(spec: str, source: str, what: str, error):
    path = Path(source).resolve()
    if not path.is_file():
        raise error(f"{what} {spec!r}: file {source!r} does not exist")
    key = f"trl_ext.user_code:{path}"  # sys.modules' key: a file imports once however it is named
    if key not in sys.modules:
        loader_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[key] = module
        try:
            loader_spec.loader.exec_module(module)
        except (ImportError, SyntaxError) as err:
            del sys.modules[key]
            raise error(f"{what} {spec!r}: cannot import {source!r} ({_import_failure(err)})") from None
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]


def _import_failure(err: ImportError | SyntaxError) -> str:
    """What stopped an import, where a syntax error names its file and line (an exception the user's code raises
    itself keeps its traceback: it is a bug of that code, not bad input)."""
    if isinstance(err, SyntaxError):
        return f"{type(err).__name__} at {err.filename}:{err.lineno}: {err.msg}"
    return str(err)
