"""Unit tests of ``logstore acls``' filters.

Goal: as ``kafka-acls``, ``remove`` and ``list`` filter on the LITERAL pattern of the resource
given unless ``--resource-pattern-type`` says otherwise (``remove --topic secret`` must not
remove a PREFIXED DENY named ``secret``), and match every pattern when no resource is given.
Method: the CLI's own parser, and the filters it builds.
"""

from __future__ import annotations

import pytest

from logstore.cli import build_parser
from logstore.cli.acls import _filters


@pytest.mark.parametrize("verb", ["remove", "list"])
def test_a_resource_filter_defaults_to_the_literal_pattern(verb: str) -> None:
    args = build_parser().parse_args(["acls", verb, "--topic", "secret"])
    assert [f.pattern_type for f in _filters(args)] == ["LITERAL"]


@pytest.mark.parametrize("given", ["prefixed", "any", "match"])
def test_a_pattern_type_given_is_kept(given: str) -> None:
    args = build_parser().parse_args(["acls", "remove", "--topic", "secret",
                                      "--resource-pattern-type", given])
    assert [f.pattern_type for f in _filters(args)] == [given.upper()]


def test_without_a_resource_every_pattern_matches() -> None:
    args = build_parser().parse_args(["acls", "list"])
    assert [f.pattern_type for f in _filters(args)] == ["ANY"]
