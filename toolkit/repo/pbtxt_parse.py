"""A small parser for Triton's config.pbtxt (protobuf text format), keeping line numbers.

Enough for the repository checker: messages `key { ... }`, lists `key [ ... ]` of messages or
scalars, scalars `key: value` (strings, numbers, enums, bools). Repeated keys become lists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|("(?:[^"\\]|\\.)*")|([{}\[\]:,])|([^\s{}\[\]:,"#]+))')


@dataclass
class Node:
    line: int
    fields: dict[str, list] = field(default_factory=dict)

    def add(self, key: str, value) -> None:
        self.fields.setdefault(key, []).append(value)

    def get(self, key: str, default=None):
        values = self.fields.get(key)
        return values[0] if values else default

    def all(self, key: str) -> list:
        return self.fields.get(key, [])


@dataclass
class Scalar:
    value: object
    line: int


class PbtxtError(ValueError):
    def __init__(self, message: str, line: int):
        super().__init__(f"line {line}: {message}")
        self.line = line


def _tokens(text: str):
    pos, line = 0, 1
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            break
        line += text.count("\n", pos, match.start(0) + len(match.group(0)) - len(match.group(0).lstrip()))
        comment, string, punct, word = match.groups()
        if string is not None:
            yield ("str", bytes(string[1:-1], "utf-8").decode("unicode_escape"), line)
        elif punct is not None:
            yield (punct, punct, line)
        elif word is not None:
            yield ("word", word, line)
        line += match.group(0).lstrip().count("\n")
        pos = match.end()


def _scalar(kind: str, text: str):
    if kind == "str":
        return text
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text  # enum such as TYPE_INT32


def parse_pbtxt(text: str) -> Node:
    tokens = list(_tokens(text))
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else ("eof", None, tokens[-1][2] if tokens else 1)

    def take(expected=None):
        nonlocal pos
        tok = peek()
        if expected and tok[0] != expected:
            raise PbtxtError(f"expected {expected!r}, found {tok[1]!r}", tok[2])
        pos += 1
        return tok

    def parse_value(line):
        kind, value, vline = peek()
        if kind == "{":
            return parse_message()
        if kind in ("str", "word"):
            take()
            return Scalar(_scalar(kind, value), vline)
        raise PbtxtError(f"unexpected {value!r}", vline)

    def parse_message(top=False):
        start = peek()[2]
        if not top:
            take("{")
        node = Node(start)
        while True:
            kind, value, line = peek()
            if kind == "eof":
                if top:
                    return node
                raise PbtxtError("unclosed '{'", start)
            if kind == "}":
                if top:
                    raise PbtxtError("unexpected '}'", line)
                take()
                return node
            if kind == ",":
                take()
                continue
            key = take("word")[1]
            if peek()[0] == ":":
                take()
            if peek()[0] == "[":
                take()
                while peek()[0] != "]":
                    if peek()[0] == "eof":
                        raise PbtxtError("unclosed '['", line)
                    if peek()[0] == ",":
                        take()
                        continue
                    node.add(key, parse_value(line))
                take("]")
            else:
                node.add(key, parse_value(line))

    return parse_message(top=True)
