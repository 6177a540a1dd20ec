"""The FCM mapping a system states (harness/model/fcm_mapping.py): the reference's digits mod K,
an expression, or a function; anything else refused with the target file."""

from __future__ import annotations

import re
import zlib

import pytest

from harness.model.fcm_mapping import MappingError, project_function
from harness.model.system import SystemPolicy

PROJECTS = ("a", "b", "c")


def test_digits_mod_is_the_references_rule():
    of = project_function("digits-mod", PROJECTS)
    assert of is not None
    assert of("t", "u7") == "b" and of("t", "user-12") == "a"
    assert of("t", "alice") is None  # no number: the rule names no project


def test_an_expression_over_the_user_id():
    of = project_function("projects[crc32(user_id) % len(projects)]", PROJECTS)
    assert of is not None
    for user in ("u1", "alice", "u-99"):
        assert of("t", user) == PROJECTS[zlib.crc32(user.encode()) % 3]
    tenant_aware = project_function("projects[(digits(user_id) + len(tenant_id)) % 3]", PROJECTS)
    assert tenant_aware is not None and tenant_aware("tt", "u2") == "b"


def test_a_function_path():
    of = project_function("zlib:adler32", PROJECTS)  # any importable callable
    with pytest.raises(TypeError):
        assert of is not None and of("t", "u")  # adler32 takes no three arguments
    of = project_function("tests.test_fcm_mapping:last_project", PROJECTS)
    assert of is not None and of("t", "u") == "c"


def last_project(tenant_id: str, user_id: str, projects: tuple[str, ...]) -> str:
    return projects[-1]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("__import__('os').system('true')", "only crc32, md5, sha256"),
        ("projects[crc32(user_id) % len(projects)].upper()", "only crc32, md5, sha256"),
        ("projects[open('x')]", "only crc32, md5, sha256"),
        ("projects[crc32(user_id).real % 2]", "Attribute is not allowed"),
        ("projects[hidden % 2]", "unknown name 'hidden'"),
        ("projects[user_id ** 2]", "only + - * // %"),
        ("projects[", "is not an expression"),
        ("nowhere.module:function", "cannot import it"),
    ],
)
def test_anything_else_is_refused_with_what_is_wrong(text, message):
    with pytest.raises(MappingError, match=re.escape(message)):
        project_function(text, PROJECTS)


def test_no_mapping_or_no_projects_states_nothing():
    assert project_function(None, PROJECTS) is None
    assert project_function("digits-mod", ()) is None


def test_a_policy_with_a_bad_mapping_is_refused_when_read():
    with pytest.raises(MappingError):
        SystemPolicy.from_mapping({"fcm_projects": ["a"], "fcm_mapping": "exec('x')"})
    policy = SystemPolicy.from_mapping({"fcm_projects": ["a", "b"], "fcm_mapping": "digits-mod"})
    assert policy.to_dict()["fcm_mapping"] == "digits-mod"
