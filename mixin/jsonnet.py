"""The jsonnet mixin (llamacpp-mixin/mixin.libsonnet), generated from the same Python that writes
the rules and dashboards, so the two cannot disagree.

The generator runs once more on a symbolic configuration: every leaf of thresholds.yaml becomes
a `Param` that knows its jsonnet expression (`$._config.ram_miss_rate.ratio`) and its default.
Formatting a Param into a string (an f-string) leaves a token in the text; arithmetic on it
gives a Param for the jsonnet arithmetic. The output's strings are then written as jsonnet
expressions joining their literal parts and the tokens' expressions, so a `_config` override
changes every rule and panel that the same change of thresholds.yaml would.

A Param refuses what cannot be carried into jsonnet (truth value, comparison, hashing, str()),
so a generator step that decides on a threshold's value fails here instead of baking the
default into the mixin; such steps use `each` and `unique`, which both modes understand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

_TOKEN = re.compile("\x00([0-9]+)\x00")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_KEYWORDS = frozenset(
    "assert else error false for function if import importstr importbin in local null self super tailstrict then true".split()
)


class NotCarried(TypeError):
    """A generator step used a threshold's value in a way the jsonnet mixin cannot follow."""


class Param:
    """A configuration value, or arithmetic on such values, as a jsonnet expression."""

    def __init__(self, expression: str, default: Any, tokens: Tokens) -> None:
        self.expression = expression
        self.default = default
        self._tokens = tokens

    # -- into text ---------------------------------------------------------------------------
    def __format__(self, spec: str) -> str:
        return self._tokens.add(_formatted(self, spec))

    def text(self) -> str:
        """The jsonnet expression of this value as Python's str() would write it."""
        return _formatted(self, "")

    def call(self, helper: str) -> str:
        """The text that the mixin's jsonnet function `helper` makes of this value."""
        return self._tokens.add(f"{helper}({self.expression})")

    def __mod__(self, other: object) -> Param:  # runbook_url_pattern % anchor
        return self._derived(f"({self.expression} % {_literal(other)})", self.default % other)

    # -- arithmetic ----------------------------------------------------------------------------
    def _derived(self, expression: str, default: Any) -> Param:
        return Param(expression, default, self._tokens)

    def _operand(self, other: Any) -> tuple[str, Any]:
        if isinstance(other, Param):
            return other.expression, other.default
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return repr(other), other
        raise NotCarried(f"arithmetic of {self.expression} with {other!r}")

    def _binary(self, op: str, other: Any, reverse: bool = False) -> Param:
        expression, default = self._operand(other)
        left, right = (expression, self.expression) if reverse else (self.expression, expression)
        a, b = (default, self.default) if reverse else (self.default, default)
        value = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b}[op]()
        return self._derived(f"({left} {op} {right})", value)

    def __add__(self, other: Any) -> Any:
        if isinstance(other, str):
            return f"{self}" + other
        return self._binary("+", other)

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, str):
            return other + f"{self}"
        return self._binary("+", other, reverse=True)

    def __sub__(self, other: Any) -> Param:
        return self._binary("-", other)

    def __rsub__(self, other: Any) -> Param:
        return self._binary("-", other, reverse=True)

    def __mul__(self, other: Any) -> Param:
        return self._binary("*", other)

    def __rmul__(self, other: Any) -> Param:
        return self._binary("*", other, reverse=True)

    def __truediv__(self, other: Any) -> Param:
        return self._binary("/", other)

    def __rtruediv__(self, other: Any) -> Param:
        return self._binary("/", other, reverse=True)

    def __round__(self, digits: int = 0) -> Param:
        scale = 10**digits
        return self._derived(f"roundTo({self.expression}, {scale})", round(self.default, digits))

    # -- what jsonnet cannot follow ------------------------------------------------------------
    def _refuse(self, *_: Any) -> Any:
        raise NotCarried(f"{self.expression} (default {self.default!r}) used as a Python value")

    __bool__ = __str__ = __float__ = __int__ = __index__ = __hash__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse


class Tokens:
    """The jsonnet string expressions that formatted Params left in the text, by number."""

    def __init__(self) -> None:
        self.expressions: list[str] = []

    def add(self, expression: str) -> str:
        self.expressions.append(expression)
        return f"\x00{len(self.expressions) - 1}\x00"


def _formatted(p: Param, spec: str) -> str:
    """A jsonnet expression giving the text that format(value, spec) gives in Python."""
    d, e = p.default, p.expression
    if isinstance(d, str):
        if spec:
            raise NotCarried(f"format spec {spec!r} of the text {e}")
        return e
    if spec == "":
        return f"pyStr({e}, {'true' if isinstance(d, float) else 'false'})"
    if spec == "g":
        return f"std.format('%g', {e})"
    if re.fullmatch(r"\.[0-9]+f", spec):
        return f"std.format('%{spec}', {e})"
    if re.fullmatch(r"\.[0-9]+%", spec):
        return f"std.format('%{spec[:-1]}f%%', {e} * 100)"
    raise NotCarried(f"format spec {spec!r} of {e}")


def _literal(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def float_text(value: Any) -> Any:
    """repr(float(value)), as a bucket's le is written (10 -> 10.0)."""
    if isinstance(value, Param):
        return value._tokens.add(f"pyStr({value.expression}, true)")
    return repr(float(value))


# -- steps that decide on values --------------------------------------------------------------


@dataclass(frozen=True)
class Sequence:
    """A list whose length depends on the configuration: a jsonnet list expression."""

    expression: str
    first: Param


@dataclass(frozen=True)
class Splice:
    """Elements of a list made by `each` over a Sequence: `[body for var in sequence]`."""

    var: str
    sequence: str
    body: Any


def unique(values: Iterable[Any]) -> list[Any] | Sequence:
    """The values without repeats, in order (windows shared by two alerts are recorded once)."""
    values = list(values)
    params = [v for v in values if isinstance(v, Param)]
    if not params:
        return list(dict.fromkeys(values))
    items = ", ".join(v.expression if isinstance(v, Param) else _literal(v) for v in values)
    return Sequence(f"unique([{items}])", params[0])


def each(values: list[Any] | Sequence, build: Callable[[Any], Any], var: str = "item") -> list[Any]:
    """[build(v) for v in values], in jsonnet a comprehension when the values are configured."""
    if isinstance(values, Sequence):
        first = values.first
        return [Splice(var, values.expression, build(Param(var, first.default, first._tokens)))]
    return [build(v) for v in values]


def is_configured(value: Any) -> bool:
    return isinstance(value, Param)


# -- the configuration ------------------------------------------------------------------------


def _access(base: str, key: str) -> str:
    return f"{base}.{key}" if _IDENT.match(key) and key not in _KEYWORDS else f"{base}[{_literal(key)}]"


def symbolic(config: dict[str, Any], tokens: Tokens, base: str = "$._config") -> dict[str, Any]:
    """The configuration with every leaf a Param reading $._config."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        where = _access(base, key)
        out[key] = symbolic(value, tokens, where) if isinstance(value, dict) else Param(where, value, tokens)
    return out


# -- writing jsonnet --------------------------------------------------------------------------

HELPERS = """\
// Python's str() of a threshold: 0.5, 20, and 2.0 for a float that is whole
local pyStr(x, float) =
  if std.type(x) != 'number' then std.toString(x)
  else if x == std.floor(x) && std.abs(x) < 1e15 then std.format('%d', x) + (if float then '.0' else '')
  else std.format('%.15g', x);
local roundTo(x, scale) = std.floor(x * scale + 0.5) / scale;
local unique(xs) = std.foldl(function(seen, x) if std.member(seen, x) then seen else seen + [x], xs, []);
// 15m -> 15 min, for titles
local minutes(w) = if std.endsWith(w, 'm') then std.substr(w, 0, std.length(w) - 1) + ' min' else w;
"""


class Writer:
    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens

    def string(self, text: str) -> str:
        parts = _TOKEN.split(text)
        if len(parts) == 1:
            return _literal(text)
        pieces = []
        for i, part in enumerate(parts):
            if i % 2:
                pieces.append(self.tokens.expressions[int(part)])
            elif part:
                pieces.append(_literal(part))
        if len(pieces) == 1:
            return pieces[0]
        return " + ".join(pieces)

    def value(self, v: Any, indent: int = 0) -> str:
        pad, inner = "  " * indent, "  " * (indent + 1)
        if isinstance(v, Param):
            return v.expression
        if isinstance(v, str):
            return self.string(v)
        if v is None or isinstance(v, (bool, int, float)):
            return json.dumps(v)
        if isinstance(v, dict):
            if not v:
                return "{}"
            fields = []
            for key, item in v.items():
                name = self.string(key)
                name = name if name.startswith('"') else f"[{name}]"
                fields.append(f"{inner}{name}: {self.value(item, indent + 1)},")
            return "{\n" + "\n".join(fields) + f"\n{pad}}}"
        if isinstance(v, (list, tuple)):
            return self._list(list(v), indent)
        raise NotCarried(f"cannot write {type(v).__name__} as jsonnet")

    def _list(self, items: list[Any], indent: int) -> str:
        pad, inner = "  " * indent, "  " * (indent + 1)
        chunks: list[str] = []
        plain: list[str] = []

        def close() -> None:
            if plain:
                chunks.append("[\n" + "\n".join(f"{inner}{x}," for x in plain) + f"\n{pad}]")
                plain.clear()

        for item in items:
            if isinstance(item, Splice):
                close()
                chunks.append(
                    f"[\n{inner}{self.value(item.body, indent + 1)}\n{inner}for {item.var} in {item.sequence}\n{pad}]"
                )
            else:
                plain.append(self.value(item, indent + 1))
        close()
        return " + ".join(chunks) if chunks else "[]"
