"""approvals.web.links: a row's link is the path ``reverse`` gives, without reversing per row."""

from __future__ import annotations

import uuid

import pytest
from django.urls import NoReverseMatch, clear_script_prefix, reverse, set_script_prefix

from approvals.web.links import occurrence_path

NAMES = ["approvals:review", "approvals:panel", "reconciliation:timeline"]


@pytest.mark.parametrize("name", NAMES)
def test_the_path_is_reverses(name: str) -> None:
    for _ in range(3):
        pk = uuid.uuid4()
        assert occurrence_path(name, pk) == reverse(name, args=[pk])
        assert occurrence_path(name, str(pk).upper()) == reverse(name, args=[pk])


@pytest.mark.parametrize("name", NAMES)
def test_under_a_script_prefix_too(name: str) -> None:
    pk = uuid.uuid4()
    plain = occurrence_path(name, pk)
    set_script_prefix("/console/")
    try:
        prefixed = occurrence_path(name, pk)
        assert prefixed == reverse(name, args=[pk])
        assert prefixed == "/console" + plain
    finally:
        clear_script_prefix()
    assert occurrence_path(name, pk) == plain


def test_a_pattern_without_an_occurrence_id_is_refused() -> None:
    with pytest.raises(NoReverseMatch):
        occurrence_path("approvals:inbox", uuid.uuid4())


def test_anything_but_an_id_is_refused() -> None:
    with pytest.raises(ValueError):
        occurrence_path("approvals:review", "../admin/")
