#!/usr/bin/env python3
"""Generates crucible_sdk/models.py from docs/openapi.json.

    python3 sdks/python/tools/gen_models.py            # rewrite models.py
    python3 sdks/python/tools/gen_models.py --check    # exit 1 if models.py has drifted

The daemon's openapi.json is itself generated from the Rust wire types (cargo xtask
gen-openapi), so generating the Python side from it keeps one source of truth; --check is
what CI runs so that a change to the wire types cannot land without the SDK following.

Mapping: an object schema becomes a dataclass with `from_dict` (tolerant of fields it does not
know, so an older SDK reads a newer daemon's answers) and `to_dict` (which leaves out what is
unset or at its default, so requests stay as small as the daemon's defaults allow); a oneOf
of string enums becomes a Literal alias.
"""

from __future__ import annotations

import argparse
import difflib
import json
import keyword
import pathlib
import sys
import textwrap
from typing import Any, Dict, List, Optional, Tuple

HERE = pathlib.Path(__file__).resolve().parent
SPEC = HERE.parents[2] / "docs" / "openapi.json"
OUT = HERE.parent / "crucible_sdk" / "models.py"
WIDTH = 99

Schema = Dict[str, Any]


def ref_name(ref: str) -> str:
    prefix = "#/components/schemas/"
    if not ref.startswith(prefix):
        raise SystemExit(f"unsupported $ref {ref!r}")
    return ref[len(prefix):]


def enum_values(schema: Schema) -> Optional[List[str]]:
    """The values of a string enum (plain `enum` or a oneOf of one-value enums), else None."""
    if schema.get("type") == "string" and "enum" in schema:
        return [str(v) for v in schema["enum"]]
    if "oneOf" in schema and all(
        isinstance(s, dict) and s.get("type") == "string" and len(s.get("enum", [])) == 1
        for s in schema["oneOf"]
    ):
        return [str(s["enum"][0]) for s in schema["oneOf"]]
    return None


def is_null(schema: Schema) -> bool:
    return schema.get("enum") == [None]


class Type:
    """A Python annotation plus how to convert one JSON value to and from it."""

    def __init__(self, annotation: str, load: str, dump: str, optional: bool = False) -> None:
        # `load` and `dump` are format strings over `{v}`, the expression being converted.
        self.annotation = annotation
        self.load = load
        self.dump = dump
        self.optional = optional

    def loader(self, expr: str) -> str:
        if self.load == "{v}":
            return expr
        if self.optional:
            return f"None if {expr} is None else {self.load.format(v=expr)}"
        return self.load.format(v=expr)

    def dumper(self, expr: str) -> str:
        if self.dump == "{v}":
            return expr
        if self.optional:
            return f"None if {expr} is None else {self.dump.format(v=expr)}"
        return self.dump.format(v=expr)


def python_type(schema: Schema, schemas: Dict[str, Schema]) -> Type:
    if "$ref" in schema:
        name = ref_name(schema["$ref"])
        target = schemas[name]
        if enum_values(target) is not None:
            return Type(name, "{v}", "{v}")
        return Type(name, f"{name}.from_dict({{v}})", "{v}.to_dict()")
    for combinator in ("allOf", "anyOf", "oneOf"):
        if combinator in schema and enum_values(schema) is None:
            parts = [s for s in schema[combinator] if not is_null(s)]
            nullable = len(parts) < len(schema[combinator])
            if len(parts) != 1:
                raise SystemExit(f"unsupported {combinator} with {len(parts)} alternatives")
            inner = python_type(parts[0], schemas)
            return nullable_type(inner) if nullable else inner
    values = enum_values(schema)
    if values is not None:
        return Type("Literal[" + ", ".join(json.dumps(v) for v in values) + "]", "{v}", "{v}")
    kind = schema.get("type")
    if kind == "array":
        item = python_type(schema.get("items", {}), schemas)
        load = "{v}" if item.load == "{v}" else f"[{item.loader('x')} for x in {{v}}]"
        dump = "{v}" if item.dump == "{v}" else f"[{item.dumper('x')} for x in {{v}}]"
        if load == "{v}":
            load, dump = "list({v})", "list({v})"
        base = Type(f"list[{item.annotation}]", load, dump)
    elif kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            value = python_type(extra, schemas)
            if value.load != "{v}":
                raise SystemExit("maps of objects are not supported")
            base = Type(f"dict[str, {value.annotation}]", "dict({v})", "dict({v})")
        else:
            base = Type("dict[str, Any]", "dict({v})", "dict({v})")
    elif kind == "string":
        base = Type("str", "{v}", "{v}")
    elif kind == "integer":
        base = Type("int", "{v}", "{v}")
    elif kind == "number":
        base = Type("float", "float({v})", "{v}")
    elif kind == "boolean":
        base = Type("bool", "{v}", "{v}")
    else:
        raise SystemExit(f"unsupported schema {json.dumps(schema)[:120]}")
    return nullable_type(base) if schema.get("nullable") else base


def nullable_type(inner: Type) -> Type:
    if inner.optional:
        return inner
    return Type(f"{inner.annotation} | None", inner.load, inner.dump, optional=True)


def comment(text: str, indent: str, marker: str = "#: ") -> List[str]:
    lines: List[str] = []
    for paragraph in text.strip().split("\n"):
        lines += textwrap.wrap(paragraph, WIDTH - len(indent) - len(marker)) or [""]
    return [f"{indent}{marker}{line}".rstrip() for line in lines]


def docstring(text: str, indent: str) -> List[str]:
    body: List[str] = []
    for paragraph in text.strip().replace('"""', "'''").split("\n"):
        body += textwrap.wrap(paragraph, WIDTH - len(indent) - 6) or [""]
    if len(body) == 1:
        return [f'{indent}"""{body[0]}"""']
    return [f'{indent}"""{body[0]}'] + [f"{indent}{line}".rstrip() for line in body[1:]] + [
        f'{indent}"""'
    ]


def callable_of(load: str) -> str:
    """`f({v})` as `f`, anything else as a lambda."""
    if load.endswith("({v})") and load.count("{v}") == 1:
        return load[: -len("({v})")]
    return "lambda v: " + load.format(v="v")


def field_name(prop: str) -> str:
    return prop + "_" if keyword.iskeyword(prop) else prop


def gen_object(name: str, schema: Schema, schemas: Dict[str, Schema]) -> List[str]:
    required = set(schema.get("required", []))
    props: Dict[str, Schema] = schema.get("properties", {})
    # Required fields first: a dataclass field without a default cannot follow one with.
    order = sorted(props, key=lambda p: (p not in required, list(props).index(p)))
    out = ["", "", "@dataclass", f"class {name}:"]
    out += docstring(schema.get("description", name), "    ")
    if schema.get("additionalProperties") is False:
        out += ["", "    # The daemon refuses unknown fields in this body."]
    fields: List[Tuple[str, str, Type, bool, Optional[str]]] = []
    for prop in order:
        ps = props[prop]
        t = python_type(ps, schemas)
        is_required = prop in required
        default: Optional[str] = None
        if not is_required:
            if "default" in ps and ps["default"] is not None:
                value = ps["default"]
                if isinstance(value, list):
                    default = "field(default_factory=list)"
                elif isinstance(value, dict) and not t.annotation.startswith("dict["):
                    # An object of a model class: that class, loaded from the default.
                    default = f"field(default_factory=lambda: {t.loader(repr(value))})"
                elif isinstance(value, dict):
                    default = "field(default_factory=dict)"
                else:
                    default = repr(value)
            elif t.annotation.startswith(("list[", "dict[")) and not t.optional:
                kind = "list" if t.annotation.startswith("list[") else "dict"
                default = f"field(default_factory={kind})"
            else:
                t = nullable_type(t)
                default = "None"
        fields.append((prop, field_name(prop), t, is_required, default))
        out.append("")
        if ps.get("description"):
            out += comment(ps["description"], "    ")
        suffix = "" if default is None else f" = {default}"
        out.append(f"    {field_name(prop)}: {t.annotation}{suffix}")

    out += ["", "    @classmethod", f"    def from_dict(cls, data: Mapping[str, Any]) -> {name}:"]
    if not fields:
        out.append("        return cls()")
    else:
        out.append("        return cls(")
        for prop, attr, t, is_required, default in fields:
            if is_required:
                out.append(f"            {attr}={t.loader(f'data[{prop!r}]')},")
            else:
                fallback = {
                    "field(default_factory=list)": "[]",
                    "field(default_factory=dict)": "{}",
                }.get(default or "None", default or "None")
                if fallback.startswith("field(default_factory=lambda: "):
                    fallback = repr(props[prop]["default"])
                getter = f"data.get({prop!r}, {fallback})"
                if t.load == "{v}":
                    out.append(f"            {attr}={getter},")
                elif t.optional:
                    out.append(f"            {attr}=_opt(data.get({prop!r}), {callable_of(t.load)}),")
                else:
                    out.append(f"            {attr}={t.loader(getter)},")
        out.append("        )")

    out += ["", "    def to_dict(self) -> dict[str, Any]:"]
    out.append("        out: dict[str, Any] = {}")
    for prop, attr, t, is_required, default in fields:
        value = t.dumper(f"self.{attr}")
        if is_required:
            out.append(f"        out[{prop!r}] = {value}")
            continue
        if default == "None":
            condition = f"self.{attr} is not None"
        elif default in ("field(default_factory=list)", "field(default_factory=dict)"):
            condition = f"self.{attr}"
        elif default and default.startswith("field(default_factory=lambda: "):
            made = default[len("field(default_factory=lambda: "):-1]
            condition = f"self.{attr} != {made}"
        else:
            condition = f"self.{attr} != {default}"
        out.append(f"        if {condition}:")
        out.append(f"            out[{prop!r}] = {value}")
    out.append("        return out")
    return out


def generate(spec: Schema) -> str:
    schemas: Dict[str, Schema] = spec["components"]["schemas"]
    version = spec.get("info", {}).get("version", "")
    out = [
        f'"""The JSON types of the crucible API {version}, generated from docs/openapi.json.',
        "",
        "Do not edit: run `python3 sdks/python/tools/gen_models.py` (CI runs it with --check).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass, field",
        "from typing import Any, Callable, Literal, Mapping, TypeVar",
        "",
        '_T = TypeVar("_T")',
        "",
        "",
        "def _opt(value: Any, load: Callable[[Any], _T]) -> _T | None:",
        "    return None if value is None else load(value)",
    ]
    aliases = []
    for name in sorted(schemas):
        values = enum_values(schemas[name])
        if values is not None:
            aliases.append(name)
            out += ["", ""]
            if schemas[name].get("description"):
                out += comment(schemas[name]["description"], "")
            out.append(f"{name} = Literal[" + ", ".join(json.dumps(v) for v in values) + "]")
    for name in sorted(schemas):
        if name in aliases:
            continue
        if schemas[name].get("type") != "object":
            raise SystemExit(f"schema {name}: only objects and string enums are supported")
        out += gen_object(name, schemas[name], schemas)
    out += ["", "", "__all__ = ["] + [f"    {n!r}," for n in sorted(schemas)] + ["]"]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if models.py has drifted")
    parser.add_argument("--spec", type=pathlib.Path, default=SPEC)
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args()
    text = generate(json.loads(args.spec.read_text()))
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            sys.stderr.writelines(
                difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                     str(args.out), "generated")
            )
            print(f"{args.out} is out of date with {args.spec}: run "
                  "`python3 sdks/python/tools/gen_models.py`", file=sys.stderr)
            return 1
        print(f"{args.out.name} matches {args.spec.name}")
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
