"""Load rule files into compiled rules, collecting every problem like promtool.

``load_rules(paths)`` accepts files and directories (``*.yaml``/``*.yml``, in any case),
returns a :class:`RuleSet`, and raises :class:`RuleConfigError` listing every
problem as ``file:line:col: rule-id: message`` when anything is wrong.
"""

from __future__ import annotations

import errno
import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from app.alerts import RuleFacts
from app.errors import ExpressionError, RuleConfigError, RuleProblem
from app.events import SCHEMAS, Schema, schema_for
from app.rules.compile import Report, RuleParts, check_condition, compile_parts
from app.rules.expr import Compiled, parse
from app.rules.model import Engine, Rule, RuleFile, dump_canonical
from app.rules.problems import Problems, key_label
from app.rules.yamlpos import Positions, YamlProblem, load_with_positions, position_of

logger = logging.getLogger(__name__)

#: the largest rule file (256 KiB, about 500 rules): loading costs up to ~10 us a byte, most
#: of it sqlglot parsing expressions, so this bounds one file to a second or two
MAX_FILE_BYTES = 256 * 1024


@dataclass(frozen=True)
class CompiledRule:
    """A validated rule with its compiled parts, version and engine.

    ``where`` is the compiled condition (None for kinds without one);
    ``parts`` holds everything else the evaluator needs (aggregates, having,
    sequence steps, branch arms, joins, stateful functions).
    """

    rule: Rule
    version: str
    engine: Engine
    path: str
    schema: Schema
    where: Compiled | None
    line: int = 1
    parts: RuleParts | None = None
    #: what its alerts take from the rule, read once (derived: not compared, not pickled)
    facts: RuleFacts = field(init=False, repr=False, compare=False)
    #: the rule's id, a plain attribute: the evaluator reads it for every timer it runs
    id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        r = self.rule
        facts = RuleFacts(
            r.id, self.version, r.severity, r.source, r.labels, r.annotations, r.description, r.group_by
        )
        object.__setattr__(self, "facts", facts)  # frozen: set once, here
        object.__setattr__(self, "id", r.id)

    def runs_on(self, engine: str) -> bool:
        return self.engine in (engine, "both")

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as its validated model, and compiled again where it is loaded: Spark ships
        # rules to its Python workers, and the compiled closures may be native code
        # (app.runtime.native), which pickle cannot carry
        return (_recompile, (self.rule, self.engine, self.path, self.line))


@dataclass(frozen=True)
class RuleSet:
    """Every rule loaded from a set of files, in file order."""

    rules: tuple[CompiledRule, ...] = ()
    files: Mapping[str, str] = field(default_factory=dict)  # path -> content sha256

    def for_source(self, source: str, engine: str = "faust") -> list[CompiledRule]:
        return [r for r in self.rules if r.rule.source == source and r.runs_on(engine)]

    def get(self, rule_id: str) -> CompiledRule | None:
        return next((r for r in self.rules if r.id == rule_id), None)


def rule_version(rule: Rule, engine: str) -> str:
    """12 hex digits that change whenever anything about the rule changes."""
    blob = orjson.dumps({"rule": dump_canonical(rule), "engine": engine}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:12]


def _compiled(rule: Rule, engine: Engine, path: str, line: int, report: Report) -> CompiledRule | None:
    """``rule`` compiled for ``engine``, or None after telling ``report`` every problem."""
    schema = schema_for(rule.source)
    parts = compile_parts(rule, schema, report)
    if parts is None:
        return None
    return CompiledRule(rule, rule_version(rule, engine), engine, path, schema, parts.where, line, parts)


def _rule_key_label(loc: tuple[str | int, ...]) -> str:
    """How a rule file's problem names the value at ``loc``: by its key (``'size'``), or
    nothing for a rule itself (its id comes before the message)."""
    in_rule = len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int)
    return key_label(loc[2:] if in_rule else loc)


def _recompile(rule: Rule, engine: Engine, path: str, line: int) -> CompiledRule:
    """The CompiledRule the loader made of ``rule`` (see CompiledRule.__reduce__)."""
    problems: list[str] = []
    compiled = _compiled(rule, engine, path, line, lambda _where, msg: problems.append(msg))
    if compiled is None:  # it compiled where it was pickled: the same code gives the same result
        msg = f"{path}:{line}: rule {rule.id!r} no longer compiles: {'; '.join(problems)}"
        raise ValueError(msg)
    return compiled


class _FileLoader:
    def __init__(self, path: str, positions: Positions, data: Any, text: str) -> None:
        self.path = path
        self.positions = positions
        self.data = data
        self.problems = Problems(path, text, data, positions, self.rule_id_of, _rule_key_label)

    def rule_id_at(self, index: int) -> str | None:
        try:
            rid = self.data["rules"][index]["id"]
        except (KeyError, IndexError, TypeError):
            return None
        return rid if isinstance(rid, str) else None

    def rule_id_of(self, loc: tuple[str | int, ...]) -> str | None:
        """The id of the rule a path is in, None outside a rule (or for a rule without one)."""
        in_rule = len(loc) > 1 and loc[0] == "rules" and isinstance(loc[1], int)
        return self.rule_id_at(int(loc[1])) if in_rule else None

    def add(self, loc: tuple[str | int, ...], message: str) -> None:
        self.problems.add(loc, message)

    def compile_rule(self, index: int, rule: Rule, engine: Engine) -> CompiledRule | None:
        base = ("rules", index)
        if rule.no_data is not None and rule.kind != "threshold":
            self.add((*base, "no_data"), f"'no_data' belongs to threshold rules, not {rule.kind} rules")
            return None
        line, _ = position_of(self.positions, (*base, "id"))
        return _compiled(rule, engine, self.path, line, lambda path, msg: self.add((*base, *path), msg))

    def check_syntax(self, index: int, raw: Any, failed: set[Any]) -> None:
        """A rule's conditions when another key of it is invalid (the rule is not compiled):
        ``where`` and ``clear`` against the source's fields when the source is valid and the
        rule enriches nothing (an enriched rule's fields need its valid ``enrich``), else, and
        ``having`` (its names are the aggregates'), their syntax alone. One round of fixes then
        sees their problems too."""
        if not isinstance(raw, dict):
            return
        source = raw.get("source")
        schema = SCHEMAS.get(source) if isinstance(source, str) and "source" not in failed else None
        for key in ("where", "clear", "having"):
            text = raw.get(key)
            if key in failed or not isinstance(text, str):
                continue
            try:
                if schema is not None and key != "having" and not raw.get("enrich"):
                    check_condition(text, str(source), schema)
                else:
                    parse(text)
            except ExpressionError as exc:
                self.add(("rules", index, key), str(exc))

    def load(self) -> list[CompiledRule]:
        """Validate the file level, then each rule on its own, so that one bad
        rule does not hide the problems of the others."""
        if not isinstance(self.data, dict):
            self.add((), "a rule file must be a mapping with a 'rules:' list")
            return []
        try:
            top = RuleFile.model_validate(self.data)
        except ValidationError as exc:
            for err in exc.errors():
                self.problems.add_pydantic(err)
            return []
        compiled: list[CompiledRule] = []
        for i, raw in enumerate(top.rules):
            try:
                rule = Rule.model_validate(raw)
            except ValidationError as exc:
                for err in exc.errors():
                    self.problems.add_pydantic(err, ("rules", i))
                self.check_syntax(i, raw, {err["loc"][0] for err in exc.errors() if err["loc"]})
                continue
            c = self.compile_rule(i, rule, rule.engine or top.engine)
            if c is not None:
                compiled.append(c)
        return compiled


def load_text(text: str, path: str) -> tuple[list[CompiledRule], list[RuleProblem]]:
    """Compile one file's text. Returns the good rules and every problem found."""
    try:
        data, positions = load_with_positions(text)
    except YamlProblem as exc:
        return [], [RuleProblem(path, exc.line, exc.col, None, exc.message)]
    loader = _FileLoader(path, positions, data, text)
    rules = loader.load()
    return rules, loader.problems.listed()


def read_rule_file(path: Path) -> bytes:
    """A rule file's bytes, up to one past :data:`MAX_FILE_BYTES` (a longer file is refused
    whole, so no more of it is read). Raises OSError, and for anything but a regular file
    (a FIFO would block the reader)."""
    if not path.is_file() and path.exists():
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    with path.open("rb") as fh:
        return fh.read(MAX_FILE_BYTES + 1)


def file_digest(path: Path) -> str:
    """The sha256 of :func:`read_rule_file`: a file's entry in :attr:`RuleSet.files`."""
    return hashlib.sha256(read_rule_file(path)).hexdigest()


#: the endings of rule files and rule test files, matched in any case (``x.YAML``, ``x.Yml``)
YAML_SUFFIXES = (".yaml", ".yml")
TEST_SUFFIXES = (".test.yaml", ".test.yml")


def is_yaml_file(path: Path) -> bool:
    """Whether ``path`` is named as a YAML file: ``.yaml`` or ``.yml``, in any case."""
    return path.name.lower().endswith(YAML_SUFFIXES)


def is_rule_test_file(path: Path) -> bool:
    """Whether ``path`` is named as a rule test file: ``.test.yaml`` or ``.test.yml``, in any case."""
    return path.name.lower().endswith(TEST_SUFFIXES)


def rule_files(paths: Iterable[Path]) -> list[Path]:
    """Expand directories to their YAML files (:func:`is_yaml_file`; sorted), skipping rule
    tests (:func:`is_rule_test_file`, and any file in a ``tests`` directory)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if is_yaml_file(f) and not _is_test_file(f)))
        else:
            out.append(p)
    return out


def _is_test_file(path: Path) -> bool:
    return is_rule_test_file(path) or "tests" in path.parts[-2:-1]


def running_versions(paths: Iterable[Path | str]) -> frozenset[tuple[str, str]]:
    """``(rule id, version)`` of every rule in ``paths``, loaded as the engines load them: the
    versions they run once they have read the files. An alert open under any other ran under a
    rule since removed or edited, and no engine will end it. Raises RuleConfigError as
    :func:`load_rules` (the engines then keep their last good rules, which the files do not say)."""
    return frozenset((r.id, r.version) for r in load_rules(paths).rules)


def _not_utf8(name: str, raw: bytes, exc: UnicodeDecodeError) -> RuleProblem:
    """A file that is not UTF-8, reported at its first bad byte: the line, the column (in
    characters, the line's start before it being UTF-8) and the byte's offset in the file."""
    at = exc.start
    start = raw.rfind(b"\n", 0, at) + 1
    col = len(raw[start:at].decode("utf-8", errors="replace")) + 1
    msg = f"file is not UTF-8: {exc.reason}, byte 0x{raw[at]:02x} at offset {at}; save it as UTF-8"
    return RuleProblem(name, raw.count(b"\n", 0, at) + 1, col, None, msg)


def load_rules(paths: Iterable[Path | str]) -> RuleSet:
    """Load and compile every rule file under ``paths``; raise on any problem."""
    problems: list[RuleProblem] = []
    rules: list[CompiledRule] = []
    files: dict[str, str] = {}
    seen: dict[str, CompiledRule] = {}
    for f in rule_files(Path(p) for p in paths):
        name = str(f)
        try:
            raw = read_rule_file(f)
        except OSError as exc:
            problems.append(RuleProblem(name, 1, 1, None, f"cannot read file: {exc.strerror}"))
            continue
        if len(raw) > MAX_FILE_BYTES:
            msg = f"file is larger than {MAX_FILE_BYTES} bytes (the limit); split it into several files"
            problems.append(RuleProblem(name, 1, 1, None, msg))
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(_not_utf8(name, raw, exc))
            continue
        files[name] = hashlib.sha256(raw).hexdigest()
        try:
            good, bad = load_text(text, name)
        except (RecursionError, MemoryError) as exc:  # past every limit above: still the file's problem
            what = "nests too deeply" if isinstance(exc, RecursionError) else "needs too much memory"
            problems.append(RuleProblem(name, 1, 1, None, f"file {what} to load ({type(exc).__name__})"))
            continue
        problems.extend(bad)
        for r in good:
            if r.id in seen:
                problems.append(
                    RuleProblem(
                        name,
                        r.line,
                        1,
                        r.id,
                        f"duplicate rule id; first defined at {seen[r.id].path}:{seen[r.id].line}",
                    )
                )
                continue
            seen[r.id] = r
            rules.append(r)
    if problems:
        raise RuleConfigError(problems)
    return RuleSet(tuple(rules), files)


def load_what_loads(paths: list[Path]) -> tuple[RuleSet, dict[str, str] | None, Exception | None]:
    """The rules an engine starts with: those of ``paths`` if they load, else the files that
    load on their own and together (else none), with the files' hashes (the rejected set, not
    parsed again until one changes) and why the whole set did not load. An engine never stops
    on a rule file; fixing it brings the whole set in at the next reload."""
    try:
        return load_rules(paths), None, None
    except Exception as exc:  # any failure to load is a rejection, never the engine's end
        error = exc
    files = rule_files(paths)
    good = []
    for f in files:
        try:
            load_rules([f])
        except Exception:  # noqa: S112 - the whole set's problems are the caller's to report
            continue
        good.append(f)
    try:
        ruleset = load_rules(good) if good else RuleSet()
    except Exception:  # the valid files clash with one another (duplicate ids): start with none
        logger.exception("the valid rule files do not load together; starting with no rules")
        ruleset = RuleSet()
    try:
        rejected: dict[str, str] | None = {str(f): file_digest(f) for f in files}
    except OSError:
        rejected = None
    return ruleset, rejected, error


@dataclass(frozen=True)
class RuleFilesCheck:
    """One check of the rule files against the rules running (:func:`check_rule_files`):
    ``ruleset`` when they changed and load; ``error`` when they changed and do not;
    ``rejected``, the hashes of a rejected set to remember (None once the files are back to
    the rules running or load)."""

    ruleset: RuleSet | None
    rejected: dict[str, str] | None
    error: Exception | None = None


def check_rule_files(paths: list[Path], running: RuleSet, rejected: dict[str, str] | None) -> RuleFilesCheck:
    """What the files under ``paths`` say now, for an engine's hot reload: a rejected set is
    not parsed again until one of its files changes, and a set back to the rules running
    clears it (a bad edit made again is reported again). Nothing it meets raises: a file that
    vanished between listing and reading is the next check's."""
    try:
        current = {str(f): file_digest(f) for f in rule_files(paths)}
    except OSError:
        return RuleFilesCheck(None, rejected)
    if current == dict(running.files):
        return RuleFilesCheck(None, None)
    if current == rejected:
        return RuleFilesCheck(None, rejected)
    try:
        return RuleFilesCheck(load_rules(paths), None)
    except Exception as exc:  # any failure to load is a rejection, never the engine's end
        return RuleFilesCheck(None, current, exc)


def log_rejection(log: logging.Logger, outcome: str, error: Exception) -> None:
    """At ERROR on ``log``, ``rule files rejected`` + ``outcome`` (e.g. ``, keeping the last
    good rules``) with every problem of a :class:`RuleConfigError` (file, line, column, rule),
    or ``rule files could not be loaded`` + ``outcome`` with the traceback of any other failure."""
    if isinstance(error, RuleConfigError):
        log.error("rule files rejected%s:\n%s", outcome, error)
    else:
        log.error("rule files could not be loaded%s", outcome, exc_info=error)
